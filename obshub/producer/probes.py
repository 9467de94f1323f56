"""The probe catalogue and the inputs of the BPF event source.

- the catalogue: every probe obshub can attach, its layer, C file, attach points, and what the kernel (or
  the target's libraries) must offer for it;
- what the BPF event source (obshub/producer/loader.py ``BpfEventSource``, an
  :class:`producer.source.EventSource`) is given and reports: :class:`ProbeStatus`, :class:`Target`,
  :class:`ProbeOptions`;
- the look-ups that decide whether an attach point exists here (tracefs formats, ELF symbols, USDT notes)
  and which processes a target names (cgroup.procs, cgroup v2 ids, threads, TCP ports, mapped libraries).

The loader (obshub/producer/loader.py) compiles and attaches; nothing here loads BPF.

Shapes
------
- :data:`PROBES`: tuple of :class:`Probe`; a probe's ``id`` indexes the in-kernel lost-counter array and
  is passed to C as ``-D OBS_PROBE_<NAME>=<id>``.
- :data:`THRESHOLDS`: name -> (index, default, unit); ``-D OBS_THR_<NAME>=<index>``; values live in the BPF
  array ``thresholds`` and change at run time (``EventSource.set_threshold``).
- :data:`CUDA_SYMBOLS`: the CUDA/NCCL symbols, one uprobe pair each (``obs_cuda_entry_<i>``/``_return_<i>``).

Sources: tracepoint fields from ``/sys/kernel/tracing/events/<cat>/<event>/format``; ibv_* layouts
from rdma-core ``libibverbs/verbs.h``; CUDA/NCCL signatures from the CUDA runtime/driver API and
``nccl.h``.
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib.resources
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from obshub.core import usdt as usdt_contract
from obshub.core.schema import KIND_INFO, Kind, Layer

# the C sources bcc compiles: package data of obshub.bpf (a folder on disk in a checkout and in a wheel)
BPF_DIR = Path(str(importlib.resources.files("obshub.bpf")))

# ---------------------------------------------------------------------------------------------------------
# Attach points
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tracepoint:
    """A tracepoint ``category:event`` handled by C function ``fn``. ``fields`` are read at offsets the
    loader takes from tracefs (``-D TPOFF_<EVENT>_<FIELD>``); ``optional`` fields may be missing (their
    offset is then -1 and the C code skips them). ``macro`` overrides the ``<EVENT>`` part of the macro."""

    category: str
    event: str
    fn: str
    fields: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    macro: str = ""

    @property
    def name(self) -> str:
        return f"{self.category}:{self.event}"

    def offset_macro(self, fld: str) -> str:
        """The -D name carrying the byte offset of ``fld``."""
        return f"TPOFF_{(self.macro or self.event).upper()}_{fld.upper()}"


@dataclass(frozen=True)
class Usdt:
    """A USDT probe ``obshub:<probe>`` in the instrumentation library, handled by ``fn``."""

    probe: str
    fn: str
    #: attached when the library has the probe; the probe entry does not depend on it (a merged probe
    #: site that newer instrumentation fires instead of separate ones while a tracer is attached to it)
    optional: bool = False

    @property
    def name(self) -> str:
        return f"usdt:obshub:{self.probe}"


@dataclass(frozen=True)
class Uprobe:
    """A uprobe (``ret`` False) or uretprobe on ``symbol`` of the library ``lib`` (a key of
    ``ProbeOptions.libraries`` / :data:`LIBRARIES`), handled by ``fn``."""

    lib: str
    symbol: str
    fn: str
    ret: bool = False

    @property
    def name(self) -> str:
        return f"{'uretprobe' if self.ret else 'uprobe'}:{self.lib}:{self.symbol}"


AttachPoint = Tracepoint | Usdt | Uprobe


@dataclass(frozen=True)
class Probe:
    """One catalogue entry. ``attach`` lists its attach points: the probe is attached when all of them
    are. ``mechanism`` is tracepoint, usdt, uprobe or sysfs; ``requires`` says what the kernel must offer;
    ``cost`` what it costs when the target is busy."""

    id: int
    name: str
    layer: Layer
    c_file: str
    mechanism: str
    kinds: tuple[Kind, ...]
    attach: tuple[AttachPoint, ...]
    requires: str
    cost: str
    c_layer: str = ""  # OBS_LAYER_<c_layer> that compiles this probe's C file
    doc: str = ""

    @property
    def macro(self) -> str:
        return f"OBS_PROBE_{self.name.upper()}"


# ---------------------------------------------------------------------------------------------------------
# Thresholds (BPF array `thresholds`)
# ---------------------------------------------------------------------------------------------------------
THRESHOLDS: dict[str, tuple[int, int, str]] = {
    "runq_ns": (0, 1_000_000, "ns: SCHED_RUNQ emitted when run-queue latency >= this"),
    "offcpu_ns": (1, 10_000_000, "ns: SCHED_OFFCPU emitted when off-CPU time >= this"),
    "rdma_latency_ns": (2, 20_000, "ns: RDMA_CQ_DONE emitted when post->completion latency > this"),
    "page_order": (3, 3, "order: allocations of order >= this are counted (MEM_STEP_SUM)"),
    "reclaim_ns": (
        4,
        1_000_000,
        "ns: MEM_RECLAIM emitted when the reclaim stall >= this (shorter ones are summed in MEM_STEP_SUM)",
    ),
    "compaction_ns": (
        5,
        1_000_000,
        "ns: MEM_COMPACTION emitted when the compaction stall >= this (shorter ones are summed in MEM_STEP_SUM)",
    ),
    "cuda_ns": (6, 0, "ns: CUDA/NCCL call events emitted when the call time >= this"),
    "rtt_interval_ns": (7, 100_000_000, "ns: at most one TCP_RTT sample per socket per interval"),
    "page_order_single": (
        8,
        11,
        "order: a single PAGE_ALLOC for allocations of order >= this (the rest is "
        "counted in MEM_STEP_SUM; 11 = never on x86-64)",
    ),
    "cuda_launch_ns": (
        9,
        1_000_000,
        "ns: a single CUDA_LAUNCH when the launch call takes >= this (the rest is summed in CUDA_STEP_SUM)",
    ),
    "sched_singles": (
        10,
        4,
        "count: at most this many SCHED_RUNQ/SCHED_OFFCPU records per process and step "
        "(the rest is only in SCHED_STEP_SUM)",
    ),
    "page_may_block": (
        11,
        1,
        "0/1: 1 = count (and send alone) only the page allocations that may enter direct reclaim "
        "(gfp_flags has __GFP_DIRECT_RECLAIM: the ones that can stall the thread); 0 = every allocation "
        "of the orders above",
    ),
    "queue_ns": (
        12,
        100_000_000,
        "ns: TCP_QUEUE sent when a watched socket's segment waited this long in its host's egress qdisc "
        "(at most one per socket per rtt_interval_ns, carrying the longest wait since the previous)",
    ),
}

#: ``__GFP_DIRECT_RECLAIM`` where the kernel's print fmt of kmem:mm_page_alloc does not name it (bit 10
#: since Linux 4.4, include/linux/gfp_types.h)
GFP_DIRECT_RECLAIM_DEFAULT = 0x400

# ---------------------------------------------------------------------------------------------------------
# CUDA / NCCL symbols. mode: how `value` is computed (obshub/bpf/cuda.c OBS_VAL_*): 0 none, 1 argument `arg`,
# 2 dim3 by value at argument `arg` (x|y<<32 in one register, z in the next), 3 product of args arg..arg+2.
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CudaSymbol:
    """A CUDA/NCCL function watched with an entry+return uprobe pair."""

    lib: str
    symbol: str
    kind: Kind
    mode: int = 0
    arg: int = 0


CUDA_SYMBOLS: tuple[CudaSymbol, ...] = (
    CudaSymbol("cudart", "cudaLaunchKernel", Kind.CUDA_LAUNCH, 2, 2),  # (func, dim3 grid, dim3 block, ...)
    CudaSymbol("cudart", "cudaMemcpy", Kind.CUDA_MEMCPY, 1, 3),  # (dst, src, count, kind)
    CudaSymbol("cudart", "cudaMemcpyAsync", Kind.CUDA_MEMCPY, 1, 3),
    CudaSymbol("cudart", "cudaDeviceSynchronize", Kind.CUDA_SYNC),
    CudaSymbol("cudart", "cudaStreamSynchronize", Kind.CUDA_SYNC),
    CudaSymbol("cuda", "cuLaunchKernel", Kind.CUDA_LAUNCH, 3, 2),  # (f, gridX, gridY, gridZ, ...)
    CudaSymbol("cuda", "cuMemcpy", Kind.CUDA_MEMCPY, 1, 3),  # (dst, src, bytes)
    CudaSymbol("cuda", "cuMemcpyAsync", Kind.CUDA_MEMCPY, 1, 3),
    CudaSymbol("cuda", "cuMemcpyHtoD_v2", Kind.CUDA_MEMCPY, 1, 3),
    CudaSymbol("cuda", "cuMemcpyDtoH_v2", Kind.CUDA_MEMCPY, 1, 3),
    CudaSymbol("cuda", "cuCtxSynchronize", Kind.CUDA_SYNC),
    CudaSymbol("cuda", "cuStreamSynchronize", Kind.CUDA_SYNC),
    CudaSymbol("nccl", "ncclAllReduce", Kind.NCCL_COLL, 1, 3),  # (send, recv, count, ...)
    CudaSymbol("nccl", "ncclAllGather", Kind.NCCL_COLL, 1, 3),
    CudaSymbol("nccl", "ncclReduceScatter", Kind.NCCL_COLL, 1, 3),
    CudaSymbol("nccl", "ncclBroadcast", Kind.NCCL_COLL, 1, 3),
    CudaSymbol("nccl", "ncclGroupEnd", Kind.NCCL_COLL),
)
CUDA_MAX_SYMBOLS = 32  # obs_cuda_entry_0.._31 in obshub/bpf/cuda.c

#: the deep-dive tier: probes compiled with the rest but not attached at start; the agent attaches them on
#: request for a number of steps and detaches them after (``BpfEventSource.deep_dive_on/off``, ``obshub
#: deep-dive --host H``). The per-launch uprobe pair costs ~0.9-5 µs per kernel launch (bench/cuda_calls.py):
#: 9-50 ms of a 1 s step at 10,000 launches, so it is off unless a host is suspect (docs/ARCHITECTURE.md).
#: The NCCL collective pairs too (issue #34: ~1.1-1.9 µs per collective, 0.55-0.95 ms of a step at 500):
#: obshub's c10d collective kernel reports every collective issued through torch.distributed (COLLECTIVE_
#: BEGIN/END, one trap); what only the NCCL uprobes saw (NCCL calls made outside c10d, the enqueue time of
#: each NCCL call) is seen during a deep dive only
NCCL_DEEP_DIVE_PROBES: tuple[str, ...] = tuple(f"cuda_{s.symbol}" for s in CUDA_SYMBOLS if s.lib == "nccl")
DEEP_DIVE_PROBES: tuple[str, ...] = ("cuda_cudaLaunchKernel", "cuda_cuLaunchKernel", *NCCL_DEEP_DIVE_PROBES)

# Library file name patterns searched in the target's mapped files and in the library directories.
LIBRARIES: dict[str, tuple[str, ...]] = {
    "cudart": ("libcudart.so*",),
    "cuda": ("libcuda.so*",),
    "nccl": ("libnccl.so*",),
    "verbs": ("libibverbs.so*",),
}

# ---------------------------------------------------------------------------------------------------------
# The catalogue
# ---------------------------------------------------------------------------------------------------------
_TP_SCHED_COST = "one hash lookup per context switch system-wide; a map update per watched switch"


def _build() -> tuple[Probe, ...]:
    P = []

    def add(name, layer, c_file, mech, kinds, attach, requires, cost, c_layer, doc=""):
        P.append(Probe(len(P), name, layer, c_file, mech, tuple(kinds), tuple(attach), requires, cost, c_layer, doc))

    usdt_req = "uprobes (CONFIG_UPROBE_EVENTS), the instrumentation library built with sys/sdt.h"
    add(
        "pytorch_register",
        Layer.PYTORCH,
        "pytorch.c",
        "usdt",
        [Kind.REGISTER],
        [Usdt("register", "obs_usdt_register"), Usdt("caught", "obs_usdt_caught", optional=True)],
        usdt_req,
        "once per process (caught: once per exception the instrumentation caught)",
        "PYTORCH",
    )
    add(
        "pytorch_tracekey",
        Layer.PYTORCH,
        "pytorch.c",
        "usdt",
        [],
        [Usdt("tracekey", "obs_usdt_tracekey")],
        usdt_req,
        "one map update per TraceKey change",
        "PYTORCH",
        "maintains tid -> (TraceKey, step); emits nothing",
    )
    add(
        "pytorch_step",
        Layer.PYTORCH,
        "pytorch.c",
        "usdt",
        [Kind.STEP_BEGIN, Kind.STEP_END],
        [
            Usdt("step_begin", "obs_usdt_step_begin"),
            Usdt("step_end", "obs_usdt_step_end"),
            Usdt("step_next", "obs_usdt_step_next", optional=True),
        ],
        usdt_req,
        "two events per step",
        "PYTORCH",
    )
    add(
        "pytorch_phase",
        Layer.PYTORCH,
        "pytorch.c",
        "usdt",
        [Kind.PHASE],
        [
            Usdt("phase_begin", "obs_usdt_phase_begin"),
            Usdt("phase_end", "obs_usdt_phase_end"),
            Usdt("phase_next", "obs_usdt_phase_next", optional=True),
        ],
        usdt_req,
        "one event per phase",
        "PYTORCH",
    )
    add(
        "pytorch_collective",
        Layer.PYTORCH,
        "pytorch.c",
        "usdt",
        [Kind.COLLECTIVE_BEGIN, Kind.COLLECTIVE_END],
        [
            Usdt("coll_begin", "obs_usdt_coll_begin"),
            Usdt("coll_end", "obs_usdt_coll_end"),
            Usdt("coll", "obs_usdt_coll", optional=True),
            Usdt("coll_late", "obs_usdt_coll_late", optional=True),
        ],
        usdt_req,
        "two events per collective: no trap while the collective ring is read, else one (coll), three (Python kernel)",
        "PYTORCH",
    )
    add(
        "sched",
        Layer.SCHED,
        "sched.c",
        "tracepoint",
        [Kind.SCHED_RUNQ, Kind.SCHED_OFFCPU, Kind.SCHED_STEP_SUM],
        [
            Tracepoint("sched", "sched_switch", "obs_sched_switch", ("prev_pid", "prev_state", "next_pid")),
            Tracepoint("sched", "sched_wakeup", "obs_sched_wakeup", ("pid",)),
            Tracepoint("sched", "sched_wakeup_new", "obs_sched_wakeup_new", ("pid",)),
            Tracepoint("sched", "sched_process_exit", "obs_sched_exit"),
        ],
        "tracepoints sched:sched_switch, sched_wakeup, sched_wakeup_new, sched_process_exit",
        _TP_SCHED_COST,
        "SCHED",
    )
    add(
        "mem_reclaim",
        Layer.MEMORY,
        "memory.c",
        "tracepoint",
        [Kind.MEM_RECLAIM],
        [
            Tracepoint("vmscan", "mm_vmscan_direct_reclaim_begin", "obs_reclaim_begin"),
            Tracepoint("vmscan", "mm_vmscan_direct_reclaim_end", "obs_reclaim_end", ("nr_reclaimed",)),
        ],
        "tracepoints vmscan:mm_vmscan_direct_reclaim_begin/_end",
        "per reclaim (rare)",
        "MEMORY",
    )
    add(
        "mem_memcg_reclaim",
        Layer.MEMORY,
        "memory.c",
        "tracepoint",
        [Kind.MEM_RECLAIM],
        [
            Tracepoint("vmscan", "mm_vmscan_memcg_reclaim_begin", "obs_memcg_reclaim_begin"),
            Tracepoint("vmscan", "mm_vmscan_memcg_reclaim_end", "obs_memcg_reclaim_end", ("nr_reclaimed",)),
        ],
        "tracepoints vmscan:mm_vmscan_memcg_reclaim_begin/_end",
        "per cgroup-limit reclaim",
        "MEMORY",
        "reclaim stalls of tasks whose memory cgroup hit its limit (payload reclaim=memcg)",
    )
    add(
        "mem_compaction",
        Layer.MEMORY,
        "memory.c",
        "tracepoint",
        [Kind.MEM_COMPACTION],
        [
            Tracepoint("compaction", "mm_compaction_begin", "obs_compaction_begin"),
            Tracepoint("compaction", "mm_compaction_end", "obs_compaction_end", ("status",)),
        ],
        "tracepoints compaction:mm_compaction_begin/_end (CONFIG_COMPACTION)",
        "per compaction (rare)",
        "MEMORY",
    )
    add(
        "mem_page_alloc",
        Layer.MEMORY,
        "memory.c",
        "tracepoint",
        [Kind.MEM_STEP_SUM, Kind.PAGE_ALLOC],
        [Tracepoint("kmem", "mm_page_alloc", "obs_page_alloc", ("order", "gfp_flags"))],
        "tracepoint kmem:mm_page_alloc",
        "one field read per page allocation system-wide (hot path); a map update per watched one",
        "MEMORY",
        "counts allocations per process and step in the kernel "
        "(MEM_STEP_SUM at step_end, with the short reclaim/compaction stalls)",
    )
    add(
        "net_sock_state",
        Layer.NETWORK,
        "net.c",
        "tracepoint",
        [],
        [
            Tracepoint(
                "sock",
                "inet_sock_set_state",
                "obs_sock_set_state",
                ("skaddr", "oldstate", "newstate", "sport", "protocol"),
            )
        ],
        "tracepoint sock:inet_sock_set_state (4.16+)",
        "per TCP state change",
        "NET",
        "attributes TCP sockets to watched processes; emits nothing",
    )
    add(
        "net_retransmit",
        Layer.NETWORK,
        "net.c",
        "tracepoint",
        [Kind.TCP_RETRANSMIT],
        [
            Tracepoint(
                "tcp",
                "tcp_retransmit_skb",
                "obs_tcp_retransmit",
                ("skaddr", "sport", "dport", "family", "state", "saddr", "daddr", "saddr_v6", "daddr_v6"),
            )
        ],
        "tracepoint tcp:tcp_retransmit_skb",
        "per retransmitted segment",
        "NET",
    )
    add(
        "net_rtt",
        Layer.NETWORK,
        "net.c",
        "tracepoint",
        [Kind.TCP_RTT],
        [Tracepoint("tcp", "tcp_probe", "obs_tcp_probe", ("skaddr", "sport", "dport", "srtt", "saddr", "daddr"))],
        "tracepoint tcp:tcp_probe with skaddr (5.x+)",
        "one lookup per received ACK",
        "NET",
    )
    add(
        "net_drop",
        Layer.NETWORK,
        "net.c",
        "tracepoint",
        [Kind.SKB_DROP],
        [
            Tracepoint(
                "skb",
                "kfree_skb",
                "obs_kfree_skb",
                ("skbaddr", "location", "protocol"),
                ("reason", "rx_sk"),
                macro="kfree_skb",
            )
        ],
        "tracepoint skb:kfree_skb (reason field 5.17+, rx_sk 6.11+); reads sk_buff's sk and dev (offsets 24, 16), "
        "the device's and the task's network namespace (offsets from /sys/kernel/btf/vmlinux)",
        "per dropped skb system-wide: one socks look-up (rx_sk, else skb->sk); without a socket in a watched "
        "process, four pointer reads",
        "NET",
    )
    add(
        "net_queue",
        Layer.NETWORK,
        "net.c",
        "tracepoint",
        [Kind.TCP_QUEUE],
        [Tracepoint("qdisc", "qdisc_dequeue", "obs_qdisc_dequeue", ("skbaddr", "ifindex"))],
        "tracepoint qdisc:qdisc_dequeue (4.20+); reads sk_buff's sk and tstamp (offsets 24 and 32)",
        "per skb dequeued from a qdisc system-wide (per GSO skb where the NIC segments; nothing on a "
        "noqueue device such as a veth): two field reads and one socks look-up",
        "NET",
        "a watched socket's segment held in its own host's egress queue (sojourn = now - skb->tstamp)",
    )
    add(
        "pcie_aer",
        Layer.PCIE,
        "pcie.c",
        "tracepoint",
        [Kind.PCIE_AER],
        [Tracepoint("ras", "aer_event", "obs_aer_event", ("dev_name", "status", "severity"), ("tlp_header_valid",))],
        "tracepoint ras:aer_event (CONFIG_PCIEAER + CONFIG_RAS)",
        "per AER error (rare)",
        "PCIE",
    )
    for sym in CUDA_SYMBOLS:
        i = sum(1 for p in P if p.mechanism == "uprobe" and p.c_layer == "CUDA")
        layer = Layer.NCCL if sym.lib == "nccl" else Layer.CUDA
        kinds = [sym.kind, Kind.CUDA_STEP_SUM] if sym.kind == Kind.CUDA_LAUNCH else [sym.kind]
        add(
            f"cuda_{sym.symbol}",
            layer,
            "cuda.c",
            "uprobe",
            kinds,
            [
                Uprobe(sym.lib, sym.symbol, f"obs_cuda_entry_{i}"),
                Uprobe(sym.lib, sym.symbol, f"obs_cuda_return_{i}", ret=True),
            ],
            f"uprobes; {LIBRARIES[sym.lib][0]} in the target or a library dir",
            (
                "deep-dive tier (not attached by default): two traps (~0.9-5 us) per launch while a deep dive runs"
                if sym.kind == Kind.CUDA_LAUNCH
                else "deep-dive tier (not attached by default): two traps (~1.1-1.9 us) per call while a deep dive runs"
                if sym.lib == "nccl"
                else "two traps (~0.9-5 us) per call (bench/cuda_calls.py)"
            ),
            "CUDA",
        )
    add(
        "nic_verbs",
        Layer.NIC,
        "nic.c",
        "uprobe",
        [Kind.RDMA_CQ_DONE],
        [
            Uprobe("verbs", "ibv_post_send", "obs_verbs_post"),
            Uprobe("verbs", "ibv_poll_cq", "obs_verbs_poll_entry"),
            Uprobe("verbs", "ibv_poll_cq", "obs_verbs_poll_return", ret=True),
        ],
        "uprobes; a verbs library exporting post/poll functions (see ProbeOptions.verbs_symbols)",
        "one trap per post, two per poll",
        "NIC",
    )
    add(
        "sysfs_nic",
        Layer.NIC,
        "obshub/producer/sysfs_poller.py",
        "sysfs",
        [Kind.NIC_COUNTER],
        [],
        "/sys/class/infiniband/<dev>/ports/<n>/{counters,hw_counters}",
        "one read per file per interval",
        "",
    )
    add(
        "sysfs_pcie",
        Layer.PCIE,
        "obshub/producer/sysfs_poller.py",
        "sysfs",
        [Kind.PCIE_LINK, Kind.PCIE_AER],
        [],
        "/sys/bus/pci/devices/<BDF>/{current,max}_link_{speed,width}, aer_dev_correctable",
        "one read per file per interval",
        "",
    )
    return tuple(P)


def _check_layers(probes: tuple[Probe, ...]) -> tuple[Probe, ...]:
    """A probe belongs to the layer of the kinds it emits (the kinds table ``schema.KIND_INFO``); raises
    ValueError naming the probe and the kinds of another layer."""
    for p in probes:
        other = [k.name for k in p.kinds if KIND_INFO[k].layer != p.layer]
        if other:
            raise ValueError(f"probe {p.name} ({p.layer.value}) emits kinds of another layer: {', '.join(other)}")
    return probes


PROBES: tuple[Probe, ...] = _check_layers(_build())
PROBES_BY_NAME: dict[str, Probe] = {p.name: p for p in PROBES}
CUDA_PROBE_BASE = next(p.id for p in PROBES if p.c_layer == "CUDA")
C_LAYERS = ("PYTORCH", "SCHED", "MEMORY", "NET", "PCIE", "CUDA", "NIC")

# ---------------------------------------------------------------------------------------------------------
# Look-ups: does this kernel / library offer an attach point?
# ---------------------------------------------------------------------------------------------------------


@dataclass
class TracepointFormat:
    """A tracepoint's format from tracefs: field name -> (offset, size) in bytes, the symbolic value names
    found in its print fmt (``__print_symbolic``), e.g. skb drop reasons, and the single-bit flags it
    names (``__print_flags``: name -> bit value), e.g. ``__GFP_DIRECT_RECLAIM`` -> 0x400."""

    fields: dict[str, tuple[int, int]] = field(default_factory=dict)
    symbols: dict[int, str] = field(default_factory=dict)
    flags: dict[str, int] = field(default_factory=dict)


_FIELD_RE = re.compile(r"field:(?P<decl>[^;]+);\s*offset:(?P<off>\d+);\s*size:(?P<size>\d+);")
_SYM_RE = re.compile(r"\{\s*(-?\d+|0x[0-9a-fA-F]+)\s*,\s*\"([A-Za-z0-9_]+)\"\s*\}")
# a flag of __print_flags: {<expression of one bit>, "NAME"}, the bit written as a shift (6.x:
# ((1UL)) << (10)) or as a constant (older kernels: 0x400u)
_FLAG_RE = re.compile(r"\{([^{}]*?),\s*\"([A-Za-z0-9_]+)\"\s*\}")
_SHIFT_RE = re.compile(
    r"^[\s(]*(?:\(\s*unsigned long\s*\)|\(\s*gfp_t\s*\)|\(\s*__force gfp_t\s*\)|[\s(])*1UL[\s)]*<<\s*\(?\s*(\d+)\s*\)*$"
)
_CONST_RE = re.compile(
    r"^[\s(]*(?:\(\s*unsigned long\s*\)|\(\s*gfp_t\s*\)|\(\s*__force gfp_t\s*\)|[\s(])*(0x[0-9a-fA-F]+|\d+)[uUlL]*[\s)]*$"
)


def parse_format(text: str) -> TracepointFormat:
    """Parse the text of a tracefs ``format`` file. Field names drop array suffixes and ``__data_loc``
    prefixes (``char dev_name[]`` -> ``dev_name``)."""
    out = TracepointFormat()
    for m in _FIELD_RE.finditer(text):
        decl = m.group("decl").strip()
        name = re.sub(r"\[.*\]$", "", decl.split()[-1]).lstrip("*")
        out.fields[name] = (int(m.group("off")), int(m.group("size")))
    fmt = text.split("print fmt:", 1)[-1]
    for num, sym in _SYM_RE.findall(fmt):
        out.symbols.setdefault(int(num, 0), sym)
    for expr, name in _FLAG_RE.findall(fmt):
        m = _SHIFT_RE.match(expr)
        if m:
            out.flags.setdefault(name, 1 << int(m.group(1)))
            continue
        m = _CONST_RE.match(expr)
        if m and (v := int(m.group(1), 0)) and v & (v - 1) == 0:  # one bit set
            out.flags.setdefault(name, v)
    return out


@lru_cache(maxsize=None)
def tracepoint_format(tracefs: Path, category: str, event: str) -> TracepointFormat | None:
    """The format of ``category:event`` under ``tracefs``, or None when the kernel lacks it."""
    p = tracefs / "events" / category / event / "format"
    try:
        return parse_format(p.read_text())
    except OSError:
        return None


def probe(name: str) -> Probe:
    """The catalogue entry ``name``. Raises KeyError naming the known probes."""
    try:
        return PROBES_BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown probe {name!r}; known: {', '.join(PROBES_BY_NAME)}") from None


# ---------------------------------------------------------------------------------------------------------
# What the BPF event source is given and reports
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeStatus:
    """One row of the probe table: ``attached`` or not, and why not (``reason``, '' when attached)."""

    name: str
    layer: str
    attached: bool
    reason: str


@dataclass
class Target:
    """Which processes to watch: the processes of ``cgroup`` (a cgroup directory, v1 or v2; its
    ``cgroup.procs`` is re-read while running), ``pids``, and with ``registered`` every process that fires
    the ``register`` USDT probe (added in the kernel, with its threads). The union of the three. When none
    is given, every process is watched."""

    cgroup: Path | None = None
    pids: set[int] | None = None
    registered: bool = False

    @property
    def watch_all(self) -> bool:
        return self.cgroup is None and not self.pids and not self.registered


def default_lib_dirs() -> tuple[Path, ...]:
    """Library directories searched when the target has not mapped a library (yet): the NVIDIA wheels
    next to this interpreter (``site-packages/nvidia/*/lib``) and the system's multiarch lib dir."""
    import sysconfig

    nvidia = Path(sysconfig.get_paths()["purelib"]) / "nvidia"
    dirs = sorted(p for p in nvidia.glob("*/lib") if p.is_dir())
    return tuple(dirs) + (Path("/usr/lib/x86_64-linux-gnu"),)


@dataclass
class ProbeOptions:
    """How the probes are built and run.

    ``probes``: names or layer names to enable (empty = all); ``usdt_library``: the .so with the obshub
    USDT probes (default ``obshub.instrument.usdt.library_path()`` when built); ``lib_dirs``: where CUDA/NCCL/verbs
    libraries are looked for when the target has not mapped them; ``verbs_library`` and
    ``verbs_symbols`` (post, poll): the verbs data path to probe; ``thresholds``: overrides of
    :data:`THRESHOLDS`; ``ringbuf_pages``: ring buffer size in 4 KiB pages (a power of two; default 16384 = 64 MiB,
    about 365,000 records: 365 ms of a 1,000,000 events/s burst while the agent's thread waits for a CPU;
    16 MiB lost events at that rate on a busy 2-core machine, bench/agent_throughput.py);
    ``deep_dive``: probes compiled but attached only on request (:data:`DEEP_DIVE_PROBES` by default;
    ``()`` attaches everything at start);
    ``sysfs_root``/``sysfs_interval_ms``: the sysfs poller; ``target_refresh_ms``: how often the cgroup's
    processes are re-read; ``follow_scan_ms``: how often processes are scanned for copies of the
    instrumentation and probed libraries in other mount namespaces or paths (obshub/producer/discovery.py; 0 =
    never); ``coll_ring``: drain the ranks' collective rings (obshub/producer/collring.py: no trap per
    collective; False: the ``coll`` trap carries every collective); ``debug_ebpf``: print the final C and flags
    to stderr.
    Raises :class:`producer.errors.ProbeError` for an invalid value."""

    probes: tuple[str, ...] = ()
    usdt_library: Path | None = None
    lib_dirs: tuple[Path, ...] = field(default_factory=default_lib_dirs)
    verbs_library: Path | None = None
    verbs_symbols: tuple[str, str] = ("ibv_post_send", "ibv_poll_cq")
    thresholds: dict[str, int] = field(default_factory=dict)
    ringbuf_pages: int = 16384
    deep_dive: tuple[str, ...] = DEEP_DIVE_PROBES
    sysfs: bool = True
    sysfs_root: Path = Path("/")
    sysfs_interval_ms: int = 1000
    target_refresh_ms: int = 500
    follow_scan_ms: int = 1000
    coll_ring: bool = True
    debug_ebpf: bool = False

    def __post_init__(self):
        from obshub.producer.errors import ProbeError

        n = self.ringbuf_pages
        if n < 1 or n & (n - 1):
            raise ProbeError(f"ringbuf_pages={n} is not a power of two", hint="use 1, 2, 4, ... 65536")
        for name in self.deep_dive:
            if name not in PROBES_BY_NAME:
                raise ProbeError(f"unknown deep-dive probe {name!r}", hint="`obshub probes` lists the probe names")
        for name in self.thresholds:
            if name not in THRESHOLDS:
                raise ProbeError(f"unknown threshold {name!r}", hint=f"known: {', '.join(THRESHOLDS)}")

    def resolved_usdt_library(self) -> Path | None:
        """The USDT library: the configured one, else the built ``obshub.instrument._usdt`` when it is
        on disk (:func:`obshub.core.usdt.library_path`), else None."""
        if self.usdt_library is not None:
            return Path(self.usdt_library)
        return usdt_contract.library_path()

    def verbs_symbol(self, ap: Uprobe) -> str:
        """The configured symbol for a catalogue verbs attach point (post or poll)."""
        return self.verbs_symbols[0] if ap.symbol == "ibv_post_send" else self.verbs_symbols[1]


# ---------------------------------------------------------------------------------------------------------
# Target resolution and library look-ups
# ---------------------------------------------------------------------------------------------------------


def cgroup_procs(cgroup: Path) -> set[int]:
    """The pids in ``cgroup`` (its ``cgroup.procs``), including those of its child cgroups. Raises
    :class:`producer.errors.TargetError` when the cgroup does not exist."""
    from obshub.producer.errors import TargetError

    cg = Path(cgroup)
    if not cg.is_absolute():
        cg = Path("/sys/fs/cgroup/unified") / cg
    if not (cg / "cgroup.procs").exists():
        raise TargetError(
            f"cgroup {cgroup} not found (no {cg / 'cgroup.procs'})",
            hint="give the cgroup directory, e.g. /sys/fs/cgroup/cpu/myjob (v1) or /sys/fs/cgroup/unified/myjob (v2)",
        )
    pids: set[int] = set()
    for procs in cg.rglob("cgroup.procs"):
        with contextlib.suppress(OSError):
            pids.update(int(x) for x in procs.read_text().split())
    return pids


def cgroup_v2_ids(cgroup: Path) -> set[int]:
    """Cgroup ids (``bpf_get_current_cgroup_id``: the kernfs inode number) of a cgroup v2 directory and
    its descendants; empty for a v1 cgroup (no ``cgroup.controllers``) or one that does not exist."""
    cg = Path(cgroup)
    if not cg.is_absolute():
        cg = Path("/sys/fs/cgroup/unified") / cg
    if not (cg / "cgroup.controllers").exists():
        return set()
    ids = set()
    for d in [cg, *(p for p in cg.rglob("*") if p.is_dir())]:
        with contextlib.suppress(OSError):
            ids.add(os.stat(d).st_ino)
    return ids


def resolve_pids(target: Target) -> set[int]:
    """The live pids the target names now (registered processes are added in the kernel, not here)."""
    pids = {p for p in (target.pids or ()) if Path(f"/proc/{p}").exists()}
    if target.cgroup is not None:
        from obshub.producer.errors import TargetError

        with contextlib.suppress(TargetError):
            pids |= cgroup_procs(target.cgroup)
    return pids


def threads(pid: int) -> list[int]:
    """Thread ids of ``pid`` (empty when it is gone)."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def tcp_local_ports(pid: int) -> set[int]:
    """Local ports of the TCP sockets ``pid`` holds now (from /proc/<pid>/fd and net/tcp{,6})."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                cols = line.split()
                if len(cols) > 9 and cols[9] in inodes:
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def mapped_files(pid: int) -> set[str]:
    """Paths of the files ``pid`` has mapped (its /proc/<pid>/maps)."""
    out = set()
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/"):
                out.add(parts[5].strip())
    return out


def find_libraries(options: ProbeOptions, pids: set[int]) -> dict[str, Path]:
    """lib key (:data:`LIBRARIES`) -> path: first what the target processes have mapped (a process in
    another mount namespace: through ``/proc/<pid>/root``), then the first match in ``options.lib_dirs``;
    ``options.verbs_library`` wins for ``verbs``."""
    from obshub.producer.discovery import agent_path, mount_ns

    own = mount_ns()
    # a path as the process sees it -> where the agent opens it (through /proc/<pid>/root in a container)
    mapped = {m: agent_path(p, m, own) for p in sorted(pids or ()) for m in mapped_files(p)}
    out: dict[str, Path] = {}
    for key, patterns in LIBRARIES.items():
        if key == "verbs" and options.verbs_library is not None:
            out[key] = Path(options.verbs_library)
            continue
        hit = sorted(m for m in mapped if any(fnmatch.fnmatch(os.path.basename(m), pat) for pat in patterns))
        if hit:
            out[key] = mapped[hit[0]]
            continue
        for d in options.lib_dirs:
            found = sorted(q for pat in patterns for q in Path(d).glob(pat) if q.is_file())
            if found:
                out[key] = found[0]
                break
    return out


def has_symbol(lib: Path, symbol: str) -> bool:
    """Does ``lib`` define ``symbol`` (dynamic or static symbol table, as bcc resolves it)?"""
    from bcc import BPF

    try:
        BPF._check_path_symbol(str(lib).encode(), symbol.encode(), None, -1)
        return True
    except Exception:  # noqa: BLE001 - bcc raises bare Exception for a symbol it cannot resolve: that is the answer
        return False


def usdt_probe_names(lib: Path) -> set[str]:
    """Names of the ``obshub`` provider's USDT probes in ``lib`` (empty when it has none)."""
    from bcc import USDT

    try:
        return {
            p.name.decode() if isinstance(p.name, bytes) else p.name
            for p in USDT(path=str(lib)).enumerate_probes()
            if (p.provider.decode() if isinstance(p.provider, bytes) else p.provider) == "obshub"
        }
    except Exception:  # noqa: BLE001 - bcc raises bare Exception for a file without USDT notes: no probes
        return set()
