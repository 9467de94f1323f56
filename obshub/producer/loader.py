"""The bcc loader: plan which probes this machine offers, compile obshub/bpf/obshub.c with the layers needed,
attach each probe or skip it with the reason, keep the watched-process maps current, and read the ring
buffer. Implements the agent's :class:`producer.source.EventSource` as :class:`BpfEventSource`.

Steps (each failure says "Failed to ..." with the value that was wrong):

1. plan     - per probe: tracepoint in tracefs with its fields? library found, symbol in it? USDT probe
              in the instrumentation library? -> a :class:`~producer.probes.ProbeStatus` for the skipped;
2. compile  - bcc compiles obshub/bpf/obshub.c with ``-D`` flags (layers, probe ids, thresholds, tracefs field
              offsets, ring size). A layer that does not compile is skipped, the others are kept;
3. configure- thresholds, CUDA symbol table, watched processes (Target) into their maps;
4. attach   - every attach point; a probe whose attach fails is reported skipped with bcc's message;
5. poll     - drain the ring buffer in batches (``producer._ring``: its own mmap of the ring, records
              encoded to msgpack in C, the rest decoded by obshub/producer/reader.py), wait on its fd with a
              timeout when it is empty, refresh the target every ``target_refresh_ms``, poll sysfs
              counters every ``sysfs_interval_ms``, follow copies of the instrumentation and of the
              probed libraries that processes map elsewhere (another mount namespace, another
              install) every ``follow_scan_ms`` (:meth:`BpfEventSource.follow`);
6. close    - detach everything, free the maps.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import logging
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from obshub.core.schema import Event, Kind, Layer
from obshub.core.settings import Settings
from obshub.producer import btf, detach, discovery, kheaders
from obshub.producer import probes as cat
from obshub.producer.errors import ProbeError
from obshub.producer.probes import ProbeOptions, ProbeStatus, Target, Tracepoint, Uprobe, Usdt
from obshub.producer.reader import DECODE_ALL_TABLE, EVENT_SIZE, PACKED_TABLE, Decoder, packed_run
from obshub.producer.sysfs_poller import SysfsPoller

log = logging.getLogger("obshub.agent")


@dataclass(frozen=True)
class Followed:
    """A copy of the instrumentation library (``key`` "usdt") or of a probed library (a
    :data:`producer.probes.LIBRARIES` key) found mapped by process ``pid`` at ``path`` (in its mount
    namespace) and opened by the agent at ``host_path``: ``attached``, or not and ``reason``."""

    key: str
    pid: int
    path: str
    host_path: str
    attached: bool
    reason: str


class _Plan:
    """What will be compiled and attached: ``probes`` (attachable catalogue entries), ``skipped`` (name ->
    reason), ``libs`` (lib key -> path), ``usdt_probes`` (names present in the USDT library)."""

    def __init__(self):
        self.probes: list[cat.Probe] = []
        self.skipped: dict[str, str] = {}
        self.libs: dict[str, Path] = {}
        self.usdt_lib: Path | None = None
        self.usdt_probes: set[str] = set()
        self.tp_formats: dict[str, cat.TracepointFormat] = {}


def selected_probes(options: ProbeOptions) -> list[cat.Probe]:
    if not options.probes:
        return list(cat.PROBES)
    want = set(options.probes)
    unknown = want - set(cat.PROBES_BY_NAME) - {layer.value for layer in Layer}
    if unknown:
        raise ProbeError(
            f"Failed to select probes: unknown name(s) {sorted(unknown)}",
            hint="use layer names ("
            + ", ".join(sorted({p.layer.value for p in cat.PROBES}))
            + ") or probe names (`obshub probes` lists them)",
        )
    return [p for p in cat.PROBES if p.name in want or p.layer.value in want]


def plan(options: ProbeOptions, target: Target, tracefs: Path | None) -> _Plan:
    """Decide, without loading anything, which selected probes this machine offers (step 1)."""
    pl = _Plan()
    pids = cat.resolve_pids(target)
    pl.libs = cat.find_libraries(options, pids)
    pl.usdt_lib = options.resolved_usdt_library()
    if pl.usdt_lib is not None and pl.usdt_lib.exists():
        pl.usdt_probes = cat.usdt_probe_names(pl.usdt_lib)
    for p in selected_probes(options):
        reason = _missing(p, pl, tracefs, options)
        if reason:
            pl.skipped[p.name] = reason
        else:
            pl.probes.append(p)
    return pl


def _missing(p: cat.Probe, pl: _Plan, tracefs: Path | None, options: ProbeOptions) -> str:
    """Why probe ``p`` cannot attach here ('' when it can)."""
    if p.mechanism == "sysfs":
        return "" if options.sysfs else "sysfs polling disabled (ProbeOptions.sysfs=False)"
    for ap in p.attach:
        if isinstance(ap, Tracepoint):
            if tracefs is None:
                return "tracefs is not mounted (mount -t tracefs nodev /sys/kernel/tracing)"
            fmt = cat.tracepoint_format(tracefs, ap.category, ap.event)
            if fmt is None:
                return f"tracepoint {ap.name} not offered by kernel {os.uname().release}"
            lacking = [f for f in ap.fields if f not in fmt.fields]
            if lacking:
                return f"tracepoint {ap.name} lacks field(s) {', '.join(lacking)} on this kernel"
            pl.tp_formats[ap.name] = fmt
        elif isinstance(ap, Usdt):
            if pl.usdt_lib is None:
                return "no instrumentation library (obshub.instrument._usdt not built; set ProbeOptions.usdt_library)"
            if not pl.usdt_lib.exists():
                return f"instrumentation library {pl.usdt_lib} does not exist"
            if ap.probe not in pl.usdt_probes and not ap.optional:
                return f"USDT probe obshub:{ap.probe} not found in {pl.usdt_lib}"
        elif isinstance(ap, Uprobe):
            lib = pl.libs.get(ap.lib)
            if lib is None:
                dirs = [str(d) for d in options.lib_dirs]
                where = ", ".join(dirs) if len(dirs) <= 2 else f"{dirs[0]} and {len(dirs) - 1} more lib_dirs"
                where = where or "(no library dirs)"
                return f"library {cat.LIBRARIES[ap.lib][0]} not mapped by the target nor found in {where}"
            sym = options.verbs_symbol(ap) if ap.lib == "verbs" else ap.symbol
            if not cat.has_symbol(lib, sym):
                return f"symbol {sym} not found in {lib}"
    return ""


def cflags(pl: _Plan, options: ProbeOptions, target: Target, layers: set[str]) -> list[str]:
    """The -D/-I flags bcc compiles obshub/bpf/obshub.c with (step 2). Every tracepoint field of the catalogue
    gets its tracefs offset, or -1 when this kernel lacks it."""
    flags = [
        f"-I{cat.BPF_DIR}",
        f"-DOBS_RINGBUF_PAGES={options.ringbuf_pages}",
        f"-DOBS_NPROBES={len(cat.PROBES)}",
        f"-DOBS_NTHRESHOLDS={len(cat.THRESHOLDS)}",
        f"-DOBS_PROBE_CUDA_BASE={cat.CUDA_PROBE_BASE}",
        f"-DOBS_CUDA_NSYMS={cat.CUDA_MAX_SYMBOLS}",
        f"-DOBS_PID_LIMIT={_pid_limit()}",
        f"-DOBS_NCPUS={os.cpu_count() or 1}",
    ]
    flags += [f"-DOBS_LAYER_{layer}" for layer in sorted(layers)]
    flags += [f"-DOBS_ATTACHED_{p.name.upper()}" for p in pl.probes]
    flags += [f"-D{p.macro}={p.id}" for p in cat.PROBES]
    flags += [f"-DOBS_THR_{name.upper()}={idx}" for name, (idx, _d, _u) in cat.THRESHOLDS.items()]
    flags += [f"-DOBS_KIND_{k.name}={int(k)}" for k in Kind]
    for p in cat.PROBES:
        for ap in p.attach:
            if isinstance(ap, Tracepoint):
                fmt = pl.tp_formats.get(ap.name)
                for fld in ap.fields + ap.optional:
                    off = fmt.fields[fld][0] if fmt and fld in fmt.fields else -1
                    flags.append(f"-D{ap.offset_macro(fld)}={off}")
    if "net_drop" in {p.name for p in pl.probes}:
        offs = btf.kernel_offsets()
        for key, macro in (
            ("task_nsproxy", "TASK_NSPROXY"),
            ("nsproxy_net", "NSPROXY_NET"),
            ("netdev_net", "NETDEV_NET"),
        ):
            flags.append(f"-DOBS_{macro}_OFF={offs.get(key, -1)}")
    if "sched" in {p.name for p in pl.probes}:  # sched.c's exit status (obs_note_exit)
        offs = btf.kernel_offsets()
        for key in ("task_exit_code", "task_signal", "signal_flags", "signal_group_exit_code"):
            flags.append(f"-DOBS_{key.upper()}_OFF={offs.get(key, -1)}")
    alloc = pl.tp_formats.get("kmem:mm_page_alloc")
    gfp = (alloc.flags if alloc else {}).get("__GFP_DIRECT_RECLAIM", cat.GFP_DIRECT_RECLAIM_DEFAULT)
    flags.append(f"-DOBS_GFP_DIRECT_RECLAIM={gfp:#x}")
    if target.watch_all:
        flags.append("-DOBS_WATCH_ALL")
    if target.cgroup is not None and cat.cgroup_v2_ids(target.cgroup):
        flags.append("-DOBS_WATCH_CGROUP_V2")
    if target.registered:
        flags.append("-DOBS_TARGET_REGISTERED")
    return sorted(set(flags), key=flags.index)


def render_source(flags: list[str]) -> str:
    """The final C text bcc compiles (local includes expanded once each) with the flags, for
    ``--ebpf`` debugging."""
    seen: set[str] = set()

    def expand(name: str) -> str:
        if name in seen:
            return f"// ({name} already included)"
        seen.add(name)
        out = []
        for line in (cat.BPF_DIR / name).read_text().splitlines():
            s = line.strip()
            if s.startswith('#include "') and s.endswith('"'):
                out += [f"// ---- {s[10:-1]} ----", expand(s[10:-1])]
            else:
                out.append(line)
        return "\n".join(out)

    return "// bcc cflags: " + " ".join(flags) + "\n" + expand("obshub.c")


class BpfEventSource:
    """The agent's event source: BPF probes of every layer plus the sysfs poller.

    ``BpfEventSource(settings, target, options)``; ``start()`` returns one ProbeStatus per catalogue
    probe selected (attached, or skipped with the reason) and never raises because a probe is missing;
    it raises :class:`ProbeError` only when nothing at all can be loaded (no BPF support, no privilege).
    ``poll(timeout_ms)`` returns decoded :class:`obshub.core.schema.Event` s. Not thread-safe: one thread
    polls.
    """

    def __init__(self, settings: Settings, target: Target, options: ProbeOptions | None = None):
        self.settings = settings
        self.target = target
        self.options = options or ProbeOptions()
        self._bpf = None
        # bcc's failures it caught and went on from, by where (attach, compile): obshub_agent_caught_errors
        # (the property `caught` adds the instrumentation's, from the kernel)
        self._caught: collections.Counter[str] = collections.Counter()
        self._inst_caught: collections.Counter[str] = collections.Counter()  # the last read of inst_caught
        self._statuses: list[ProbeStatus] = []
        self._attached: set[str] = set()
        self._pending: list[Event] = []
        self._registrations: list[dict] = []
        self._watched: set[int] = set()
        self._trickle = False  # the last drain took records without filling up (see _drain)
        self._full = False  # the last drain filled up (_DRAIN_MAX records)
        self._wake_fd = -1  # obshub/bpf/common.h wake_req: set by the poll before it waits (see _want_wake)
        self._wake_at = 0  # what wake_req was set to since the last signalled wakeup (0: nothing)
        self._lost: dict[str, int] | None = None  # lost() at the sum _lost_sum of the counters
        self._lost_sum = 0
        self._wake_key, self._wake_one = ctypes.c_uint32(0), ctypes.c_uint64(1)
        self._update_elem = None
        self._trickle_ms = 0  # the longest wait for trickling records: a quarter ring at their last rate
        self._last_drain = 0.0
        self._ring_records = 1  # records the ring holds (set at start)
        self._tids: dict[int, set[int]] = {}  # watched pid -> its threads already written to wtids
        self._next_refresh = 0.0
        self._sysfs: SysfsPoller | None = None
        self._decoder: Decoder | None = None
        self._ring = None
        self._coll = None  # producer.collring.CollRings: the ranks' collective rings (None: not read)
        self.detach_pid: int | None = None  # the child detaching the probes after close() (producer.detach)
        self._next_coll = 0.0
        self._usdt_text = ""  # the argument readers bcc generated for the USDT probes
        self._usdt_fns: list[tuple[str, str]] = []  # (probe, handler) enabled
        self._scanner: discovery.LibraryScanner | None = None
        self._next_follow = 0.0
        self.followed: list[Followed] = []
        self.libs: dict[str, Path] = {}  # lib key -> the path the uprobes were attached to at start
        self.source_text = ""
        self.flags: list[str] = []
        self._deep: dict[str, list[tuple[bytes, bytes, bytes, bool]]] = {}  # deep-dive probe -> its uprobes
        self._deep_on = False
        self._deep_gen = 0  # the deep dive's window number in deep_gate (0: no budget)
        self.extra_source = ""  # C appended to obshub/bpf/obshub.c (benchmarks' own handlers; they see common.h)

    # -- start: plan, compile, configure, attach ------------------------------------------------------
    def start(self) -> list[ProbeStatus]:
        """Plan, compile, configure and attach (steps 1-4). Returns the probe table. Raises
        :class:`producer.errors.TargetError` when the target cgroup does not exist."""
        if self.target.cgroup is not None:
            cat.cgroup_procs(self.target.cgroup)  # fail early, with the path, when it does not exist
        tracefs, _ = kheaders.ensure_tracefs()
        pl = plan(self.options, self.target, tracefs)
        self._lost = None
        self.libs = dict(pl.libs)
        skipped = dict(pl.skipped)
        bpf_probes = [p for p in pl.probes if p.mechanism != "sysfs"]
        layers = {p.c_layer for p in bpf_probes}
        if layers:
            kheaders.apply_env(self.settings)  # BCC_KERNEL_SOURCE for this process
            layers = self._compile(pl, layers, skipped)
        if self._bpf is not None:
            self._configure(pl)
            for p in bpf_probes:
                if p.c_layer in layers and p.name not in skipped and p.name in self.options.deep_dive:
                    self._deep[p.name] = self._uprobe_points(p, pl)  # attached on request only
                    continue
                if p.c_layer in layers and p.name not in skipped:
                    err = self._attach(p, pl)
                    if err:
                        skipped[p.name] = err
                    else:
                        self._attached.add(p.name)
            from obshub.producer._ring import Ring

            size = self.options.ringbuf_pages * os.sysconf("SC_PAGE_SIZE")
            self._ring = Ring(self._bpf[b"events"].map_fd, size)
            if self.options.coll_ring and "pytorch_collective" in self._attached:
                from obshub.producer.collring import CollRings

                pid = next(p.id for p in cat.PROBES if p.name == "pytorch_collective")
                self._coll = CollRings(pid, Kind.COLLECTIVE_BEGIN, Kind.COLLECTIVE_END)
            self._ring_records = max(1, size // (EVENT_SIZE + 8))  # 8-byte record header
            from bcc.libbcc import lib

            self._update_elem = lib.bpf_update_elem
            self._wake_fd = self._bpf[b"wake_req"].map_fd
            self._want_wake()
        if any(p.mechanism == "sysfs" for p in pl.probes):
            self._sysfs = SysfsPoller(self.options.sysfs_root, self.options.sysfs_interval_ms * 1_000_000)
            for p in pl.probes:
                if p.mechanism == "sysfs":
                    self._attached.add(p.name)
        self._statuses = [
            ProbeStatus(
                p.name,
                p.layer.value,
                p.name in self._attached,
                ""
                if p.name in self._attached
                else DEEP_DIVE_REASON
                if p.name in self._deep
                else skipped.get(p.name, "not attached"),
            )
            for p in selected_probes(self.options)
        ]
        self._refresh_target(force=True)
        self._start_follow(pl)
        return list(self._statuses)

    # -- following copies of the libraries -----------------------------------------------------------
    def _start_follow(self, pl: _Plan) -> None:
        """Set up the scanner for copies of the attached USDT library and uprobe libraries."""
        if self._bpf is None or not self.options.follow_scan_ms:
            return
        patterns: dict[str, tuple[str, ...]] = {}
        known = []
        if self._usdt_fns and pl.usdt_lib is not None:
            patterns["usdt"] = tuple({pl.usdt_lib.name, "_usdt*.so"})
            known.append(discovery.file_identity(pl.usdt_lib))
        for p in cat.PROBES:
            if p.name in self._attached:
                for ap in p.attach:
                    if isinstance(ap, Uprobe) and ap.lib != "verbs":
                        patterns[ap.lib] = cat.LIBRARIES[ap.lib]
                        known.append(discovery.file_identity(pl.libs[ap.lib]))
        if not patterns:
            return
        t = self.target
        pids = None if t.watch_all or t.registered else (lambda: cat.resolve_pids(self.target))
        self._scanner = discovery.LibraryScanner(
            patterns, [k for k in known if k is not None], pids=pids, settle_key="usdt" if "usdt" in patterns else None
        )
        self.follow()

    def follow(self) -> list[Followed]:
        """Scan the processes (all of them for ``--registered``, else the target's) for copies of the
        instrumentation library or of a probed library that the probes do not cover yet (a container's
        own install: a path in another mount namespace, opened through ``/proc/<pid>/root``; or another
        install on this host) and attach the same handlers to each. A USDT copy is attached only when
        bcc generates the same argument readers for it (the same probes with the same argument
        locations), else it is reported with the reason. Called by the poll every ``follow_scan_ms``;
        returns what this call found (also appended to :attr:`followed` and logged)."""
        if self._scanner is None or self._bpf is None:
            return []
        self._next_follow = time.monotonic() + self.options.follow_scan_ms / 1000
        found = []
        for key, m in self._scanner.scan():
            reason = self._attach_copy(key, m)
            f = Followed(key, m.pid, m.path, str(m.host_path), not reason, reason)
            found.append(f)
            if reason:
                log.warning("not following %s of pid %d (%s): %s", key, m.pid, m.path, reason)
            else:
                log.info("following %s of pid %d: %s (as %s)", key, m.pid, m.path, m.host_path)
        self.followed.extend(found)
        return found

    def _attach_copy(self, key: str, m: discovery.Mapped) -> str:
        """Attach the handlers of ``key`` to the copy ``m``; '' or why not."""
        b = self._bpf
        path = str(m.host_path)
        if key == "usdt":
            from bcc import USDT

            try:
                u = USDT(path=path)
                for probe, fn in self._usdt_fns:
                    u.enable_probe(probe=probe, fn_name=fn)
                if u.get_text() != self._usdt_text:
                    return "its USDT probes read their arguments from other places (another build)"
                for binpath, fn, addr, _pid in u.enumerate_active_probes():
                    b.attach_uprobe(name=binpath, fn_name=fn, addr=addr, pid=-1)
            except Exception as exc:  # noqa: BLE001 - bcc raises bare Exception; the library is reported skipped
                self._caught["attach"] += 1
                return f"Failed to attach the USDT probes: {exc}"
            return ""
        attached, failed = 0, []
        for p in cat.PROBES:
            if p.name not in self._attached:
                continue
            for ap in p.attach:
                if not (isinstance(ap, Uprobe) and ap.lib == key):
                    continue
                if not cat.has_symbol(m.host_path, ap.symbol):  # another version of the library
                    failed.append(f"{ap.symbol} not in it")
                    continue
                try:
                    attach = b.attach_uretprobe if ap.ret else b.attach_uprobe
                    attach(name=path.encode(), sym=ap.symbol.encode(), fn_name=ap.fn.encode())
                    attached += 1
                except Exception as exc:  # noqa: BLE001 - bcc raises bare Exception; logged with the library
                    self._caught["attach"] += 1
                    failed.append(f"Failed to attach {ap.name}: {exc}")
        if failed:
            log.warning("library %s of pid %d: %s", m.path, m.pid, "; ".join(failed))
        return "" if attached else "; ".join(failed) or "no attached probe uses it"

    def _compile(self, pl: _Plan, layers: set[str], skipped: dict[str, str]) -> set[str]:
        """Compile the layers; when the whole fails, find the layers that fail alone and drop them."""
        try:
            self._bpf = self._build(pl, layers)
            return layers
        except Exception as exc:  # noqa: BLE001 - bcc raises bare Exception on compile errors: each layer alone next
            self._caught["compile"] += 1
            first_error = str(exc)
        good = set()
        for layer in sorted(layers):
            try:
                self._build(pl, {layer}, keep=False)
                good.add(layer)
            except Exception as exc:  # noqa: BLE001 - bcc's bare Exception: the layer's probes reported skipped
                self._caught["compile"] += 1
                for p in pl.probes:
                    if p.c_layer == layer:
                        skipped[p.name] = f"Failed to build obshub/bpf/{p.c_file}: {exc}"
        if not good:
            raise ProbeError(
                f"Failed to load any BPF program ({', '.join(sorted(layers))}): {first_error}",
                hint="run as root or grant CAP_BPF, CAP_PERFMON (+CAP_SYS_ADMIN for uprobes and "
                "USDT); `obshub doctor` shows what this kernel offers, `--ebpf` the C text",
            )
        self._bpf = self._build(pl, good)
        return good

    def _build(self, pl: _Plan, layers: set[str], keep: bool = True):
        from bcc import BPF, USDT

        flags = cflags(pl, self.options, self.target, layers)
        usdt = []
        if "PYTORCH" in layers and pl.usdt_lib is not None:
            u = USDT(path=str(pl.usdt_lib))
            fns = [
                (ap.probe, ap.fn)
                for p in pl.probes
                for ap in p.attach
                if isinstance(ap, Usdt) and (not ap.optional or ap.probe in pl.usdt_probes)
            ]
            for probe, fn in fns:
                u.enable_probe(probe=probe, fn_name=fn)
            usdt.append(u)
            if keep:
                self._usdt_text, self._usdt_fns = u.get_text(), fns
        if keep:
            self.flags = flags
            self.source_text = render_source(flags)
            if self.options.debug_ebpf:
                print(self.source_text, file=sys.stderr)
        # bcc treats only functions of the main file as programs, so the layer files are compiled as one
        # text: render_source() expands the local includes of obshub/bpf/obshub.c (the text --ebpf prints)
        text = render_source(flags) + ("\n" + self.extra_source if self.extra_source else "")
        b = BPF(text=text.encode(), cflags=flags, usdt_contexts=usdt)
        if not keep:
            b.cleanup()
        return b

    def _configure(self, pl: _Plan) -> None:
        thr = self._bpf[b"thresholds"]
        for name, (idx, default, _unit) in cat.THRESHOLDS.items():
            thr[ctypes.c_int(idx)] = ctypes.c_uint64(self.options.thresholds.get(name, default))
        if "CUDA" in {p.c_layer for p in pl.probes}:
            with contextlib.suppress(KeyError):
                table = self._bpf[b"cuda_sym"]
                for i, sym in enumerate(cat.CUDA_SYMBOLS):
                    v = table.Leaf(int(sym.kind), sym.mode, sym.arg, 0)
                    table[ctypes.c_int(i)] = v
        reasons = pl.tp_formats.get("skb:kfree_skb")
        self._decoder = Decoder(
            reasons.symbols if reasons else {},
            {i: s.symbol for i, s in enumerate(cat.CUDA_SYMBOLS)},
            self._registrations.append,
        )

    def _attach(self, p: cat.Probe, pl: _Plan) -> str:
        """Attach every attach point of ``p``; '' or the reason it failed (already-attached points of a
        failed probe stay attached but emit nothing useful alone)."""
        b = self._bpf
        for ap in p.attach:
            try:
                if isinstance(ap, Tracepoint):
                    b.attach_tracepoint(tp=ap.name.encode(), fn_name=ap.fn.encode())
                elif isinstance(ap, Uprobe):
                    lib = str(pl.libs[ap.lib]).encode()
                    sym = (self.options.verbs_symbol(ap) if ap.lib == "verbs" else ap.symbol).encode()
                    if ap.ret:
                        b.attach_uretprobe(name=lib, sym=sym, fn_name=ap.fn.encode())
                    else:
                        b.attach_uprobe(name=lib, sym=sym, fn_name=ap.fn.encode())
                # USDT probes were attached by bcc when the program was built
            except Exception as exc:  # noqa: BLE001 - bcc raises bare Exception; the probe is reported skipped
                self._caught["attach"] += 1
                return f"Failed to attach {ap.name}: {exc}"
        return ""

    def _uprobe_points(self, p: cat.Probe, pl: _Plan) -> list[tuple[bytes, bytes, bytes, bool]]:
        """(library path, symbol, handler, is-return) of every uprobe of ``p``."""
        return [
            (str(pl.libs[ap.lib]).encode(), ap.symbol.encode(), ap.fn.encode(), ap.ret)
            for ap in p.attach
            if isinstance(ap, Uprobe)
        ]

    @property
    def caught(self) -> collections.Counter[str]:
        """Failures caught and gone on from, by where (``obshub_agent_caught_errors_total{where}``): this
        source's own (``attach``, ``compile``: bcc's bare Exception) and the instrumentation's in the
        watched ranks (``instrument_<where>``: the ``obshub:caught`` USDT probe, counted in the kernel map
        ``inst_caught`` of obshub/bpf/pytorch.c; the counts read last stay after :meth:`close`). A fresh
        Counter; never raises."""
        out = collections.Counter(self._caught)
        if self._bpf is not None:
            try:
                self._inst_caught = collections.Counter(
                    {
                        "instrument_" + bytes(k.where).split(b"\0", 1)[0].decode("ascii", "replace"): v.value
                        for k, v in self._bpf[b"inst_caught"].items()
                    }
                )
            except KeyError:  # no such map: the PYTORCH layer is not loaded
                pass
        out.update(self._inst_caught)
        return out

    # -- deep dive: the per-call probes attached on request -------------------------------------------
    def deep_dive_probes(self) -> list[str]:
        """The deep-dive probes this source can attach on request (compiled, their libraries found):
        a subset of ``ProbeOptions.deep_dive``; empty when there is nothing to dive into here."""
        return sorted(self._deep)

    @property
    def deep_diving(self) -> bool:
        """Are the deep-dive probes attached now?"""
        return self._deep_on

    def deep_dive_on(self, steps: int | None = None) -> float:
        """Attach the deep-dive probes (``ProbeOptions.deep_dive``: by default the per-launch CUDA
        uprobes) to the libraries found at start. Returns the seconds the attach took (bcc resolves each
        symbol; ~10-50 ms). Idempotent: a call while attached only renews the budget. ``steps``: the
        window's step budget, kept in the kernel (``deep_gate``/``deep_left`` of obshub/bpf/common.h):
        each process's deep-dive calls count for ``steps`` steps from its first call in the window (the
        step open then included) and no more, however late the agent detaches; the window opens when every
        probe is attached (a window of 0 steps while they attach); None: no budget. A probe
        whose attach fails is logged with bcc's message and left out; raises :class:`ProbeError` only
        when nothing is loaded."""
        if self._bpf is None:
            raise ProbeError("Failed to start the deep dive: no BPF program is loaded")
        t0 = time.monotonic()
        if not self._deep_on and steps is not None:
            # the window opens once every probe is attached: while they attach one by one (bcc resolves each
            # symbol; a large library's under load takes longer than a short step), a window of 0 steps
            # counts nothing, so a probe attached first cannot spend the budget before the last one fires
            # (a 3-step window of 0.1 s steps once shipped launch aggregates and no NCCL call)
            self._deep_budget(0)
        else:
            self._deep_budget(steps)
        if not self._deep_on:
            for name, points in self._deep.items():
                for lib, sym, fn, ret in points:
                    try:
                        attach = self._bpf.attach_uretprobe if ret else self._bpf.attach_uprobe
                        attach(name=lib, sym=sym, fn_name=fn)
                    except Exception as exc:  # noqa: BLE001 - bcc's bare Exception: the others still attach
                        self._caught["attach"] += 1
                        log.warning("deep dive: Failed to attach %s to %s:%s: %s", name, lib, sym, exc)
            self._deep_on = True
            if steps is not None:
                self._deep_budget(steps)  # a new window: every process starts from ``steps``
        return time.monotonic() - t0

    def deep_dive_off(self) -> None:
        """Detach the deep-dive probes (what they counted in the open step is still sent at its end).
        Idempotent; never raises."""
        if self._bpf is None or not self._deep_on:
            self._deep_on = False
            return
        for points in self._deep.values():
            for lib, sym, _fn, ret in points:
                with contextlib.suppress(Exception):
                    (self._bpf.detach_uretprobe if ret else self._bpf.detach_uprobe)(name=lib, sym=sym)
        self._deep_on = False
        with contextlib.suppress(Exception):
            self._deep_budget(None)

    def _deep_budget(self, steps: int | None) -> None:
        """Mark the deep-dive CUDA symbols in ``cuda_sym`` and open window ``gen + 1`` of ``steps`` steps
        in ``deep_gate`` (None: gen 0, no budget)."""
        with contextlib.suppress(KeyError):
            table = self._bpf[b"cuda_sym"]
            for points in self._deep.values():
                for _lib, _sym, fn, _ret in points:
                    m = re.fullmatch(rb"obs_cuda_(?:entry|return)_(\d+)", fn)
                    if m:
                        i = int(m.group(1))
                        info = cat.CUDA_SYMBOLS[i]
                        table[ctypes.c_int(i)] = table.Leaf(int(info.kind), info.mode, info.arg, 1)
        gate = self._bpf[b"deep_gate"]
        self._deep_gen = 0 if steps is None else self._deep_gen + 1
        gate[ctypes.c_int(0)] = gate.Leaf(self._deep_gen, 0 if steps is None else int(steps))

    # -- target ---------------------------------------------------------------------------------------
    def _refresh_target(self, force: bool = False) -> None:
        now = time.monotonic()
        if self._bpf is None or (not force and now < self._next_refresh):
            return
        self._next_refresh = now + self.options.target_refresh_ms / 1000
        if self.target.watch_all:
            return
        pids = cat.resolve_pids(self.target)
        watched, wtids = self._bpf[b"watched"], self._bpf[b"wtids"]
        if self.target.cgroup is not None:  # cgroup v2: new child cgroups too
            wcgroups = self._bpf[b"wcgroups"]
            for cgid in cat.cgroup_v2_ids(self.target.cgroup):
                wcgroups[ctypes.c_uint64(cgid)] = ctypes.c_uint8(1)
        bits = _Bits(self._bpf[b"wbits"])
        for pid in pids - self._watched:
            watched[ctypes.c_uint32(pid)] = ctypes.c_uint8(1)
            bits.set_tgid(pid)
        for pid in self._watched - pids:
            with contextlib.suppress(KeyError):
                del watched[ctypes.c_uint32(pid)]
            bits.clear_tgid(pid)
            self._tids.pop(pid, None)
        for pid in pids:  # only threads not seen before: one map write per new thread, not per refresh
            now_tids = set(cat.threads(pid))
            for tid in now_tids - self._tids.get(pid, set()):
                wtids[ctypes.c_uint32(tid)] = ctypes.c_uint32(pid)
                bits.set_tid(tid)
            self._tids[pid] = now_tids
        if "net_retransmit" in self._attached or "net_rtt" in self._attached:
            lports = self._bpf[b"lports"]
            for pid in pids - self._watched:
                for port in cat.tcp_local_ports(pid):
                    lports[ctypes.c_uint16(port)] = ctypes.c_uint32(pid)
        self._watched = pids

    def attach_uprobe(self, path: str | Path, symbol: str, fn_name: str) -> None:
        """Attach handler ``fn_name`` (from :attr:`extra_source`) to ``symbol`` of ``path`` as a uprobe.
        Raises :class:`ProbeError` when nothing is loaded or bcc refuses."""
        if self._bpf is None:
            raise ProbeError(f"Failed to attach {fn_name} to {path}:{symbol}: no BPF program is loaded")
        try:
            self._bpf.attach_uprobe(name=str(path).encode(), sym=symbol.encode(), fn_name=fn_name.encode())
        except Exception as exc:  # noqa: BLE001 - bcc raises bare Exception: re-raised as ProbeError, naming it
            raise ProbeError(f"Failed to attach {fn_name} to {path}:{symbol}: {exc}") from None

    # -- EventSource ----------------------------------------------------------------------------------
    def _drain(self, timeout_ms: int, table: bytes, quiet_ms: int = 0) -> list:
        """Sysfs events, then what the ring buffer holds (waiting up to ``timeout_ms`` when both are
        empty, or, when the previous drain took records without filling up, first waiting up to
        ``timeout_ms`` for more to gather): Events, and PackedRun s for the kinds ``table`` lets the C
        reader encode. A record waits in the ring at most about one ``timeout_ms`` (the agent passes the
        time until its open batch is due, at most the batch age bound). ``quiet_ms``: for that long (at
        most ``timeout_ms``) a step end does not wake the reader (the kernel lets only the first step end
        after it signal the ring's fd; the wait still ends at ``timeout_ms`` or at the kernel's wakeup of
        a quarter ring), unless the previous drain filled up; the wait is bounded, like the wait for
        trickling records, by the time a quarter of the ring takes to fill at the last drain's rate."""
        self._refresh_target()
        if self._scanner is not None and time.monotonic() >= self._next_follow:
            self.follow()
        out = self._pending
        self._pending = []
        if self._sysfs is not None:
            out.extend(self._sysfs.poll())
        if self._ring is None:
            if not out and timeout_ms > 0:
                time.sleep(timeout_ms / 1000)
            return out
        ring = self._ring
        waited = False
        trickle = self._trickle
        if quiet_ms > 0 and not out and timeout_ms > 0 and not self._full:
            # nothing the kernel signals before quiet_ms can be used (the agent's open batch is too young
            # to be sealed by a step end): the kernel is told to let only a step end from then on wake
            # the reader (wake_req holds the time), the edge an earlier wakeup may have left on the fd is
            # cleared (only when wake_req was set since the last signalled wakeup: a step end's wakeup
            # clears it, so in steady training there is none to clear; a quarter ring's wakeup that left
            # one costs a turn), and the reader waits for that step end or the timeout: one wakeup per
            # sealed batch
            quiet = min(int(timeout_ms), int(quiet_ms))
            wait = int(timeout_ms)
            if trickle:
                quiet = min(quiet, self._trickle_ms)
                wait = min(wait, self._trickle_ms)
            edge = self._wake_at  # set since the last signalled wakeup: a step end may have signalled
            self._want_wake(time.monotonic_ns() + (quiet + 1) * 1_000_000)
            if edge:
                ring.wait(0)
            if ring.wait(wait) > 0:
                self._wake_at = 0
            waited = True
        elif not self._wake_at or self._wake_at > time.monotonic_ns():
            # wake_req is as the last wakeup left it (0 after a step end's) or names a time not reached:
            # let the next step end wake the reader, and take what came since the last drain before any
            # wait (a step end among it did not signal)
            self._want_wake()
            trickle = False
        if not waited and trickle and not out and timeout_ms > 0:
            # the previous drain found records without filling up: they trickle in (no wakeup per record).
            # Let them gather until the timeout or the kernel's wakeup (4 MiB pending) instead of turning
            # the loop for a few records at a time (each turn costs the agent ~0.1 ms of CPU), but never
            # longer than a quarter of the ring takes to fill at the last drain's rate
            if ring.wait(min(int(timeout_ms), self._trickle_ms)) > 0:
                self._wake_at = 0
            waited = True
        before, t0 = ring.consumed, time.monotonic()
        coll = self._coll
        items = ring.drain(table, _DRAIN_MAX)
        if not items and not out and timeout_ms > 0 and not waited:
            if ring.wait(int(timeout_ms)) > 0:
                self._wake_at = 0
            items = ring.drain(table, _DRAIN_MAX)
        taken = ring.consumed - before
        self._full = taken >= _DRAIN_MAX
        self._trickle = 0 < taken < _DRAIN_MAX
        if self._trickle:
            rate = taken / max(1e-3, t0 - self._last_drain)  # records/s since the previous drain
            self._trickle_ms = max(1, int(self._ring_records / 4 / rate * 1000))
        self._last_drain = t0
        if coll is not None:
            # the collective rings after the BPF ring: a collective that ended before a step end the BPF ring
            # gave is in its ring by now, so it reaches the batcher in the same turn as that step end
            if t0 >= self._next_coll:
                self._next_coll = t0 + self.options.target_refresh_ms / 1000
                coll.refresh(self._watched | {r["pid"] for r in self._registrations})
            items.extend(coll.drain(table, _DRAIN_MAX))
        decode = self._decoder.decode
        for it in items:
            out.append(decode(it) if type(it) is bytes else packed_run(it))
        return out

    def _want_wake(self, at_ns: int = 1) -> None:
        """Let the first step end at or after ``at_ns`` (CLOCK_MONOTONIC ns; 1: the next one) wake the
        reader (``wake_req`` of obshub/bpf/common.h: only one step end signals the ring's fd, and clears it; one
        map write, a system call). A drain does not arm it again: the next poll does, with the time its
        wait may end at or, when it waits for any step end, 1 (``_wake_at``: the value written since the
        last signalled wakeup, 0 when none was)."""
        self._wake_at = at_ns
        if self._wake_fd >= 0:
            value = self._wake_one if at_ns == 1 else ctypes.c_uint64(at_ns)
            self._update_elem(self._wake_fd, ctypes.byref(self._wake_key), ctypes.byref(value), 0)

    def poll(self, timeout_ms: int) -> list[Event]:
        """Drain the ring buffer (waiting up to ``timeout_ms`` for the first record) and the sysfs
        poller; return the events in arrival order, every one decoded to an :class:`Event`."""
        return self._drain(timeout_ms, DECODE_ALL_TABLE)

    #: :meth:`poll_packed` takes ``quiet_ms`` (the agent passes it when the source has this attribute)
    QUIET_POLL = True

    def poll_packed(self, timeout_ms: int, quiet_ms: int = 0) -> list:
        """As :meth:`poll`, but runs of records of the kinds in ``producer.reader.PACKED_FORMATS`` come as
        :class:`producer.reader.PackedRun` (msgpack bytes made in C, no Python object per event); the
        agent's hot path (``Batcher.add_packed``). ``quiet_ms``: how long the kernel's wakeups (a step's
        end) may be slept through, see :meth:`_drain`."""
        return self._drain(timeout_ms, PACKED_TABLE, quiet_ms)

    def consumed(self) -> int:
        """Records taken from the ring buffer since start (the ``delivered`` of lost = produced -
        delivered)."""
        return self._ring.consumed if self._ring is not None else 0

    def lost(self) -> dict[str, int]:
        """Failed ring-buffer reservations per attached probe, counted in the kernel since start."""
        if self._bpf is None:
            return {}
        table = self._bpf[b"lost"]
        # the sum of every probe's counter (its own slot, obshub/bpf/common.h): one map read (a system call) when
        # nothing was lost since the last call, else one per attached probe
        total = table[ctypes.c_int(len(cat.PROBES))].value
        if total != self._lost_sum or self._lost is None:
            self._lost = {
                p.name: table[ctypes.c_int(p.id)].value
                for p in cat.PROBES
                if p.name in self._attached and p.mechanism != "sysfs"
            }
            self._lost_sum = total
        return dict(self._lost)

    def misses(self) -> dict[str, int]:
        """Runs of each attached probe's programs that the kernel skipped (``recursion_misses`` of
        ``bpf_prog_info``, Linux 5.12+): a tracepoint program that fires while another BPF program runs
        on the same CPU is not run. Not part of the EventSource protocol; the agent may report it
        next to :meth:`lost`."""
        if self._bpf is None:
            return {}
        out = {}
        for p in cat.PROBES:
            if p.name not in self._attached or p.mechanism == "sysfs":
                continue
            fds = {self._bpf.funcs[ap.fn.encode()].fd for ap in p.attach if ap.fn.encode() in self._bpf.funcs}
            out[p.name] = sum(_recursion_misses(fd) for fd in fds)
        return out

    def set_threshold(self, name: str, value: int) -> None:
        """Change a threshold (:data:`producer.probes.THRESHOLDS`) in the running BPF programs."""
        if name not in cat.THRESHOLDS:
            raise ProbeError(
                f"Failed to set threshold {name!r}: unknown", hint=f"known thresholds: {', '.join(cat.THRESHOLDS)}"
            )
        if not isinstance(value, int) or value < 0:
            raise ProbeError(f"Failed to set threshold {name}={value!r}: must be a non-negative int")
        if self._bpf is None:
            raise ProbeError(
                f"Failed to set threshold {name}: no BPF program is loaded",
                hint="call start() first; see the probe table for why nothing loaded",
            )
        self._bpf[b"thresholds"][ctypes.c_int(cat.THRESHOLDS[name][0])] = ctypes.c_uint64(value)

    def registrations(self) -> list[dict]:
        """REGISTER events seen so far: dicts with job, rank, world_size, host_id, local_rank, pid."""
        return list(self._registrations)

    def exit_status(self, pid: int) -> tuple[int, int] | None:
        """How process ``pid`` ended, as the kernel recorded it at its exit (obshub/bpf/sched.c
        ``obs_note_exit``, the scheduler layer's ``sched_process_exit`` handler): ``(ts_ns, status)``, the
        CLOCK_MONOTONIC ns of the exit and the wait status its parent reads (the ``waitpid(2)`` form), kept
        after the parent reaps it (an LRU map of 4,096 processes). None when nothing was recorded: the
        process was not watched, has not ended, the ``sched`` probe is not attached, or this kernel's BTF
        lacks a member it reads. A pid number reused later holds the newest exit: compare ``ts_ns``."""
        if self._bpf is None or "sched" not in self._attached:
            return None
        try:
            v = self._bpf[b"exit_status"][ctypes.c_uint32(pid)]
        except KeyError:
            return None
        return int(v.ts_ns), int(v.status)

    def statuses(self) -> list[ProbeStatus]:
        """The probe table of the last start()."""
        return list(self._statuses)

    def coll_rings(self) -> dict[int, dict[str, int]]:
        """Per pid whose collective ring the agent reads: ``drops`` (collectives its kernel sent by the
        ``coll`` trap because the ring was full) and ``written`` (records). {} when none is read."""
        return self._coll.stats() if self._coll is not None else {}

    def coll_ring_totals(self) -> tuple[int, int]:
        """``(records, drops)``: records read from the ranks' collective rings since start, and collectives
        their kernels sent by the ``coll`` trap because the ring was full (the agent metrics
        ``obshub_agent_coll_ring_records_total`` / ``obshub_agent_coll_ring_drops_total``); (0, 0) when none
        is read."""
        return (self._coll.read, self._coll.drops_total()) if self._coll is not None else (0, 0)

    def close(self) -> None:
        """Detach every probe and free the BPF program. Idempotent. Returns in milliseconds: the kernel's
        detach of the probes (~0.1 s each) goes on in a child process, ``detach_pid``
        (:func:`obshub.producer.detach.release`; :func:`obshub.producer.detach.wait` waits for it)."""
        if self._coll is not None:
            self._coll.close()
            self._coll = None
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        self._wake_fd = -1
        if self._sysfs is not None:
            self._sysfs.close()
        if self._scanner is not None:
            self._scanner.close()
        if self._bpf is not None:
            _ = self.caught  # the instrumentation's counts, kept past the map
            with contextlib.suppress(Exception):
                # the kernel's detach (~0.1 s a probe, serial) is done by a child (producer.detach)
                self.detach_pid = detach.release(self._bpf)
            self._bpf = None


#: the probe table's reason for a deep-dive probe: compiled, not attached until asked for
DEEP_DIVE_REASON = "deep dive: attached on request for N steps (`obshub deep-dive --host H`), not by default"


def _pid_limit() -> int:
    """``kernel.pid_max``: the size of the watched-task bitmaps of obshub/bpf/common.h (4,194,304 when unreadable)."""
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return 4_194_304


class _Bits:
    """Sets and clears bits of the watched-task bitmaps (``wbits`` of obshub/bpf/common.h: per 64 pid numbers a
    word of process bits and a word of thread bits): read-modify-write of one element; a bit the kernel
    sets in the same element meanwhile can be lost, and the kernel sets it again on the thread's next probe
    (the bitmaps are pre-filters only)."""

    def __init__(self, table):
        self.table = table

    def _update(self, field: str, n: int, on: bool) -> None:
        key = ctypes.c_int(n >> 6)
        try:
            words = self.table[key]
        except (KeyError, IndexError):
            return  # beyond the bitmap (pid_max raised after the start): the hash maps answer
        bit = 1 << (n & 63)
        word = getattr(words, field)
        setattr(words, field, word | bit if on else word & ~bit)
        self.table[key] = words

    def set_tgid(self, pid: int) -> None:
        self._update("tgid", pid, True)

    def clear_tgid(self, pid: int) -> None:
        self._update("tgid", pid, False)

    def set_tid(self, tid: int) -> None:
        self._update("tid", tid, True)


_DRAIN_MAX = 65536  # records per drain: bounds the memory of one poll, not the rate (the agent polls again)
_PROG_INFO_SIZE = 256
_RECURSION_MISSES_OFFSET = 208  # struct bpf_prog_info.recursion_misses (include/uapi/linux/bpf.h, 5.12+)


def _recursion_misses(fd: int) -> int:
    """``recursion_misses`` of the BPF program ``fd`` (0 when the kernel does not report it)."""
    from bcc.libbcc import lib

    fn = lib.bpf_obj_get_info_by_fd
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32)]
    info = (ctypes.c_uint8 * _PROG_INFO_SIZE)()
    size = ctypes.c_uint32(_PROG_INFO_SIZE)
    if fn(fd, ctypes.byref(info), ctypes.byref(size)) != 0 or size.value < _RECURSION_MISSES_OFFSET + 8:
        return 0
    return int.from_bytes(bytes(info[_RECURSION_MISSES_OFFSET : _RECURSION_MISSES_OFFSET + 8]), "little")
