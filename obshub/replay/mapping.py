"""Map one rank's Kineto trace (and, where present, its execution trace) onto obshub events.

Two streamed passes over the file keep memory bounded by the number of *steps and collectives*, not of
events:

1. **skeleton** (:func:`load_rank`): the header (rank, world size, ``baseTimeNanoseconds``), the
   ``ProfilerStep#N`` spans, the CPU-side collective spans and the NCCL kernels;
2. **events** (:func:`map_rank`): every other event is mapped and yielded as it is read; the NCCL
   kernel launches seen on the way tie each kernel to its collective; the collectives and the step ends
   come last (so a stream worker never sees an event of a step after that step's end).

Mapping (Kineto ``cat`` / name -> :class:`obshub.core.schema.Kind`):

============================================  ==============================================================
``ProfilerStep#N``                            STEP_BEGIN (ts = begin) and STEP_END (ts = end, duration)
``cpu_op``, ``user_annotation``,              PYTORCH_OP ``{"op"}``; ``Optimizer.step#*`` and ``## forward ##``
``python_function``                           style annotations -> PHASE ``{"phase"}``
``cuda_runtime``/``cuda_driver`` launches     CUDA_LAUNCH ``{"symbol"}`` (gpu = -1: the CPU-side call)
... ``*Synchronize*``                         CUDA_SYNC; ``cudaMemcpy*``/``cudaMemset*`` -> CUDA_MEMCPY
``kernel`` (not NCCL)                         CUDA_LAUNCH with gpu = device: the kernel's *execution* on the
                                              GPU; value = grid blocks; payload ``{"symbol", "stream"}``
``gpu_memcpy``, ``gpu_memset``                CUDA_MEMCPY with gpu = device, value = bytes
``record_param_comms`` / ``nccl:*``           NCCL_COLL (the CPU enqueue; value = elements) and
  + its NCCL kernel                           COLLECTIVE_BEGIN (ts = kernel start = arrival) / COLLECTIVE_END
                                              (ts = kernel end, duration = kernel time incl. waiting for
                                              peers); payload ``{"pg", "coll_seq", "op", "seq_source",
                                              "timing"}``, value = bytes
flows (``ac2g``, ``fwdbwd``), metadata,       skipped, counted by reason in :class:`RankStats`
instants, ``gpu_user_annotation``, unknown
============================================  ==============================================================

Collective sequence numbers (``coll_seq``, the cross-rank join key), in order of preference: a ``Seq``
argument on ``record_param_comms`` (newer PyTorch); the execution trace's ``seq`` matched to the Kineto
collectives by issue order when both list the same operations; else the ordinal of the collective in
the trace per process group (consistent across ranks when every rank's profiler window covers the same
steps, which ``torch.profiler.schedule`` ensures). ``seq_source`` in the payload says which was used.

Times: ``ts_ns = baseTimeNanoseconds + ts_µs * 1000`` (see :mod:`kineto`); the batch clock offset is 0
so ``ts_ns`` is the trace's own (normally Unix epoch) time.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from obshub.core import schema
from obshub.core.schema import Event, Kind
from obshub.replay.et import EtFile
from obshub.replay.kineto import I64_MAX, KinetoFile, dur_to_ns, is_int, rank_from_filename, ts_to_ns

DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "double": 8,
    "float64": 8,
    "c10::half": 2,
    "half": 2,
    "float16": 2,
    "c10::bfloat16": 2,
    "bfloat16": 2,
    "long int": 8,
    "long": 8,
    "int64": 8,
    "int": 4,
    "int32": 4,
    "short int": 2,
    "short": 2,
    "signed char": 1,
    "unsigned char": 1,
    "byte": 1,
    "char": 1,
    "bool": 1,
    "uint8": 1,
    "int8": 1,
    "c10::float8_e4m3fn": 1,
    "c10::float8_e5m2": 1,
}
_OP_ALIASES = {
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "allgather": "all_gather",
    "_allgather_base": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_base": "all_gather",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_base": "reduce_scatter",
    "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "all_to_allv": "all_to_all",
    "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all",
    "sendrecv": "send_recv",
}
_NCCL_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_PHASE_ANNOTATION = re.compile(r"^#*\s*(forward|backward|optimizer|data)\s*#*$", re.IGNORECASE)
NON_COLLECTIVE_OPS = frozenset({"wait", "barrier_wait", ""})
MAX_NAME = schema.MAX_STR_LEN


def normalize_op(name: str) -> str:
    """Canonical collective name (``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``,
    ``broadcast``, ``send_recv``...) from c10d, Kineto annotation or NCCL kernel spellings."""
    n = name.strip().lower().removeprefix("nccl:").removeprefix("gloo:")
    return _OP_ALIASES.get(n, _OP_ALIASES.get(n.lstrip("_"), n.lstrip("_")))


def kernel_op(kernel_name: str) -> str | None:
    """The collective of an NCCL kernel name (``ncclKernel_AllReduce_RING_LL_Sum_float`` ->
    ``all_reduce``), or None when it is not an NCCL kernel."""
    m = _NCCL_KERNEL.match(kernel_name)
    if not m:
        return None
    return normalize_op(re.sub(r"(?<!^)(?=[A-Z])", "_", m.group(1)).lower())


def _dims_bytes(dims: Any, types: Any) -> int:
    """Bytes of Kineto ``Input Dims`` / ``Input type`` lists (first tensor argument(s) only)."""
    if not isinstance(dims, list) or not isinstance(types, list):
        return 0
    total = 0
    for d, t in zip(dims, types):
        if isinstance(d, list) and d and all(is_int(x) for x in d) and isinstance(t, str):
            n = 1
            for x in d:
                n *= max(x, 0)
            total += n * DTYPE_BYTES.get(t.lower(), 0)
    return total


@dataclass
class StepSpan:
    """A ``ProfilerStep#N`` span: step ``number`` and its CPU begin/end in ns."""

    number: int
    begin_ns: int
    end_ns: int
    tid: int


@dataclass
class CollSpan:
    """A collective as the CPU issued it (``record_param_comms`` or the ``nccl:*`` annotation)."""

    ts_ns: int
    end_ns: int
    tid: int
    op: str
    pg: str
    bytes: int
    elements: int
    seq: int | None


@dataclass
class NcclKernel:
    """An NCCL kernel execution on the GPU; ``op`` from the kernel args or name."""

    ts_ns: int
    dur_ns: int
    device: int
    stream: int
    correlation: int | None
    name: str
    op: str


@dataclass
class RankStats:
    """What happened to one rank's events: ``emitted`` per kind name, ``skipped`` per reason,
    ``seq_source`` of the collective sequence numbers and ``notes`` for the operator."""

    emitted: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)
    seq_source: str = ""
    notes: list[str] = field(default_factory=list)


@dataclass
class RankTrace:
    """One rank: its Kineto file, skeleton (steps, collective spans, NCCL kernels), ET if paired."""

    path: Path
    kineto: KinetoFile
    rank: int
    world_size: int | None
    pid: int
    steps: list[StepSpan]
    spans: list[CollSpan]
    kernels: list[NcclKernel]
    et: EtFile | None = None
    stats: RankStats = field(default_factory=RankStats)

    @property
    def host(self) -> str:
        """The agent identity this rank is replayed as (``rank<N>``)."""
        return f"rank{self.rank}"


def _u32(v: Any, default: int = 0) -> int:
    """``v`` when it is an integer in 0..2**32-1 (a pid, tid or stream), else ``default``."""
    return v if is_int(v) and 0 <= v < 2**32 else default


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int_or_none(v: Any) -> int | None:
    return v if is_int(v) else None


def _collective_span(e: dict, base_ns: int) -> tuple[str, CollSpan] | None:
    """``("new"|"old", span)`` when ``e`` is a CPU-side collective record, else None. "new" =
    ``record_param_comms`` carrying ``Collective name`` (Kineto with NCCL metadata), "old" = the
    ``nccl:<op>`` / ``gloo:<op>`` annotation of older PyTorch."""
    name, args = e.get("name"), e.get("args") if isinstance(e.get("args"), dict) else {}
    if e.get("cat") not in ("cpu_op", "user_annotation") or not isinstance(name, str) or not _num(e.get("ts")):
        return None
    tid = _u32(e.get("tid"))
    try:
        ts = ts_to_ns(e["ts"], base_ns)
    except ValueError:
        return None
    end = min(ts + dur_to_ns(e.get("dur")), I64_MAX)
    if name == "record_param_comms" and isinstance(args.get("Collective name"), str):
        op = args["Collective name"]
        if op in NON_COLLECTIVE_OPS:
            return None
        nel = min(max(args["In msg nelems"], 0), 2**48) if is_int(args.get("In msg nelems")) else 0
        size = DTYPE_BYTES.get(str(args.get("dtype", "")).lower(), 0)
        seq = args.get("Seq") if is_int(args.get("Seq")) else None
        pg = args.get("Process Group Name")
        return "new", CollSpan(ts, end, tid, normalize_op(op), str(pg) if pg is not None else "0", nel * size, nel, seq)
    if name.startswith(("nccl:", "gloo:")) and e.get("cat") in ("user_annotation", "cpu_op"):
        nbytes = _dims_bytes(args.get("Input Dims"), args.get("Input type"))
        dims = args.get("Input Dims")
        nel = 0
        if isinstance(dims, list) and dims and isinstance(dims[0], list):
            nel = 1
            for x in dims[0]:
                nel *= x if is_int(x) and x > 0 else 1
        return "old", CollSpan(ts, end, tid, normalize_op(name), "0", nbytes, nel, None)
    return None


def load_rank(path: Path, *, rank: int | None = None) -> RankTrace:
    """Pass 1 over one Kineto file: header and skeleton. ``rank`` overrides ``distributedInfo``.
    Raises TraceFormatError for unreadable files and ReplayError when no rank can be determined."""
    from obshub.replay.errors import ReplayError

    kf = KinetoFile(path)
    raw_steps, new_spans, old_spans, kernels = [], [], [], []
    pids: Counter = Counter()
    # the header (baseTimeNanoseconds) may only be known at the end: keep raw µs and convert after
    for e in kf.events():
        if not isinstance(e, dict) or e.get("ph") != "X" or not _num(e.get("ts")):
            continue
        name, cat = e.get("name"), e.get("cat")
        if not isinstance(name, str):
            continue
        if cat in ("cpu_op", "user_annotation") and _u32(e.get("pid"), -1) >= 0:
            pids[e["pid"]] += 1
        m = _STEP.match(name)
        if m and cat in ("user_annotation", "cpu_op") and len(m.group(1)) < 18:
            raw_steps.append((int(m.group(1)), e["ts"], e.get("dur"), e.get("tid")))
            continue
        if cat == "kernel" and (op := kernel_op(name)) is not None:
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            if isinstance(args.get("Collective name"), str):
                op = normalize_op(args["Collective name"])
            kernels.append(
                (
                    e["ts"],
                    e.get("dur"),
                    args.get("device"),
                    args.get("stream"),
                    _int_or_none(args.get("correlation")),
                    name,
                    op,
                )
            )
            continue
        sp = _collective_span(e, 0)
        if sp is not None:
            (new_spans if sp[0] == "new" else old_spans).append((e["ts"], sp[1]))
    base = kf.base_ns
    r, world = kf.rank_info()
    if rank is not None:
        r = rank
    if r is None:
        r = rank_from_filename(path)
        if r is None:
            raise ReplayError(
                f"Failed to tell the rank of {path}: no distributedInfo.rank and no rank in the file name",
                hint="name the files rank<N>.json (or worker<N>, <name>_<N>.json), one per rank",
            )
    if r > schema.HOST_ID_MAX:
        raise ReplayError(f"rank {r} of {path} exceeds obshub's 16-bit host id", hint="replay a subset of ranks")

    def ns(ts) -> int | None:
        try:
            return ts_to_ns(ts, base)
        except ValueError:
            return None

    steps = sorted(
        (
            StepSpan(n, b, min(b + dur_to_ns(d), I64_MAX), _u32(t))
            for n, ts, d, t in raw_steps
            if (b := ns(ts)) is not None
        ),
        key=lambda s: s.begin_ns,
    )
    spans = []
    for ts, sp in sorted(new_spans or old_spans, key=lambda x: x[0]):
        if (b := ns(ts)) is not None:  # the span was built with base 0: shift it onto the real base
            sp.end_ns, sp.ts_ns = min(b + (sp.end_ns - sp.ts_ns), I64_MAX), b
            spans.append(sp)
    ks = sorted(
        (
            NcclKernel(
                b,
                dur_to_ns(d),
                dev if is_int(dev) and 0 <= dev <= 65535 else -1,
                _u32(st),
                c if is_int(c) else None,
                n,
                op,
            )
            for ts, d, dev, st, c, n, op in kernels
            if (b := ns(ts)) is not None
        ),
        key=lambda k: k.ts_ns,
    )
    pid = pids.most_common(1)[0][0] if pids else 0
    rt = RankTrace(path, kf, r, world, pid, steps, spans, ks)
    if not steps:
        rt.stats.notes.append(
            "no ProfilerStep#N spans: events carry step -1 and cannot be joined per step "
            "(call prof.step() once per iteration when profiling)"
        )
    return rt


# ---------------------------------------------------------------------------------------------------------
# pass 2
# ---------------------------------------------------------------------------------------------------------
class _StepIndex:
    """Which step a timestamp belongs to: CPU events within a ``ProfilerStep`` span; GPU work (which
    runs after its launch) to the last step begun before it, until the next step begins."""

    def __init__(self, steps: list[StepSpan]):
        self.steps = steps
        self.begins = [s.begin_ns for s in steps]

    def cpu(self, ts: int) -> int:
        i = bisect.bisect_right(self.begins, ts) - 1
        return self.steps[i].number if i >= 0 and ts < self.steps[i].end_ns else -1

    def gpu(self, ts: int) -> int:
        i = bisect.bisect_right(self.begins, ts) - 1
        if i < 0:
            return -1
        s = self.steps[i]
        if i == len(self.steps) - 1 and ts >= s.end_ns + (s.end_ns - s.begin_ns):
            return -1
        return s.number


_SKIP_QUIET = {
    "ac2g": "flow event (ac2g)",
    "fwdbwd": "flow event (fwdbwd)",
    "Trace": "profiler span",
    "gpu_user_annotation": "GPU-side annotation (duplicate of the CPU one)",
}


def _runtime_kind(name: str) -> Kind | None:
    if "Launch" in name:
        return Kind.CUDA_LAUNCH
    if "Synchronize" in name:
        return Kind.CUDA_SYNC
    if name.startswith(("cudaMemcpy", "cudaMemset", "cuMemcpy", "cuMemset")):
        return Kind.CUDA_MEMCPY
    return None


def _phase_of(name: str, cat: str) -> str | None:
    if name.startswith("Optimizer.step#"):
        return "optimizer"
    if cat == "user_annotation":
        m = _PHASE_ANNOTATION.match(name)
        if m:
            return m.group(1).lower()
    return None


def map_rank(rt: RankTrace, job: str) -> Iterator[Event]:
    """Pass 2: yield one rank's events (REGISTER, STEP_BEGINs, mapped events in file order, then the
    collectives and STEP_ENDs), counting into ``rt.stats``. Raises TraceFormatError if the file became
    unreadable since :func:`load_rank`."""
    st = rt.stats
    base, idx, host_id = rt.kineto.base_ns, _StepIndex(rt.steps), rt.rank
    world = rt.world_size or 0

    def out(ev: Event) -> Event:
        st.emitted[Kind(ev.kind).name] += 1
        return ev

    def key(step: int, op_seq: int = 0) -> int:
        return schema.make_trace_key(host_id, step, op_seq) if step >= 0 else 0

    yield out(
        Event(
            Kind.REGISTER,
            rt.steps[0].begin_ns if rt.steps else 0,
            0,
            0,
            -1,
            rt.pid,
            rt.pid,
            -1,
            rt.rank,
            {"world_size": world, "job": job, "host_id": host_id, "local_rank": -1},
        )
    )
    for s in rt.steps:
        yield out(Event(Kind.STEP_BEGIN, s.begin_ns, 0, key(s.number), s.number, rt.pid, s.tid, -1, s.number, {}))
    nccl_corr = {k.correlation: k for k in rt.kernels if k.correlation is not None}
    launches: dict[int, tuple[int, int]] = {}  # correlation -> (tid, ts_ns) of NCCL kernel launches
    for e in rt.kineto.events():
        ev = _map_one(e, base, idx, rt, st, nccl_corr, launches, key)
        if ev is not None:
            yield out(ev)
    for ev in _collective_events(rt, launches, idx, key):
        yield out(ev)
    for s in rt.steps:
        yield out(
            Event(
                Kind.STEP_END, s.end_ns, s.end_ns - s.begin_ns, key(s.number), s.number, rt.pid, s.tid, -1, s.number, {}
            )
        )


def _map_one(
    e: Any, base: int, idx: _StepIndex, rt: RankTrace, st: RankStats, nccl_corr: dict, launches: dict, key
) -> Event | None:
    """Map one raw event; None (and a count in ``st.skipped``) when it is skipped."""
    if not isinstance(e, dict):
        st.skipped["not a JSON object"] += 1
        return None
    ph, cat, name = e.get("ph"), e.get("cat"), e.get("name")
    if cat is not None and not isinstance(cat, str):
        st.skipped["invalid cat (not a string)"] += 1
        return None
    if ph == "M":
        st.skipped["metadata"] += 1
        return None
    if cat in _SKIP_QUIET:
        st.skipped[_SKIP_QUIET[cat]] += 1
        return None
    if ph != "X":
        st.skipped[f"phase {ph!r} (only complete 'X' events are mapped)"] += 1
        return None
    if not isinstance(name, str) or not name:
        st.skipped["missing name"] += 1
        return None
    try:
        ts = ts_to_ns(e.get("ts"), base)
    except ValueError:
        st.skipped["missing or invalid ts"] += 1
        return None
    dur = dur_to_ns(e.get("dur"))
    pid, tid = e.get("pid"), e.get("tid")
    tid = _u32(tid)
    args = e.get("args") if isinstance(e.get("args"), dict) else {}
    short = name[:MAX_NAME]
    if cat in ("cpu_op", "user_annotation", "python_function"):
        if _STEP.match(name):
            return None  # emitted from the skeleton
        if _collective_span(e, base) is not None:
            return None  # emitted as NCCL_COLL / COLLECTIVE_* from the skeleton
        step = idx.cpu(ts)
        phase = _phase_of(name, cat)
        if phase:
            return Event(Kind.PHASE, ts, dur, key(step), step, rt.pid, tid, -1, 0, {"phase": phase})
        return Event(Kind.PYTORCH_OP, ts, dur, key(step), step, rt.pid, tid, -1, 0, {"op": short})
    if cat in ("cuda_runtime", "cuda_driver"):
        corr = args.get("correlation")
        if is_int(corr) and corr in nccl_corr:
            launches[corr] = (tid, ts)
        kind = _runtime_kind(name)
        if kind is None:
            st.skipped["CUDA runtime call other than launch/sync/memcpy"] += 1
            return None
        step = idx.cpu(ts)
        return Event(kind, ts, dur, key(step), step, rt.pid, tid, -1, 0, {"symbol": short})
    if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
        if cat == "kernel" and kernel_op(name) is not None:
            return None  # an NCCL kernel: part of its collective
        dev = args.get("device")
        gpu = dev if is_int(dev) and 0 <= dev <= 65535 else (pid if is_int(pid) and 0 <= pid <= 65535 else 0)
        stream = _u32(args.get("stream"), tid)
        step = idx.gpu(ts)
        if cat == "kernel":
            grid = args.get("grid")
            blocks = 0
            if isinstance(grid, list) and grid and all(is_int(g) for g in grid):
                blocks = 1
                for g in grid:
                    blocks *= g
            return Event(
                Kind.CUDA_LAUNCH,
                ts,
                dur,
                key(step),
                step,
                rt.pid,
                stream,
                gpu,
                min(blocks, I64_MAX),
                {"symbol": short, "stream": stream},
            )
        nbytes = min(max(args["bytes"], 0), I64_MAX) if is_int(args.get("bytes")) else 0
        return Event(
            Kind.CUDA_MEMCPY, ts, dur, key(step), step, rt.pid, stream, gpu, nbytes, {"symbol": short, "stream": stream}
        )
    st.skipped[f"unknown category {str(cat)[:40]!r}"] += 1
    return None


def _collective_events(rt: RankTrace, launches: dict, idx: _StepIndex, key) -> Iterator[Event]:
    """Pair CPU collective spans with their NCCL kernels (via the launch's correlation id: the launch
    runs on the span's thread inside the span), number them, and yield NCCL_COLL + COLLECTIVE_BEGIN/END."""
    st = rt.stats
    pairs: list[tuple[CollSpan | None, NcclKernel | None]] = []
    used: set[int] = set()
    by_tid: dict[int, list[tuple[int, int]]] = {}  # launch tid -> sorted [(launch ts, kernel index)]
    for i, k in enumerate(rt.kernels):
        if k.correlation in launches:
            ltid, lts = launches[k.correlation]
            by_tid.setdefault(ltid, []).append((lts, i))
    for lst in by_tid.values():
        lst.sort()
    for sp in rt.spans:
        lst = by_tid.get(sp.tid, [])
        j = bisect.bisect_left(lst, (sp.ts_ns, -1))
        match = None
        while j < len(lst) and lst[j][0] <= sp.end_ns:
            if lst[j][1] not in used:
                match = lst[j][1]
                break
            j += 1
        if match is not None:
            used.add(match)
        pairs.append((sp, rt.kernels[match] if match is not None else None))
    spare_spans = [i for i, (sp, k) in enumerate(pairs) if k is None]
    spare_kernels = [i for i in range(len(rt.kernels)) if i not in used]
    if spare_spans and len(spare_spans) == len(spare_kernels):  # no correlation info: pair in order
        for si, ki in zip(spare_spans, spare_kernels):
            pairs[si] = (pairs[si][0], rt.kernels[ki])
        spare_kernels = []
    elif spare_spans or spare_kernels:
        st.notes.append(
            f"{len(spare_spans)} collective(s) without an NCCL kernel (timed on the CPU), "
            f"{len(spare_kernels)} NCCL kernel(s) without a CPU record"
        )
    pairs += [(None, rt.kernels[i]) for i in spare_kernels]
    pairs.sort(key=lambda p: p[0].ts_ns if p[0] else p[1].ts_ns)
    seqs = _assign_seqs(rt, pairs)
    per_step: Counter = Counter()
    for (sp, k), (pg, seq) in zip(pairs, seqs):
        op = sp.op if sp else k.op
        nbytes = min(max(sp.bytes, 0), I64_MAX) if sp else 0
        step = idx.cpu(sp.ts_ns) if sp else idx.gpu(k.ts_ns)
        per_step[step] += 1
        tk = key(step, per_step[step])
        tid = sp.tid if sp else (k.stream if k else 0)
        payload = {"pg": pg, "coll_seq": seq, "op": op, "seq_source": st.seq_source, "timing": "gpu" if k else "cpu"}
        if sp:
            yield Event(
                Kind.NCCL_COLL,
                sp.ts_ns,
                sp.end_ns - sp.ts_ns,
                tk,
                step,
                rt.pid,
                sp.tid,
                -1,
                min(sp.elements, I64_MAX),
                {"symbol": op},
            )
        t0, d = (k.ts_ns, k.dur_ns) if k else (sp.ts_ns, sp.end_ns - sp.ts_ns)
        gpu = k.device if k and k.device >= 0 else -1
        yield Event(Kind.COLLECTIVE_BEGIN, t0, 0, tk, step, rt.pid, tid, gpu, nbytes, payload)
        yield Event(Kind.COLLECTIVE_END, t0 + d, d, tk, step, rt.pid, tid, gpu, nbytes, dict(payload))


def _assign_seqs(rt: RankTrace, pairs: list) -> list[tuple[str, int]]:
    """(pg, coll_seq) per pair; sets ``rt.stats.seq_source`` to "trace", "et" or "order"."""
    st = rt.stats
    spans = [sp for sp, _ in pairs]
    if spans and all(sp is not None and sp.seq is not None for sp in spans):
        st.seq_source = "trace"
        return [(sp.pg, sp.seq) for sp in spans]
    if rt.et is not None:
        et_ops = [normalize_op(c.op) for c in rt.et.collectives]
        tr_ops = [sp.op if sp else None for sp in spans]
        if et_ops == tr_ops:
            st.seq_source = "et"
            return [(sp.pg if sp.pg != "0" else c.pg, c.seq) for sp, c in zip(spans, rt.et.collectives)]
        st.notes.append(
            f"execution trace {rt.et.path.name} lists {len(et_ops)} collectives that do not match "
            f"the {len(tr_ops)} of the Kineto trace in order; sequence numbers by order instead"
        )
    st.seq_source = "order"
    counters: Counter = Counter()
    out = []
    for sp, _ in pairs:
        pg = sp.pg if sp else "0"
        out.append((pg, counters[pg]))
        counters[pg] += 1
    return out
