"""Each demo fault really acts on a real gloo DDP training (obshub.workloads.ddp_train) running across
three network namespaces: net-loss drops data segments (nft counter) and their senders retransmit them; net-slow throttles
(tc overlimits) and the steps slow down; cpu gives the hog CPU time and the training waits on the run
queue; mem makes the cgroup hit its limit and refault. After each fault the training still runs.

One cluster and one training serve every fault (module fixture), to keep the file near 1 minute."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from obshub.demo import parts
from obshub.demo.cluster import Cluster, last_lock_holder, leftovers
from obshub.demo.faults import make_fault

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces, cgroups)"),
    pytest.mark.torch,
]

HOSTS = 3
FAULTY = 2


class Training:
    """ddp_train ranks in the cluster; ``steps[i]`` = list of (monotonic s, step ms) per rank."""

    def __init__(self, cluster: Cluster):
        self.procs, self.steps = [], {h.index: [] for h in cluster.hosts}
        for h in cluster.hosts:
            env = parts.training_env(dict(os.environ), h, HOSTS, cluster.hosts[0].address)
            p = cluster.spawn(
                h,
                [sys.executable, "-m", parts.TRAIN_MODULE, "--steps", "1000000"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
            self.procs.append(p)
            threading.Thread(target=self._read, args=(h.index, p), daemon=True).start()

    def _read(self, i, p):
        for line in p.stdout:
            parts_ = line.split()
            if parts_[:1] == [b"step"]:
                self.steps[i].append((time.monotonic(), float(parts_[5])))

    def count(self, i: int) -> int:
        return len(self.steps[i])

    def wait_steps(self, n: int, timeout: float = 120.0) -> None:
        """Wait until every rank made ``n`` more steps."""
        start = {i: self.count(i) for i in self.steps}
        deadline = time.monotonic() + timeout
        while any(self.count(i) < start[i] + n for i in self.steps):
            assert all(p.poll() is None for p in self.procs), "a training rank exited"
            assert time.monotonic() < deadline, f"training made no {n} steps in {timeout} s"
            time.sleep(0.1)

    def max_ms_since(self, t: float) -> float:
        """The slowest step of the faulty rank that ended after monotonic time ``t`` (0 when none)."""
        return max((ms for ts, ms in self.steps[FAULTY] if ts >= t), default=0.0)

    def median_ms_since(self, t: float) -> float:
        xs = sorted(ms for ts, ms in self.steps[FAULTY] if ts >= t)
        return xs[len(xs) // 2] if xs else float("inf")


@pytest.fixture(scope="module")
def training():
    with Cluster(HOSTS, lock_wait_s=500) as c:  # wait for another demo on this machine
        t = Training(c)
        t.wait_steps(5)
        yield c, t
        for p in t.procs:
            Cluster.stop(p)
    holder = last_lock_holder()
    assert leftovers() == {"netns": [], "links": [], "cgroups": []} or (
        holder not in (None, os.getpid()) and os.path.exists(f"/proc/{holder}")
    )


def _apply(cluster, kind, seconds, params=None):
    f = make_fault(kind, cluster, FAULTY, params)
    f.prepare()
    f.inject()
    try:
        time.sleep(seconds)
        return f.evidence()
    finally:
        f.remove()


def _until(cond, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        time.sleep(0.2)


def test_net_loss_drops_and_retransmits(training):
    """A data segment dropped on its way into the faulty host was sent by a peer, and the peer
    retransmits it (its own namespace counts it): the fault stays until the table's ``data-in`` counter
    has dropped data segments, and then the retransmits over every namespace of the cluster must grow
    (the training makes steps again only once every dropped segment was retransmitted). Waits for the
    conditions, never for a fixed time (a loaded machine may send little in a few seconds)."""
    from obshub.demo.faults import cluster_retrans_segs

    c, t = training
    before = cluster_retrans_segs(c)
    f = make_fault("net-loss", c, FAULTY)
    f.prepare()
    f.inject()
    try:
        _until(lambda: f.data_dropped() >= 3, 120, "no data segment from a peer was dropped")
        ev = f.evidence()
    finally:
        f.remove()
    assert ev["nft_dropped_data_in"] >= 3 and ev["nft_dropped_packets"] >= ev["nft_dropped_data_in"], ev
    t.wait_steps(2)
    _until(lambda: cluster_retrans_segs(c) > before, 60, "no peer retransmitted the dropped data")
    # the table is gone and training goes on
    out = subprocess.run(
        ["ip", "netns", "exec", c.hosts[FAULTY].netns, "nft", "list", "tables"], capture_output=True, text=True
    ).stdout
    assert "obshub_fault" not in out
    t.wait_steps(3)


def test_net_slow_throttles_and_slows_steps(training):
    c, t = training
    before_t = time.monotonic()
    t.wait_steps(10)
    before = t.median_ms_since(before_t)
    during_t = time.monotonic()
    ev = _apply(c, "net-slow", 5, {"rate_mbit": 8})
    # a throttled step may still be in flight when the fault is removed: let it finish, then take the
    # slowest step that ended since the fault began (steps that ended just before it took hold are fast)
    t.wait_steps(2)
    during = t.max_ms_since(during_t)
    assert ev["egress_overlimits"] > 0 and ev["ingress_overlimits"] > 0
    assert ev["egress_bytes"] > 0
    # 8 Mbit/s for a 4.4 MB gradient all-reduce: a step takes seconds instead of tens of ms
    assert during > 3 * before, (before, during)
    out = subprocess.run(["tc", "qdisc", "show", "dev", c.hosts[FAULTY].veth], capture_output=True, text=True)
    assert "tbf" not in out.stdout
    t.wait_steps(3)


def test_cpu_hog_takes_cpu_and_delays_training(training):
    c, t = training
    ev = _apply(c, "cpu", 4)
    assert ev["hog_cpu_s"] > 0.5
    assert ev["training_runq_wait_s"] > 0.2
    assert ev["hog_share_of_machine"] > 0.1
    t.wait_steps(3)


def test_a_one_rank_cpu_hog_starves_that_rank_in_a_cgroup_of_its_own_and_gives_it_back(training):
    """``--fault cpu --fault-rank``: the rank and the busy loops share a v1 cpu cgroup of their own (loops at
    ``RANK_HOG_NICE``), not the host's: loops in the host's cgroup starved its other ranks too (CFS splits
    a group's shares over the CPUs by its runnable load; walk24, 2 x 2 ranks: rank 2 named for rank 3's
    fault). On removal the rank is back in its host's cgroup and trains on (on 7bd97fe the loops ran in
    the host's cgroup beside the rank)."""
    from obshub.demo.cluster import cgroup_pids
    from obshub.demo.faults import RANK_HOG_NICE

    c, t = training
    rank = t.procs[FAULTY]
    host_cg = c.hosts[FAULTY].cgroup("cpu")
    f = make_fault("cpu", c, FAULTY, pid=rank.pid)
    f.prepare()
    f.inject()
    try:
        time.sleep(2.0)
        loops = [p.pid for p in f._noise.procs]
        mine = cgroup_pids(host_cg)
        assert rank.pid not in mine and not set(loops) & mine, (rank.pid, loops, mine)
        own = (c.aux_cgroups("rank-fault")["cpu"] / "cgroup.procs").read_text().split()
        assert str(rank.pid) in own and all(str(p) in own for p in loops), own
        assert {os.getpriority(os.PRIO_PROCESS, p) for p in loops} == {RANK_HOG_NICE}
        ev = f.evidence()
    finally:
        f.remove()
    assert ev["hog_cpu_s"] > 0.5 and ev["training_runq_wait_s"] > 0.1, ev
    assert rank.pid in cgroup_pids(host_cg)
    t.wait_steps(3)


def _wait_for(cond, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        time.sleep(0.01)


def _sleep_until_ns(t_ns: int) -> None:
    time.sleep(max(0.0, (t_ns - time.time_ns()) / 1e9))


def test_a_one_rank_cpu_burst_runs_in_a_cgroup_of_its_own_and_its_host_peers_keep_their_cpu(training):
    """``--fault stall --param layer=cpu --fault-rank``: for each burst the rank alone joins the busy loops
    (nice -20) in the v1 cpu cgroup ``obshub-demo/rank-fault`` and is pinned to their CPU; after it the rank
    is back in its host's cgroup on every CPU, and at removal too. A peer of the rank in the host's cgroup,
    on the other CPU against an equal-weight neighbour there, keeps about half that CPU during the bursts:
    on f6666cb the loops ran in the host's cgroup, whose weight CFS then put almost all on the burst's CPU
    (by its runnable load), so the peer got ~0.2 % of its CPU (the 2 x 2 cpu fault's rank 2 starvation,
    lead24). The burst still stalls the rank's step."""
    from obshub.demo.cluster import cgroup_pids
    from obshub.demo.faults import BUSY_LOOP, proc_cpu_ns

    c, t = training
    cpus = sorted(os.sched_getaffinity(0))
    assert len(cpus) >= 2, "needs two CPUs"
    rank, host = t.procs[FAULTY], c.hosts[FAULTY]
    host_cg, own_cg = host.cgroup("cpu"), c.aux_cgroups("rank-fault")["cpu"]
    noise = c.aux_cgroups("noise")
    loop = ["taskset", "-c", str(cpus[0]), sys.executable, "-c", BUSY_LOOP]
    # the host's other rank (its v1 cpu cgroup; v2 outside, no rank of the job) and a neighbour's job, both
    # on the CPU the burst leaves alone
    peer = c.spawn(host, loop, cgroups={"unified": noise["unified"]} if "unified" in noise else None)
    neighbour = c.spawn(host, loop, cgroups=noise)
    f = None
    try:
        t.wait_steps(10)
        t_base = time.monotonic()
        t.wait_steps(10)
        median = t.median_ms_since(t_base)
        f = make_fault("stall", c, FAULTY, {"layer": "cpu", "stall_ms": 800, "period_s": 2.5}, pid=rank.pid)
        f.prepare()
        t0 = time.monotonic()
        f.inject()
        loops = [p.pid for p in f._noise.procs]
        shares, during, between = [], [], []
        for k in (1, 2):
            _wait_for(lambda k=k: len(f.starts_ns) >= k, 10, f"no stall {k}")
            start = f.starts_ns[k - 1]
            _sleep_until_ns(start + 250_000_000)
            a = proc_cpu_ns(peer.pid)[0], proc_cpu_ns(neighbour.pid)[0]
            _sleep_until_ns(start + 700_000_000)
            b = proc_cpu_ns(peer.pid)[0], proc_cpu_ns(neighbour.pid)[0]
            assert len(f.ends_ns) < k, "the stall ended before it was sampled"
            mine, own = cgroup_pids(host_cg), cgroup_pids(own_cg)
            during.append(
                (rank.pid in own, set(loops) <= own, rank.pid not in mine, os.sched_getaffinity(rank.pid) == {cpus[-1]})
            )
            peer_ns, neighbour_ns = b[0] - a[0], b[1] - a[1]
            assert peer_ns + neighbour_ns > 50_000_000, (k, peer_ns, neighbour_ns)  # the CPU ran them at all
            shares.append(peer_ns / (peer_ns + neighbour_ns))
            _wait_for(lambda k=k: len(f.ends_ns) >= k, 5, f"stall {k} did not end")
            time.sleep(0.05)
            # between bursts: the rank home, on every CPU, the loops stopped
            between.append(
                (
                    rank.pid in cgroup_pids(host_cg),
                    rank.pid not in cgroup_pids(own_cg),
                    os.sched_getaffinity(rank.pid) == set(cpus),
                )
            )
            for p in loops:
                with open(f"/proc/{p}/stat") as fh:
                    assert fh.read().rsplit(")", 1)[1].split()[0] == "T", p
    finally:
        if f is not None:
            f.remove()
        for p in (peer, neighbour):
            Cluster.stop(p, grace_s=1.0)
    ev = f.evidence()
    assert not ev.get("error"), ev
    # equal weights on that CPU: about half each; f6666cb: 0.001-0.01 (the host group's weight there ~2)
    print(f"the peer's share of its CPU against an equal-weight neighbour during bursts 1, 2: {shares}")
    assert min(shares) > 0.25, shares
    # in each burst: the rank and the loops in the rank's own cgroup, the rank out of its host's, pinned
    assert during == [(True, True, True, True)] * 2, during
    assert between == [(True, True, True)] * 2, between
    assert rank.pid in cgroup_pids(host_cg) and not cgroup_pids(own_cg)
    assert os.sched_getaffinity(rank.pid) == set(cpus)
    t.wait_steps(5)
    slow = max(ms for ts, ms in t.steps[FAULTY] if ts >= t0)
    assert slow >= max(3 * median, median + 250), (median, slow)


def test_a_one_rank_cpu_quota_stall_squeezes_that_rank_alone_and_gives_it_back(training):
    """``--param layer=cpu --param shape=quota --fault-rank``: for each stall the rank alone is moved into
    ``obshub-demo/rank-fault`` squeezed to ``quota_us`` per 100 ms; its host's cgroup (its peers) is never
    squeezed (on f6666cb the host's ``cpu.cfs_quota_us`` was: every rank of the host stalled), and after
    each stall and at removal the rank is home and no quota is left."""
    from obshub.demo.cluster import cgroup_pids

    c, t = training
    rank, host = t.procs[FAULTY], c.hosts[FAULTY]
    host_cg, own_cg = host.cgroup("cpu"), c.aux_cgroups("rank-fault")["cpu"]

    def quota(cg):
        return int((cg / "cpu.cfs_quota_us").read_text())

    params = {"layer": "cpu", "shape": "quota", "quota_us": 2000, "stall_ms": 800, "period_s": 2.5}
    f = make_fault("stall", c, FAULTY, params, pid=rank.pid)
    f.prepare()
    f.inject()
    try:
        for k in (1, 2):
            _wait_for(lambda k=k: len(f.starts_ns) >= k, 10, f"no stall {k}")
            _sleep_until_ns(f.starts_ns[k - 1] + 400_000_000)
            assert len(f.ends_ns) < k
            assert quota(host_cg) == -1 and quota(own_cg) == 2000
            assert rank.pid in cgroup_pids(own_cg) and rank.pid not in cgroup_pids(host_cg)
            _wait_for(lambda k=k: len(f.ends_ns) >= k, 5, f"stall {k} did not end")
            time.sleep(0.05)
            assert rank.pid in cgroup_pids(host_cg) and quota(own_cg) == -1
    finally:
        f.remove()
    assert not f.evidence().get("error")
    assert rank.pid in cgroup_pids(host_cg) and quota(host_cg) == -1 and quota(own_cg) == -1
    t.wait_steps(3)


def test_hang_freezes_the_rank_and_training_resumes(training):
    c, t = training
    f = make_fault("hang", c, FAULTY)
    f.prepare()
    f.inject()
    try:
        time.sleep(1.0)
        n = {i: t.count(i) for i in t.steps}
        time.sleep(2.0)
        ev = f.evidence()
        # frozen: no rank makes a step (the others block in the collective with it)
        assert {i: t.count(i) for i in t.steps} == n
    finally:
        f.remove()
    assert ev["frozen"] == 1 and ev["frozen_pids"] >= 1, ev
    t.wait_steps(3)


def test_mem_pressure_reclaims_in_the_cgroup(training):
    c, t = training
    ev = _apply(c, "mem", 5)
    assert ev["failcnt"] > 0  # charges hit memory.limit_in_bytes
    assert ev["workingset_refault_file"] > 0  # reclaimed file pages were faulted back in
    assert ev["pgpgout"] > 0
    limit = (c.hosts[FAULTY].cgroup("memory") / "memory.limit_in_bytes").read_text()
    assert int(limit) > 1 << 60  # the limit was lifted again
    t.wait_steps(3)


@pytest.mark.parametrize("layer", ["net", "cpu", "process", "mem"])
def test_sporadic_stall_stalls_single_steps_then_training_runs_normally(training, layer):
    # kind stall: one 800 ms stall every 3 s; each stalls the faulty rank's step far beyond its median
    # (the rule's default is 3 x the median and 250 ms more), and the steps between are normal again
    c, t = training
    t.wait_steps(10)
    t_base = time.monotonic()
    t.wait_steps(20)
    median = t.median_ms_since(t_base)
    f = make_fault("stall", c, FAULTY, {"layer": layer, "stall_ms": 800, "period_s": 3})
    f.prepare()
    t0 = time.monotonic()
    f.inject()
    try:
        time.sleep(7.0)
    finally:
        f.remove()
    ev = f.evidence()
    assert ev["stalls"] == 3 and 2.3 <= ev["stalled_s"] <= 3.2 and not ev.get("error"), ev
    assert [round((e - s) / 1e9, 1) >= 0.8 for s, e in zip(f.starts_ns, f.ends_ns)] == [True] * 3
    t.wait_steps(5)
    slow = sorted((ms for ts, ms in t.steps[FAULTY] if ts >= t0), reverse=True)
    if layer == "mem":
        # measured: the tight limit slows the step x1.5-x4 of the median here (+100-200 ms), below the
        # stall rules' threshold (x3 AND +250 ms): a brief memory stall of this size is not a "stalled
        # step". What the injector must do is reclaim in the rank's cgroup (failcnt, below); the step's
        # slowdown depends on the machine's page cache and load and is not asserted.
        pass
    else:
        assert slow[0] >= max(3 * median, median + 250), (layer, median, slow[:6])
    # a sporadic stall: most steps in between run at the usual pace
    assert t.median_ms_since(t0) < 2 * median, (layer, median, slow)
    if layer == "mem":
        assert ev["failcnt"] > 0, ev
    limit = (c.hosts[FAULTY].cgroup("memory") / "memory.limit_in_bytes").read_text()
    assert int(limit) > 1 << 60  # no limit left behind


def test_an_rtt_spike_without_netem_is_refused_before_the_first_stall(training):
    # `--param delay_ms` shapes the stall with tc netem, which some kernels lack (this one: "Specified qdisc
    # kind is unknown"); prepare() says so, with the tbf shape as the way out, instead of failing every stall
    from obshub.demo.errors import FaultError
    from obshub.demo.faults import qdisc_refused

    c, _t = training
    ns = c.hosts[FAULTY].netns
    tried = subprocess.run(
        ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
        capture_output=True,
        text=True,
    )
    subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True)
    assert (qdisc_refused(ns, ["netem", "delay", "1ms"]) != "") == (tried.returncode != 0)
    f = make_fault("stall", c, FAULTY, {"layer": "net", "delay_ms": 50})
    if tried.returncode:
        with pytest.raises(FaultError, match="no netem qdisc") as e:
            f.prepare()
        assert "rate_kbit" in e.value.hint
    else:
        f.prepare()
    qdiscs = subprocess.run(
        ["ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True
    )
    assert "netem" not in qdiscs.stdout  # nothing left on the namespace's loopback
    assert qdisc_refused(ns, ["tbf", "rate", "1000kbit", "burst", "16kb", "latency", "100ms"]) == ""
