"""A simulated cluster on one machine: H hosts, each a network namespace on a shared bridge with its own
cgroups, and the processes started inside them.

Layout (host index N = 0..H-1; host 0 is the rendezvous host, MASTER_ADDR)::

    root namespace                      netns obshub-h<N>
    bridge obshub-br0 (no address) <--- veth obshub-v<N>  <==>  eth0  10.77.0.<10+N>/24, lo up
    cgroup v1 cpu     /sys/fs/cgroup/cpu/obshub-demo/h<N>
    cgroup v1 memory  /sys/fs/cgroup/memory/obshub-demo/h<N>
    cgroup v2         /sys/fs/cgroup/unified/obshub-demo/h<N>   (what a BPF cgroup filter sees:
                                                                bpf_get_current_cgroup_id() is the v2 id)

Only addresses of 10.77.0.0/24 are used and only inside namespaces this module made; the bridge has no
address, so nothing inside a host can reach the root namespace (the agents run in the root namespace).

Processes are started with ``ip netns exec`` behind a tiny ``sh`` that first writes its own pid into the
host's cgroups, so the process and all its children are accounted there from their first instruction.

Cleanup: every object made is recorded in a state file (default ``/run/obshub-demo/state.json``) before it
is made. ``Cluster.destroy`` (called on exit, Ctrl-C and SIGTERM by the runner) and ``sweep`` (called at
the start of every run, to clean up after a crashed one) kill the processes in the namespaces and
cgroups, then delete namespaces (which takes their nftables tables and the veth ends inside), links,
qdiscs and cgroups; ``sweep`` also removes anything named like them (``obshub-h<N>``, ``obshub-v<N>``,
``obshub-br0``, cgroups ``obshub-demo``) that the state file missed. A lock (``/run/obshub-demo/lock``, flock) keeps two demos from sweeping each other.

Errors raise :class:`obshub.demo.errors.ClusterError` quoting the command and its stderr.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from obshub.demo.errors import ClusterError, DemoBusyError

SUBNET = ipaddress.ip_network("10.77.0.0/24")
BRIDGE = "obshub-br0"
NETNS_PREFIX = "obshub-h"
VETH_PREFIX = "obshub-v"
CGROUP_NAME = "obshub-demo"
CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("cpu", "memory")
V2_DIR = "unified"
STATE_DIR = Path("/run/obshub-demo")
FIRST_HOST_OCTET = 10

Progress = Callable[[str], None]


def _quiet(_msg: str) -> None:
    pass


def sh(argv: list[str], *, check: bool = True, timeout: float = 30.0, netns: str | None = None) -> str:
    """Run ``argv`` (inside ``netns`` when given) and return its stdout. Raises ClusterError with the
    command line and stderr when it exits non-zero and ``check`` is set."""
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as exc:
        raise ClusterError(
            f"Failed to run {argv[0]}: not installed", "run `make setup` (installs iproute2 and nftables)"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise ClusterError(f"`{shlex.join(argv)}` did not finish in {timeout:.0f} s") from exc
    if check and proc.returncode != 0:
        raise ClusterError(
            f"Failed: `{shlex.join(argv)}` exited {proc.returncode}: {proc.stderr.strip()}",
            "run as root on a kernel with network namespaces and cgroups (obshub doctor)",
        )
    return proc.stdout


@dataclass(frozen=True)
class Host:
    """One simulated host: ``index`` N (0-based, also its rank and host id), names and address."""

    index: int

    @property
    def netns(self) -> str:
        return f"{NETNS_PREFIX}{self.index}"

    @property
    def veth(self) -> str:
        """The root-namespace end of the host's link (attached to the bridge)."""
        return f"{VETH_PREFIX}{self.index}"

    @property
    def ifname(self) -> str:
        """The interface name inside the namespace."""
        return "eth0"

    @property
    def address(self) -> str:
        return str(SUBNET.network_address + FIRST_HOST_OCTET + self.index)

    @property
    def name(self) -> str:
        """The host name the agent publishes as (``node-00``, ``node-01``...)."""
        return f"node-{self.index:02d}"

    def cgroup(self, controller: str) -> Path:
        """The host's cgroup directory for ``controller`` (``cpu``, ``memory`` or ``unified``)."""
        return CGROUP_ROOT / controller / CGROUP_NAME / f"h{self.index}"


def cgroup_parent(controller: str) -> Path:
    """``/sys/fs/cgroup/<controller>/obshub-demo``."""
    return CGROUP_ROOT / controller / CGROUP_NAME


def controllers() -> list[str]:
    """The cgroup hierarchies the demo uses that exist on this machine (v1 cpu, memory; v2 unified)."""
    return [c for c in (*V1_CONTROLLERS, V2_DIR) if (CGROUP_ROOT / c / "cgroup.procs").exists()]


def cgroup_pids(path: Path) -> set[int]:
    """Every pid in the cgroup at ``path`` and its descendants (empty when it does not exist)."""
    out: set[int] = set()
    if not path.is_dir():
        return out
    for procs in path.rglob("cgroup.procs"):
        try:
            out |= {int(x) for x in procs.read_text().split()}
        except (OSError, ValueError):
            continue
    return out


def netns_pids(netns: str) -> set[int]:
    """Every pid whose network namespace is ``netns`` (``ip netns pids``)."""
    try:
        out = sh(["ip", "netns", "pids", netns], check=False, timeout=10)
    except ClusterError:
        return set()
    return {int(x) for x in out.split() if x.isdigit()}


def kill_pids(pids: set[int], grace_s: float = 5.0) -> None:
    """SIGTERM ``pids``, wait up to ``grace_s``, then SIGKILL the survivors. Never signals this process."""
    pids = {p for p in pids if p not in (os.getpid(), 0, 1)}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in list(pids):
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pids.discard(p)
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        while pids and time.monotonic() < deadline:
            for p in list(pids):
                try:
                    if os.waitpid(p, os.WNOHANG)[0] == p:
                        pids.discard(p)
                        continue
                except ChildProcessError:
                    pass
                if not Path(f"/proc/{p}").exists() or _is_zombie(p):
                    pids.discard(p)
            time.sleep(0.05)
        if not pids:
            return


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def remove_cgroup_tree(path: Path) -> None:
    """rmdir ``path`` and its sub-cgroups, deepest first (processes must be gone already)."""
    if not path.is_dir():
        return
    dirs = sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
    for d in [*dirs, path]:
        for _ in range(50):
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:  # EBUSY while the last tasks exit
                time.sleep(0.1)
        else:
            raise ClusterError(
                f"Failed to remove cgroup {d}: still busy", f"list what is inside with `cat {d}/cgroup.procs`"
            )


class Cluster:
    """H hosts on one bridge. ``create()`` makes everything, ``spawn()`` starts processes inside a host,
    ``destroy()`` removes everything. Use as a context manager (``with Cluster(4) as c:``), which also
    takes the machine-wide lock and sweeps leftovers of a crashed run first.

    ``state_dir`` holds ``state.json`` (what was made) and ``lock``; tests pass their own only when they
    also use their own names, which this class does not support, so it is the global one by default.
    """

    def __init__(
        self, hosts: int = 4, *, state_dir: Path = STATE_DIR, progress: Progress = _quiet, lock_wait_s: float = 0.0
    ):
        if not 1 <= hosts <= 200:
            raise ClusterError(f"--hosts {hosts} is outside 1..200", "use between 2 and 8 hosts")
        self.hosts = [Host(i) for i in range(hosts)]
        self.state_dir = state_dir
        self.state_file = state_dir / "state.json"
        self.progress = progress
        self.lock_wait_s = lock_wait_s
        self._lock_fd: int | None = None
        self._state: dict = {"pid": os.getpid(), "netns": [], "links": [], "cgroups": [], "pids": [], "paths": []}

    # lock ---------------------------------------------------------------------------------------------
    def lock(self, wait_s: float | None = None) -> None:
        """Take the machine-wide demo lock, waiting up to ``wait_s`` seconds (default: the constructor's
        ``lock_wait_s``) for another demo to finish. Raises DemoBusyError when it is still held."""
        wait_s = self.lock_wait_s if wait_s is None else wait_s
        self.state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.state_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        deadline, told = time.monotonic() + wait_s, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise DemoBusyError(
                        f"another obshub demo (pid {holder}) is using the cluster namespaces",
                        "wait for it to finish (--lock-wait SECONDS), or stop it",
                    ) from None
                if not told:
                    self.progress(f"waiting up to {wait_s:.0f} s for another demo (pid {holder}) to finish")
                    told = True
                time.sleep(1.0)
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def unlock(self) -> None:
        """Release the lock taken by ``lock``."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # state --------------------------------------------------------------------------------------------
    def _record(self, key: str, value) -> None:
        if value not in self._state[key]:
            self._state[key].append(value)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._state, indent=1))
        tmp.replace(self.state_file)

    # create -------------------------------------------------------------------------------------------
    def create(self) -> None:
        """Make the bridge, one namespace + veth + address + cgroups per host. Idempotent only after a
        ``sweep``; raises ClusterError on the first failure (call ``destroy`` to undo the rest)."""
        self.progress(f"creating bridge {BRIDGE}")
        self._record("links", BRIDGE)
        sh(["ip", "link", "add", BRIDGE, "type", "bridge"])
        sh(["ip", "link", "set", BRIDGE, "up"])
        for h in self.hosts:
            self.progress(f"creating host {h.name}: netns {h.netns}, {h.address}")
            self._record("netns", h.netns)
            sh(["ip", "netns", "add", h.netns])
            self._record("links", h.veth)
            sh(["ip", "link", "add", h.veth, "type", "veth", "peer", "name", h.ifname, "netns", h.netns])
            sh(["ip", "link", "set", h.veth, "master", BRIDGE])
            sh(["ip", "link", "set", h.veth, "up"])
            sh(["ip", "addr", "add", f"{h.address}/{SUBNET.prefixlen}", "dev", h.ifname], netns=h.netns)
            sh(["ip", "link", "set", h.ifname, "up"], netns=h.netns)
            sh(["ip", "link", "set", "lo", "up"], netns=h.netns)
            for c in controllers():
                path = h.cgroup(c)
                self._record("cgroups", str(cgroup_parent(c)))
                path.mkdir(parents=True, exist_ok=True)
        self.wait_reachable()

    def wait_reachable(self, timeout_s: float = 15.0) -> None:
        """Wait until host 0 answers a TCP SYN (with a RST: port 9 is closed) from every other host; the
        bridge forwards a moment after its ports come up. No ``ping`` needed."""
        deadline = time.monotonic() + timeout_s
        probe = (
            "import socket,sys\ntry: socket.create_connection((sys.argv[1], 9), 1)\n"
            "except ConnectionRefusedError: sys.exit(0)\nexcept OSError: sys.exit(1)"
        )
        for h in self.hosts[1:]:
            while True:
                out = subprocess.run(
                    ["ip", "netns", "exec", h.netns, sys.executable, "-c", probe, self.hosts[0].address],
                    capture_output=True,
                )
                if out.returncode == 0:
                    break
                if time.monotonic() > deadline:
                    raise ClusterError(
                        f"{h.name} cannot reach {self.hosts[0].address} over {BRIDGE}",
                        "check `ip link show master obshub-br0` and bridge-nf settings",
                    )
                time.sleep(0.2)

    # processes ----------------------------------------------------------------------------------------
    def spawn(
        self,
        host: Host | int,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        stdout=None,
        stderr=None,
        cgroups: dict[str, Path] | None = None,
        netns: bool = True,
    ) -> subprocess.Popen:
        """Start ``argv`` inside ``host``'s namespace (``netns=False``: in the root namespace) and cgroups.

        ``cgroups`` overrides the cgroup per hierarchy (``{"cpu": path, "unified": path, ...}``; a
        hierarchy mapped to None is left as inherited). The process leads its own session, so
        ``stop(proc)`` reaches its children. Returns the Popen of the wrapper, whose pid is the process's
        pid (the wrapper ``exec``s)."""
        h = self.hosts[host] if isinstance(host, int) else host
        targets = {c: h.cgroup(c) for c in controllers()}
        targets.update(cgroups or {})
        writes = " ".join(
            f"echo $$ > {shlex.quote(str(p / 'cgroup.procs'))} &&" for p in targets.values() if p is not None
        )
        inner = (["ip", "netns", "exec", h.netns] if netns else []) + argv
        script = f"{writes} exec {shlex.join(inner)}"
        proc = subprocess.Popen(["sh", "-c", script], env=env, stdout=stdout, stderr=stderr, start_new_session=True)
        self._record("pids", [proc.pid, start_time(proc.pid)])
        return proc

    @staticmethod
    def stop(proc: subprocess.Popen, grace_s: float = 5.0) -> int | None:
        """SIGTERM the process group of ``proc``, SIGKILL after ``grace_s``; returns its exit code."""
        if proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        return proc.poll()

    def aux_cgroups(self, name: str) -> dict[str, Path]:
        """Make (once) ``obshub-demo/<name>`` in every hierarchy, for processes that belong to the demo
        but to no host (agents, noise), and return ``{hierarchy: path}`` for ``spawn(cgroups=...)``."""
        out = {}
        for c in controllers():
            self._record("cgroups", str(cgroup_parent(c)))
            out[c] = cgroup_parent(c) / name
            out[c].mkdir(parents=True, exist_ok=True)
        return out

    def record_path(self, path: Path) -> None:
        """Note a file or folder the demo makes outside the cluster (removed by ``destroy``/``sweep``)."""
        self._record("paths", str(path))

    def pids(self) -> set[int]:
        """Every process inside any host's namespace or cgroups."""
        out: set[int] = set()
        for h in self.hosts:
            out |= netns_pids(h.netns)
        for c in controllers():
            out |= cgroup_pids(cgroup_parent(c))
        return out

    # destroy ------------------------------------------------------------------------------------------
    def destroy(self) -> list[str]:
        """Kill every process of the cluster and remove namespaces, links and cgroups. Never raises for
        something already gone; returns what was removed."""
        removed = _teardown(self._state, self.progress)
        if self.state_file.exists():
            self.state_file.unlink()
        return removed

    def __enter__(self) -> "Cluster":
        self.lock()
        sweep(self.state_dir, self.progress)
        try:
            self.create()
        except BaseException:
            self.destroy()
            self.unlock()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.destroy()
        finally:
            self.unlock()


def _teardown(state: dict, progress: Progress) -> list[str]:
    removed: list[str] = []
    # a recorded pid may have been reused after a crash: it counts only when its start time matches
    ours = {pid for pid, started in state.get("pids", []) if start_time(pid) == started}
    for ns in state.get("netns", []):
        ours |= netns_pids(ns)
    for cg in state.get("cgroups", []):
        ours |= cgroup_pids(Path(cg))
    if ours:
        progress(f"stopping {len(ours)} demo processes")
        kill_pids(ours)
        removed.append(f"{len(ours)} processes")
    existing = _netns_list()
    for ns in state.get("netns", []):
        if ns in existing:
            sh(["ip", "netns", "del", ns], check=False)
            removed.append(f"netns {ns}")
    for link in state.get("links", []):
        if _link_exists(link):
            sh(["ip", "link", "del", link], check=False)
            removed.append(f"link {link}")
    for cg in state.get("cgroups", []):
        if Path(cg).exists():
            remove_cgroup_tree(Path(cg))
            removed.append(f"cgroup {cg}")
    for path in map(Path, state.get("paths", [])):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(f"folder {path}")
        elif path.exists():
            path.unlink()
            removed.append(f"file {path}")
    if removed:
        progress("removed " + ", ".join(removed))
    return removed


def start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (field 22 of /proc/<pid>/stat), None when gone;
    (pid, start time) names a process even after pids are reused."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _netns_list() -> list[str]:
    out = sh(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


def last_lock_holder(state_dir: Path = STATE_DIR) -> int | None:
    """The pid that last took the demo lock (it stays written after release), None when unknown."""
    try:
        return int((state_dir / "lock").read_text().strip())
    except (OSError, ValueError):
        return None


def _ours(name: str) -> bool:
    """Names this module makes: ``obshub-h<N>`` (namespaces), ``obshub-v<N>`` (veths), ``obshub-br0``.
    Other ``obshub-*`` names (e.g. a probe test's ``obshub-t-...`` namespace) belong to someone else."""
    return name == BRIDGE or re.fullmatch(rf"({re.escape(NETNS_PREFIX)}|{re.escape(VETH_PREFIX)})\d+", name) is not None


def leftovers() -> dict[str, list[str]]:
    """What of a demo exists on this machine now, by name: ``{"netns": [...], "links": [...],
    "cgroups": [...]}`` (namespaces ``obshub-h<N>``, links ``obshub-v<N>`` and ``obshub-br0``, cgroups
    ``*/obshub-demo``)."""
    links = []
    for line in sh(["ip", "-o", "link", "show"], check=False).splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if _ours(name):
                links.append(name)
    return {
        "netns": [n for n in _netns_list() if _ours(n)],
        "links": links,
        "cgroups": [str(cgroup_parent(c)) for c in controllers() if cgroup_parent(c).exists()],
    }


def sweep(state_dir: Path = STATE_DIR, progress: Progress = _quiet) -> list[str]:
    """Remove what a previous (crashed) run left: everything in its state file, then anything named as
    this module names things (``obshub-h<N>``, ``obshub-v<N>``, ``obshub-br0``, cgroups ``obshub-demo``). The caller must hold the lock.
    Returns what was removed."""
    state: dict = {"netns": [], "links": [], "cgroups": [], "pids": [], "paths": []}
    state_file = state_dir / "state.json"
    if state_file.exists():
        try:
            state.update(json.loads(state_file.read_text()))
        except (OSError, ValueError):
            progress(f"ignoring unreadable {state_file}")
    found = leftovers()
    for key in ("netns", "links", "cgroups"):
        state[key] = list(dict.fromkeys([*state.get(key, []), *found[key]]))
    # namespaces first (their processes die), bridge after its ports
    state["links"].sort(key=lambda n: n == BRIDGE)
    removed = _teardown(state, progress) if any(state[k] for k in ("netns", "links", "cgroups", "paths")) else []
    if state_file.exists():
        state_file.unlink()
    if removed:
        progress("cleaned up after a previous run: " + ", ".join(removed))
    return removed
