"""Reduce one decoded batch to per-(step, host) partial accumulators, and merge partials.

The ingest agent does not forward events: it forwards one small accumulator per (job, step, host) per
batch. Accumulators are typed records (msgspec Structs, docs/ARCHITECTURE.md "Typed accumulators"): a
:class:`HostAcc` per host and step, a :class:`RankRow` per rank of it, its :class:`HostNet` and packed
:class:`RankTable`; each field's meaning and unit is in its class's docstring (``*_rt`` = CLOCK_REALTIME
ns, i.e. the event's monotonic ``ts_ns`` plus the batch's ``clock.offset_ns``; durations ns). They are
encoded as msgpack arrays (``array_like``: no field names on the wire, decoded in C into the records),
travel in a :class:`PartMsg` on the internal topic and live in the fold's ``parts`` table as
:class:`PartEntry` records, so ``merge`` works on both in-process and recovered values. The dict form
that workers before the typed records wrote (host accumulator ``{"host", "host_id", "events", "step_ns",
..., "net": {"addrs", "pairs"}, "ranks" | "rb" + "rt" | "rank"}``) is still read: :func:`as_acc`,
:func:`as_entry`, :func:`as_part`, and rank row blobs in :func:`rank_rows`; :func:`to_dict` writes it.

The ingest sends ``ranks`` packed (:func:`pack_ranks`): ``rb`` (the rows as one msgpack blob) and ``rt``
(the compact rank table the close reads, :func:`rank_table_of`); :func:`merge` and the readers
(:func:`rank_rows`, :func:`rank_table`, :func:`rank_count`, :func:`ranks_ended`) take both forms.

``ranks`` holds one **rank row** per registered training process of the host that had an event in the
step: the :class:`StepAcc` fields of a host accumulator (its own ``step_ns``, ``begin_rt``/``end_rt``,
``phases``, ``layers``, ``colls``), plus ``pid``, ``local_rank`` and ``gpu`` (the GPU index of its CUDA
events, -1 when none). An event belongs to the rank whose REGISTER
named its ``pid`` (the agent's process id of the rank, ``ranks`` argument of :func:`reduce_batch`);
events of other pids (softirq TCP events, a helper process) stay host-level only, and TCP events never
go into a rank row: a host's link is shared by its ranks (docs/ANALYSIS.md "Several ranks per host").
The host-level fields keep their meaning whatever the number of ranks (``step_ns`` the largest of its
ranks, a collective's arrival the earliest).

``net`` feeds the connection-based network blame (docs/ANALYSIS.md "Network blame by connection"); an
accumulator without it (written by an older worker) merges as empty. A retransmit is counted by its sender
(the TCP_RETRANSMIT's ``saddr``), so the last two values of a pair split ``retransmits`` by direction; a
pair of three values (an older worker's) merges into the first three only.

What counts as a layer's ``time_ns`` and ``count`` per kind is ``KIND_RULES`` below, derived from the kinds
table ``schema.KIND_INFO`` (its ``step`` rules) and documented
with reasons in docs/ANALYSIS.md ("Layer time per kind"). The ``pytorch`` layer's time is not summed
here: it is the host's compute time, derived at close (see ``analysis.compute_ns``).
"""

from __future__ import annotations

import bisect
import functools
import ipaddress
import struct
from typing import Any, Callable

import msgspec

from obshub.core import schema
from obshub.core.schema import Batch, Event, Kind, Layer

# kind -> (layer, time_ns(event), count(event), max candidate(event)); None = structural, handled apart
Rule = tuple[Layer, Callable[[Event], int], Callable[[Event], int], Callable[[Event], int]]


def _dur(e: Event) -> int:
    return e.duration_ns


def _zero(_e: Event) -> int:
    return 0


def _one(_e: Event) -> int:
    return 1


def _value_pos(e: Event) -> int:
    return max(0, e.value)


def _retrans(e: Event) -> int:
    return max(1, e.value)


def _preempted_offcpu(e: Event) -> int:
    # value = previous task state; 0 = TASK_RUNNING, i.e. preempted while runnable (involuntary wait).
    # Voluntary sleeps (blocked on a socket, a futex: waiting for a collective) are not the host's fault.
    return e.duration_ns if e.value == 0 else 0


def _mem_step_count(e: Event) -> int:
    # allocations + the short stalls summed with them: the count the single records would have given
    return max(0, e.value) + max(0, int((e.payload or {}).get("stalls", 0) or 0))


def _mem_step_max(e: Event) -> int:
    return max(0, int((e.payload or {}).get("stall_max_ns", 0) or 0))


def _cuda_step_max(e: Event) -> int:
    return max(0, int((e.payload or {}).get("max_ns", 0) or 0))


#: rule name (:data:`obshub.core.schema.STEP_RULES`) -> function of an event
_RULE_FNS: dict[str, Callable[[Event], int]] = {
    "zero": _zero,
    "one": _one,
    "duration": _dur,
    "value": _value_pos,
    "retransmits": _retrans,
    "preempted": _preempted_offcpu,
    "mem_step_count": _mem_step_count,
    "mem_step_max": _mem_step_max,
    "cuda_step_max": _cuda_step_max,
}

#: per kind: its layer and how it counts, derived from the kinds table ``schema.KIND_INFO``
KIND_RULES: dict[Kind, Rule] = {
    kind: (info.layer, _RULE_FNS[info.step[0]], _RULE_FNS[info.step[1]], _RULE_FNS[info.step[2]])
    for kind, info in schema.KIND_INFO.items()
    if info.step is not None
}

#: kinds handled apart (step and collective boundaries, registrations, agent loss)
STRUCTURAL = {kind for kind, info in schema.KIND_INFO.items() if info.step is None}


class _DictStyle(msgspec.Struct):
    """Dict-style access to a Struct's fields for tools and tests written against the dict form (the
    worker's code reads and writes attributes): ``rec["field"]``, ``rec.get("field", default)``
    (``default`` also for a field that is None), ``"field" in rec`` (set and not None), ``rec["field"] =
    v`` (a nested record may be given in its dict form), ``rec.update(...)``, ``rec.items()``."""

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, key)
        except AttributeError:
            cfg = self.__struct_config__
            if key == cfg.tag_field:  # a tagged record's tag, as its dict form holds it (``PartMsg["t"]``)
                return cfg.tag
            raise KeyError(key) from None

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self.__struct_fields__:
            raise KeyError(f"{type(self).__name__} has no field {key!r}")
        if isinstance(value, dict) and key in _NESTED:
            value = _NESTED[key](value)  # a nested record given in the dict form
        setattr(self, key, value)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and getattr(self, key, None) is not None

    def get(self, key: str, default: Any = None) -> Any:
        """The field ``key`` (a tagged record's tag too), ``default`` when it is None or not a field."""
        try:
            v = self[key]
        except KeyError:
            return default
        return default if v is None else v

    def update(self, *args: Any, **kw: Any) -> None:
        """Set fields from a mapping and/or keyword arguments (KeyError naming an unknown field)."""
        for k, v in dict(*args, **kw).items():
            self[k] = v

    def keys(self) -> list[str]:
        """The fields that are set (not None), in wire order: the keys the dict form would hold."""
        return [k for k, _v in self.items()]

    def items(self) -> list[tuple[str, Any]]:
        """``(field, value)`` of every field that is set (not None), in wire order: the keys the dict form
        would hold."""
        return [(k, v) for k in self.__struct_fields__ if (v := getattr(self, k)) is not None]


class _Record(_DictStyle, array_like=True, gc=False):
    """Base of the typed accumulator records: msgspec Structs encoded as msgpack arrays (field order = wire
    order: append new fields at the end with a default, never reorder). ``gc=False``: a record never takes
    part in a reference cycle (it holds dicts, lists, numbers, text, bytes and other records), so the
    cyclic collector need not track the millions of them a wide job's parts decode to."""


def to_dict(rec: Any) -> Any:
    """``rec`` in the dict form the worker wrote before the typed records (fields that are None left out,
    nested records as dicts, containers copied): for tools, tests and readers of the older format."""
    if isinstance(rec, _DictStyle):
        return {k: to_dict(v) for k, v in rec.items()}
    if isinstance(rec, dict):
        return {k: to_dict(v) for k, v in rec.items()}
    if isinstance(rec, list):
        return [to_dict(v) for v in rec]
    return rec


class HostNet(_Record):
    """A host's TCP view of one step (docs/ANALYSIS.md "Network blame by connection").

    ``addrs``: this host's own IPv4 addresses (the ``saddr`` of its TCP events) -> 1. ``pairs``: per
    connection ``"<a>|<b>"`` (a < b) ``[rtt_samples, retransmits, rtt_sum_ns, retransmits_a_to_b,
    retransmits_b_to_a]`` (counts, ns); a pair of three values (an older worker's) merges into the first
    three. ``queue_max_ns``: the longest a watched socket's segment waited in this host's own egress qdisc
    in the step (TCP_QUEUE, ns; parts merge by max; None: no TCP_QUEUE, i.e. none at or above the agent's
    ``queue_ns``, or an agent or worker without the probe or the field). ``drops``: this host's own
    watched sockets' segments dropped on their way in the step (SKB_DROP whose reason is not a decision of
    the receiving TCP socket, ``link_drop``: netfilter, a qdisc, the device; a count; parts merge by sum;
    None: none, or an older worker's)."""

    addrs: dict[str, int] = {}
    pairs: dict[str, list[int]] = {}
    queue_max_ns: int | None = None
    drops: int | None = None


class StepAcc(_Record):
    """The per-step fields a host accumulator and each of its rank rows share (times: ``*_rt`` =
    CLOCK_REALTIME ns, durations ns).

    ``events``: events folded in. ``step_ns``: STEP_END ``duration_ns`` (the largest seen; None before
    one). ``begin_rt``/``end_rt``: STEP_BEGIN / STEP_END time (None: not seen). ``unc_ns``: the largest clock
    uncertainty of the batches folded in (ns). ``phases``: phase -> PHASE durations summed (ns).
    ``layers``: layer -> ``[time_ns, count, max_ns]`` (``KIND_RULES``). ``colls``: ``"<pg>#<coll_seq>"`` ->
    ``[op, arrive_rt | None, end_rt | None, duration_ns | None]``. ``ringbuf_lost``: events the agent's ring
    buffer dropped (AGENT_LOSS values). ``stopped_ns``: longest SCHED_OFFCPU of a stopped/traced thread
    (None: none). ``last_phase``: ``[end_rt, phase]`` of the latest PHASE to end (None before the first)."""

    events: int = 0
    step_ns: int | None = None
    begin_rt: int | None = None
    end_rt: int | None = None
    unc_ns: int = 0
    phases: dict[str, int] = {}
    layers: dict[str, list[int]] = {}
    colls: dict[str, list[Any]] = {}
    ringbuf_lost: int = 0
    stopped_ns: int | None = None
    last_phase: list[Any] | None = None


class RankRow(StepAcc):
    """One training process's share of a host's step (:class:`StepAcc` fields) plus ``pid`` (its process
    id), ``local_rank`` and ``gpu`` (the GPU index of its CUDA events, -1 when none)."""

    pid: int = 0
    local_rank: int = 0
    gpu: int = -1


class RankTable(_Record, array_like=True):
    """The compact rank table of a host's rank rows (:func:`rank_table_of`), what the close reads instead of
    the rows. Per rank, in row order: ``r`` global rank, ``p`` pid, ``l`` local rank, ``g`` GPU index (-1
    unknown), ``s`` step_ns (None before its STEP_END), ``u`` clock uncertainty (ns). ``k``: the host's
    collective keys (order of its ``colls``). ``a``/``e``/``d``: per rank then per key (index
    ``rank_index * len(k) + key_index``) arrival, end (CLOCK_REALTIME ns) and duration (ns), None when
    unknown. ``hv``: per key, the host view's record ``[op, arrive_rt, end_rt, duration_ns]`` of its
    last-arriving rank (``analysis.ranks.host_view``).

    The integer columns ``r p l g s u a e d`` are **packed** (:func:`pack_column`): little-endian int64
    bytes, 8 per value, ``None`` written as :data:`PACKED_NONE`, so that the part's decode, encode and
    changelog handle one bytes object per column instead of thousands of ints, and the close builds its
    int64 matrices with ``numpy.frombuffer``. A table with a value that int64 cannot hold (or that equals
    the mark) keeps int lists, as every table written before the packed columns did; readers take both
    (:func:`column`, :func:`column_len`, :func:`table_lists`)."""

    r: list[int] | bytes = []
    p: list[int] | bytes = []
    l: list[int] | bytes = []  # noqa: E741 (the table's documented one-letter field names)
    g: list[int] | bytes = []
    s: list[int | None] | bytes = []
    u: list[int] | bytes = []
    k: list[str] = []
    a: list[int | None] | bytes = []
    e: list[int | None] | bytes = []
    d: list[int | None] | bytes = []
    hv: list[list[Any]] = []


PACKED_NONE = -(2**63)
_PACKED_NONE_BYTES = struct.pack("<q", PACKED_NONE)  # the mark as a packed column holds it
"""A packed column's mark of None (int64's minimum: no rank, pid, time or duration takes it; a table
holding that value keeps int lists). ``analysis.ranks`` uses the same value as its matrices' "none"."""

PACKED_COLUMNS = ("r", "p", "l", "g", "s", "u", "a", "e", "d")
"""The :class:`RankTable` columns written packed."""


def pack_column(values: list[int | None]) -> bytes | None:
    """``values`` (ints or None) as little-endian int64 bytes, None as :data:`PACKED_NONE`; None (the
    caller keeps the list) when a value is not an int64 or equals the mark."""
    try:
        if None in values:
            if PACKED_NONE in values:
                return None
            return struct.pack(f"<{len(values)}q", *[PACKED_NONE if v is None else v for v in values])
        if PACKED_NONE in values:
            return None
        return struct.pack(f"<{len(values)}q", *values)
    except struct.error:  # beyond int64 (or not an int): the list form
        return None


def column(v: list | bytes) -> list:
    """A :class:`RankTable` column as a list (ints, None for the mark): a packed column unpacked (new list
    each call), a list column as it is."""
    if isinstance(v, (bytes, bytearray)):
        return [None if x == PACKED_NONE else x for x in struct.unpack(f"<{len(v) // 8}q", v)]
    return v


def column_len(v: list | bytes) -> int:
    """Number of values of a :class:`RankTable` column, packed or not."""
    return len(v) // 8 if isinstance(v, (bytes, bytearray)) else len(v)


def is_packed(t: RankTable) -> bool:
    """Whether ``t``'s integer columns are packed (:func:`pack_column`; :func:`packed_table` packs a table
    whole, so its ranks and arrivals tell; a reader of the bytes still checks their lengths)."""
    return type(t.r) is bytes and type(t.a) is bytes


def table_lists(t: RankTable) -> RankTable:
    """``t`` with every column as a list (:func:`column`): ``t`` itself when none is packed."""
    if not any(isinstance(getattr(t, c), (bytes, bytearray)) for c in PACKED_COLUMNS):
        return t
    return msgspec.structs.replace(t, **{c: column(getattr(t, c)) for c in PACKED_COLUMNS})


def packed_table(t: RankTable) -> RankTable:
    """``t`` with its integer columns packed (:func:`pack_column`), or ``t`` unchanged (lists) when a column
    cannot be packed: a table is packed whole or not at all."""
    cols = {}
    for c in PACKED_COLUMNS:
        v = getattr(t, c)
        if isinstance(v, (bytes, bytearray)):
            cols[c] = v
            continue
        b = pack_column(v)
        if b is None:
            return table_lists(t)
        cols[c] = b
    return msgspec.structs.replace(t, **cols)


class HostAcc(StepAcc):
    """One host's accumulator of one step (:class:`StepAcc` fields, the largest/earliest of its ranks:
    ``step_ns`` the largest, a collective's arrival the earliest) plus ``host``, ``host_id``, ``net``
    (:class:`HostNet`), and its ranks: ``rank`` = ``[rank, local_rank, pid]`` when it has exactly one
    known rank; with two or more, ``ranks`` (``{"<global rank>": RankRow}``) or, packed
    (:func:`pack_ranks`), ``rb`` (the rows as one msgpack blob) and ``rt`` (:class:`RankTable`, None when
    the table cannot stand for the rows)."""

    host: str = ""
    host_id: int = 0
    net: HostNet | None = None
    rank: list[int] | None = None
    ranks: dict[str, RankRow] | None = None
    rb: bytes | None = None
    rt: RankTable | None = None


def new_rank_row(pid: int, local_rank: int) -> RankRow:
    """An empty rank row of a host accumulator's ``ranks``."""
    return RankRow(phases={}, layers={}, colls={}, pid=pid, local_rank=local_rank)


def new_acc(host: str, host_id: int) -> HostAcc:
    """An empty host accumulator."""
    return HostAcc(phases={}, layers={}, colls={}, host=host, host_id=host_id, net=HostNet(addrs={}, pairs={}))


class PartMsg(_DictStyle, tag="part", tag_field="t", gc=False):
    """One host's share of one step on the internal topic (ingest -> fold): a msgpack map ``{"t": "part",
    job, step, host, bid, acc, q}`` whose ``acc`` is a :class:`HostAcc` (an array). ``bid``:
    ``"<agent_id>:<seq>"`` of the batch it came from (the fold's idempotence key); ``q``: quality counters
    (``lost_batches``, ``duplicate_batches``: batches) carried once per batch."""

    job: str
    step: int
    host: str
    bid: str
    acc: HostAcc
    q: dict[str, int] = {}


class PartEntry(_Record):
    """A host's latest share of an open step in the fold's ``parts`` table (``streams.fold``): ``acc`` the
    merged :class:`HostAcc` of its parts so far, ``bids`` the batch ids applied (``"<agent_id>:<seq>"``, in
    order), ``q`` the quality counters (batches) not yet summarised. An array ``[acc, bids, q]`` on the
    changelog."""

    acc: HostAcc
    bids: list[str] = []
    q: dict[str, int] = {}


def as_entry(e: Any) -> PartEntry:
    """A ``parts`` entry as a :class:`PartEntry`: itself, the array form a changelog's untyped decode gives,
    or the dict form ``{"acc": {...}, "bids": [...], "q": {...}}`` of an older worker. Raises
    ``msgspec.ValidationError`` or ``TypeError`` for anything else."""
    if isinstance(e, PartEntry):
        return e
    if isinstance(e, dict):
        return PartEntry(acc=as_acc(e["acc"]), bids=list(e.get("bids") or ()), q=dict(e.get("q") or {}))
    return msgspec.convert(e, PartEntry)


def as_part(v: Any) -> PartMsg:
    """An internal ``part`` message as a :class:`PartMsg`: itself, or the dict form (an older ingest's, or
    one Faust's untyped codec decoded), its ``acc`` through :func:`as_acc`."""
    if isinstance(v, PartMsg):
        return v
    return PartMsg(
        job=str(v["job"]),
        step=int(v["step"]),
        host=str(v["host"]),
        bid=str(v["bid"]),
        acc=as_acc(v["acc"]),
        q=dict(v.get("q") or {}),
    )


_part_decoder = msgspec.msgpack.Decoder(PartMsg)
_any_decoder = msgspec.msgpack.Decoder()


def decode_internal(raw: bytes) -> Any:
    """One internal message from its msgpack bytes: a ``part`` decoded typed (:class:`PartMsg`, in C), any
    other message (or a part in the dict form of an older ingest) as plain dicts. Raises
    ``msgspec.DecodeError`` for bytes that are not msgpack."""
    try:
        return _part_decoder.decode(raw)
    except msgspec.ValidationError:
        return _any_decoder.decode(raw)


# -- the dict form (today's changelogs and internal messages of older workers) --------------------------

_STEP_KEYS = tuple(StepAcc.__struct_fields__)


def _step_kw(d: dict) -> dict:
    kw = {k: d[k] for k in _STEP_KEYS if d.get(k) is not None}
    for k in ("phases", "layers", "colls"):
        kw[k] = dict(kw.get(k) or {})
    return kw


def row_from_dict(d: dict) -> RankRow:
    """A rank row of the dict form (an older worker's) as a :class:`RankRow`."""
    return RankRow(
        **_step_kw(d), pid=int(d.get("pid") or 0), local_rank=int(d.get("local_rank") or 0), gpu=int(d.get("gpu", -1))
    )


def table_from_dict(d: dict) -> RankTable:
    """A rank table of the dict form (keys ``r p l g s u k a e d hv``) as a :class:`RankTable`."""
    return RankTable(
        **{
            k: v if isinstance(v := d.get(k) or (), (bytes, bytearray)) else list(v)
            for k in RankTable.__struct_fields__
        }
    )


def _net_from_dict(d: dict) -> HostNet:
    """:class:`HostNet` from its dict form (``queue_max_ns``, ``drops`` None when absent: an older worker's)."""
    return HostNet(
        addrs=dict(d.get("addrs") or {}),
        pairs=dict(d.get("pairs") or {}),
        queue_max_ns=d.get("queue_max_ns"),
        drops=d.get("drops"),
    )


#: the nested records a ``rec["field"] = {...}`` of the dict form converts
_NESTED: dict[str, Callable[[dict], Any]] = {
    "net": lambda d: _net_from_dict(d),
    "ranks": lambda d: {str(r): row if isinstance(row, RankRow) else row_from_dict(row) for r, row in d.items()},
    "rt": lambda d: table_from_dict(d),
}


def as_acc(acc: Any) -> HostAcc:
    """``acc`` as a :class:`HostAcc`: itself, or converted from the dict form (module docstring of an older
    worker: ``net`` as a dict, ``ranks`` as dict rows, ``rt`` as a dict table) or from the array form a
    changelog's untyped decode gives. Raises ``msgspec.ValidationError`` (naming the field) or ``TypeError``
    for anything else."""
    if isinstance(acc, HostAcc):
        return acc
    if isinstance(acc, (list, tuple)):
        return msgspec.convert(acc, HostAcc)
    if not isinstance(acc, dict):
        raise TypeError(f"a host accumulator is a HostAcc, a dict or a list, not {type(acc).__name__}")
    out = HostAcc(**_step_kw(acc), host=str(acc.get("host") or ""), host_id=int(acc.get("host_id") or 0))
    net = acc.get("net")
    if isinstance(net, dict):
        out.net = _net_from_dict(net)
    elif net is not None:
        out.net = msgspec.convert(net, HostNet)
    else:
        out.net = HostNet(addrs={}, pairs={})
    if acc.get("rank"):
        out.rank = list(acc["rank"])
    if acc.get("ranks"):
        out.ranks = {str(r): row if isinstance(row, RankRow) else row_from_dict(row) for r, row in acc["ranks"].items()}
    if acc.get("rb") is not None:
        out.rb = bytes(acc["rb"])
        rt = acc.get("rt")
        out.rt = rt if isinstance(rt, RankTable) or rt is None else table_from_dict(rt)
    return out


def as_accs(accs: dict[str, Any]) -> dict[str, Any]:
    """``{host: accumulator}`` with every value typed: a :class:`StepAcc` (host accumulator or rank row)
    stays, anything else is :func:`as_acc` (no copy when the first value is typed: a caller passes one
    form). The analysis's public functions
    call it, so callers holding the dict form (tools, tests) keep working."""
    for a in accs.values():  # one form per call: the first value tells (O(1) on the worker's path)
        if isinstance(a, StepAcc):
            return accs
        break
    return {h: a if isinstance(a, StepAcc) else as_acc(a) for h, a in accs.items()}


@functools.lru_cache(maxsize=65536)
def _ipv4_text(addr: str) -> str | None:
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return None
    if ip.version == 6:
        ip = ip.ipv4_mapped
        if ip is None:
            return None
    return None if ip.is_loopback else str(ip)


def ipv4(addr: object) -> str | None:
    """``addr`` as dotted IPv4 text (an IPv4-mapped IPv6 address such as ``::ffff:a4d:a`` unwrapped), or
    None when it is not an IPv4 address. Loopback is None (it never crosses a link)."""
    return _ipv4_text(str(addr))  # parsing is slow (~10 µs) and a host talks to few addresses: cached


def _add_net(acc: HostAcc, kind: int, e: Event) -> None:
    p = e.payload or {}
    src, dst = ipv4(p.get("saddr")), ipv4(p.get("daddr"))
    if src is None or dst is None or src == dst:
        return
    net = acc.net
    if net is None:
        net = acc.net = HostNet(addrs={}, pairs={})
    net.addrs[src] = 1
    slot = net.pairs.setdefault("|".join(sorted((src, dst))), [0, 0, 0, 0, 0])
    if kind == Kind.TCP_RTT:
        slot[0] += 1
        slot[2] += max(0, e.duration_ns)
    else:
        n = max(1, e.value)
        slot[1] += n
        slot[3 if src < dst else 4] += n


# Event kinds as plain ints: ``Kind(x)`` and ``Kind.X`` cost a Python-level enum lookup each, per event
# (an event's ``kind`` compares equal to its int, and ``KIND_RULES`` finds its rule by it).
_STEP_END = int(Kind.STEP_END)
_STEP_BEGIN = int(Kind.STEP_BEGIN)
_COLL_BEGIN = int(Kind.COLLECTIVE_BEGIN)
_COLL_END = int(Kind.COLLECTIVE_END)
_AGENT_LOSS = int(Kind.AGENT_LOSS)
_TCP_RTT = int(Kind.TCP_RTT)
_TCP_RETRANSMIT = int(Kind.TCP_RETRANSMIT)
_TCP_QUEUE = int(Kind.TCP_QUEUE)
_SKB_DROP = int(Kind.SKB_DROP)
_PHASE = int(Kind.PHASE)
_REGISTER = int(Kind.REGISTER)
_RANK_STATE = int(Kind.RANK_STATE)
_SCHED_OFFCPU = int(Kind.SCHED_OFFCPU)
_SCHED_RUNQ = int(Kind.SCHED_RUNQ)
_STOPPED_STATES = 0x0C  # SCHED_OFFCPU value (task state at switch-out): __TASK_STOPPED 0x4, TASK_TRACED 0x8


RECEIVER_DROP_PREFIXES = ("TCP_", "SOCKET_", "PROTO_MEM")
"""Drop reasons (``skb_drop_reason`` names, the agent's SKB_DROP ``reason``) that are a decision of the
receiving socket about a segment that arrived (a duplicate of a spurious retransmit, ``TCP_OLD_DATA``; out of
window, a full receive buffer, ``SOCKET_RCVBUFF``), not its link's loss: ``link_drop`` leaves them out."""


def link_drop(e: Event) -> bool:
    """Whether an SKB_DROP counts as one of its host's segments dropped on their way (``HostNet.drops``):
    its reason (``payload["reason"]``, a name; a number where the agent knew none) is not one of
    ``RECEIVER_DROP_PREFIXES``. A blackout's netfilter drops (``NETFILTER_DROP``), a qdisc's (``QDISC_DROP``,
    ``NOT_SPECIFIED`` when one is reset) and the device's count; a receiver's discard of a sender's excess
    does not."""
    reason = str((e.payload or {}).get("reason", ""))
    return not reason.startswith(RECEIVER_DROP_PREFIXES)


def coll_key(pg: str, coll_seq: int) -> str:
    """The join key of one collective within a job: ``"<pg>#<coll_seq>"`` (docs/SCHEMA.md "TraceKey")."""
    return f"{pg}#{coll_seq}"


def add_event(acc: StepAcc, e: Event, offset_ns: int) -> None:
    """Fold one event into a host accumulator or rank row. ``offset_ns`` is the batch's clock offset
    (monotonic -> realtime). Unknown-to-this-table kinds only count in ``events``."""
    acc.events += 1
    kind = int(e.kind)
    rt = e.ts_ns + offset_ns
    if kind == _STEP_END:
        acc.step_ns = max(acc.step_ns or 0, e.duration_ns)
        acc.end_rt = rt
    elif kind == _STEP_BEGIN:
        acc.begin_rt = rt
    elif kind == _COLL_BEGIN or kind == _COLL_END:
        p = e.payload or {}
        key = coll_key(str(p.get("pg", "?")), int(p.get("coll_seq", -1)))
        c = acc.colls.setdefault(key, [str(p.get("op", "?")), None, None, None])
        if kind == _COLL_BEGIN:
            c[1] = rt if c[1] is None else min(c[1], rt)
        else:
            c[2], c[3] = rt, e.duration_ns
    elif kind == _AGENT_LOSS:
        acc.ringbuf_lost += max(0, e.value)
    elif kind == _SCHED_OFFCPU and e.value & _STOPPED_STATES:  # a stopped/traced thread: its longest stop
        acc.stopped_ns = max(acc.stopped_ns or 0, e.duration_ns)
    elif kind == _TCP_RTT or kind == _TCP_RETRANSMIT:
        if isinstance(acc, HostAcc):  # links are per host: a rank row has no net
            _add_net(acc, kind, e)
    elif kind == _TCP_QUEUE:  # the host's own egress queue: no layer slot, no connection
        if isinstance(acc, HostAcc):
            if acc.net is None:
                acc.net = HostNet(addrs={}, pairs={})
            acc.net.queue_max_ns = max(acc.net.queue_max_ns or 0, e.duration_ns)
        return
    elif kind == _SKB_DROP:  # counts in the network layer (below); the host's own segments also in its net
        if isinstance(acc, HostAcc) and link_drop(e):
            if acc.net is None:
                acc.net = HostNet(addrs={}, pairs={})
            acc.net.drops = (acc.net.drops or 0) + 1
    if kind == _PHASE:
        ph = str((e.payload or {}).get("phase", "?"))
        acc.phases[ph] = acc.phases.get(ph, 0) + e.duration_ns
        lp = acc.last_phase
        if lp is None or rt >= lp[0]:
            acc.last_phase = [rt, ph]
    rule = KIND_RULES.get(kind)
    if rule is not None:
        layer, t_fn, c_fn, m_fn = rule
        slot = acc.layers.setdefault(layer.value, [0, 0, 0])
        slot[0] += t_fn(e)
        slot[1] += c_fn(e)
        slot[2] = max(slot[2], m_fn(e))


# Kinds whose whole effect is one layer slot update of a fixed pattern (the bulk of real traffic): handled
# inline by ``reduce_batch`` without a call per event. Patterns: 0 = (time, count, max) = (duration, 1,
# duration); 1 = (0, 1, duration); 2 = (0, 1, 0). Must agree with ``KIND_RULES`` (tests check it).
_FAST: dict[int, tuple[str, int]] = {}
for _kind, (_layer, _t, _c, _m) in KIND_RULES.items():
    if _kind in STRUCTURAL or _kind in (Kind.PHASE, Kind.TCP_RTT, Kind.TCP_RETRANSMIT, Kind.TCP_QUEUE, Kind.SKB_DROP):
        continue
    _pattern = {(_dur, _one, _dur): 0, (_zero, _one, _dur): 1, (_zero, _one, _zero): 2}.get((_t, _c, _m))
    if _pattern is not None:
        _FAST[int(_kind)] = (_layer.value, _pattern)


COLLS_MAX = 1024
"""Collectives kept per process group in one accumulator (a host's or a rank row's share of one step): a
step of thousands of collectives (a launch-bound loop, a benchmark's 3,000 all-reduces, a hand-written
per-parameter all-reduce) keeps its latest ``COLLS_MAX`` of each group (the highest sequence numbers, the
same on every rank that ran them), so a host's share of a step stays under ~50 KB per group and rank; a
share of 10,000 collectives per rank grew a changelog record to 17 MB, over the broker's limit, and
crashed the worker. The straggler analysis then reads those collectives; a hang the latest one."""


def cap_colls(acc: HostAcc) -> int:
    """Drop, in place, all but the :data:`COLLS_MAX` highest sequence numbers of each process group of
    ``acc.colls`` (``"<pg>#<seq>"`` keys) and of each of its unpacked rank rows; returns how many were
    dropped (0, and no work beyond a length test, under the cap)."""
    dropped = _cap(acc.colls)
    for row in (acc.ranks or {}).values():
        dropped += _cap(row.colls)
    return dropped


def _cap(colls: dict) -> int:
    if len(colls) <= COLLS_MAX:
        return 0
    by_pg: dict[str, list[tuple[int, str]]] = {}
    for key in colls:
        pg, _, seq = key.rpartition("#")
        by_pg.setdefault(pg, []).append((int(seq) if seq.lstrip("-").isdigit() else -1, key))
    dropped = 0
    for items in by_pg.values():
        if len(items) > COLLS_MAX:
            items.sort()
            for _seq, key in items[:-COLLS_MAX]:
                del colls[key]
            dropped += len(items) - COLLS_MAX
    return dropped


def reduce_batch(
    batch: Batch, running_step: int | None = None, ranks: dict[int, tuple[int, int]] | None = None
) -> dict[int, HostAcc]:
    """Reduce a validated batch to ``{step: host accumulator}`` for every step >= 0 its events belong to.

    ``ranks``: ``{pid: (global rank, local rank)}`` of the host's registered training processes (from
    their REGISTER events, this batch's included: :func:`rank_map`); with two or more, each stepped event
    of such a pid is also folded into that rank's row (``acc.ranks``), TCP events excepted; with one,
    every accumulator only names it (``acc.rank = [rank, local_rank, pid]``, no rows). None or empty:
    neither.

    Events with ``step == -1`` (outside any step, e.g. REGISTER) are not part of any step; an AGENT_LOSS
    outside a step is charged to the batch's lowest step so ring-buffer loss is never dropped. TCP_RTT and
    TCP_RETRANSMIT events and the SKB_DROPs of a watched socket outside its process (its own segments
    dropped by netfilter on output or after early demux, in softirq and timer context) come without a
    TraceKey (step -1): they are charged to the step of the batch's latest stepped event at or before
    them (else the first after them), i.e. the step the host was in when the packet went out (the host
    row only); so are the SCHED_RUNQ / SCHED_OFFCPU of a rank's threads
    without a TraceKey (step -1: gloo's I/O threads, intra-op workers), which starve inside a collective
    when a CPU burst hits a rank waiting in it (also into the rank's row); in a batch without any stepped event (sealed by age
    while a rank blocks in a long collective) to ``running_step``, the step the host's previous batches
    left running (``running_step``), and dropped when that is None. Same result as ``add_event`` on every
    event; the common layer-only kinds (``_FAST``) are folded inline (about 1 µs per event on this machine).
    """
    out: dict[int, HostAcc] = {}
    loose_loss = 0
    stepped = None
    offset_ns = batch.clock.offset_ns
    fast = _FAST
    acc = None
    acc_step = None
    one = None
    if ranks and len(ranks) == 1:  # one rank on the host: the host row is its row; only its identity is kept
        (pid1, (r1, l1)), ranks = next(iter(ranks.items())), None
        one = [r1, l1, pid1]
    for e in batch.events:
        if ranks:
            r = ranks.get(e.pid)
            if r is not None and e.step >= 0:
                _add_rank_event(out, batch, e, r, offset_ns)
        step = e.step
        if step < 0:
            kind = e.kind
            if (
                kind == _TCP_RTT
                or kind == _TCP_RETRANSMIT
                or kind == _TCP_QUEUE
                or kind == _SKB_DROP
                or kind == _SCHED_RUNQ
                or kind == _SCHED_OFFCPU
            ):
                if stepped is None:
                    stepped = sorted((x.ts_ns, x.step) for x in batch.events if x.step >= 0)
                if stepped:
                    step = _step_at(stepped, e.ts_ns)
                elif running_step is not None:
                    step = running_step
                else:
                    continue
                e = e._replace(step=step)
                if ranks and (kind == _SCHED_RUNQ or kind == _SCHED_OFFCPU) and e.pid in ranks:
                    _add_rank_event(out, batch, e, ranks[e.pid], offset_ns)
            else:
                if kind == _AGENT_LOSS:
                    loose_loss += max(0, e.value)
                continue
        if step != acc_step:
            acc = out.get(step)
            if acc is None:
                acc = out[step] = new_acc(batch.host, batch.host_id)
                acc.unc_ns = batch.clock.uncertainty_ns
            acc_step = step
        f = fast.get(e.kind)
        if f is None:
            add_event(acc, e, offset_ns)
            continue
        acc.events += 1
        layers = acc.layers
        slot = layers.get(f[0])
        if slot is None:
            slot = layers[f[0]] = [0, 0, 0]
        pattern = f[1]
        if pattern == 0:
            d = e.duration_ns
            slot[0] += d
            slot[1] += 1
            if d > slot[2]:
                slot[2] = d
        elif pattern == 1:
            slot[1] += 1
            if e.duration_ns > slot[2]:
                slot[2] = e.duration_ns
        else:
            slot[1] += 1
    if loose_loss and out:
        out[min(out)].ringbuf_lost += loose_loss
    if one is not None:
        for a in out.values():
            a.rank = one
    for a in out.values():
        if len(a.colls) > COLLS_MAX or a.ranks:
            cap_colls(a)
    return out


def _add_rank_event(out: dict[int, HostAcc], batch: Batch, e: Event, r: tuple[int, int], offset_ns: int) -> None:
    """Fold stepped event ``e`` of rank ``r = (global rank, local rank)`` into its rank row of ``out``."""
    kind = int(e.kind)
    if kind == _TCP_RTT or kind == _TCP_RETRANSMIT or kind == _TCP_QUEUE:
        return
    acc = out.get(e.step)
    if acc is None:
        acc = out[e.step] = new_acc(batch.host, batch.host_id)
        acc.unc_ns = batch.clock.uncertainty_ns
    rows = acc.ranks
    if rows is None:
        rows = acc.ranks = {}
    key = str(r[0])
    row = rows.get(key)
    if row is None:
        row = rows[key] = new_rank_row(e.pid, r[1])
        row.unc_ns = batch.clock.uncertainty_ns
    if e.gpu >= 0:
        row.gpu = e.gpu
    f = _FAST.get(kind)
    if f is None:
        add_event(row, e, offset_ns)
        return
    row.events += 1  # the common layer-only kinds, as reduce_batch folds them
    slot = row.layers.get(f[0])
    if slot is None:
        slot = row.layers[f[0]] = [0, 0, 0]
    slot[1] += 1
    if f[1] == 0:
        slot[0] += e.duration_ns
    if f[1] != 2 and e.duration_ns > slot[2]:
        slot[2] = e.duration_ns


def rank_map(
    batch: Batch, known: dict[int, tuple[int, int, str | None]] | None = None
) -> dict[int, tuple[int, int, str | None]]:
    """``{pid: (global rank, local rank, job)}`` of the training processes registered on the batch's host,
    of every job its agent serves: ``known`` (the map after the host's previous batches; a job of None, from
    a record of an older worker, matches any job) updated with the batch's REGISTER events (a REGISTER
    without ``local_rank`` counts local rank 0). A REGISTER replaces the pid of the same rank **of the
    same job** (the rank restarted under a new pid); rank 0 of another job on the host is another process
    (two jobs on one node: the second job's ranks are not evicted by the first's)."""
    out = dict(known or {})
    job = batch.job
    for e in batch.events:
        if e.kind == _REGISTER:
            rank = int(e.value)
            for pid in [p for p, v in out.items() if v[0] == rank and (v[2] is None or v[2] == job)]:
                del out[pid]  # the rank restarted under a new pid
            out[int(e.pid)] = (rank, int((e.payload or {}).get("local_rank", 0) or 0), job)
    return out


def job_ranks(ranks: dict[int, tuple[int, int, str | None]], job: str) -> dict[int, tuple[int, int]]:
    """``{pid: (global rank, local rank)}`` of job ``job`` among a host's registered processes
    (:func:`rank_map`; a job of None matches)."""
    return {pid: (v[0], v[1]) for pid, v in ranks.items() if v[2] is None or v[2] == job}


def running_step(batch: Batch, before: int | None) -> int | None:
    """The step a host is in after ``batch``: the step of its latest stepped event unless the batch holds
    that step's STEP_END (the step is over: None); ``before`` (the value after the host's previous batch)
    when the batch has no stepped event."""
    last = None
    ended = set()
    for e in batch.events:
        if e.step < 0:
            continue
        if last is None or e.ts_ns >= last[0]:
            last = (e.ts_ns, e.step)
        if e.kind == Kind.STEP_END:
            ended.add(e.step)
    if last is None:
        return before
    return None if last[1] in ended else last[1]


def _step_at(stepped: list[tuple[int, int]], ts_ns: int) -> int:
    """The step of the latest stepped event at or before ``ts_ns`` in ``stepped`` (sorted ``(ts_ns, step)``),
    else of the first one after it."""
    i = bisect.bisect_right(stepped, (ts_ns, 1 << 62))
    return stepped[i - 1][1] if i else stepped[0][1]


def registrations(batch: Batch) -> list[dict]:
    """The REGISTER events of a batch as ``{"job", "host", "host_id", "rank", "world_size", "pid"}`` (the
    local rank: :func:`rank_map`)."""
    regs = []
    for e in batch.events:
        if e.kind == _REGISTER:
            p = e.payload or {}
            regs.append(
                {
                    "job": str(p.get("job") or batch.job),
                    "host": batch.host,
                    "host_id": int(p.get("host_id", batch.host_id)),
                    "rank": e.value,
                    "world_size": int(p.get("world_size", 0)),
                    "pid": e.pid,
                }
            )
    return regs


def _int_or_zero(v) -> int:
    """``v`` as an int, 0 for None or anything that is not an int (a bad payload value names nothing)."""
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 128 else 0


def rank_states(batch: Batch) -> list[dict]:
    """The RANK_STATE events of a batch as ``{"job", "host", "pid", "state", "at_rt", "signal"}``
    (``state``: running, frozen, stopped or exited; ``at_rt``: CLOCK_REALTIME ns of the agent's read, of
    the exit for an exit; ``signal``: the signal number that ended an exited process, 0 when none or not
    known)."""
    out = []
    for e in batch.events:
        if e.kind == _RANK_STATE:
            state = str((e.payload or {}).get("state") or "")
            if state not in RANK_STATES:
                continue
            out.append(
                {
                    "job": batch.job,
                    "host": batch.host,
                    "pid": e.pid,
                    "state": state,
                    "at_rt": e.ts_ns + batch.clock.offset_ns,
                    # the signal that ended an exited process (0: none or unknown; rankstate.exit_payload)
                    "signal": _int_or_zero((e.payload or {}).get("signal")),
                }
            )
    return out


#: the states a RANK_STATE event may name (obshub/producer/rankstate.py)
RANK_STATES = ("running", "frozen", "stopped", "exited")


def merge(into: StepAcc, part: StepAcc) -> StepAcc:
    """Merge accumulator ``part`` into ``into`` (same host, same step; two :class:`HostAcc` or two
    :class:`RankRow`; a host accumulator in the dict form is converted first, :func:`as_acc`) and return
    ``into``.

    Sums: events, phases, layer time and count, ring-buffer loss, per-connection RTT samples and
    retransmits (addresses: union); rank rows merge the same way, row by row (a new rank is added). Maxima: step_ns, layer max, clock
    uncertainty. Times of one-off events (begin, end, collective arrival) keep the first value seen,
    except that a missing value is filled in.
    """
    if not isinstance(into, StepAcc):  # the dict form (an older worker's value, a tool's)
        into = as_acc(into)
    if not isinstance(part, StepAcc):
        part = as_acc(part)
    into.events += part.events
    if part.step_ns is not None:
        into.step_ns = max(into.step_ns or 0, part.step_ns)
    if into.begin_rt is None:
        into.begin_rt = part.begin_rt
    if into.end_rt is None:
        into.end_rt = part.end_rt
    into.unc_ns = max(into.unc_ns, part.unc_ns)
    phases = into.phases
    for ph, ns in part.phases.items():
        phases[ph] = phases.get(ph, 0) + ns
    layers = into.layers
    for layer, (t, c, m) in part.layers.items():
        slot = layers.setdefault(layer, [0, 0, 0])
        slot[0] += t
        slot[1] += c
        slot[2] = max(slot[2], m)
    colls = into.colls
    keys = set(colls)
    for key, c in part.colls.items():
        mine = colls.setdefault(key, list(c))
        if mine is not c:
            for i in range(1, 4):
                if mine[i] is None:
                    mine[i] = c[i]
    if len(into.colls) > COLLS_MAX:
        _cap(into.colls)
    into.ringbuf_lost += part.ringbuf_lost
    if part.stopped_ns:
        into.stopped_ns = max(into.stopped_ns or 0, part.stopped_ns)
    lp = part.last_phase
    if lp and (not into.last_phase or lp[0] >= into.last_phase[0]):
        into.last_phase = list(lp)
    if not isinstance(into, HostAcc) or not isinstance(part, HostAcc):
        return into
    pnet = part.net
    if pnet is not None and (pnet.addrs or pnet.pairs or pnet.queue_max_ns or pnet.drops):
        net = into.net
        if net is None:
            net = into.net = HostNet(addrs={}, pairs={})
        if pnet.queue_max_ns is not None and pnet.queue_max_ns > (net.queue_max_ns or 0):
            net.queue_max_ns = pnet.queue_max_ns
        if pnet.drops:
            net.drops = (net.drops or 0) + pnet.drops
        net.addrs.update(pnet.addrs)
        for key, vals in pnet.pairs.items():
            slot = net.pairs.setdefault(key, [0, 0, 0, 0, 0])
            if len(slot) < 5:
                slot.extend([0] * (5 - len(slot)))  # recovered from an older worker's changelog
            for i, v in enumerate(vals[:5]):
                slot[i] += v
    if part.rank and not into.rank:
        into.rank = part.rank
    packed = into.rb is not None or part.rb is not None
    if not packed:
        _merge_rows(into, part.ranks)
    elif part.rb is None and not part.ranks and set(part.colls) <= keys:
        pass  # a part without rank data that adds no collective: the packed rank table stays right
    else:  # packed rank rows (pack_ranks) on either side: merged as full rows, packed again
        rows = rank_rows(into)
        into.rb = None
        into.rt = None
        into.ranks = rows
        _merge_rows(into, rank_rows(part))
        pack_ranks(into)
    return into


def _merge_rows(into: HostAcc, pranks: dict[str, RankRow] | None) -> None:
    """Merge rank rows ``pranks`` (``{"<rank>": row}``) into ``into.ranks``, row by row."""
    if pranks:
        mine = into.ranks
        if mine is None:
            mine = into.ranks = {}
        for key, row in pranks.items():
            have = mine.get(key)
            if have is None:
                mine[key] = row
            else:
                merge(have, row)
                if row.gpu >= 0:
                    have.gpu = row.gpu


# ---------------------------------------------------------------------------------------------------
# Packed rank rows: the second level of the two-level join (docs/ARCHITECTURE.md, docs/STREAMS.md).

_pack = msgspec.msgpack.Encoder().encode
_unpack_rows = msgspec.msgpack.Decoder(dict[str, RankRow]).decode
_unpack = msgspec.msgpack.Decoder().decode


def pack_ranks(acc: HostAcc) -> HostAcc:
    """Pack the rank rows of host accumulator ``acc`` in place and return it: ``acc.ranks`` (full rows)
    becomes ``acc.rb`` (the rows as one msgpack blob, opaque to the fold) and ``acc.rt`` (the compact
    rank table the close reads, :func:`rank_table_of`). An accumulator without rank rows is unchanged.
    The ingest packs every part it sends (it scales out by host); :func:`merge` keeps a packed
    accumulator packed and :func:`rank_rows` gives the full rows back."""
    rows = acc.ranks
    acc.ranks = None
    if rows:
        acc.rb = _pack(rows)
        acc.rt = rank_table_of(acc.colls, rows)
    return acc


def rank_rows(acc: HostAcc) -> dict[str, RankRow]:
    """The full rank rows of host accumulator ``acc`` (``{"<global rank>": RankRow}``), packed
    (:func:`pack_ranks`, decoded here: new rows each call; a blob of an older worker's dict rows is
    converted) or not; ``{}`` when it has none."""
    blob = acc.rb
    if blob is not None:
        try:
            return _unpack_rows(blob)
        except msgspec.ValidationError:  # an older worker's blob: rows as maps
            return {str(r): row_from_dict(row) for r, row in _unpack(blob).items()}
    return acc.ranks or {}


def rank_table_of(host_colls: dict[str, list], rows: dict[str, RankRow]) -> RankTable | None:
    """The compact :class:`RankTable` of rank rows ``rows`` (``{"<global rank>": RankRow}``) of a host
    whose own collectives are ``host_colls``. None when a rank row's collective has another op than the
    host's record (the readers then use the full rows) or names a collective the host's records lack."""
    keys = list(host_colls)
    col = {k: i for i, k in enumerate(keys)}
    n = len(keys)
    rs: list[int] = []
    ps: list[int] = []
    ls: list[int] = []
    gs: list[int] = []
    ss: list[int | None] = []
    us: list[int] = []
    a: list = [None] * (n * len(rows))
    e: list = [None] * (n * len(rows))
    d: list = [None] * (n * len(rows))
    best: list = [None] * n
    for j, (r, row) in enumerate(rows.items()):
        rs.append(int(r))
        ps.append(row.pid)
        ls.append(row.local_rank)
        gs.append(row.gpu)
        ss.append(row.step_ns)
        us.append(row.unc_ns or 0)
        base = j * n
        for key, c in row.colls.items():
            i = col.get(key)
            if i is None or c[0] != host_colls[key][0]:
                return None
            a[base + i], e[base + i], d[base + i] = c[1], c[2], c[3]
            if c[1] is not None and (best[i] is None or c[1] > best[i][1]):
                best[i] = c
    hv = [list(b) if b is not None else [host_colls[k][0], None, None, None] for k, b in zip(keys, best)]
    return packed_table(RankTable(r=rs, p=ps, l=ls, g=gs, s=ss, u=us, k=keys, a=a, e=e, d=d, hv=hv))


def rank_table(acc: HostAcc) -> RankTable | None:
    """The compact rank table of host accumulator ``acc`` (:func:`rank_table_of`): the packed one, else
    built from its full rows; None without rank rows or when the table cannot stand for them."""
    if acc.rb is not None:
        return acc.rt
    rows = acc.ranks
    return rank_table_of(acc.colls, rows) if rows else None


def rank_count(acc: HostAcc) -> int:
    """How many rank rows host accumulator ``acc`` holds (packed or not)."""
    if acc.rb is not None:
        rt = acc.rt
        return column_len(rt.r) if rt is not None else len(rank_rows(acc))
    return len(acc.ranks or ())


def ranks_ended(acc: HostAcc) -> int:
    """How many rank rows of host accumulator ``acc`` have a step time (their rank's STEP_END)."""
    if acc.rb is not None:
        rt = acc.rt
        if rt is not None:
            ss = rt.s
            if isinstance(ss, (bytes, bytearray)):
                if _PACKED_NONE_BYTES not in ss:  # no value is the mark (a part's usual case): one C search
                    return len(ss) // 8
                return len(ss) // 8 - struct.unpack(f"<{len(ss) // 8}q", ss).count(PACKED_NONE)
            return len(ss) - ss.count(None)
        return sum(1 for r in rank_rows(acc).values() if r.step_ns is not None)
    return sum(1 for r in (acc.ranks or {}).values() if r.step_ns is not None)
