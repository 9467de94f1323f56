"""The worker's ``ingest`` agent logic: one agent batch -> sequence bookkeeping -> per-(step, host) parts.

:class:`Ingest` decodes a message with ``streams.wire.decode_batch`` (anything it rejects goes to the
dead-letter topic), tracks every agent instance's batch sequence in the ``agents`` table (partitioned like
the input topic, key ``agent_id``, value ``{seq, partition, offset, lost, dups, gaps, run, seen_ns, ranks}``:
a gap = lost batches, a sequence seen again = a duplicate, dropped; ``gaps`` = the most recent gaps as
``[first, last]`` seq ranges (at most :data:`GAP_RANGES`, within :data:`GAP_SPAN` of the newest seq): a batch
that arrives late and fills one (an agent's spool replayed behind newer batches after a broker failover:
obshub/producer/transport.py) is folded, not dropped, and counted ``late``; the last input offset
recognises a replay after a restart, which is none of these; ``run`` = ``[job, step]`` the step the agent's host was in after its
last batch, or None: ``accumulate.running_step``; ``seen_ns`` = CLOCK_REALTIME ns of its last batch, for
retention: the worker deletes the record ``job_retention_s`` after it; ``ranks`` = ``{pid: [global rank,
local rank, job]}`` of the host's registered processes of every job, from their REGISTER events:
``accumulate.rank_map``; a batch folds with its own job's, ``accumulate.job_ranks``),
reduces the batch to one accumulator per step
(``streams.accumulate``) and returns what the agent must send on the internal topic:

- ``("broadcast", job, {"t": "host", job, host, host_id, rank, world_size, pid, local_rank})`` for each
  REGISTER event and for the first batch of an agent instance (every partition must know the job's hosts;
  ``pid`` of the registered process tells a restarted rank from a repeated registration);
- ``("broadcast", job, {"t": "state", job, host, pid, state, at_rt})`` for each RANK_STATE event (a
  registered process found frozen, stopped, exited, or running again: the hang check reads it);
- ``("part", "job|step", accumulate.PartMsg)`` (a map ``{"t": "part", job, step, host, bid, acc, q}`` on
  the wire, ``acc`` a typed ``accumulate.HostAcc``) per step of the batch; ``bid`` =
  ``"<agent_id>:<seq>"`` makes the fold idempotent, ``q`` carries the lost/duplicate batch counts once;
  ``acc``'s rank rows are packed (``accumulate.pack_ranks``: a blob and a compact rank table), the
  per-host work of several ranks done here, where the work scales out by host.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, MutableMapping

from obshub.core import schema
from obshub.streams import accumulate, wire

log = logging.getLogger("obshub.streams")

GAP_RANGES = 16  # gaps (seq ranges) remembered per agent instance for late batches to fill
GAP_SPAN = 4096  # a gap older than this many batches behind the newest seq is forgotten


@dataclass
class IngestResult:
    """What one input message produced: ``error`` (send it to the DLQ) or the internal messages to send;
    ``events``/``lost``/``dup``/``late``/``replay`` for the metrics (``late``: a batch that filled an earlier
    gap), ``sent_ns`` the batch's send time (0 = none)."""

    error: schema.SchemaError | None = None
    sends: list[tuple[str, str, Any]] = field(default_factory=list)
    events: int = 0
    lost: int = 0
    dup: bool = False
    late: bool = False
    replay: bool = False
    sent_ns: int = 0


class Ingest:
    """Per-message ingest over the ``agents`` table (any mapping with ``get`` and item assignment)."""

    def __init__(self, agents: MutableMapping[str, Any]):
        self.agents = agents
        self._adopted: dict[str, int] = {}  # agent id -> when a record without ``seen_ns`` was first swept

    def expired_agents(self, retention_ns: int, partitions: Any = None, now: int | None = None) -> list[str]:
        """Agent ids whose sequence record (of input ``partitions``; all when None) had no batch for
        ``retention_ns`` (CLOCK_REALTIME ns; a record without ``seen_ns``, from an older worker, counts from
        the first sweep that saw it). Reads only: the caller deletes them (a tombstone each) with a record
        of that input partition as Faust's current event. An instance that sends again after its record
        was dropped is a new instance: its batches up to that ``seq`` count as lost once."""
        now = time.time_ns() if now is None else now
        out = []
        for aid, st in list(self.agents.items()):
            if not isinstance(st, dict) or (partitions is not None and st.get("partition") not in partitions):
                continue
            if now - int(st.get("seen_ns") or self._adopted.setdefault(aid, now)) >= retention_ns:
                out.append(aid)
                self._adopted.pop(aid, None)
        return out

    def handle(self, value: bytes, topic: str, partition: int, offset: int) -> IngestResult:
        """Process the message at ``topic[partition]@offset``. Never raises for bad input."""
        try:
            batch = wire.decode_batch(value)
        except schema.SchemaError as exc:
            return IngestResult(error=exc)
        st = self.agents.get(batch.agent_id)
        first = st is None
        if first:
            st = {"seq": -1, "partition": partition, "offset": -1, "lost": 0, "dups": 0}
            log.info(
                "new agent instance %s (job %s, host %s) on %s[%d]@%d",
                batch.agent_id,
                batch.job,
                batch.host,
                topic,
                partition,
                offset,
            )
        st["seen_ns"] = time.time_ns()  # the instance's last batch (retention, docs/STREAMS.md)
        replay = partition == st["partition"] and offset <= st["offset"]
        late = False
        if not replay and batch.seq <= st["seq"]:
            st["offset"], st["partition"] = offset, partition
            late = _fill_gap(st, batch.seq)
            if not late:
                st["dups"] += 1
                self.agents[batch.agent_id] = st
                return IngestResult(dup=True)
        if replay:
            log.info(
                "replay of %s seq %d (%s[%d]@%d, already processed before a restart)",
                batch.agent_id,
                batch.seq,
                topic,
                partition,
                offset,
            )
        lost = 0 if replay or late else batch.seq - st["seq"] - 1
        if lost:
            st["lost"] += lost
            _note_gap(st, st["seq"] + 1, batch.seq - 1)
        res = IngestResult(events=len(batch.events), lost=lost, late=late, replay=replay, sent_ns=batch.sent_ns)
        hosts = accumulate.registrations(batch)
        if first and not hosts:
            hosts = [{"job": batch.job, "host": batch.host, "host_id": batch.host_id}]
        # the host's registered ranks (pid -> [rank, local rank]), kept with the agent's record: every batch
        # after the REGISTER events folds each rank's events into its own rank row too
        # (of every job the agent serves: [rank, local rank, job]; a record of an older worker has no job)
        known = {
            int(k): (int(v[0]), int(v[1]), v[2] if len(v) > 2 else None) for k, v in (st.get("ranks") or {}).items()
        }
        every = accumulate.rank_map(batch, known) if any("pid" in h for h in hosts) else known
        if every != known and not replay:
            st["ranks"] = {str(k): list(v) for k, v in every.items()}
        ranks = accumulate.job_ranks(every, batch.job)
        for reg in hosts:
            res.sends.append(
                (
                    "broadcast",
                    reg["job"],
                    {
                        "t": "host",
                        "job": reg["job"],
                        "host": reg["host"],
                        "host_id": reg["host_id"],
                        "rank": reg.get("rank"),
                        "world_size": reg.get("world_size", 0),
                        "pid": reg.get("pid"),
                        "local_rank": ranks.get(reg.get("pid"), (None, None))[1],
                    },
                )
            )
        for rs in accumulate.rank_states(batch):
            res.sends.append(("broadcast", rs["job"], {"t": "state", **rs}))
        # the step the host was in after its previous batch, for TCP events of a batch without a stepped
        # event (a rank blocked in a long collective): a slow link shows while its step still runs
        run = st.get("run")
        run_step = run[1] if run and run[0] == batch.job and not late else None
        parts = accumulate.reduce_batch(batch, run_step, ranks)
        bid = f"{batch.agent_id}:{batch.seq}"
        for i, (step, acc) in enumerate(sorted(parts.items())):
            accumulate.pack_ranks(acc)  # the rank rows as a blob and a compact table (the close reads it)
            q = {}
            if i == 0 and not replay:
                q = {"lost_batches": st["lost"], "duplicate_batches": st["dups"]}
                st["lost"] = st["dups"] = 0
            res.sends.append(
                (
                    "part",
                    f"{batch.job}|{step}",
                    accumulate.PartMsg(job=batch.job, step=step, host=batch.host, bid=bid, acc=acc, q=q),
                )
            )
        if late:
            self.agents[batch.agent_id] = st
        elif not replay:
            st["seq"], st["offset"], st["partition"] = batch.seq, offset, partition
            nxt = accumulate.running_step(batch, run_step)
            st["run"] = [batch.job, nxt] if nxt is not None else None
            self.agents[batch.agent_id] = st
        return res


def _note_gap(st: dict, first: int, last: int) -> None:
    """Remember the missing seqs ``first..last`` (inclusive) in ``st["gaps"]``, keeping the newest
    :data:`GAP_RANGES` ranges within :data:`GAP_SPAN` of ``last``."""
    gaps = [g for g in st.get("gaps") or () if g[1] > last - GAP_SPAN]
    gaps.append([first, last])
    st["gaps"] = gaps[-GAP_RANGES:]


def _fill_gap(st: dict, seq: int) -> bool:
    """True when ``seq`` lies in a remembered gap of ``st`` (which then no longer holds it)."""
    gaps = st.get("gaps")
    if not gaps:
        return False
    for i, (lo, hi) in enumerate(gaps):
        if lo <= seq <= hi:
            rest = [r for r in ([lo, seq - 1], [seq + 1, hi]) if r[0] <= r[1]]
            gaps[i : i + 1] = rest
            if not gaps:
                del st["gaps"]
            return True
    return False
