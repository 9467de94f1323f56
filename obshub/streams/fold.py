"""The per-step join across hosts: fold host accumulators into open steps, close a step, summarise it.

This is the state machine of the worker's ``fold`` agent, written against five changelog-backed tables
(any mapping with ``get``, item assignment and ``del``; the worker passes Faust tables, the fold
benchmark plain dicts that encode every write). All five are partitioned like the internal topic: every
key below belongs to the partition ``p`` of the step or job it names, and every write happens while the
fold agent processes a message of that partition.

State layout (docs/STREAMS.md "State"); one batch part costs one small write, whatever the job's width:

``parts``   ``job|step|r<n>`` -> ``{host: {"acc": host accumulator, "bids": [batch ids applied], "q": {quality}}}``
            The hosts' shares of one open step, one record per unit of application (a worker's round of
            one partition, :meth:`Fold.apply_round`) in which they changed, at most ``PART_RECORD_MAX``
            hosts and about ``PART_RECORD_BYTES`` each; ``n`` counts the step's records from 0. A host's latest entry is in the highest
            ``n`` that holds it (entries are cumulative: a part from the host merges into its entry,
            ``accumulate.merge``); a part whose batch id is already listed is a replay and changes nothing.
            Which record holds which host is derived state (``Fold._where``), rebuilt from the keys after
            a restart or rebalance. A per-host record ``job|step|host`` -> entry (an older layout) is read
            the same way.
``steps``   ``job|step`` -> ``{"job", "step", "p", "opened_ns", "extra"}``
            The open step: when its first data arrived (processing time, for the window) and the hosts that
            sent data without being registered. Written when the step opens (and when such a host appears).
            How many of its hosts reported STEP_END is derived state, kept in memory (``Fold.ended``) and
            recounted from ``parts`` after a restart or rebalance (``Fold.forget``).
``members`` ``job@p#<b>`` -> ``{host: host_id}`` and ``job@p#r<b>`` -> ``{rank: [host, pid]}`` (the host alone
            for a rank registered without a pid)
            The job's registered hosts and ranks, in 256 buckets by CRC-32 of the host name (``b``) and by
            rank, so a registration rewrites one small bucket and a close reads the used buckets once.
``jobs``    ``job@p`` -> ``{"n_hosts", "n_ranks", "world_size", "buckets", "history", "pending", "closed",
            "floor"}``: counts for the completeness test, the baseline history, quality counters waiting
            for the next summary, the last ``CLOSED_KEEP`` steps closed here and ``floor`` (the highest
            step whose closed record was dropped).
``closed``  ``job|step`` -> ``{"p", "bids": 8-byte BLAKE2b digests of the batch ids summarised, "late"}``
            The step was summarised; a later part is a replay (digest known) or late data (counted).

Hangs (docs/ANALYSIS.md "Hangs"): :meth:`hangs` checks the latest open step of every job with
``analysis.hang_check`` from in-memory derived state (when each host last sent data for the job, the
highest step seen, the processes the agents found frozen, stopped or exited) and returns an interim summary (``closed_by = "hang"``) for each hung step; a hung step
is not closed by its window for ``Thresholds.hang_hold_ns`` after it opened. A step that hung and the job's
``Thresholds.hang_quiet_steps`` steps after it (closed in this process) carry no sequential evidence.

Running steps (docs/ANALYSIS.md "Inside a running step"): :meth:`running` checks the latest open step of
every job that does not hang with ``analysis.running_check`` and returns an interim summary (``closed_by
= "running"``) naming the hosts whose every busy connection is slow or lossy while the step runs far
longer than the job's usual step.

A step is complete when every rank of ``world_size`` registered and the number of hosts that ended it
equals the registered hosts plus the unregistered ones that sent data. Closing reads each of the step's
``parts`` records once, deletes them, and writes the ``closed`` record: the changelog bytes of a step grow
linearly with its hosts (bench/fold_width.py measures it), and its records with the units it spans.

Every message is applied inside a unit (:meth:`Fold.apply_round`; a single message is a unit of its
own): every table write goes through a :class:`WriteBack` and reaches the table once per key at the end,
so a step whose parts all arrive in one unit and that closes in it writes no ``parts`` or ``steps``
record, only its ``closed`` record.
"""

from __future__ import annotations

import ast
import collections
import functools
import hashlib
import logging
import math
import time
import zlib
from typing import Any, Callable, Iterable, Iterator, MutableMapping

from obshub.streams import accumulate, analysis
from obshub.streams.accumulate import HostAcc, PartEntry, PartMsg, as_entry, as_part, decode_internal

log = logging.getLogger("obshub.streams")

QUALITY_KEYS = ("lost_batches", "duplicate_batches", "late_events")
BUCKETS = 256
PART_RECORD_MAX = 256  # host entries per ``parts`` record (about 300 bytes each at 64 events per host-step)
PART_RECORD_BYTES = 4 * 1024 * 1024  # about this many bytes per ``parts`` record at most (estimated, _entry_bytes)
RUNNING_NAMED_MAX = 4096  # open steps whose running record's network culprit is kept for their close
# how far behind its job's latest step (a later step has data or closed here) an open step is still checked
# while it runs (Fold.running): the step just before the latest is where a blackout leaves the host it
# hit when the other hosts got their last segments of the step before it started (they end the step and
# block in the next one's all-reduce, which holds nothing of that host; docs/ANALYSIS.md "Inside a running
# step"); steps further behind (a host whose data lags) are judged at their close
RUNNING_BEHIND_STEPS = 1
# a step that has run long gets its running check when new parts of it arrive (apply_round), not only from
# the worker's 0.5 s timer: a blocked rank's TCP events reach the worker only in its agent's age-sealed
# batch (at most 1 s), and a 1 s blackout's step closes ~0.6 s later; the timer alone left 3 of 10 such
# steps without a record (early18) and others with one just before the close. At most one such check per
# step per RUNNING_ARRIVAL_EVERY_NS (a later arrival waits for the next round past it, or the timer)
RUNNING_ARRIVAL_EVERY_NS = 100_000_000
RUNNING_READ_WITHIN_NS = 3_000_000_000  # as the timer's: every input partition read to its end this recently
CLOSED_KEEP = 256  # closed-step records kept per (job, partition) to recognise replays and late data
JOB_RETENTION_NS = 3_600_000_000_000  # a job's state is dropped this long after its last data (1 h, ns)

# ("summary", job, summary dict) | ("running", job, interim summary dict) | ("broadcast", job, internal message)
Emit = tuple[str, str, Any]


@functools.lru_cache(maxsize=1 << 14)
def bucket_of(host: str) -> int:
    """Bucket of ``host`` in the ``members`` table: CRC-32 of its UTF-8 name mod ``BUCKETS`` (cached: the
    fold asks it for every part, 2,048 a step at 2,048 hosts; 16,384 hosts kept, ~2.5 MB at most)."""
    return zlib.crc32(host.encode()) % BUCKETS


def bid_digest(bid: str) -> bytes:
    """The 8-byte BLAKE2b digest of a batch id ``"<agent_id>:<seq>"`` (as kept in ``closed``)."""
    return hashlib.blake2b(bid.encode(), digest_size=8).digest()


def digest_blob(bids: Any) -> bytes:
    """The ``bids`` of a ``closed`` record as bytes (8 per digest). Written as bytes, and recovered as
    bytes from the worker's msgpack changelog; a record an older worker wrote in Faust's JSON (read by
    ``streams.wire.CHANGELOG``) holds the text of their Python repr (``"b'...'"``), and hex text is
    accepted too. Anything else reads as no digest."""
    if isinstance(bids, (bytes, bytearray)):
        return bytes(bids)
    if isinstance(bids, str):
        if bids[:2] in ("b'", 'b"'):
            try:
                v = ast.literal_eval(bids)
            except (ValueError, SyntaxError):
                return b""
            return v if isinstance(v, bytes) else b""
        try:
            return bytes.fromhex(bids)
        except ValueError:
            return b""
    return b""


_GONE = object()
_UNSET = object()


def _all_exited(
    hosts: set[str], pids: dict[str, dict[int, tuple[int, int]]], states: dict[str, dict[int, tuple]]
) -> bool:
    """Has every registered rank of every one of ``hosts`` exited? (``pids``: ``host -> pid -> (rank,
    local rank)`` of the job's current life; ``states``: ``host -> pid -> (state, ...)`` from RANK_STATE.)
    False when a host has no registered rank: an unregistered host's processes are not known."""
    if not hosts:
        return False
    for h in hosts:
        known, st = pids.get(h), states.get(h) or {}
        if not known or any(st.get(pid, ("running",))[0] != "exited" for pid in known):
            return False
    return True


#: the signals a job is stopped with on purpose (scancel and kubectl delete: SIGTERM; Ctrl-C: SIGINT; a
#: closed terminal: SIGHUP); SIGKILL is not one of them (an OOM kill, a killed rank, a scheduler's last resort)
STOP_SIGNALS = (1, 2, 15)


def _stop_exit_ns(v: tuple) -> int | None:
    """The ``received_ns`` (worker clock) of one process state ``v`` (``(state, received_ns, at_rt,
    signal)``, as :meth:`Fold.state` keeps it) when it is an exit by a stop signal (:data:`STOP_SIGNALS`),
    else None (still stopped or frozen, killed by another signal, or an older state without a signal)."""
    if v[0] == "exited" and len(v) > 3 and v[3] in STOP_SIGNALS:
        return int(v[1])
    return None


def _stop_exits(hosts: set[str], states: dict[str, dict[int, tuple]]) -> list[int]:
    """The ``received_ns`` (worker clock) of each process of ``hosts`` reported exited by a stop signal
    (``states``: ``host -> pid -> (state, received_ns, at_rt, signal)``; see :func:`_stop_exit_ns`)."""
    return [ns for h in hosts for v in (states.get(h) or {}).values() if (ns := _stop_exit_ns(v)) is not None]


def _cancelled(
    hosts: set[str], pids: dict[str, dict[int, tuple[int, int]]], states: dict[str, dict[int, tuple]]
) -> bool:
    """Was every registered rank of every one of ``hosts`` ended by a stop signal (:data:`STOP_SIGNALS`)?
    A job cancelled by its scheduler or by Ctrl-C, not a hang. False for no hosts, or a host with no
    registered rank (``pids``: ``host -> pid -> (rank, local rank)``; ``states`` as :func:`_stop_exits`)."""
    if not hosts:
        return False
    for h in hosts:
        known, st = pids.get(h), states.get(h) or {}
        if not known:
            return False
        for pid in known:
            v = st.get(pid)
            if v is None or _stop_exit_ns(v) is None:
                return False
    return True


def _exited_before(
    hosts: set[str], pids: dict[str, dict[int, tuple[int, int]]], states: dict[str, dict[int, tuple]], ns: int
) -> bool:
    """Had every rank of every one of ``hosts`` exited before ``ns`` (CLOCK_REALTIME)? Per host, each of
    its registered processes (``pids``: ``host -> pid -> (rank, local rank)``), or when none is known at
    least one, was reported exited (``states``: ``host -> pid -> (state, received_ns, at_rt)`` from
    RANK_STATE) with an exit time ``at_rt`` before ``ns``. False for no hosts."""
    if not hosts:
        return False
    for h in hosts:
        st = states.get(h) or {}
        known = pids.get(h) or {pid for pid, v in st.items() if v[0] == "exited"}
        for pid in known or (None,):
            v = st.get(pid) if pid is not None else None
            if v is None or v[0] != "exited" or len(v) < 3 or not 0 < v[2] < ns:
                return False
    return True


def _weaker_than_named(culprit: dict | None, named: dict | None) -> bool:
    """Whether a running record's ``culprit`` names another host than the one an earlier record of the same
    open step named (``named``, ``Fold.running_named``) on less evidence (spreads): such a record is not
    sent (docs/ANALYSIS.md "Inside a running step", point 4). A step's traffic shifts while it runs: the
    lossy host's one retransmitting connection grows to carry most of its RTT samples, its other
    connection stops counting as busy, its evidence ends, and a peer's two or three retransmits per
    connection are left to name (live, lead23-makedemo-final step 149: node-01 named at 7.0 spreads,
    then node-00 at 2.0, 3.4 s into a step held by node-01's lossy link: a wrong ``step_stall``)."""
    if culprit is None or named is None or culprit.get("host") == named.get("host"):
        return False
    return float(culprit.get("evidence") or 0.0) < float(named.get("evidence") or 0.0)


def _entry_bytes(entry: Any) -> int:
    """A cheap upper estimate of the msgpack bytes of one ``parts`` host entry: its collectives (~60 bytes
    each, a rank row's too), its packed rank rows and batch ids, plus 2 KB for the rest."""
    if isinstance(entry, dict):  # the dict form (an older worker's entry)
        entry = as_entry(entry)
    if not isinstance(entry, PartEntry):
        return 2048
    acc = entry.acc
    n = 2048 + 60 * len(acc.colls) + 40 * len(entry.bids)
    rb = acc.rb
    if rb is not None:
        n += 2 * len(rb)  # the blob and its rank table
    for row in (acc.ranks or {}).values():
        n += 1024 + 60 * len(row.colls)
    return n


def _chunks(hosts: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``hosts`` (host -> ``parts`` entry) cut into records of at most ``PART_RECORD_MAX`` hosts and about
    ``PART_RECORD_BYTES`` (a host whose entry alone is larger gets a record of its own), in order: a record
    must stay under the changelog's ``max.message.bytes`` (core.topics.CHANGELOG_MAX_BYTES)."""
    chunk: dict[str, Any] = {}
    size = 0
    for h, entry in hosts.items():
        b = _entry_bytes(entry)
        if chunk and (len(chunk) >= PART_RECORD_MAX or size + b > PART_RECORD_BYTES):
            yield chunk
            chunk, size = {}, 0
        chunk[h] = entry
        size += b
    if chunk:
        yield chunk


class WriteBack:
    """A write-back view of one table for the messages of one unit (``Fold.apply_round``): reads see the
    unit's own writes, each key is read from ``table`` at most once (a Faust table read costs a few µs
    of Python: sensors, partition bookkeeping), :meth:`flush` writes each changed key to ``table`` once
    (its last value), and a key deleted before it ever reached the table costs nothing. Not thread-safe;
    nothing else may write ``table`` while the view is in use; every write happens in :meth:`flush`,
    which the caller runs with the unit's partition as the current event (so each changelog record goes
    to that partition)."""

    def __init__(self, table: MutableMapping):
        self.table = table
        self.dirty: dict[str, Any] = {}
        self.read: dict[str, Any] = {}  # key -> the table's value (None: absent), read once

    def get(self, key: str, default: Any = None) -> Any:
        v = self.dirty.get(key, _UNSET)
        if v is _UNSET:
            v = self.read.get(key, _UNSET)
            if v is _UNSET:
                v = self.read[key] = self.table.get(key)
            return default if v is None else v
        return default if v is _GONE else v

    def __getitem__(self, key: str) -> Any:
        v = self.get(key, _UNSET)
        if v is _UNSET:
            raise KeyError(key)
        return v

    def __setitem__(self, key: str, value: Any) -> None:
        self.dirty[key] = value

    def __delitem__(self, key: str) -> None:
        self.dirty[key] = _GONE

    def items(self) -> list[tuple[str, Any]]:
        """Every (key, value) as the table will hold them after :meth:`flush`."""
        merged = dict(self.table.items())
        for k, v in self.dirty.items():
            if v is _GONE:
                merged.pop(k, None)
            else:
                merged[k] = v
        return list(merged.items())

    def flush(self) -> None:
        """Write every changed key to the table once; delete only keys the table holds."""
        for k, v in self.dirty.items():
            if v is _GONE:
                if self.table.get(k) is not None:
                    del self.table[k]
            else:
                self.table[k] = v
        self.dirty.clear()
        self.read.clear()


def _new_job() -> dict:
    return {
        "n_hosts": 0,
        "n_ranks": 0,
        "world_size": 0,
        "buckets": [],
        "history": [],
        "pending": dict.fromkeys(QUALITY_KEYS, 0),
        "closed": [],
        "floor": -1,
        "rbuckets": [],
    }


class Fold:
    """The fold agent's logic over its tables. :meth:`apply` takes one internal message (a dict with
    ``t`` = ``part`` | ``host`` | ``hist`` | ``close`` | ``read``, shapes in docs/STREAMS.md) of partition ``p`` and
    returns what to send: step summaries (to the output topic) and broadcasts (to every partition).

    ``window_ns``: a ``close`` request closes a step only when it has been open that long.
    ``on_late(n)`` / ``on_summary(closed_by)``: metric callbacks. ``clock``: CLOCK_REALTIME ns."""

    def __init__(
        self,
        tables: dict[str, MutableMapping],
        *,
        window_ns: int,
        th: analysis.Thresholds = analysis.Thresholds(),
        closed_keep: int = CLOSED_KEEP,
        on_late: Callable[[int], None] = lambda n: None,
        on_summary: Callable[[str], None] = lambda by: None,
        clock: Callable[[], int] = time.time_ns,
        input_partitions: int = 0,
        hold_max_ns: int | None = None,
        on_error: Callable[[dict | bytes, BaseException], None] = lambda value, exc: None,
        retention_ns: int = JOB_RETENTION_NS,
    ):
        self.parts, self.steps = tables["parts"], tables["steps"]
        # an internal message the fold failed on (a bug), with the exception: the worker counts it in a metric
        # and dead-letters it; the other messages of the unit still apply
        self.on_error = on_error
        self.members, self.jobs, self.closed = tables["members"], tables["jobs"], tables["closed"]
        self.window_ns, self.th, self.closed_keep = window_ns, th, closed_keep
        self.on_late, self.on_summary, self.clock = on_late, on_summary, clock
        self._digests: dict[str, set[bytes]] = {}  # closed key -> its digests, for repeated replay checks
        self.ended: dict[str, int] = {}  # open step key -> hosts whose part holds a STEP_END (derived)
        self.last_seen: dict[str, dict[str, int]] = {}  # job -> host -> clock() of its last part (hangs)
        self.top_step: dict[str, int] = {}  # job -> highest step a part arrived for in this process
        self.hung: dict[str, int] = {}  # open step key -> clock() when its hang was first seen
        self.was_hung: set[str] = set()  # open step keys that hung at some point (kept after they resume)
        self.exit_named: set[str] = set()  # hung step keys named once after every rank exited (named no more)
        self.hang_hosts: dict[str, list] = {}  # open step key -> the hosts its latest hang record named
        self.quiet_until: dict[str, int] = {}  # job -> last step whose evidence is dropped after a hang
        # job -> latest step closed here whose retransmits met the directed view's condition (derived, in
        # memory: a restarted worker judges each step on its own until one meets it again)
        self.net_directed: dict[str, int] = {}
        # job -> the retransmits per connection of its last net_window_steps steps closed here
        # (analysis.net_window_part; derived, in memory: a restarted worker starts with an empty window)
        self.net_recent: dict[str, collections.deque] = {}
        # job -> analysis.persistent_key of its last closed steps here (derived, in memory)
        self.culprit_recent: dict[str, collections.deque] = {}
        # job -> analysis.charge_starved's parts (run-queue ns per host and, in steps of at most 64 hosts,
        # per (host, rank)) of its last closed steps here (derived, in memory: a restarted worker compares
        # hosts with their peers alone until SELF_MIN steps closed)
        self.sched_recent: dict[str, collections.deque] = {}
        # job -> a slowed step of it that named nobody because several hosts stood out alike, held until a
        # later step names one of them (analysis.hold_ambiguous; derived, in memory)
        self.ambiguous_held: dict[str, dict] = {}
        # job -> its memory episodes' state: closed steps seen, each host's latest memory charge, the episode
        # in progress (analysis.memory_episode; derived, in memory: a restarted worker sees no onset until
        # MEMORY_QUIET_STEPS steps closed here)
        self.memory_state: dict[str, dict] = {}
        # open step key -> the network culprit its latest ``running`` record named (derived, in memory;
        # dropped at its close: a close that names no culprit of its own is charged to it, source "running")
        self.running_named: dict[str, dict] = {}
        self.running_due: set[str] = set()  # open steps that got parts since their last arrival check
        self.running_at: dict[str, int] = {}  # open step -> clock() ns of its last arrival check
        # job -> host -> pid -> (state, clock() when received, at_rt): registered processes their agent found
        # frozen, stopped or exited (RANK_STATE; derived, in memory: a restarted worker falls back to silence)
        self.rank_state: dict[str, dict[str, dict[int, tuple[str, int]]]] = {}
        # job -> host -> pid -> (global rank, local rank) of its registered processes (derived, in memory,
        # from the registrations seen here: a restarted worker names hung hosts without their rank, and
        # judges a host done with a step by its first STEP_END until its ranks register again)
        self.host_ranks: dict[str, dict[str, dict[int, tuple[int, int]]]] = {}
        self.input_partitions = input_partitions
        self.hold_max_ns = hold_max_ns if hold_max_ns is not None else max(10 * window_ns, 60_000_000_000)
        self.read_ns: dict[int, int] = {}  # input partition -> clock() up to which it was read (derived)
        self.read_new_at = -math.inf  # time.monotonic() of the last ``read`` report flagged ``new`` (derived)
        self._held: set[str] = set()  # open steps whose window close waits for input (logged once)
        # parts records (derived from the keys; None = rebuild from the table): open step -> host -> the key
        # of the record with its latest entry; open step -> its keys, oldest first; -> its next record number
        self._where: dict[str, dict[str, str]] | None = None
        self._recs: dict[str, list[str]] = {}
        self._next: dict[str, int] = {}
        self._legacy: set[str] = set()  # per-host keys of the older layout (value = the entry itself)
        self._pending: dict[str, dict[str, PartEntry]] = {}  # open step -> host -> entry changed in this unit
        self._unit = False  # inside apply_round: the tables are WriteBack views
        # job retention (docs/STREAMS.md "Retention"): job -> clock() of its last message in this process
        # (part, registration, state, history; derived, in memory), and when this process started (the
        # last activity of a ``jobs`` record without ``seen_ns``, written by an older worker)
        self.retention_ns = retention_ns
        self.active_ns: dict[str, int] = {}
        self.started_ns = clock()
        self.life_of: dict[str, int] = {}  # job -> its latest life seen here (derived: resets once per life)

    def input_read_past(self, st: dict) -> bool:
        """True when step record ``st`` may close by its window: every input partition was read to its end
        at or after the window's end (so a host without data really sent none: its agent stopped, not the
        worker that reads it), or the step has been held ``hold_max_ns`` (an input that never catches up
        must not keep steps open for ever). Always true without ``input_partitions`` (one process)."""
        if self.input_read_since(st["opened_ns"] + self.window_ns):
            return True
        return self.clock() - st["opened_ns"] >= self.hold_max_ns

    def input_read_since(self, ns: int) -> bool:
        """True when every input partition was reported read to its end at or after ``ns`` (clock() ns);
        always true without ``input_partitions``."""
        return all(self.read_ns.get(ip, 0) >= ns for ip in range(self.input_partitions))

    def forget(self) -> None:
        """Drop the derived in-memory state; call after the tables were recovered (restart, rebalance)."""
        self.ended.clear()
        self._digests.clear()
        self._where = None

    def _ended(self, sk: str, st: dict, p: int) -> int:
        """Hosts of open step ``sk`` that reported STEP_END: from memory, or counted once from ``parts``."""
        n = self.ended.get(sk)
        if n is None:
            js = self._job(f"{st['job']}@{p}")
            names = set(self.expected_hosts(st["job"], p, js)).union(st["extra"])
            entries, _keys = self.step_parts(sk)
            n = 0
            for h in names:
                e = entries.get(h)
                if e is not None and self.host_done(st["job"], h, e.acc):
                    n += 1
            self.ended[sk] = n
        return n

    # ------------------------------------------------------------------------------------------------
    def _index(self) -> dict[str, dict[str, str]]:
        """``open step -> host -> parts key``, rebuilt from the ``parts`` keys when forgotten."""
        if self._where is None:
            found = []
            self._legacy = set()
            for k, rec in self.parts.items():
                sk, _, tail = k.rpartition("|")
                if not isinstance(rec, dict):
                    continue
                if tail[:1] == "r" and tail[1:].isdigit():
                    found.append((sk, int(tail[1:]), k, list(rec)))
                elif "acc" in rec:  # a per-host record of the older layout
                    found.append((sk, -1, k, [tail]))
                    self._legacy.add(k)
            where: dict[str, dict[str, str]] = {}
            self._recs, self._next = {}, {}
            for sk, n, k, hosts in sorted(found, key=lambda x: (x[0], x[1])):
                self._recs.setdefault(sk, []).append(k)
                self._next[sk] = max(self._next.get(sk, 0), n + 1)
                w = where.setdefault(sk, {})
                for h in hosts:
                    w[h] = k
            self._where = where
        return self._where

    def _entry(self, sk: str, host: str) -> PartEntry | None:
        """``host``'s latest part entry in open step ``sk``, or None."""
        pend = self._pending.get(sk)
        if pend is not None and host in pend:
            return pend[host]
        k = self._index().get(sk, {}).get(host)
        if k is None:
            return None
        rec = self.parts.get(k)
        if rec is None:
            return None
        e = rec if k in self._legacy else rec.get(host)
        return None if e is None else as_entry(e)

    def step_parts(self, sk: str) -> tuple[dict[str, PartEntry], list[str]]:
        """``({host: latest part entry}, [parts keys of the step])`` of open step ``sk``: one read per
        record."""
        where = self._index().get(sk, {})
        keys = list(self._recs.get(sk, ()))
        recs = {k: self.parts.get(k) for k in keys}
        entries: dict[str, PartEntry] = {}
        for h, k in where.items():
            rec = recs.get(k)
            if rec is not None:
                e = rec if k in self._legacy else rec.get(h)
                if e is not None:
                    entries[h] = e if type(e) is PartEntry else as_entry(e)  # recovered: array or dict form
        entries.update(self._pending.get(sk, {}))
        return entries, [k for k in keys if recs[k] is not None]

    def _drop_parts(self, sk: str) -> None:
        """Delete every ``parts`` record of step ``sk`` and forget its index."""
        self._index()
        for k in self._recs.pop(sk, ()):
            if self.parts.get(k) is not None:
                del self.parts[k]
            self._legacy.discard(k)
        self._pending.pop(sk, None)
        if self._where is not None:
            self._where.pop(sk, None)
        self._next.pop(sk, None)

    def _write_pending(self) -> None:
        """Write the entries changed in this unit: per open step, records of at most ``PART_RECORD_MAX``
        hosts and about ``PART_RECORD_BYTES`` (:func:`_chunks`) under the step's next record numbers."""
        if not self._pending:
            return
        where = self._index()
        for sk, hosts in self._pending.items():
            if self.steps.get(sk) is None:  # closed in this unit
                continue
            w = where.setdefault(sk, {})
            recs = self._recs.setdefault(sk, [])
            for chunk in _chunks(hosts):
                n = self._next.get(sk, 0)
                self._next[sk] = n + 1
                k = f"{sk}|r{n}"
                self.parts[k] = chunk
                recs.append(k)
                for h in chunk:
                    w[h] = k
        self._pending.clear()

    # ------------------------------------------------------------------------------------------------
    def apply(self, v: dict, p: int) -> list[Emit]:
        """Apply one internal message of partition ``p`` (a unit of its own, :meth:`apply_round`, unless
        inside one). Unknown message types are ignored."""
        if not self._unit:
            return self.apply_round([v], p)
        if type(v) is PartMsg:
            return self.part(v, p)
        t = v.get("t")
        if t == "part":
            return self.part(as_part(v), p)
        if t == "batch":
            return self.apply_batch(v["msgs"], p)
        if t == "host":
            out = self.host(v, p)
            if v.get("rank") is not None:  # a (re)registered rank: its host's old states are over
                self.rank_state.get(v["job"], {}).pop(v["host"], None)
            return out
        elif t == "state":
            self.state(v)
        elif t == "drop":
            self.drop_job(v["job"], p)
        elif t == "hist":
            self.hist(v, p)
        elif t == "read":
            for ip, ns in v["read"]:
                if ns > self.read_ns.get(ip, 0):
                    self.read_ns[ip] = ns
            if v.get("new"):  # a worker read new input (streams.app.ReadReports): reports stay frequent
                self.read_new_at = time.monotonic()
        elif t == "close":
            st = self.steps.get(v["key"])
            if st is not None and v["key"] in self.hung and self.clock() - st["opened_ns"] < self.th.hang_hold_ns:
                return []  # a hung step stays open while it hangs (``hangs`` sends its interim records)
            if st is not None and self.clock() - st["opened_ns"] >= self.window_ns and not self.input_read_past(st):
                if v["key"] not in self._held:
                    self._held.add(v["key"])
                    late = sorted(
                        ip
                        for ip in range(self.input_partitions)
                        if self.read_ns.get(ip, 0) < st["opened_ns"] + self.window_ns
                    )
                    log.info(
                        "holding %s past its window: input partitions %s not read that far yet "
                        "(a worker failover or a backlog)",
                        v["key"],
                        late,
                    )
                return []
            if st is not None and self.clock() - st["opened_ns"] >= self.window_ns:
                self._held.discard(v["key"])
                log.info("closing %s by window (%d hosts ended)", v["key"], self._ended(v["key"], st, p))
                return self.close(v["key"], st, p, "window")
        return []

    def apply_batch(self, msgs: list[bytes], p: int) -> list[Emit]:
        """Apply the internal messages ``msgs`` (each msgpack bytes of one message, in order) of partition
        ``p`` as one unit (:meth:`apply_round`), or as part of the unit being applied. Consecutive parts
        are applied together (:meth:`parts_run`). A message that fails (a bug) is logged and skipped, like
        a single message would be; the others still apply."""
        if not self._unit:
            return self.apply_round([{"t": "batch", "msgs": msgs}], p)
        out: list[Emit] = []
        run: list[tuple[Any, PartMsg]] = []
        for raw in msgs:
            try:
                v = decode_internal(raw)
                if type(v) is PartMsg:
                    run.append((raw, v))
                    continue
                if run:
                    self.parts_run(run, p, out, self.on_error)
                    run = []
                out.extend(self.apply(v, p))
            # Broad on purpose: a message that is not msgpack (msgspec.DecodeError), a part in a form
            # as_part cannot read (ValidationError, KeyError, TypeError) or a bug in the analysis must not
            # stop the partition. Each is counted (obshub_streams_processing_errors_total{stage="fold"})
            # and its bytes dead-lettered by the worker through on_error (streams.app); the others apply.
            except Exception as exc:
                if run:  # the parts before it first, in order
                    self.parts_run(run, p, out, self.on_error)
                    run = []
                log.error("fold failed on one message of a batch of partition %d", p, exc_info=exc)
                self.on_error(raw, exc)
        if run:
            self.parts_run(run, p, out, self.on_error)
        return out

    def apply_round(self, values: list[dict], p: int) -> list[Emit]:
        """Apply the internal messages ``values`` (decoded dicts, in partition order; ``batch`` messages
        are expanded) of partition ``p`` as one unit: every table write goes through a :class:`WriteBack`
        and reaches the table once per key at the end; the part entries that changed are written as the
        step's next ``parts`` record(s), so a step that opens and closes within the unit writes no
        ``parts`` or ``steps`` record, only its ``closed`` record, and the ``jobs`` record is written once
        however many history entries arrived. The caller makes a message of partition ``p`` Faust's
        current event first (every write goes to that changelog partition). A message that fails (a bug)
        is logged and skipped; the others still apply. Returns what the messages emit, in order."""
        if self._unit:
            out: list[Emit] = []
            for v in values:
                out.extend(self.apply(v, p))
            return out
        real = (self.parts, self.steps, self.members, self.jobs, self.closed)
        caches = tuple(WriteBack(t) for t in real)
        self.parts, self.steps, self.members, self.jobs, self.closed = caches
        self._unit = True
        out = []
        try:
            for v in values:
                try:
                    out.extend(self.apply(v, p))
                # Broad on purpose, as in apply_batch: one bad message or a bug must not stop the
                # partition; counted (processing_errors{stage="fold"}) and dead-lettered via on_error.
                except Exception as exc:
                    log.exception("fold failed on one message of partition %d", p)
                    self.on_error(v, exc)
        finally:
            try:
                self._write_pending()
            finally:
                self._unit = False
                self.parts, self.steps, self.members, self.jobs, self.closed = real
                for c in caches:
                    c.flush()
        if self.running_due:
            out.extend(("running", s["job"], s) for _sk, s in self.running_arrived())
        return out

    def running_arrived(self) -> list[tuple[str, dict]]:
        """The running check (:meth:`running`) of the open steps that got parts since their last such
        check (``running_due``) and have run at least ``running_min_ns``, at most once per step per
        ``RUNNING_ARRIVAL_EVERY_NS`` (a step checked more recently stays due), while every input partition
        was read to its end within ``RUNNING_READ_WITHIN_NS`` (as the worker's timer). Returns what
        :meth:`running` returns for them; :meth:`apply_round` emits each as ``("running", job, summary)``
        (docs/ANALYSIS.md "Inside a running step")."""
        now = self.clock()
        if not self.input_read_since(now - RUNNING_READ_WITHIN_NS):
            self.running_due.clear()
            return []
        only = set()
        for sk in list(self.running_due):
            st = self.steps.get(sk)
            if st is None:
                self.running_due.discard(sk)
            elif now - st["opened_ns"] >= self.th.running_min_ns:
                if now - self.running_at.get(sk, -RUNNING_ARRIVAL_EVERY_NS) >= RUNNING_ARRIVAL_EVERY_NS:
                    only.add(sk)
            else:
                self.running_due.discard(sk)  # young: the timer checks it once it has run long enough
        if not only:
            return []
        self.running_due -= only
        for sk in only:
            if len(self.running_at) >= RUNNING_NAMED_MAX and sk not in self.running_at:
                self.running_at.pop(next(iter(self.running_at)))  # bounded: oldest step first
            self.running_at[sk] = now
        return self.running(only=only)

    def open_steps(self) -> Iterator[tuple[str, dict]]:
        """``(job|step, step record)`` of every open step held by this process (all its partitions)."""
        return iter(list(self.steps.items()))

    # ------------------------------------------------------------------------------------------------
    def _job(self, jk: str) -> dict:
        js = self.jobs.get(jk)
        return js if js is not None else _new_job()

    def _put_job(self, jk: str, js: dict) -> None:
        """Write the ``jobs`` record ``js`` of ``jk`` (``job@p``), stamped ``seen_ns`` = clock() (the job's
        last activity in this partition, for retention)."""
        js["seen_ns"] = self.clock()
        self.jobs[jk] = js

    # -- retention (docs/STREAMS.md "Retention") ---------------------------------------------------------
    def _job_idle_since(self, job: str, js: dict) -> int:
        """clock() ns of the last activity of ``job`` known here: its ``jobs`` record's ``seen_ns`` (this
        process's start for a record without one) or a message of the job in this process, the later."""
        return max(int(js.get("seen_ns") or self.started_ns), self.active_ns.get(job, 0))

    def _open_jobs(self) -> set[tuple[str, int]]:
        return {(st["job"], st["p"]) for _sk, st in self.open_steps()}

    def expired_jobs(self, partitions: set[int] | None = None, now: int | None = None) -> list[tuple[str, int]]:
        """``(job, partition)`` of every ``jobs`` record (of ``partitions``; all when None) whose job had no
        data for ``retention_ns`` (:meth:`_job_idle_since`), has no open step in that partition, and whose
        silence is real: every input partition was read to its end after the retention ran out (data of
        the job waiting in Kafka, after a worker outage, is no silence). Reads only: the caller sends a
        ``drop`` message into each partition (:meth:`drop_job` does the writes)."""
        now = self.clock() if now is None else now
        open_ = self._open_jobs()
        out = []
        for jk, js in list(self.jobs.items()):
            job, _, ps = jk.rpartition("@")
            if not job or not ps.isdigit() or not isinstance(js, dict):
                continue
            p = int(ps)
            if partitions is not None and p not in partitions:
                continue
            idle = self._job_idle_since(job, js)
            if (
                now - idle >= self.retention_ns
                and (job, p) not in open_
                and self.input_read_since(idle + self.retention_ns)
            ):
                out.append((job, p))
        return out

    def _drop_records(self, job: str, p: int, js: dict) -> None:
        """Delete the ``members`` buckets and ``closed`` records of ``job`` in partition ``p`` (its ``jobs``
        record ``js`` lists them); each ``del`` is a tombstone in the compacted changelog."""
        for b in js.get("buckets") or ():
            mk = f"{job}@{p}#{b}"
            if self.members.get(mk) is not None:
                del self.members[mk]
        rbuckets = js.get("rbuckets")
        for rb in rbuckets if rbuckets is not None else range(BUCKETS):  # an older record: every bucket
            rk = f"{job}@{p}#r{rb}"
            if self.members.get(rk) is not None:
                del self.members[rk]
        for step in js.get("closed") or ():
            ck = f"{job}|{step}"
            if self.closed.get(ck) is not None:
                del self.closed[ck]
            self._digests.pop(ck, None)

    def drop_job(self, job: str, p: int) -> bool:
        """Delete every table record of ``job`` in partition ``p`` (``jobs``, its ``members`` buckets, its
        ``closed`` records; each ``del`` is a tombstone in the compacted changelog) when it is still
        expired (no data for ``retention_ns``, no open step here); otherwise nothing. Returns whether it
        dropped. A part of the job arriving later opens a new step (no closed record, no floor remain)."""
        jk = f"{job}@{p}"
        js = self.jobs.get(jk)
        if js is None:
            return False
        idle = self._job_idle_since(job, js)
        if (
            self.clock() - idle < self.retention_ns
            or (job, p) in self._open_jobs()
            or not self.input_read_since(idle + self.retention_ns)
        ):
            return False
        self._drop_records(job, p, js)
        del self.jobs[jk]
        log.info("dropped the state of job %s in partition %d (no data for %.0f s)", job, p, self.retention_ns / 1e9)
        return True

    def forget_jobs(self, now: int | None = None) -> list[str]:
        """Drop the in-memory per-job state (last data per host, highest step, network windows, hang
        quieting, process states) of every job without a message in this process for ``retention_ns`` and
        without an open step here. No table write: safe from a timer. Returns the jobs forgotten."""
        now = self.clock() if now is None else now
        open_ = {job for job, _p in self._open_jobs()}
        jobs = set(self.active_ns).union(
            self.last_seen,
            self.top_step,
            self.quiet_until,
            self.net_directed,
            self.net_recent,
            self.rank_state,
            self.host_ranks,
        )
        jobs |= set(self.culprit_recent) | set(self.sched_recent) | set(self.ambiguous_held) | set(self.memory_state)
        for j in jobs.difference(self.active_ns):  # state without a message here yet (a restart): from now
            self.active_ns[j] = now
        gone = [j for j in jobs if now - self.active_ns[j] >= self.retention_ns and j not in open_]
        for j in gone:
            for m in (
                self.active_ns,
                self.last_seen,
                self.top_step,
                self.quiet_until,
                self.net_directed,
                self.net_recent,
                self.rank_state,
                self.culprit_recent,
                self.sched_recent,
                self.ambiguous_held,
                self.memory_state,
                self.host_ranks,
                self.life_of,
            ):
                m.pop(j, None)
        return gone

    def registered(self, job: str, p: int, host: str) -> bool:
        """True when ``host`` registered for ``job`` in partition ``p``."""
        b = self.members.get(f"{job}@{p}#{bucket_of(host)}")
        return b is not None and host in b

    def expected_hosts(self, job: str, p: int, js: dict) -> list[str]:
        """The registered hosts of ``job`` (partition ``p``), sorted: one read per used bucket."""
        out: list[str] = []
        for b in js["buckets"]:
            out.extend(self.members.get(f"{job}@{p}#{b}") or ())
        return sorted(out)

    def state(self, v: dict) -> None:
        """A RANK_STATE message ``{job, host, pid, state, at_rt, signal}``: remember a stopped process as
        ``(state, clock() ns received, at_rt, signal)`` (``signal``: what ended an exited one, 0 when none
        or unknown), forget one that runs again."""
        self.active_ns[v["job"]] = self.clock()
        pids = self.rank_state.setdefault(v["job"], {}).setdefault(v["host"], {})
        if v["state"] == "running":
            pids.pop(int(v["pid"]), None)
        else:
            sig = v.get("signal")
            sig = sig if isinstance(sig, int) and not isinstance(sig, bool) else 0
            pids[int(v["pid"])] = (str(v["state"]), self.clock(), int(v.get("at_rt") or 0), sig)
        if not pids:
            self.rank_state[v["job"]].pop(v["host"], None)

    def stopped_hosts(self, job: str) -> dict[str, tuple[str, int, int]]:
        """``host -> (state, clock() ns received, CLOCK_REALTIME ns of the state)`` for the hosts of ``job``
        with a process their agent found frozen, stopped or exited (the earliest such state of the host)."""
        return {h: min(pids.values(), key=lambda x: x[2]) for h, pids in self.rank_state.get(job, {}).items() if pids}

    def host(self, v: dict, p: int) -> list[Emit]:
        """A registration ``{job, host, host_id, rank, world_size, pid}``: one bucket write when it is news.
        A rank registered again by another process starts a new life of the job (:meth:`_new_life`): the
        summaries of the steps it interrupted are returned."""
        job, host = v["job"], v["host"]
        jk = f"{job}@{p}"
        self.active_ns[job] = self.clock()
        js, emits = self._new_life(v, p, self._job(jk))
        changed = bool(emits)
        b = bucket_of(host)
        mk = f"{job}@{p}#{b}"
        bucket = self.members.get(mk) or {}
        if host not in bucket:
            bucket[host] = v["host_id"]
            self.members[mk] = bucket
            js["n_hosts"] += 1
            if b not in js["buckets"]:
                js["buckets"] = sorted(js["buckets"] + [b])
            changed = True
        rank = v.get("rank")
        if rank is not None and v.get("pid") is not None:
            pids = self.host_ranks.setdefault(job, {}).setdefault(host, {})
            for pid, (r, _lr) in list(pids.items()):
                if r == int(rank):  # the rank restarted under a new pid
                    del pids[pid]
            pids[int(v["pid"])] = (int(rank), int(v.get("local_rank") or 0))
        if rank is not None:
            rk = f"{job}@{p}#r{int(rank) % BUCKETS}"
            ranks = self.members.get(rk) or {}
            # the rank's host and, once known, its pid (this life's process: _new_life compares it)
            who = [host, int(v["pid"])] if v.get("pid") is not None else host
            had = ranks.get(str(rank))
            if had is None:
                js["n_ranks"] += 1
                rb = int(rank) % BUCKETS
                if rb not in js.setdefault("rbuckets", []):
                    js["rbuckets"] = sorted(js["rbuckets"] + [rb])
                changed = True
            if had is None or (had != who and isinstance(who, list)):
                ranks[str(rank)] = who
                self.members[rk] = ranks
        world = v.get("world_size") or 0
        if world > js["world_size"]:
            js["world_size"] = world
            changed = True
        if changed:
            self._put_job(jk, js)
        return emits

    # -- job lives (docs/STREAMS.md "Restarts, resumes and world-size changes") ---------------------------
    def _new_life(self, v: dict, p: int, js: dict) -> tuple[dict, list[Emit]]:
        """Whether registration ``v`` starts a new life of its job in partition ``p`` (``js``: the job's
        ``jobs`` record): rank ``v["rank"]`` was registered by another process (``js["pids"]``: rank ->
        ``[host, pid]`` of this life). A torchrun restart, a run resumed under the same job name and an
        elastic world-size change all start their ranks again, so the first rank registered again ends the
        life: the job's open steps in ``p`` are closed (``closed_by = "restart"``, with what arrived), its
        members and closed records are dropped (tombstones; the new life numbers its steps again and
        registers its own hosts and world size) and a new record starts with ``life`` + 1. The other ranks
        of the new life then register into it. Returns the (new) record and the summaries to send."""
        rank, pid = v.get("rank"), v.get("pid")
        old = self._rank_pid(v["job"], p, js, rank) if rank is not None and pid is not None else None
        if old is None or old == [v["host"], int(pid)]:
            return js, []
        job = v["job"]
        jk = f"{job}@{p}"
        emits: list[Emit] = []
        for sk, st in list(self.open_steps()):
            if st["job"] == job and st["p"] == p:
                emits += self.close(sk, st, p, "restart")
        js = self._job(jk)
        self._drop_records(job, p, js)
        life = int(js.get("life") or 0) + 1
        new = _new_job()
        new.update(life=life, life_ns=self.clock())
        if life > self.life_of.get(job, 0):  # the job's derived state, once per life (every partition sees it)
            self.life_of[job] = life
            for m in (self.top_step, self.quiet_until, self.net_directed, self.net_recent, self.last_seen):
                m.pop(job, None)
            self.rank_state.pop(job, None)
            log.info(
                "job %s restarted (life %d): rank %s registered again by pid %s on %s (was pid %s on %s)",
                job,
                life,
                rank,
                pid,
                v["host"],
                old[1],
                old[0],
            )
        return new, emits

    def _rank_pid(self, job: str, p: int, js: dict, rank: int) -> list | None:
        """``[host, pid]`` of the process that registered ``rank`` of ``job`` in this life, None when unknown:
        from the rank's ``members`` bucket (``job@p#r<b>``: rank -> ``[host, pid]``, or the host alone when
        it registered without a pid), else from ``js["pids"]`` (rank -> ``[host, pid]``), where an older
        worker kept every rank's in the ``jobs`` record: rewritten with each step's history, it grew to
        262 KB at 2,048 hosts x 8 ranks (docs/STREAMS.md "State")."""
        who = (self.members.get(f"{job}@{p}#r{int(rank) % BUCKETS}") or {}).get(str(rank))
        if isinstance(who, list):
            return who
        old = (js.get("pids") or {}).get(str(rank))
        return list(old) if old is not None else None

    def _gone(self, job: str, sk: str) -> set[str]:
        """Hosts of ``job`` whose every registered process exited (RANK_STATE) and that sent nothing for
        open step ``sk``: their ranks finished before this step (a rank that ends earlier than its peers),
        so the step neither waits for them nor lists them missing. A rank that crashed before the step
        while its peers need it leaves them waiting in a collective: that is a hang (``hangs``)."""
        out = set()
        for h, s in self.stopped_hosts(job).items():
            if s[0] == "exited" and self._entry(sk, h) is None:
                out.add(h)
        return out

    def hist(self, v: dict, p: int) -> None:
        """A closed step's time ``{job, step, ns, entry}`` for the baseline history of every partition
        (``entry``: ``analysis.history_entry``, with the step's lateness; absent from older workers)."""
        jk = f"{v['job']}@{p}"
        self.active_ns[v["job"]] = self.clock()
        js = self._job(jk)
        hist = [h for h in js["history"] if h[0] != v["step"]] + [v.get("entry") or [v["step"], v["ns"]]]
        js["history"] = sorted(hist)[-self.th.baseline_n * 2 :]
        self._put_job(jk, js)

    # ------------------------------------------------------------------------------------------------
    def _is_replay(self, sk: str, done: dict, bid: str) -> bool:
        digests = self._digests.get(sk)
        if digests is None:
            blob = digest_blob(done["bids"])
            digests = {blob[i : i + 8] for i in range(0, len(blob), 8)}
            if len(self._digests) > 64:
                self._digests.clear()
            self._digests[sk] = digests
        return bid_digest(bid) in digests

    def _late(self, v: PartMsg, p: int, sk: str, done: dict | None) -> None:
        n = v.acc.events
        if done is not None:
            done["late"] += n
            done["bids"] = digest_blob(done["bids"]) + bid_digest(v.bid)
            self._digests.pop(sk, None)
            self.closed[sk] = done
        jk = f"{v.job}@{p}"
        js = self._job(jk)
        js["pending"]["late_events"] += n
        for k, x in v.q.items():
            js["pending"][k] = js["pending"].get(k, 0) + x
        self._put_job(jk, js)
        self.on_late(n)

    def part(self, v: PartMsg, p: int) -> list[Emit]:
        """One host's accumulator for one step (``accumulate.PartMsg``): one write to ``parts``, a write to
        ``steps`` when the step opens or this host ends it; closes the step when complete. Raises what the
        fold raises on it (a bug); :meth:`parts_run` applies several."""
        out: list[Emit] = []
        self.parts_run([(v, v)], p, out, None)
        return out

    def parts_run(
        self,
        items: list[tuple[Any, PartMsg]],
        p: int,
        out: list[Emit],
        on_error: Callable[[Any, BaseException], None] | None,
    ) -> None:
        """Apply the parts ``items`` (``(what on_error gets, part)``, in partition order) of partition ``p``
        one after the other, exactly as :meth:`part` one at a time would, appending what they emit to
        ``out``; what a run of parts of one step shares is looked up once (issue #30 item 4: at 2,048 x 8 a
        round holds ~512 parts of one step): the step's ``closed`` and ``steps`` records, its job's record,
        registrations and ranks, its entries and the count of hosts that ended it. A close, a late part
        or a failure starts the lookups again. ``on_error``: called with a failing item's first element
        and the exception, the others still apply; None: the exception propagates."""
        key: tuple[str, int] | None = None  # (job, step) the cached lookups below belong to
        last_seen, top_step, active_ns = self.last_seen, self.top_step, self.active_ns
        for what, v in items:
            try:
                job, step, host, bid = v.job, v.step, v.host, v.bid
                now = active_ns[job] = self.clock()
                seen = last_seen.get(job)
                if seen is None:
                    seen = last_seen[job] = {}
                seen[host] = now
                if step > top_step.get(job, -1):
                    top_step[job] = step
                if key is None or key[0] != job or key[1] != step:
                    key = None  # set again once this step's lookups are made
                    sk = f"{job}|{step}"
                    done = self.closed.get(sk)
                    st = self.steps.get(sk) if done is None else None
                    js = ranks = buckets = pend = where = None
                    ended = need = 0
                if done is not None:
                    if not self._is_replay(sk, done, bid):
                        key = None
                        self._late(v, p, sk, done)
                    continue
                if st is not None and key is None:  # the open step's lookups, once per run of its parts
                    self.running_due.add(sk)
                    js = self._job(f"{job}@{p}")
                    ranks = self.host_ranks.get(job, {})
                    buckets = {}
                    pend = self._pending.get(sk)
                    where = self._index().get(sk) or {}
                    ended = self._ended(sk, st, p)  # before this run changes anything: a recount must not see it
                    need = js["n_hosts"] + sum(1 for h in st["extra"] if not self.registered(job, p, h))
                    key = (job, step)
                entry = None
                if st is not None and ((pend is not None and host in pend) or host in where):
                    entry = self._entry(sk, host)
                    if entry is not None and bid in entry.bids:
                        continue  # replay of a batch already folded in
                st_dirty = False
                if st is None:
                    js = self._job(f"{job}@{p}")
                    if step <= js["floor"]:
                        self._late(v, p, sk, None)  # older than every closed record kept here
                        continue
                    st = {"job": job, "step": step, "p": p, "opened_ns": self.clock(), "extra": []}
                    self._drop_parts(sk)  # nothing of an earlier life of this step counts
                    self.ended[sk] = ended = 0
                    ranks, buckets, pend, where = self.host_ranks.get(job, {}), {}, None, {}
                    need = js["n_hosts"]
                    st_dirty = True
                    key = (job, step)
                vq = v.q  # the quality counters: usually every one 0 (one C pass to see it)
                q = {k: x for k, x in vq.items() if x} if vq and any(vq.values()) else {}
                acc = v.acc
                if entry is None:
                    entry = PartEntry(acc=acc, bids=[bid], q=q)
                    was_ended = False
                    b = bucket_of(host)
                    members = buckets.get(b, _UNSET)
                    if members is _UNSET:
                        members = buckets[b] = self.members.get(f"{job}@{p}#{b}")
                    if members is None or host not in members:  # not registered
                        st["extra"].append(host)
                        need += 1
                        st_dirty = True
                else:
                    was_ended = self.host_done(job, host, entry.acc)
                    accumulate.merge(entry.acc, acc)
                    entry.bids.append(bid)
                    for k, x in q.items():
                        entry.q[k] = entry.q.get(k, 0) + x
                    acc = entry.acc
                if pend is None:
                    pend = self._pending[sk] = {}
                pend[host] = entry
                if st_dirty:
                    self.steps[sk] = st
                # host_done (inline): a STEP_END of each of its ranks registered here, or its first one
                if was_ended or acc.step_ns is None:
                    continue
                n = len(ranks.get(host, ()))
                if n >= 2 and accumulate.ranks_ended(acc) < n:
                    continue
                ended += 1
                self.ended[sk] = ended
                if js["n_ranks"] < js["world_size"]:
                    continue
                if ended >= need or (job in self.rank_state and self._complete(st, ended, js, p)):
                    key = None
                    out.extend(self.close(sk, st, p, "complete"))
            except Exception as exc:
                key = None
                if on_error is None:
                    raise
                log.error("fold failed on one message of a batch of partition %d", p, exc_info=exc)
                on_error(what, exc)

    def host_done(self, job: str, host: str, acc: HostAcc) -> bool:
        """Whether ``host`` is done with the step of accumulator ``acc``: a STEP_END of each of its ranks
        registered here (rank rows, ``accumulate``), or its first STEP_END when its ranks are unknown (one
        rank per host, or a restarted worker)."""
        if acc.step_ns is None:
            return False
        n = len(self.host_ranks.get(job, {}).get(host, ()))
        if n < 2:
            return True
        return accumulate.ranks_ended(acc) >= n

    def _registered_pids(self, job: str, p: int, js: dict, hosts: set[str]) -> dict[str, dict[int, tuple[int, int]]]:
        """``host -> pid -> (global rank, local rank)`` of ``job``'s processes registered in this life:
        :meth:`rank_of` (in memory), completed for the ``hosts`` it does not know from the rank buckets
        of ``members`` (``job@p#r<b>``: rank -> ``[host, pid]``, kept in the changelog; local rank 0 there),
        so a restarted worker still tells a job whose every rank exited."""
        pids = self.rank_of(job)
        if all(pids.get(h) for h in hosts):
            return pids
        out = {h: dict(v) for h, v in pids.items()}
        for b in js.get("rbuckets") or ():
            for rank, who in (self.members.get(f"{job}@{p}#r{b}") or {}).items():
                if isinstance(who, list) and who[0] in hosts and not pids.get(who[0]):
                    out.setdefault(who[0], {})[int(who[1])] = (int(rank), 0)
        return out

    def rank_of(self, job: str) -> dict[str, dict[int, tuple[int, int]]]:
        """``host -> pid -> (global rank, local rank)`` of the processes of ``job`` registered here."""
        return self.host_ranks.get(job, {})

    def _complete(self, st: dict, ended: int, js: dict, p: int) -> bool:
        # every rank of the job must have registered (hosts in other input partitions may lag), and every
        # known host (registered, or sending data unregistered) must have reported STEP_END
        if js["n_ranks"] < js["world_size"]:
            return False
        need = js["n_hosts"] + sum(1 for h in st["extra"] if not self.registered(st["job"], p, h))
        if ended < need and st["job"] in self.rank_state:  # ranks that finished before this step
            need -= len(self._gone(st["job"], f"{st['job']}|{st['step']}"))
        return ended >= need

    def close(self, sk: str, st: dict, p: int, closed_by: str) -> list[Emit]:
        """Summarise the open step ``sk`` from its hosts' parts, drop them, record the step as closed."""
        job, step = st["job"], st["step"]
        jk = f"{job}@{p}"
        js = self._job(jk)
        expected = self.expected_hosts(job, p, js)
        gone = self._gone(job, sk) if job in self.rank_state else set()
        expected = [h for h in expected if h not in gone]
        names = sorted(set(expected).union(st["extra"]))
        accs: dict[str, HostAcc] = {}
        quality = dict(js["pending"])
        digests = []
        entries, _keys = self.step_parts(sk)
        for h in names:
            entry = entries.get(h)
            if entry is None:
                continue
            accs[h] = entry.acc
            digests.extend(map(bid_digest, entry.bids))
            if entry.q:
                for k, x in entry.q.items():
                    quality[k] = quality.get(k, 0) + x
        self._drop_parts(sk)
        summary = analysis.summarize(
            job,
            step,
            accs,
            expected_hosts=expected,
            history=js["history"],
            quality=quality,
            closed_by=closed_by,
            closed_at_ns=self.clock(),
            th=self.th,
            world_size=js["world_size"],
            recent_directed=self.recent_directed(job, step),
            window=self.net_window(job),
            life=int(js.get("life") or 0),
        )
        if summary["net_directed"]:
            self.net_directed[job] = max(self.net_directed.get(job, step), step)
        recent = self.net_recent.get(job)
        if recent is None:
            recent = self.net_recent[job] = collections.deque(maxlen=max(1, self.th.net_window_steps))
        recent.append(analysis.net_window_part(accs))
        if (
            sk in self.hung or sk in self.was_hung
        ):  # the ranks resynchronise after a hang: no layer's fault for a few steps
            self.quiet_until[job] = max(self.quiet_until.get(job, -1), step + self.th.hang_quiet_steps)
        if step <= self.quiet_until.get(job, -1):
            summary["evidence"]["hosts"] = {}
            summary["evidence"].pop("ranks", None)
            summary["evidence"].pop("net_view", None)
            summary["culprit"] = analysis.culprit_rank(analysis.culprit(summary), summary)
        recent_s = self.sched_recent.setdefault(job, collections.deque(maxlen=analysis.SELF_STEPS))
        recent_s.append(analysis.charge_starved(summary, recent_s))  # a burst against the host's own steps
        recent_c = self.culprit_recent.setdefault(job, collections.deque(maxlen=analysis.PERSIST_STEPS))
        summary["culprit"], key = analysis.charge_persistent(summary, recent_c)  # a persistent fault's victims
        recent_c.append(key)
        named = self.running_named.pop(sk, None)
        self.running_at.pop(sk, None)
        self.running_due.discard(sk)
        if named is not None and analysis.running_applies(summary, named):
            # the step ran with every busy connection of one host slow or lossy (its running record named
            # it), and closed with nothing to compare (a slowed link slows every rank alike), or with that
            # host's own lateness (a retransmission back-off its closed step kept no evidence of)
            summary["culprit"] = analysis.charge_running(named, summary["culprit"])
        hung_hosts = self.hang_hosts.pop(sk, None)
        if hung_hosts:  # a step that hung is charged to the rank that held it up (docs/ANALYSIS.md "Culprit")
            summary["culprit"] = analysis.hang_culprit(hung_hosts)
            if summary["culprit"] is not None:
                summary["culprit"]["rank"] = hung_hosts[0].get("rank")
        # a one-rank host's culprit names its rank, whichever path named the host (docs/RULES.md, rank label)
        summary["culprit"] = analysis.one_rank_culprit(summary["culprit"], accs)
        held = analysis.hold_ambiguous(summary, self.ambiguous_held.pop(job, None))  # hosts alike: a later step says
        if held is not None:
            self.ambiguous_held[job] = held
        # a memory stall over several steps that started after 16 steps without (an onset; docs/ANALYSIS.md)
        self.memory_state[job] = analysis.memory_episode(summary, self.memory_state.get(job))
        self.hung.pop(sk, None)
        self.was_hung.discard(sk)
        self._held.discard(sk)
        self.closed[sk] = {"p": p, "bids": b"".join(digests), "late": 0}
        del self.steps[sk]
        self.ended.pop(sk, None)
        js["pending"] = dict.fromkeys(QUALITY_KEYS, 0)
        js["closed"].append(step)
        while len(js["closed"]) > self.closed_keep:
            old = js["closed"].pop(0)
            ok = f"{job}|{old}"
            if self.closed.get(ok) is not None:
                del self.closed[ok]
                self._digests.pop(ok, None)
            js["floor"] = max(js["floor"], old)
        self._put_job(jk, js)
        self.on_summary(closed_by)
        return [
            ("summary", job, summary),
            (
                "broadcast",
                job,
                {
                    "t": "hist",
                    "job": job,
                    "step": step,
                    "ns": summary["step_time_max_ns"],
                    "entry": analysis.history_entry(summary),
                },
            ),
        ]

    # ------------------------------------------------------------------------------------------------
    def _open_accs(self, sk: str, st: dict, js: dict) -> tuple[list[str], dict[str, HostAcc]]:
        """``(expected hosts, {host: accumulator})`` of open step ``sk`` (its ``steps`` record ``st``, its
        job's state ``js``): the accumulators of the expected and extra hosts that sent a part."""
        expected = self.expected_hosts(st["job"], st["p"], js)
        entries, _keys = self.step_parts(sk)
        names = set(expected).union(st["extra"])  # the hosts in sorted order, as close reads them
        return expected, {h: entries[h].acc for h in sorted(entries) if h in names}

    def _still_in_step(self, job: str, accs: dict[str, HostAcc], found: dict) -> dict | None:
        """``analysis.running_check``'s ``found`` without the hosts done with the step (``host_done``), or
        None when none is left: a running step is held up by the ranks still in it, and a host whose every
        rank ended the step holds nobody up in it. A framework whose loop opens each step with a collective
        (PyTorch Lightning's broadcast from rank 0) splits a blackout across two steps by rank: the held
        ranks stay in the old step while the others, done with it, wait at the new step's first
        collective; the held ranks' retransmits toward a done host then name it (live, frame21: step 483
        still held node-00 and node-01 of an 800 ms blackout of node-01 when its running record named
        node-03, done with it in 148 ms, by 2 retransmits toward it; in 38 kept runs no running record
        that named the fault's host named a host done with the step, 77 of 77, while 3 wrong ones did)."""
        hosts = {h: v for h, v in found["hosts"].items() if h not in accs or not self.host_done(job, h, accs[h])}
        if not hosts:
            return None
        return {**found, "hosts": hosts}

    def recent_directed(self, job: str, step: int) -> bool:
        """Whether a step of ``job`` closed here within ``net_directed_keep_steps`` before ``step`` met the
        directed view's condition (``analysis.net_stats``): the job's traffic runs both ways on its
        connections, so its network evidence is read in the directed view."""
        last = self.net_directed.get(job)
        return last is not None and 0 <= step - last <= self.th.net_directed_keep_steps

    def net_window(self, job: str) -> dict[str, list[int]]:
        """The retransmits per connection of the job's last ``net_window_steps`` steps closed here
        (``analysis.net_window``): what a slowed step of the job reads with its own."""
        return analysis.net_window(self.net_recent.get(job, ()))

    def _interim_summary(
        self, st: dict, js: dict, accs: dict[str, dict], expected: list[str], closed_by: str, now: int
    ) -> dict:
        """The summary of an open step as far as it has come (``closed_by`` "hang" or "running", closed at
        ``now`` ns), before the caller narrows its straggler, blame and evidence."""
        return analysis.summarize(
            st["job"],
            st["step"],
            accs,
            expected_hosts=expected,
            history=js["history"],
            quality={},
            closed_by=closed_by,
            closed_at_ns=now,
            th=self.th,
            world_size=js["world_size"],
            recent_directed=self.recent_directed(st["job"], st["step"]),
            window=self.net_window(st["job"]),
            life=int(js.get("life") or 0),
        )

    def hangs(self, partitions: set[int] | None = None) -> list[tuple[str, dict, bool]]:
        """Check the open steps (of ``partitions``; all when None) for hangs. Returns ``(step key, interim
        summary, first)`` per hung step (``first``: newly hung); forgets steps that no longer hang. Reads
        only (no table write): safe from a timer. A step is checked only while it is its job's latest
        (no later step has data or closed here) and younger than ``hang_hold_ns``."""
        now = self.clock()
        out = []
        for sk, st in self.open_steps():
            p = st["p"]
            if partitions is not None and p not in partitions:
                continue
            job = st["job"]
            js = self._job(f"{job}@{p}")
            later = max(self.top_step.get(job, -1), max((h[0] for h in js["history"]), default=-1))
            if now - st["opened_ns"] > self.th.hang_hold_ns or later > st["step"]:
                self.hung.pop(sk, None)
                continue
            expected, accs = self._open_accs(sk, st, js)
            pids, states = self.rank_of(job), self.rank_state.get(job, {})
            # every rank of this life has exited (a crash and torchrun's stop of the others, a job killed):
            # the exit is named once (below: the earliest exit, state "exited"), then no more, as nothing
            # is left running to hang; the alert resolves instead of firing until a new life registers
            hosts = set(expected) | set(accs)
            registered = self._registered_pids(job, p, js, hosts)  # a restarted worker's too (changelog)
            gone = _all_exited(hosts, registered, states)
            if gone and sk in self.exit_named:
                self.hung.pop(sk, None)
                continue
            found = analysis.one_node_hang(
                accs,
                expected,
                self.last_seen.get(job, {}),
                st["opened_ns"],
                js["history"],
                st["step"],
                now,
                self.th,
                pids,
                states,
            )
            if found is None and len(set(expected) | set(accs)) > 1:
                found = analysis.hang_ranks(
                    analysis.hang_check(
                        analysis.host_view(accs, strict=True),  # a host has arrived when its ranks all have
                        expected,
                        self.last_seen.get(job, {}),
                        st["opened_ns"],
                        js["history"],
                        st["step"],
                        now,
                        self.th,
                        stopped=self.stopped_hosts(job),
                    ),
                    accs,
                    pids,
                    states,
                )
            # a hang whose named ranks and waiting ranks all exited before this worker started is an ended
            # job read afterwards: a worker that resumes its open step (changelog) and reads the exits the
            # one before it had not read (committed offsets) names nothing (a demo paged rank_hang for the
            # previous demo's job, stopped mid-step). A rank still waiting, or an exit seen live, is named.
            if found is not None and all(e["state"] == "exited" for e in found["hosts"]):
                who = {e["host"] for e in found["hosts"]} | set(found["waiting"])
                if _exited_before(who, registered, states, self.started_ns):
                    found = None
            # a job cancelled (scancel, kubectl delete: SIGTERM to every rank; Ctrl-C: SIGINT) is no hang: its
            # ranks end within a second of each other, the ones inside a collective last. A hang on exits
            # with a rank ended by a stop signal waits hang_cancel_wait_ns from that exit; every rank of the
            # step's hosts then ended by a stop signal names nothing. A rank killed otherwise (SIGKILL, a
            # crash) or peers still running then: named as before.
            if found is not None and all(e["state"] == "exited" for e in found["hosts"]):
                stops = _stop_exits(hosts, states)
                if stops and (now - min(stops) < self.th.hang_cancel_wait_ns or _cancelled(hosts, registered, states)):
                    found = None
            if found is None:
                self.hung.pop(sk, None)
                continue
            if gone:
                self.exit_named.add(sk)
            first = sk not in self.hung
            self.hung.setdefault(sk, now)
            self.was_hung.add(sk)
            self.hang_hosts[sk] = found["hosts"]
            summary = self._interim_summary(st, js, accs, expected, "hang", now)
            summary.update(
                straggler=None,
                blame=[],
                hang=found,
                evidence={"spread_ns": summary["evidence"]["spread_ns"], "hosts": {}},
                culprit=None,
            )
            out.append((sk, summary, first))
        for sk in [k for k in self.hung if self.steps.get(k) is None]:
            del self.hung[sk]
        self.was_hung.intersection_update(k for k, _ in self.open_steps())
        self.exit_named.intersection_update(self.was_hung)
        for sk in [k for k in self.hang_hosts if k not in self.was_hung]:
            del self.hang_hosts[sk]
        return out

    def running(self, partitions: set[int] | None = None, only: set[str] | None = None) -> list[tuple[str, dict]]:
        """Check the open steps (of ``partitions``; all when None) that are their job's latest or at most
        ``RUNNING_BEHIND_STEPS`` (1) before it, and not hung, for network evidence while they run
        (``analysis.running_check``, docs/ANALYSIS.md "Inside a running step"); ``only``: those of these
        step keys alone (:meth:`running_arrived`). Returns ``(step key, interim summary)`` per step with evidence: ``closed_by =
        "running"``, ``evidence.hosts`` = the named hosts' network evidence only, ``blame`` = one network
        entry per named host (``straggler_ns`` its RTT, ``peer_median_ns`` the other hosts' median,
        ``count`` its retransmits), ``step_time_max_ns`` = how long the step has run so far (ns, the check's
        ``elapsed_ns``), ``stall_ratio`` = that over the baseline median, no straggler, quality counters 0.
        Reads only (no table write)."""
        now = self.clock()
        out = []
        steps: Iterable[tuple[str, dict | None]] = (
            self.open_steps() if only is None else [(sk, self.steps.get(sk)) for sk in sorted(only)]
        )
        for sk, st in steps:
            if st is None:
                continue
            p = st["p"]
            if (partitions is not None and p not in partitions) or sk in self.hung:
                continue
            job = st["job"]
            js = self._job(f"{job}@{p}")
            later = max(self.top_step.get(job, -1), max((h[0] for h in js["history"]), default=-1))
            if later - st["step"] > RUNNING_BEHIND_STEPS or st["step"] <= self.quiet_until.get(job, -1):
                continue
            expected, accs = self._open_accs(sk, st, js)
            found = analysis.running_check(
                accs,
                js["history"],
                st["step"],
                st["opened_ns"],
                now,
                self.th,
                stopped=self.stopped_hosts(job),
                recent_directed=self.recent_directed(job, st["step"]),
                window=self.net_window(job),
            )
            if found is not None:
                found = self._still_in_step(job, accs, found)
            if found is None:
                continue
            summary = self._interim_summary(st, js, accs, expected, "running", now)
            hosts = {}
            blame = []
            for h, v in found["hosts"].items():
                hosts[h] = dict.fromkeys(analysis.EVIDENCE_LAYERS, 0.0)
                hosts[h]["network"] = v["z"]
                blame.append(
                    {
                        "host": h,
                        "rank": None,  # a host's link: its ranks share it
                        "layer": "network",
                        "excess_ns": max(0, v["rtt_ns"] - v["peer_rtt_ns"]),
                        "straggler_ns": v["rtt_ns"],
                        "peer_median_ns": v["peer_rtt_ns"],
                        "count": v["rx"],
                        "max_ns": 0,
                    }
                )
            median = summary["baseline"]["median_ns"]
            summary.update(
                straggler=None,
                blame=blame,
                evidence={"spread_ns": found["spread_ns"], "hosts": hosts},
                quality=dict.fromkeys(summary["quality"], 0),
                # how long the open step has run so far, and that over the job's median step: a running
                # record's step time (the rule step_stall reads it, docs/ANALYSIS.md "Inside a running step")
                step_time_max_ns=found["elapsed_ns"],
                stall_ratio=round(found["elapsed_ns"] / median, 3) if median > 0 else 0.0,
            )
            views = {h: v["view"] for h, v in found["hosts"].items() if v.get("view")}
            if views:  # which view of its connections gave each named host's evidence
                summary["evidence"]["net_view"] = views
            summary["culprit"] = analysis.culprit_rank(analysis.culprit(summary), summary)
            c = summary["culprit"]
            if _weaker_than_named(c, self.running_named.get(sk)):
                continue  # the step's earlier record named a host on stronger evidence: no new name (below)
            if c is not None and c.get("layer") == "network":
                if len(self.running_named) >= RUNNING_NAMED_MAX and sk not in self.running_named:
                    self.running_named.pop(next(iter(self.running_named)))  # bounded: oldest step first
                self.running_named[sk] = c
            out.append((sk, summary))
        return out
