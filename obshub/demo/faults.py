"""Real faults injected into one host of the simulated cluster, each with counters that prove it acts.

=========  ======================================================================  =========  ===========
kind       what it does                                                            layer      evidence
=========  ======================================================================  =========  ===========
net-slow   tc tbf rate limit on both directions of the host's link (eth0 egress     network    tc qdisc
           inside the namespace, the bridge-side veth egress = the host's ingress)             bytes, drops
net-loss   nftables table ``inet obshub_fault`` inside the host's namespace drops    network    nft counter,
           ``numgen random mod 100 < P`` of TCP packets in and out                            TCP RetransSegs
cpu        noisy neighbour: busy-loop processes in the host's v1 cpu cgroup (same    sched      hog CPU s,
           CFS group as the training, so it gets a fraction of the group's share)             run-queue wait
mem        memory.limit_in_bytes of the host's memory cgroup set just above its     memory     failcnt,
           usage + a process in the cgroup that holds anonymous memory and touches             refaults,
           a file mapping larger than the room left, so every charge reclaims                  pgmajfault
hang       the host's training processes frozen with the cgroup v2 freezer          process    cgroup.events
           (``cgroup.freeze`` of the host's v2 cgroup); removing the fault thaws them          frozen, pids
exit       the host's training processes killed (SIGKILL): the rank is gone         process    pids killed
stall      sporadic: every ``period_s`` one ``stall_ms`` stall of one layer (net:       per        stalls,
           a blackout; cpu: a CPU burst; process: SIGSTOP of the rank; mem: a tight   ``layer``  stalled_s
           memory limit with a reading hog), then normal training again (``Stall``)
none       nothing                                                                 -          -
=========  ======================================================================  =========  ===========

The noise processes of ``cpu`` and ``mem`` sit in the host's v1 cpu (resp. memory) cgroup, where they
compete, but in the v2 cgroup ``obshub-demo/noise``, so an agent that filters by the host's v2 cgroup
does not watch them: a neighbour is not part of the job.

Sources: tc-tbf(8); nft(8) "NUMGEN EXPRESSION"; cgroup v1 docs Documentation/admin-guide/cgroup-v1/
memory.rst (limit_in_bytes, failcnt, memory.stat) and scheduler/sched-design-CFS.rst (group shares);
/proc/<pid>/schedstat (proc(5): time on CPU ns, run-queue wait ns, timeslices); /proc/net/snmp Tcp
RetransSegs (per network namespace); Documentation/admin-guide/cgroup-v2.rst (cgroup.freeze,
cgroup.events).

A TCP segment is retransmitted by its sender: with loss on one host's link, most retransmits are counted
in the namespaces of its peers (they send into the drops), so the network faults report retransmits of
the faulty host and of the whole cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from obshub.demo.cluster import SUBNET, Cluster, Host, cgroup_pids, sh
from obshub.demo.errors import ClusterError, FaultError

KINDS = ("none", "net-slow", "net-loss", "cpu", "mem", "hang", "exit", "stall")
# the settings a fault reads from ``--param KEY=VALUE`` (each a positive number; defaults in its class)
PARAMS = {
    "net-slow": ("rate_mbit", "burst_kb", "latency_ms"),
    "net-loss": ("percent",),
    "cpu": ("procs",),
    "mem": ("room_mb", "hog_anon_mb", "file_mb"),
    "stall": (
        "layer",
        "stall_ms",
        "period_s",
        "procs",
        "room_mb",
        "full",
        "loss_pct",
        "delay_ms",
        "rate_kbit",
        "shape",
        "quota_us",
    ),
}
# a sporadic stall (kind ``stall``): its ``layer`` param (names as ``--param layer=...``) and the layer
# obshub should name for it
STALL_LAYERS = {"net": "network", "cpu": "sched", "process": "process", "mem": "memory"}
#: shapes of a ``cpu`` stall (``Stall``): busy loops in the rank's cpu cgroup, outside it pinned to its CPU,
#: or its cgroup's CFS quota squeezed
CPU_SHAPES = ("burst", "outside", "quota")
LAYER_OF = {
    "net-slow": "network",
    "net-loss": "network",
    "cpu": "sched",
    "mem": "memory",
    "hang": "process",
    "exit": "process",
    "none": None,
    "stall": None,  # per its layer param: layer_of
}


def qdisc_refused(netns: str, qdisc: list[str]) -> str:
    """Whether the kernel takes qdisc ``qdisc`` (tc's words, e.g. ``["netem", "delay", "1ms"]``): tried as the
    root qdisc of the loopback device of network namespace ``netns`` and removed again. Returns tc's error
    ("" when it was taken). Raises ClusterError when tc cannot be run at all."""
    out = subprocess.run(
        ["ip", "netns", "exec", netns, "tc", "qdisc", "add", "dev", "lo", "root", *qdisc],
        capture_output=True,
        text=True,
        timeout=10,
    )
    if out.returncode:
        return out.stderr.strip() or f"tc exited {out.returncode}"
    sh(["tc", "qdisc", "del", "dev", "lo", "root"], netns=netns, check=False)
    return ""


def layer_of(kind: str, params: dict | None = None) -> str | None:
    """The layer obshub should name for a fault of ``kind`` with ``params`` (a ``stall``'s follows its
    ``layer`` param, default net: network)."""
    if kind == "stall":
        return STALL_LAYERS.get(str((params or {}).get("layer", "net")))
    return LAYER_OF[kind]


NFT_TABLE = "obshub_fault"
MAX_HEADERS = 120  # bytes: the longest IPv4 header (60) + the longest TCP header (60); longer carries data
PAGECACHE_DIR = Path("/var/tmp/obshub-demo")  # on disk: tmpfs pages cannot be reclaimed without swap


@dataclass
class Fault:
    """Base of every fault: ``kind``, the ``layer`` obshub should blame, the target ``host`` and the
    sizes it uses (``params``). ``inject`` starts it, ``evidence`` reads its counters (a dict of numbers,
    cumulative since ``prepare``), ``remove`` undoes it (idempotent, never raises for what is gone)."""

    cluster: Cluster
    host: Host
    params: dict = field(default_factory=dict)
    kind: str = "none"
    pid: int | None = None  # one rank's process of the host (``--fault-rank``): cpu and hang hit it alone

    @property
    def layer(self) -> str | None:
        return layer_of(self.kind, self.params)

    def prepare(self) -> None:
        """Work done before t0 that is not the fault itself (e.g. writing a file)."""

    def inject(self) -> None:
        """Start the fault now."""

    def evidence(self) -> dict:
        """Counters that show the fault acting."""
        return {}

    def remove(self) -> None:
        """Stop the fault."""

    def describe(self) -> str:
        """One line: kind, host and sizes."""
        sizes = ", ".join(f"{k}={v}" for k, v in self.params.items())
        on = self.host.name + (f" pid {self.pid}" if self.pid else "")
        return f"{self.kind} on {on}" + (f" ({sizes})" if sizes else "")


# ---------------------------------------------------------------------------------------------------------
# network
# ---------------------------------------------------------------------------------------------------------
def cluster_retrans_segs(cluster: Cluster) -> int:
    """TCP segments retransmitted in every host namespace of ``cluster`` (sum of ``tcp_retrans_segs``)."""
    return sum(tcp_retrans_segs(h.netns) for h in cluster.hosts)


def tcp_retrans_segs(netns: str) -> int:
    """TCP segments retransmitted in ``netns`` since it was made (/proc/net/snmp ``Tcp: RetransSegs``)."""
    lines = [ln.split() for ln in sh(["cat", "/proc/net/snmp"], netns=netns).splitlines() if ln.startswith("Tcp:")]
    header, values = lines[0], lines[1]
    return int(values[header.index("RetransSegs")])


def qdisc_stats(dev: str, netns: str | None = None) -> dict:
    """The root qdisc of ``dev``: ``{"kind", "bytes", "packets", "drops", "overlimits"}`` (tc -s -j)."""
    out = json.loads(sh(["tc", "-s", "-j", "qdisc", "show", "dev", dev, "root"], netns=netns) or "[]")
    if not out:
        return {}
    q = out[0]
    return {
        "kind": q.get("kind"),
        "bytes": q.get("bytes", 0),
        "packets": q.get("packets", 0),
        "drops": q.get("drops", 0),
        "overlimits": q.get("overlimits", 0),
    }


@dataclass
class NetSlow(Fault):
    """tbf on both directions of the host's link. params: ``rate_mbit`` (default 24), ``burst_kb``
    (32), ``latency_ms`` (queue bound, 100): packets beyond the queue are dropped, so TCP both queues
    (RTT up) and retransmits."""

    kind: str = "net-slow"

    def __post_init__(self):
        self.params = {"rate_mbit": 24, "burst_kb": 32, "latency_ms": 100, **self.params}
        self._base = 0

    def _tbf(self) -> list[str]:
        p = self.params
        return [
            "root",
            "tbf",
            "rate",
            f"{p['rate_mbit']}mbit",
            "burst",
            f"{p['burst_kb']}kb",
            "latency",
            f"{p['latency_ms']}ms",
        ]

    def prepare(self) -> None:
        self._base = tcp_retrans_segs(self.host.netns)
        self._base_all = cluster_retrans_segs(self.cluster)

    def inject(self) -> None:
        sh(["tc", "qdisc", "replace", "dev", self.host.ifname, *self._tbf()], netns=self.host.netns)
        sh(["tc", "qdisc", "replace", "dev", self.host.veth, *self._tbf()])

    def evidence(self) -> dict:
        out = {
            "tcp_retrans_segs": tcp_retrans_segs(self.host.netns) - self._base,
            "cluster_tcp_retrans_segs": cluster_retrans_segs(self.cluster) - self._base_all,
        }
        for side, (dev, ns) in {
            "egress": (self.host.ifname, self.host.netns),
            "ingress": (self.host.veth, None),
        }.items():
            q = qdisc_stats(dev, ns)
            if q.get("kind") == "tbf":
                out.update(
                    {f"{side}_bytes": q["bytes"], f"{side}_drops": q["drops"], f"{side}_overlimits": q["overlimits"]}
                )
        return out

    def remove(self) -> None:
        sh(["tc", "qdisc", "del", "dev", self.host.ifname, "root"], netns=self.host.netns, check=False)
        sh(["tc", "qdisc", "del", "dev", self.host.veth, "root"], check=False)


@dataclass
class NetLoss(Fault):
    """Random TCP drops inside the host's namespace with nftables. params: ``percent`` (default 8) of
    the packets to and from 10.77.0.0/24, in each direction."""

    kind: str = "net-loss"

    def __post_init__(self):
        self.params = {"percent": 8, **self.params}
        self._base = 0

    def ruleset(self) -> str:
        """The nft script (``nft -f -``): one table, an input and an output chain. Each chain drops
        ``percent`` of the TCP packets from/to the subnet with two counted rules that split them by size:
        a packet longer than ``MAX_HEADERS`` bytes carries data (an IPv4 header is at most 60 bytes and
        a TCP header at most 60), the rest may be bare ACKs. The input chain's data rule has the comment
        ``data-in``: every segment it drops was sent by a peer, which retransmits it (``data_dropped``)."""
        p, net, n = int(self.params["percent"]), SUBNET, MAX_HEADERS
        drop = f"numgen random mod 100 < {p} counter drop"
        return (
            f"table inet {NFT_TABLE} {{\n"
            f"  chain input {{ type filter hook input priority 0; policy accept;\n"
            f'    ip saddr {net} meta l4proto tcp meta length > {n} {drop} comment "data-in"\n'
            f"    ip saddr {net} meta l4proto tcp meta length <= {n} {drop}\n  }}\n"
            f"  chain output {{ type filter hook output priority 0; policy accept;\n"
            f"    ip daddr {net} meta l4proto tcp meta length > {n} {drop}\n"
            f"    ip daddr {net} meta l4proto tcp meta length <= {n} {drop}\n  }}\n}}\n"
        )

    def prepare(self) -> None:
        self._base = tcp_retrans_segs(self.host.netns)
        self._base_all = cluster_retrans_segs(self.cluster)

    def inject(self) -> None:
        proc = subprocess.run(
            ["ip", "netns", "exec", self.host.netns, "nft", "-f", "-"],
            input=self.ruleset(),
            capture_output=True,
            text=True,
        )
        if proc.returncode:
            raise FaultError(
                f"Failed to load nftables table {NFT_TABLE} in {self.host.netns}: {proc.stderr.strip()}",
                "check `nft --version` (1.0+) and the nf_tables module",
            )

    def _counters(self) -> list[tuple[str, int]]:
        """``(comment, packets)`` of every counted rule of the table ([] when it is absent)."""
        out = sh(["nft", "-j", "list", "table", "inet", NFT_TABLE], netns=self.host.netns, check=False)
        rows = []
        for item in json.loads(out or '{"nftables": []}').get("nftables", []):
            rule = item.get("rule", {})
            for expr in rule.get("expr", []):
                if "counter" in expr:
                    rows.append((rule.get("comment", ""), expr["counter"]["packets"]))
        return rows

    def dropped(self) -> int:
        """Packets dropped so far by the table's rules (sum of their counters), 0 when it is absent."""
        return sum(n for _c, n in self._counters())

    def data_dropped(self) -> int:
        """Data segments (longer than ``MAX_HEADERS``) from peers dropped on the way in so far: each is
        retransmitted by the peer that sent it while the connection lives."""
        return sum(n for c, n in self._counters() if c == "data-in")

    def evidence(self) -> dict:
        rows = self._counters()  # one reading of the table: the data-in share never exceeds the total
        return {
            "nft_dropped_packets": sum(n for _c, n in rows),
            "nft_dropped_data_in": sum(n for c, n in rows if c == "data-in"),
            "tcp_retrans_segs": tcp_retrans_segs(self.host.netns) - self._base,
            "cluster_tcp_retrans_segs": cluster_retrans_segs(self.cluster) - self._base_all,
        }

    def remove(self) -> None:
        sh(["nft", "delete", "table", "inet", NFT_TABLE], netns=self.host.netns, check=False)


# ---------------------------------------------------------------------------------------------------------
# cpu and memory: noise processes
# ---------------------------------------------------------------------------------------------------------
def proc_cpu_ns(pid: int) -> tuple[int, int]:
    """(time on CPU ns, time waiting on a run queue ns) of every thread of ``pid`` (/proc/<pid>/task/*/
    schedstat), (0, 0) when it is gone."""
    run = wait = 0
    for f in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            a, b, _ = f.read_text().split()
            run, wait = run + int(a), wait + int(b)
        except (OSError, ValueError):
            continue
    return run, wait


class _Noise:
    """Noise processes started in the host's namespace: given v1 cgroups, v2 cgroup ``obshub-demo/noise``."""

    def __init__(self, cluster: Cluster, host: Host, v1: dict[str, Path]):
        self.cluster, self.host = cluster, host
        aux = cluster.aux_cgroups("noise")
        self.cgroups = {c: v1.get(c, aux[c]) for c in aux}
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: list[str], n: int = 1) -> None:
        for _ in range(n):
            self.procs.append(
                self.cluster.spawn(
                    self.host, argv, cgroups=self.cgroups, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
                )
            )

    def check_alive(self) -> None:
        for p in self.procs:
            if p.poll() is not None:
                err = p.stderr.read().decode(errors="replace")[-500:] if p.stderr else ""
                raise FaultError(f"noise process {p.pid} on {self.host.name} exited {p.returncode}: {err}")

    def stop(self) -> None:
        for p in self.procs:
            Cluster.stop(p, grace_s=2.0)
        self.procs = []


BUSY_LOOP = "import os\nwhile True:\n    pass\n"
RANK_HOG_NICE = -5
"""The nice value of a one-rank ``cpu`` fault's busy loops (``CpuHog`` with ``--fault-rank``); the environment
variable ``RANK_HOG_NICE`` (an integer -20..19, read at injection) overrides it: at 0 the fault is mild (x1.3-x1.7
steps, docs/BENCHMARKS.md 8, mildrank25)."""


def rank_hog_nice() -> int:
    """The nice value of a one-rank ``cpu`` fault's busy loops: ``RANK_HOG_NICE`` from the environment, else the
    module's. Raises FaultError naming the variable and its value when it is no integer in -20..19."""
    raw = os.environ.get("RANK_HOG_NICE", "").strip()
    if not raw:
        return RANK_HOG_NICE
    try:
        nice = int(raw)
    except ValueError:
        nice = None
    if nice is None or not -20 <= nice <= 19:
        raise FaultError(f"RANK_HOG_NICE={raw!r} is no nice value", "give an integer from -20 to 19, or unset it")
    return nice


@dataclass
class CpuHog(Fault):
    """Noisy neighbour in the host's cpu cgroup. params: ``procs`` busy loops (default 3 per CPU of the
    machine), so the training threads get about 1/(procs+1) of their group's share. With a rank (``pid``,
    ``--fault-rank``) that rank alone is moved into a v1 cpu cgroup of its own with the busy loops, all
    pinned to one CPU (``inject``); it goes back to its host's cgroup on removal."""

    kind: str = "cpu"

    def __post_init__(self):
        self.params = {"procs": 3 * (os.cpu_count() or 1), **self.params}
        self._noise: _Noise | None = None
        self._t0 = 0.0
        self._train_base = (0, 0)
        self._moved: Path | None = None  # the host cgroup the faulted rank was moved out of

    def _training(self) -> tuple[int, int]:
        noise = {p.pid for p in self._noise.procs} if self._noise else set()
        run = wait = 0
        pids = cgroup_pids(self.host.cgroup("cpu")) | ({self.pid} if self.pid else set())
        for pid in pids - noise:
            a, b = proc_cpu_ns(pid)
            run, wait = run + a, wait + b
        return run, wait

    def prepare(self) -> None:
        self._train_base = self._training()

    def inject(self) -> None:
        # one rank (--fault-rank): the rank and the busy loops share a v1 cpu cgroup of their own, outside its
        # host's, and one CPU. Loops in the host's cgroup starved its other ranks too, and so did loops outside
        # it at a weight that starves the rank (2 x 2 ranks, --fault-rank 1: rank 2 waited 543-892 ms a step in
        # its run queue and was named, walk24, lead24): CFS splits a group's shares over the CPUs by its
        # runnable load on each, and a starved rank's is all on its CPU, which left the group little weight on
        # the other CPU, where its other ranks ran. In a group of its own the rank gets 1/(procs+1) of it.
        cgroups = {"cpu": self.host.cgroup("cpu")}
        if self.pid:
            cg = self.cluster.aux_cgroups("rank-fault").get("cpu")
            if cg is None:
                raise FaultError("no v1 cpu cgroup hierarchy for the faulted rank", "a v1 cpu controller is needed")
            _move_to(self.pid, cg)
            self._moved = self.host.cgroup("cpu")
            cgroups = {"cpu": cg}
        nice = rank_hog_nice() if self.pid else 0
        self._noise = _Noise(self.cluster, self.host, cgroups)
        self._t0 = time.monotonic()
        self._train_base = self._training()
        argv = [sys.executable, "-c", BUSY_LOOP]
        if self.pid:  # one rank: it and the busy loops share one CPU, its peers keep the others
            cpu = max(os.sched_getaffinity(0))
            _pin(self.pid, {cpu})
            argv = ["taskset", "-c", str(cpu), *argv]
        self._noise.start(argv, int(self.params["procs"]))
        if self.pid:
            # at nice 0 the rank kept 1/(procs+1) of its cgroup: x1.3-x1.7 steps that the job's baseline took
            # in within seconds (named 2 of 3, lead24); at RANK_HOG_NICE (CFS weight 3121 vs the rank's 1024)
            # it keeps about 1/(3 procs+1), as a core's noisy neighbour of higher priority leaves it
            for p in self._noise.procs:
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, p.pid, nice)

    def evidence(self) -> dict:
        if not self._noise:
            return {}
        self._noise.check_alive()
        wall_ns = max(1, int((time.monotonic() - self._t0) * 1e9))
        hog_ns = sum(proc_cpu_ns(p.pid)[0] for p in self._noise.procs)
        run, wait = self._training()
        return {
            "hog_cpu_s": round(hog_ns / 1e9, 2),
            "hog_share_of_machine": round(hog_ns / (wall_ns * (os.cpu_count() or 1)), 3),
            "training_runq_wait_s": round((wait - self._train_base[1]) / 1e9, 2),
            "training_cpu_s": round((run - self._train_base[0]) / 1e9, 2),
        }

    def remove(self) -> None:
        if self._noise:
            self._noise.stop()
        if self.pid:
            _pin(self.pid, os.sched_getaffinity(0))
        if self.pid and self._moved is not None:
            try:
                _move_to(self.pid, self._moved)
            except FaultError:
                pass  # the rank has exited: nothing to move back
            self._moved = None


def _move_to(pid: int, cgroup: Path) -> None:
    """Move process ``pid`` (every thread: a v1 ``cgroup.procs`` write moves the thread group) into the v1
    cgroup at ``cgroup``. Raises FaultError naming the cgroup when the kernel refuses (the process is gone)."""
    try:
        (cgroup / "cgroup.procs").write_text(str(pid))
    except OSError as exc:
        raise FaultError(f"Failed to move pid {pid} into {cgroup}: {exc}") from exc


def _pin(pid: int, cpus: set[int]) -> None:
    """Set the CPU affinity of every thread of process ``pid`` (gone threads and processes are skipped)."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass


MEM_HOG = """\
import mmap, os, random, sys, time
path, anon_mb = sys.argv[1], int(sys.argv[2])
anon = bytearray(anon_mb << 20)
for i in range(0, len(anon), 4096):
    anon[i] = 1
fd = os.open(path, os.O_RDONLY)
m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
pages = len(m) // 4096
print("ready", flush=True)
while True:
    for _ in range(2000):
        m[random.randrange(pages) * 4096]
    time.sleep(0.001)
"""


ANON_BURST = """\
import signal, time
held, go = [], [False]
signal.signal(signal.SIGUSR2, lambda *_: go.__setitem__(0, True))
signal.signal(signal.SIGUSR1, lambda *_: go.__setitem__(0, False))
while True:
    if go[0]:
        x = bytearray(1 << 20)
        x[::4096] = b"\\1" * 256
        held.append(x)
    elif held:
        held.clear()
    else:
        time.sleep(0.005)
"""
# the sporadic memory stall's hog: on SIGUSR2 it touches anonymous memory, 1 MiB at a time, until SIGUSR1
# (a task waiting in its cgroup's OOM wait queue takes the signal once it wakes), then frees all of it


def _under_oom(cgroup: Path) -> int:
    """1 when the v1 memory cgroup is under OOM now (``memory.oom_control`` ``under_oom``), else 0."""
    try:
        kv = dict(ln.split() for ln in (cgroup / "memory.oom_control").read_text().splitlines() if ln.strip())
    except OSError:
        return 0
    return int(kv.get("under_oom", 0))


def memory_stat(cgroup: Path) -> dict[str, int]:
    """memory.stat of a v1 memory cgroup as ints."""
    return {k: int(v) for k, v in (ln.split() for ln in (cgroup / "memory.stat").read_text().splitlines())}


@dataclass
class MemPressure(Fault):
    """Memory pressure in the host's memory cgroup. params: ``room_mb`` (default 48) allowed above the
    cgroup's usage at injection, ``hog_anon_mb`` (24) held by the noise process, ``file_mb`` (256) of a
    file it maps and reads at random, so its working set never fits and every new charge in the cgroup
    (the training's page faults included) goes through memcg reclaim; no swap is needed (file pages are
    reclaimed and refaulted)."""

    kind: str = "mem"

    def __post_init__(self):
        self.params = {"room_mb": 48, "hog_anon_mb": 24, "file_mb": 256, **self.params}
        self._noise: _Noise | None = None
        self._base: dict[str, int] = {}
        self._limit_before = ""
        self.file = PAGECACHE_DIR / f"pagecache-h{self.host.index}.bin"

    @property
    def cg(self) -> Path:
        return self.host.cgroup("memory")

    def prepare(self) -> None:
        self.cluster.record_path(PAGECACHE_DIR)
        PAGECACHE_DIR.mkdir(parents=True, exist_ok=True)
        size = int(self.params["file_mb"]) << 20
        if not self.file.exists() or self.file.stat().st_size != size:
            with open(self.file, "wb") as f:
                chunk = os.urandom(1 << 20)
                for _ in range(size >> 20):
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
        # drop what writing cached, so the file is read back (and charged) inside the cgroup
        fd = os.open(self.file, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)

    def _counters(self) -> dict[str, int]:
        st = memory_stat(self.cg)
        return {
            "failcnt": int((self.cg / "memory.failcnt").read_text()),
            "pgmajfault": st.get("pgmajfault", 0),
            "workingset_refault_file": st.get("workingset_refault_file", 0),
            "pgpgout": st.get("pgpgout", 0),
        }

    def inject(self) -> None:
        self._limit_before = (self.cg / "memory.limit_in_bytes").read_text().strip()
        usage = int((self.cg / "memory.usage_in_bytes").read_text())
        limit = usage + (int(self.params["room_mb"]) << 20)
        self._base = self._counters()
        try:
            (self.cg / "memory.limit_in_bytes").write_text(str(limit))
        except OSError as exc:
            raise FaultError(f"Failed to set {self.cg}/memory.limit_in_bytes to {limit}: {exc}") from exc
        self.params["limit_mb"] = limit >> 20
        self._noise = _Noise(self.cluster, self.host, {"memory": self.cg})
        self._noise.start([sys.executable, "-c", MEM_HOG, str(self.file), str(self.params["hog_anon_mb"])])

    def evidence(self) -> dict:
        if not self._noise:
            return {}
        self._noise.check_alive()
        now = self._counters()
        out = {k: now[k] - self._base.get(k, 0) for k in now}
        out["usage_mb"] = int((self.cg / "memory.usage_in_bytes").read_text()) >> 20
        return out

    def remove(self) -> None:
        if self._noise:
            self._noise.stop()
            self._noise = None
        if self._limit_before and self.cg.exists():
            try:
                (self.cg / "memory.limit_in_bytes").write_text("-1")
            except OSError:
                pass
        if self.file.exists():
            self.file.unlink()


# ---------------------------------------------------------------------------------------------------------
# the rank itself: frozen or gone
# ---------------------------------------------------------------------------------------------------------
@dataclass
class Hang(Fault):
    """The host's training processes frozen (cgroup v2 freezer: ``cgroup.freeze`` = 1 on the host's v2
    cgroup, which holds the rank and nothing else); the other ranks block in their next collective.
    ``remove`` thaws them and training resumes."""

    kind: str = "hang"

    def __post_init__(self):
        self._t0 = 0.0
        self._frozen = False

    @property
    def cg(self) -> Path:
        return self.host.cgroup("unified")

    def inject(self) -> None:
        if self.pid:  # one rank of the host: stopped (SIGSTOP), its peers on the host run on
            try:
                os.kill(self.pid, signal.SIGSTOP)
            except OSError as exc:
                raise FaultError(f"Failed to stop pid {self.pid}: {exc}", "the rank is gone") from exc
            self._t0, self._frozen = time.monotonic(), True
            return
        try:
            (self.cg / "cgroup.freeze").write_text("1")
        except OSError as exc:
            raise FaultError(
                f"Failed to freeze {self.cg}: {exc}", "the cgroup v2 freezer needs Linux 5.2+ (cgroup.freeze)"
            ) from exc
        self._t0, self._frozen = time.monotonic(), True

    def evidence(self) -> dict:
        if not self._frozen:
            return {}
        if self.pid:
            return {"stopped_pid": self.pid, "frozen_s": round(time.monotonic() - self._t0, 1)}
        events = dict(ln.split() for ln in (self.cg / "cgroup.events").read_text().splitlines() if ln.strip())
        return {
            "frozen": int(events.get("frozen", 0)),
            "frozen_pids": len(cgroup_pids(self.cg)),
            "frozen_s": round(time.monotonic() - self._t0, 1),
        }

    def remove(self) -> None:
        if self._frozen and self.pid:
            try:
                os.kill(self.pid, signal.SIGCONT)
            except OSError:
                pass
        elif self._frozen and (self.cg / "cgroup.freeze").exists():
            try:
                (self.cg / "cgroup.freeze").write_text("0")
            except OSError:
                pass
        self._frozen = False


@dataclass
class Exit(Fault):
    """Every process of the host's v2 cgroup (the rank and its ``obshub run`` wrapper) killed with
    SIGKILL: the rank is gone; the other ranks fail or block at their next collective with it."""

    kind: str = "exit"

    def __post_init__(self):
        self._killed: list[int] = []

    def inject(self) -> None:
        import signal

        for pid in sorted(cgroup_pids(self.host.cgroup("unified"))):
            try:
                os.kill(pid, signal.SIGKILL)
                self._killed.append(pid)
            except ProcessLookupError:
                continue
        if not self._killed:
            raise FaultError(
                f"no process to kill in {self.host.cgroup('unified')}", "the rank of this host is not running"
            )

    def evidence(self) -> dict:
        return {"killed_pids": len(self._killed), "alive": sum(1 for p in self._killed if Path(f"/proc/{p}").exists())}


# ---------------------------------------------------------------------------------------------------------
# sporadic: one short stall every period
# ---------------------------------------------------------------------------------------------------------
def blackout_ruleset(loss_pct: float = 100.0) -> str:
    """The nft script of a network blackout of one host (``nft -f -`` inside its namespace): table
    ``inet obshub_stall`` drops every TCP packet from and to the subnet, with a counter; with
    ``loss_pct`` below 100, that percent of them at random (a loss burst, nft ``numgen random``)."""
    net = SUBNET
    pick = f"numgen random mod 100 < {max(1, min(100, round(loss_pct)))} " if loss_pct < 100 else ""
    return (
        "table inet obshub_stall {\n"
        "  chain input { type filter hook input priority 0; policy accept;\n"
        f"    ip saddr {net} meta l4proto tcp {pick}counter drop\n  }}\n"
        "  chain output { type filter hook output priority 0; policy accept;\n"
        f"    ip daddr {net} meta l4proto tcp {pick}counter drop\n  }}\n}}\n"
    )


def check_choice(key: str, value, allowed: tuple[str, ...], what: str) -> None:
    """Refuse a word ``--param KEY=VALUE`` outside ``allowed``.

    Raises FaultError (a DemoError: the demo's CLI makes it a usage error, exit 2) naming the parameter,
    the value and ``what`` it should be, with the allowed words as the hint."""
    if value not in allowed:
        raise FaultError(f"--param {key}={value}: unknown {what}", f"use one of {', '.join(allowed)}")


@dataclass
class Stall(Fault):
    """A sporadic stall: every ``period_s`` (default 18) one stall of ``stall_ms`` (default 800) in one
    layer of the host, then the host runs normally again. params: ``layer`` (default net):

    - ``net``: a blackout of the host's link: nftables table ``inet obshub_stall`` in its namespace drops
      every TCP packet from and to the subnet (loaded at the stall's start, deleted at its end); with
      ``loss_pct`` (1-99) a loss burst instead: that percent of them dropped at random; with ``delay_ms``
      an RTT spike instead: tc netem delays every packet of both directions of its link by that much (a
      kernel without sch_netem: FaultError at ``prepare``); with ``rate_kbit`` an RTT spike with
      tbf: both directions limited to that rate, segments queued up to 2 s;
    - ``cpu``: a CPU burst: ``procs`` busy loops (default 3 per CPU) at nice -20 in the host's v1 cpu
      cgroup (the training's CFS group: the training gets about 1 % of it while they run), started once
      and stopped (SIGSTOP) between stalls, continued (SIGCONT) during one. With a rank (``pid``,
      ``--fault-rank``) the loops live in the v1 cpu cgroup ``obshub-demo/rank-fault`` instead, and for
      each burst that rank alone is moved into it and pinned with them to one CPU; after the burst it is
      moved back into its host's cgroup and unpinned (``_rank_in`` / ``_rank_out``): loops in the host's
      cgroup starved the host's other ranks too (see ``CpuHog.inject``). Other shapes (``shape``):
      ``outside``: the busy loops run outside the rank's cgroups (the demo's noise cgroups), pinned with
      the host's rank(s) to one CPU (a neighbour's job, not the rank's own container); ``quota``: no busy
      loop, the host's v1 cpu cgroup squeezed to ``quota_us`` (default 1000) of CPU per 100 ms
      (``cpu.cfs_quota_us``) for the stall (a container's CPU limit hit), lifted after; with a rank, that
      rank alone is moved into ``obshub-demo/rank-fault`` squeezed so for each stall, and back after;
    - ``process``: the host's rank (every process of its v2 cgroup; with ``--fault-rank`` that rank's process
      alone, and a ``cpu`` burst then shares one CPU with that rank only) stopped with SIGSTOP for the stall,
      then continued (SIGCONT);
    - ``mem``: memory pressure: during the stall the host's memory cgroup is limited to its anonymous
      memory (memory.stat ``rss``) plus ``room_mb`` (default 64) of page cache, and a stopped hog (as
      ``mem``'s) is continued, reading a file larger than the room: the training's own file pages are
      reclaimed and fault back in; between stalls the hog is stopped and the limit lifted. This slows the
      rank's steps by 50-300 ms of an 800 ms stall, no more (``python -m bench.mem_stall``). With
      ``full`` (``--param full=1``) a burst of anonymous memory that fills the rank's cgroup instead: the
      host's v1 memory cgroup limited to its anonymous memory plus ``room_mb`` (default 16) and a hog in
      it (``ANON_BURST``) touches anonymous memory until the cgroup is full: the rank's file
      pages (its code, its libraries) are reclaimed and, with no swap, nothing else can be, so the
      cgroup's OOM killer (disabled for the fault, ``memory.oom_control``) would act: every task of the
      cgroup that charges a page (the rank refaulting its code) sleeps in the cgroup's OOM wait queue
      until the stall ends (the hog frees its memory, the limit is lifted). This stalls the rank for most
      of the stall (``python -m bench.mem_stall``: the limit alone with a reading or a writing hog slowed
      steps by 50-300 ms of 800; a training rank in steady state charges no new page of its own). A
      hazard it shares with production: a page the kernel itself faults in for the rank while the
      cgroup is full (a ``recv`` into a fresh buffer) gets no wait, the system call fails with EFAULT
      (gloo: "Read error ... Bad address") and the rank exits: 1 of 6 campaign runs and 1 of 3 runs of
      the demo's fault test on 2026-12-05, hence not the default.

    The first stall starts at ``inject``; ``starts_ns`` / ``ends_ns`` hold each stall's CLOCK_REALTIME ns.
    ``remove`` starts no new stall, lets the running one finish (it is never cut short) and undoes
    everything."""

    kind: str = "stall"

    def __post_init__(self):
        self.params = {"layer": "net", "stall_ms": 800, "period_s": 18, **self.params}
        check_choice("layer", self.params["layer"], STALL_LAYERS, "stall layer")
        if not 0 < float(self.params.get("loss_pct", 50)) <= 100:
            raise FaultError(f"--param loss_pct={self.params['loss_pct']}: a percent, 1-100")
        shapes = [k for k in ("loss_pct", "delay_ms", "rate_kbit") if k in self.params]
        if self.params["layer"] != "net" and shapes:
            raise FaultError(
                "--param loss_pct / delay_ms / rate_kbit: shapes of a net stall", "use them with layer=net"
            )
        if len(shapes) > 1:
            raise FaultError(f"--param {' and '.join(shapes)}: one shape of a net stall at a time")
        if self.params["layer"] == "cpu":
            self.params.setdefault("procs", 3 * (os.cpu_count() or 1))
            self.params.setdefault("shape", "burst")
            check_choice("shape", self.params["shape"], CPU_SHAPES, "cpu stall shape")
            if not 0 < int(self.params.get("quota_us", 1000)) <= 100_000:
                raise FaultError(f"--param quota_us={self.params['quota_us']}: µs of CPU per 100 ms period, 1-100000")
        elif "shape" in self.params or "quota_us" in self.params:
            raise FaultError("--param shape / quota_us: shapes of a cpu stall", "use them with layer=cpu")
        if self.params["layer"] == "mem":
            self.params.setdefault("room_mb", 16 if self.params.get("full") else 64)
        self.starts_ns: list[int] = []
        self.ends_ns: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._noise: _Noise | None = None
        self._mem: MemPressure | None = None
        self._stopped: list[int] = []
        self._pinned: list[int] = []  # cpu: the rank pids pinned to the bursts' CPU (unpinned at remove)
        self._rank_cg: Path | None = None  # cpu with a rank: the v1 cpu cgroup it is moved into for a stall
        self._burst_cpu = -1  # cpu burst with a rank: the CPU it and the loops share during a stall
        self._rank_out_of: Path | None = None  # the host cgroup the rank was moved out of (None: it is home)
        self._error = ""
        self._under_oom = 0  # mem: stalls at whose end the cgroup was under OOM (its tasks waited)

    @property
    def _full(self) -> bool:
        """A ``mem`` stall that fills the cgroup (``full``) rather than reading a file through it."""
        return self.params["layer"] == "mem" and bool(self.params.get("full"))

    def prepare(self) -> None:
        """Checks the kernel can shape the stall (an RTT spike of ``delay_ms`` needs tc's netem qdisc) and
        readies a ``mem`` stall's hog. Raises FaultError (exit 2, before t0) when netem is missing."""
        if self.params["layer"] == "net" and self.params.get("delay_ms"):
            refused = qdisc_refused(self.host.netns, ["netem", "delay", "1ms"])
            if refused:
                raise FaultError(
                    f"--param delay_ms: this kernel has no netem qdisc (sch_netem); tc said: {refused}",
                    "use --param rate_kbit=N instead: an RTT spike with tc tbf (segments queue at that rate)",
                )
        if self._full:
            self._mem = MemPressure(self.cluster, self.host, {"file_mb": 0, "hog_anon_mb": 0})
        elif self.params["layer"] == "mem":
            self._mem = MemPressure(self.cluster, self.host, {"file_mb": 256, "hog_anon_mb": 24})
            self._mem.prepare()

    def _signal(self, pids, sig) -> list[int]:
        done = []
        for pid in pids:
            try:
                os.kill(pid, sig)
                done.append(pid)
            except ProcessLookupError:
                continue
        return done

    def _on(self) -> None:
        layer = self.params["layer"]
        if layer == "net" and self.params.get("rate_kbit"):
            tbf = self._tbf()
            sh(["tc", "qdisc", "replace", "dev", self.host.ifname, "root", *tbf], netns=self.host.netns)
            sh(["tc", "qdisc", "replace", "dev", self.host.veth, "root", *tbf])
        elif layer == "net" and self.params.get("delay_ms"):
            delay = ["netem", "delay", f"{float(self.params['delay_ms']):g}ms"]
            sh(["tc", "qdisc", "replace", "dev", self.host.ifname, "root", *delay], netns=self.host.netns)
            sh(["tc", "qdisc", "replace", "dev", self.host.veth, "root", *delay])
        elif layer == "net":
            proc = subprocess.run(
                ["ip", "netns", "exec", self.host.netns, "nft", "-f", "-"],
                input=blackout_ruleset(float(self.params.get("loss_pct") or 100)),
                capture_output=True,
                text=True,
            )
            if proc.returncode:
                raise FaultError(f"Failed to load nftables table obshub_stall in {self.host.netns}: {proc.stderr}")
        elif layer == "cpu" and self.params.get("shape") == "quota":
            cg = self._rank_cg or self.host.cgroup("cpu")
            (cg / "cpu.cfs_quota_us").write_text(str(int(self.params.get("quota_us", 1000))))
            self._rank_in()
        elif layer == "cpu" and self._noise:
            self._rank_in()
            self._signal([p.pid for p in self._noise.procs], signal.SIGCONT)
        elif layer == "process":  # one rank (--fault-rank: its process alone) or every process of the host
            pids = [self.pid] if self.pid else sorted(cgroup_pids(self.host.cgroup("unified")))
            self._stopped = self._signal(pids, signal.SIGSTOP)
        elif layer == "mem" and self._mem and self._mem._noise:
            cg = self._mem.cg
            st = memory_stat(cg)
            # the cgroup's anonymous memory plus room_mb: the hog's burst fills the room, the rank's file
            # pages are reclaimed, and its next charge waits for the cgroup's OOM (disabled) to end
            limit = st.get("rss", 0) + (int(self.params["room_mb"]) << 20)
            (cg / "memory.limit_in_bytes").write_text(str(limit))
            self._signal([p.pid for p in self._mem._noise.procs], signal.SIGUSR2 if self._full else signal.SIGCONT)

    def _tbf(self) -> list[str]:
        """An RTT spike without netem: tbf at ``rate_kbit`` with a queue of up to 2 s (segments wait in it
        rather than being dropped)."""
        return ["tbf", "rate", f"{float(self.params['rate_kbit']):g}kbit", "burst", "16kb", "latency", "2000ms"]

    def _rank_in(self) -> None:
        """A cpu stall of one rank: move the rank (``pid``) into its own v1 cpu cgroup (``_rank_cg``) and,
        for a burst, pin it to the loops' CPU. Nothing without a rank. Raises FaultError when the rank is
        gone (the stall thread records it as the evidence's ``error``)."""
        if not (self.pid and self._rank_cg):
            return
        self._rank_out_of = self.host.cgroup("cpu")
        _move_to(self.pid, self._rank_cg)
        if self._burst_cpu >= 0:
            self._pinned = [self.pid]
            _pin(self.pid, {self._burst_cpu})

    def _rank_out(self) -> None:
        """Undo ``_rank_in``: the rank back in its host's v1 cpu cgroup and on every CPU. Never raises (a
        rank that has exited has nothing to move back)."""
        if self._pinned and self.pid:
            for pid in self._pinned:
                _pin(pid, os.sched_getaffinity(0))
            self._pinned = []
        if self._rank_out_of is not None and self.pid:
            with contextlib.suppress(FaultError):
                _move_to(self.pid, self._rank_out_of)
            self._rank_out_of = None

    def _off(self) -> None:
        layer = self.params["layer"]
        if layer == "net" and (self.params.get("delay_ms") or self.params.get("rate_kbit")):
            sh(["tc", "qdisc", "del", "dev", self.host.ifname, "root"], netns=self.host.netns, check=False)
            sh(["tc", "qdisc", "del", "dev", self.host.veth, "root"], check=False)
        elif layer == "net":
            sh(["nft", "delete", "table", "inet", "obshub_stall"], netns=self.host.netns, check=False)
        elif layer == "cpu" and self.params.get("shape") == "quota":
            self._rank_out()
            with contextlib.suppress(OSError):
                (self._rank_cg or self.host.cgroup("cpu")).joinpath("cpu.cfs_quota_us").write_text("-1")
        elif layer == "cpu" and self._noise:
            self._signal([p.pid for p in self._noise.procs], signal.SIGSTOP)
            self._rank_out()
        elif layer == "process":
            self._signal(self._stopped, signal.SIGCONT)
            self._stopped = []
        elif layer == "mem" and self._mem and self._mem._noise:
            self._under_oom += _under_oom(self._mem.cg)
            # full: the hog frees its burst when it runs again (the limit lifted wakes it and the rank)
            self._signal([p.pid for p in self._mem._noise.procs], signal.SIGUSR1 if self._full else signal.SIGSTOP)
            try:
                (self._mem.cg / "memory.limit_in_bytes").write_text("-1")
            except OSError:
                pass

    def _loop(self) -> None:
        stall_s, period_s = float(self.params["stall_ms"]) / 1e3, float(self.params["period_s"])
        t_next = time.monotonic()
        while not self._stop.wait(max(0.0, t_next - time.monotonic())):
            self.starts_ns.append(time.time_ns())
            try:
                self._on()
                time.sleep(stall_s)  # never cut short: a stall is judged whole
            except (OSError, FaultError, ClusterError) as exc:  # recorded (evidence "error"), never a dead thread
                self._error = str(exc)
            finally:
                self._off()
                self.ends_ns.append(time.time_ns())
            t_next += period_s

    def inject(self) -> None:
        layer = self.params["layer"]
        outside = layer == "cpu" and self.params["shape"] == "outside"
        if layer == "cpu" and self.pid and not outside:
            # one rank (--fault-rank): each stall moves that rank alone into a v1 cpu cgroup of its own (with
            # the burst's loops, or squeezed by the quota) and back after it. Loops in the host's cgroup
            # starved its other ranks too (CFS splits a group's shares over the CPUs by its runnable load:
            # the loops' nice -20 load on the burst's CPU left the group almost no weight on the others,
            # where its other ranks ran; CpuHog.inject), and a squeezed host cgroup stalled all of its ranks
            cg = self.cluster.aux_cgroups("rank-fault").get("cpu")
            if cg is None:
                raise FaultError("no v1 cpu cgroup hierarchy for the faulted rank", "a v1 cpu controller is needed")
            self._rank_cg = cg
            with contextlib.suppress(OSError):  # a quota left by an earlier fault of this cluster
                (cg / "cpu.cfs_quota_us").write_text("-1")
        if layer == "cpu" and self.params["shape"] == "quota":
            cg = self._rank_cg or self.host.cgroup("cpu")
            if not (cg / "cpu.cfs_quota_us").exists():
                raise FaultError(f"no cpu.cfs_quota_us in {cg}", "a v1 cpu controller is needed")
        elif layer == "cpu":
            # outside: the demo's noise cgroups (a neighbour's job); one rank: the rank's own cgroup, which
            # it joins for each burst; else the host's own v1 cpu cgroup
            home = self._rank_cg or self.host.cgroup("cpu")
            self._noise = _Noise(self.cluster, self.host, {} if outside else {"cpu": home})
            argv = [sys.executable, "-c", BUSY_LOOP]
            if self.pid or outside:  # the rank(s) and the bursts share one CPU (--fault-rank: its host's peers
                # the others; the rank is pinned for each burst, by _rank_in)
                cpu = max(os.sched_getaffinity(0))
                if self._rank_cg is not None:
                    self._burst_cpu = cpu
                else:
                    self._pinned = [self.pid] if self.pid else sorted(cgroup_pids(self.host.cgroup("unified")))
                    for pid in self._pinned:
                        _pin(pid, {cpu})
                argv = ["taskset", "-c", str(cpu), *argv]
            self._noise.start(argv, int(self.params["procs"]))
            self._signal([p.pid for p in self._noise.procs], signal.SIGSTOP)
            for p in self._noise.procs:  # a burst that takes the CPUs: nice -20 (CFS weight 88761 vs 1024)
                os.setpriority(os.PRIO_PROCESS, p.pid, -20)
        elif layer == "mem" and self._mem and self._full:
            self._mem._limit_before = "-1"
            self._mem._base = self._mem._counters()
            try:  # the cgroup's tasks wait at its limit instead of one of them being killed
                (self._mem.cg / "memory.oom_control").write_text("1")
            except OSError as exc:
                raise FaultError(f"Failed to disable the OOM killer of {self._mem.cg}: {exc}") from exc
            self._mem._noise = _Noise(self.cluster, self.host, {"memory": self._mem.cg})
            self._mem._noise.start([sys.executable, "-c", ANON_BURST])
            time.sleep(0.5)  # the interpreter's own memory is charged before the first limit
        elif layer == "mem" and self._mem:
            self._mem._limit_before = "-1"
            self._mem._base = self._mem._counters()
            self._mem._noise = _Noise(self.cluster, self.host, {"memory": self._mem.cg})
            self._mem._noise.start(
                [sys.executable, "-c", MEM_HOG, str(self._mem.file), str(self._mem.params["hog_anon_mb"])]
            )
            time.sleep(0.5)  # its anonymous memory is touched before the first limit
            self._signal([p.pid for p in self._mem._noise.procs], signal.SIGSTOP)
        elif layer == "process" and not cgroup_pids(self.host.cgroup("unified")):
            raise FaultError(f"no process to stop in {self.host.cgroup('unified')}", "the rank is not running")
        self._thread = threading.Thread(target=self._loop, name="stall", daemon=True)
        self._thread.start()

    def evidence(self) -> dict:
        out = {
            "stalls": len(self.starts_ns),
            "stalled_s": round(sum(e - s for s, e in zip(self.starts_ns, self.ends_ns)) / 1e9, 2),
        }
        if self._error:
            out["error"] = self._error
        if self._full:
            out["under_oom"] = self._under_oom
        if self._mem and self._mem._noise:
            out.update(self._mem_deltas())
        elif getattr(self, "_mem_counters", None):
            out.update(self._mem_counters)  # measured when the fault was removed
        return out

    def remove(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(float(self.params["stall_ms"]) / 1e3 + 10)
            self._thread = None
        if self._noise:
            # killed while stopped: continued first, the nice -20 loops would burst the CPUs once more
            # until their SIGTERM (a 2026-12-05 campaign saw x3-x4 steps on the other hosts right then)
            self._signal([p.pid for p in self._noise.procs], signal.SIGKILL)
            self._noise.stop()
            self._noise = None
            for pid in self._pinned:
                _pin(pid, os.sched_getaffinity(0))
            self._pinned = []
        self._rank_out()  # the stall thread did, unless it died or is still stuck: the rank home in any case
        if self.params["layer"] == "cpu" and self.params.get("shape") == "quota":
            with contextlib.suppress(OSError):
                (self._rank_cg or self.host.cgroup("cpu")).joinpath("cpu.cfs_quota_us").write_text("-1")
        if self._stopped:
            self._signal(self._stopped, signal.SIGCONT)
            self._stopped = []
        if self.params["layer"] == "net" and (self.params.get("delay_ms") or self.params.get("rate_kbit")):
            sh(["tc", "qdisc", "del", "dev", self.host.ifname, "root"], netns=self.host.netns, check=False)
            sh(["tc", "qdisc", "del", "dev", self.host.veth, "root"], check=False)
        elif self.params["layer"] == "net":
            sh(["nft", "delete", "table", "inet", "obshub_stall"], netns=self.host.netns, check=False)
        if self._mem:
            if self._mem._noise:
                self._mem_counters = self._mem_deltas()  # evidence() after remove() still reports them
                self._signal([p.pid for p in self._mem._noise.procs], signal.SIGKILL)  # not one more burst
            self._mem.remove()
            if self._full:
                try:
                    (self._mem.cg / "memory.oom_control").write_text("0")
                except OSError:
                    pass

    def _mem_deltas(self) -> dict[str, int]:
        st = self._mem._counters()
        return {k: st[k] - self._mem._base.get(k, 0) for k in ("failcnt", "pgmajfault")}


@dataclass
class NoFault(Fault):
    """The clean run: injects nothing."""

    kind: str = "none"


_CLASSES = {
    "none": NoFault,
    "net-slow": NetSlow,
    "net-loss": NetLoss,
    "cpu": CpuHog,
    "mem": MemPressure,
    "hang": Hang,
    "exit": Exit,
    "stall": Stall,
}


def make_fault(kind: str, cluster: Cluster, host: int, params: dict | None = None, pid: int | None = None) -> Fault:
    """The fault of ``kind`` (one of ``KINDS``) on host index ``host`` (``pid``: on that one rank's
    process; ``cpu``, ``hang`` and a ``cpu`` or ``process`` stall only). Raises FaultError for an unknown kind or a host outside the
    cluster."""
    if kind not in _CLASSES:
        raise FaultError(f"unknown fault kind {kind!r}", f"use one of {', '.join(KINDS)}")
    if not 0 <= host < len(cluster.hosts):
        raise FaultError(
            f"--fault-host {host} is outside 0..{len(cluster.hosts) - 1}",
            "hosts are numbered from 0 (host 0 is the rendezvous host)",
        )
    one_rank = kind in ("cpu", "hang") or (kind == "stall" and (params or {}).get("layer") in ("cpu", "process"))
    if pid is not None and not one_rank:
        raise FaultError(
            f"--fault-rank: the {kind} fault hits a whole host",
            "use it with --fault cpu or hang, or a cpu / process stall",
        )
    return _CLASSES[kind](cluster, cluster.hosts[host], dict(params or {}), pid=pid)
