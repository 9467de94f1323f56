"""In-process instrumentation: the USDT extension, `obshub.instrument` and
`obshub run`, observed with a real bcc USDT reader attached to ``obshub.instrument.usdt.library_path()`` in the
running kernel, and real torch.distributed (gloo) training in subprocesses.

The reader sees every process that fires the probes on this machine (other test sessions may run
instrumented programs at the same time), so each test keeps only the processes that registered with its
own unique job name.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from pathlib import Path

import pytest

from obshub.core import schema
from obshub.instrument import usdt

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
OBSHUB = [PY, "-m", "obshub.cli"]
PROBES = usdt.PROBES

# One handler per probe; each copies its arguments into one ring-buffer record.
READER_C = r"""
struct rec {
    u32 probe;
    u32 pid;
    u32 tid;
    s32 i32[4];
    s64 step;
    u64 key;
    u64 seq;
    u64 bytes;
    char s1[32];
    char s2[32];
};
BPF_RINGBUF_OUTPUT(events, 1024);

static __always_inline struct rec *start(u32 probe)
{
    struct rec *r = events.ringbuf_reserve(sizeof(struct rec));
    if (!r)
        return 0;
    __builtin_memset(r, 0, sizeof(*r));
    u64 id = bpf_get_current_pid_tgid();
    r->probe = probe;
    r->pid = id >> 32;
    r->tid = (u32)id;
    return r;
}

/* bcc rewrites bpf_usdt_readarg per attached function: each handler reads its own arguments */

int on_register(struct pt_regs *ctx)
{
    struct rec *r = start(0);
    if (!r)
        return 0;
    u64 a1 = 0;
    bpf_usdt_readarg(1, ctx, &a1);
    bpf_probe_read_user_str(r->s1, sizeof(r->s1), (void *)a1);
    bpf_usdt_readarg(2, ctx, &r->i32[0]);
    bpf_usdt_readarg(3, ctx, &r->i32[1]);
    bpf_usdt_readarg(4, ctx, &r->i32[2]);
    bpf_usdt_readarg(5, ctx, &r->i32[3]);
    events.ringbuf_submit(r, 0);
    return 0;
}

int on_tracekey(struct pt_regs *ctx)
{
    struct rec *r = start(1);
    if (!r)
        return 0;
    bpf_usdt_readarg(1, ctx, &r->key);
    bpf_usdt_readarg(2, ctx, &r->step);
    events.ringbuf_submit(r, 0);
    return 0;
}

int on_step_begin(struct pt_regs *ctx)
{
    struct rec *r = start(2);
    if (!r)
        return 0;
    bpf_usdt_readarg(1, ctx, &r->step);
    bpf_usdt_readarg(2, ctx, &r->key);
    events.ringbuf_submit(r, 0);
    return 0;
}

int on_step_end(struct pt_regs *ctx)
{
    struct rec *r = start(3);
    if (!r)
        return 0;
    bpf_usdt_readarg(1, ctx, &r->step);
    bpf_usdt_readarg(2, ctx, &r->key);
    events.ringbuf_submit(r, 0);
    return 0;
}

int on_phase_begin(struct pt_regs *ctx)
{
    struct rec *r = start(4);
    if (!r)
        return 0;
    u64 a1 = 0;
    bpf_usdt_readarg(1, ctx, &a1);
    bpf_probe_read_user_str(r->s1, sizeof(r->s1), (void *)a1);
    bpf_usdt_readarg(2, ctx, &r->step);
    bpf_usdt_readarg(3, ctx, &r->key);
    events.ringbuf_submit(r, 0);
    return 0;
}

int on_phase_end(struct pt_regs *ctx)
{
    struct rec *r = start(5);
    if (!r)
        return 0;
    u64 a1 = 0;
    bpf_usdt_readarg(1, ctx, &a1);
    bpf_probe_read_user_str(r->s1, sizeof(r->s1), (void *)a1);
    bpf_usdt_readarg(2, ctx, &r->step);
    bpf_usdt_readarg(3, ctx, &r->key);
    events.ringbuf_submit(r, 0);
    return 0;
}

int on_coll_begin(struct pt_regs *ctx)
{
    struct rec *r = start(6);
    if (!r)
        return 0;
    u64 a1 = 0, a3 = 0;
    bpf_usdt_readarg(1, ctx, &a1);
    bpf_probe_read_user_str(r->s1, sizeof(r->s1), (void *)a1);
    bpf_usdt_readarg(2, ctx, &r->seq);
    bpf_usdt_readarg(3, ctx, &a3);
    bpf_probe_read_user_str(r->s2, sizeof(r->s2), (void *)a3);
    bpf_usdt_readarg(4, ctx, &r->bytes);
    bpf_usdt_readarg(5, ctx, &r->step);
    bpf_usdt_readarg(6, ctx, &r->key);
    events.ringbuf_submit(r, 0);
    return 0;
}

int on_coll_end(struct pt_regs *ctx)
{
    struct rec *r = start(7);
    if (!r)
        return 0;
    u64 a1 = 0, a3 = 0;
    bpf_usdt_readarg(1, ctx, &a1);
    bpf_probe_read_user_str(r->s1, sizeof(r->s1), (void *)a1);
    bpf_usdt_readarg(2, ctx, &r->seq);
    bpf_usdt_readarg(3, ctx, &a3);
    bpf_probe_read_user_str(r->s2, sizeof(r->s2), (void *)a3);
    bpf_usdt_readarg(4, ctx, &r->bytes);
    bpf_usdt_readarg(5, ctx, &r->step);
    bpf_usdt_readarg(6, ctx, &r->key);
    events.ringbuf_submit(r, 0);
    return 0;
}
"""


class Rec(ctypes.Structure):
    _fields_ = [
        ("probe", ctypes.c_uint32),
        ("pid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("i32", ctypes.c_int32 * 4),
        ("step", ctypes.c_int64),
        ("key", ctypes.c_uint64),
        ("seq", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("s1", ctypes.c_char * 32),
        ("s2", ctypes.c_char * 32),
    ]


class UsdtReader:
    """Collects every obshub USDT probe hit on this machine as dicts, in ring-buffer order."""

    def __init__(self):
        from bcc import BPF, USDT

        from obshub.core.settings import load_settings
        from obshub.producer import kheaders

        kheaders.apply_env(load_settings())
        u = USDT(path=usdt.library_path())
        # the separate probes only: with phase_next, step_next and coll untraced, the instrumentation
        # fires the separate ones, which this reader asserts on (the merged ones are covered with the
        # agent's handlers in tests/producer/test_probes_usdt.py)
        for name in PROBES:
            if name not in ("phase_next", "step_next", "coll", "caught", "coll_late"):
                u.enable_probe(probe=name, fn_name=f"on_{name}")
        self.bpf = BPF(text=READER_C.encode(), usdt_contexts=[u])
        self.records: list[dict] = []
        self._lock = threading.Lock()
        self.bpf[b"events"].open_ring_buffer(self._on_event)
        self._stop = threading.Event()
        self._drain = threading.Event()
        self._drained = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _on_event(self, ctx, data, size):
        r = ctypes.cast(data, ctypes.POINTER(Rec)).contents
        rec = {
            "probe": PROBES[r.probe],
            "pid": r.pid,
            "tid": r.tid,
            "i32": list(r.i32),
            "step": r.step,
            "key": r.key,
            "seq": r.seq,
            "bytes": r.bytes,
            "s1": r.s1.decode(),
            "s2": r.s2.decode(),
        }
        with self._lock:
            self.records.append(rec)

    def _loop(self):
        # the only thread touching the ring buffer: polls, and drains it completely on request
        while not self._stop.is_set():
            self.bpf.ring_buffer_poll(50)
            if self._drain.is_set():
                self._drain.clear()
                self.bpf.ring_buffer_consume()
                self._drained.set()

    def of_job(self, job: str) -> list[dict]:
        """The records of the processes that registered with ``job``. Call it after those processes
        exited: every record they made is in the ring buffer by then, and it is drained first."""
        self._drained.clear()
        self._drain.set()
        assert self._drained.wait(30), "the ring-buffer reader thread did not drain in 30 s"
        with self._lock:
            recs = list(self.records)
        pids = {r["pid"] for r in recs if r["probe"] == "register" and r["s1"] == job}
        return [r for r in recs if r["pid"] in pids]

    def close(self):
        self._stop.set()
        self._thread.join(5)
        self.bpf.cleanup()


@pytest.fixture(scope="module")
def reader():
    if os.geteuid() != 0:
        pytest.skip("attaching USDT probes needs root (CAP_BPF + CAP_PERFMON + CAP_SYS_ADMIN for uprobes)")
    pytest.importorskip("bcc", reason="bcc (Debian python3-bpfcc) is not importable: run `make setup`")
    r = UsdtReader()
    yield r
    r.close()


def _env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBSHUB_")}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **extra)
    return env


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _by(recs, probe, pid=None):
    return [r for r in recs if r["probe"] == probe and (pid is None or r["pid"] == pid)]


# --------------------------------------------------------------------------------------------------------
def test_extension_has_stapsdt_notes():
    out = subprocess.run(["readelf", "-n", usdt.library_path()], capture_output=True, text=True, check=True).stdout
    assert "NT_STAPSDT" in out
    names = {line.split(":", 1)[1].strip() for line in out.splitlines() if line.strip().startswith("Name:")}
    assert names == set(PROBES)
    providers = {line.split(":", 1)[1].strip() for line in out.splitlines() if line.strip().startswith("Provider:")}
    assert providers == {"obshub"}
    # no semaphores: every probe site is a plain NOP, attachable by file path
    sems = [line for line in out.splitlines() if "Semaphore:" in line]
    assert sems and all(line.rstrip().endswith("0x0000000000000000") for line in sems)


def _file_offset(lib: str, vaddr: int) -> int:
    """File offset of virtual address ``vaddr`` of the shared object (its LOAD program headers)."""
    out = subprocess.run(["readelf", "-lW", lib], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        f = line.split()
        if f and f[0] == "LOAD":
            off, va, filesz = int(f[1], 16), int(f[2], 16), int(f[4], 16)
            if va <= vaddr < va + filesz:
                return off + vaddr - va
    raise AssertionError(f"{lib}: no LOAD segment holds {vaddr:#x}")


def test_every_probe_site_is_a_five_byte_nop():
    # a uprobe on a 5-byte NOP can be entered by a call instead of an int3 trap (Linux 6.18+, x86-64); a
    # build whose sites fall back to sys/sdt.h's 1-byte NOP still works but pays a trap per hit
    lib = usdt.library_path()
    out = subprocess.run(["readelf", "-n", lib], capture_output=True, text=True, check=True).stdout
    sites = {}
    name = None
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Name:"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("Location:"):
            sites[name] = int(line.split(":", 1)[1].split(",")[0], 16)
    assert set(sites) == set(PROBES)
    data = Path(lib).read_bytes()
    for probe, vaddr in sites.items():
        off = _file_offset(lib, vaddr)
        assert data[off : off + 5] == bytes.fromhex("0f1f440000"), (probe, data[off : off + 5].hex())


def test_a_traced_site_stays_traced_after_many_hits(reader):
    # Linux 6.18+ rewrites a traced 5-byte NOP into a call of its uprobe trampoline after the first hit:
    # the instrumentation must still see the tracer (it decides the merged probes and the registration
    # replay by this), and the probe must still deliver every argument
    site = usdt.probe_site("tracekey")
    assert site is not None
    assert usdt.site_traced(site)  # the reader attached a uprobe: at least the breakpoint is there
    me = os.getpid()
    for i in range(200):
        usdt.tracekey(0x5EED0000 + i, i)
    assert usdt.site_traced(site)
    reader._drained.clear()
    reader._drain.set()
    assert reader._drained.wait(30)
    with reader._lock:
        mine = [r for r in reader.records if r["probe"] == "tracekey" and r["pid"] == me]
    got = [(r["key"], r["step"]) for r in mine if r["key"] >= 0x5EED0000]
    assert got == [(0x5EED0000 + i, i) for i in range(200)]


def test_probe_functions_check_their_arguments():
    usdt.coll_begin("0", 1, "all_reduce", 4096, 3, schema.make_trace_key(1, 3, 2))
    with pytest.raises(TypeError):
        usdt.phase_begin(b"forward", 0, 0)
    with pytest.raises(TypeError):
        usdt.step_begin(1)
    with pytest.raises(OverflowError):
        usdt.tracekey(-1, 0)
    with pytest.raises(OverflowError):
        usdt.register("job", 2**31, 1, 0, 0)


@pytest.mark.bpf
@pytest.mark.torch
def test_torchrun_two_ranks_under_obshub_run(reader):
    job = f"t-{uuid.uuid4().hex[:8]}"
    steps = 4
    torchrun = shutil.which("torchrun", path=str(Path(PY).parent)) or "torchrun"
    cmd = [
        *OBSHUB,
        "run",
        "--job",
        job,
        "--",
        torchrun,
        "--nproc-per-node",
        "2",
        "--master-port",
        str(_free_port()),
        "-m",
        "obshub.workloads.ddp_train",
        "--steps",
        str(steps),
        "--hidden",
        "64",
        "--batch",
        "16",
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = re.findall(r"^step (\d+) rank (\d+) time_ms [\d.]+$", proc.stdout, re.M)
    assert sorted(lines) == sorted((str(s), str(r)) for s in range(steps) for r in (0, 1))
    recs = reader.of_job(job)

    regs = _by(recs, "register")
    assert sorted(r["i32"][0] for r in regs) == [0, 1]  # ranks
    assert all(r["i32"][1] == 2 for r in regs)  # world size
    assert sorted((r["i32"][0], r["i32"][2], r["i32"][3]) for r in regs) == [(0, 0, 0), (1, 1, 1)]
    rank_of = {r["pid"]: r["i32"][0] for r in regs}

    colls = {}
    for pid, rank in rank_of.items():
        mine = [r for r in recs if r["pid"] == pid]
        # steps: every step begins and ends once, in order; one trailing begin (the loop ended)
        begins = [r["step"] for r in _by(mine, "step_begin")]
        ends = [r["step"] for r in _by(mine, "step_end")]
        assert ends == list(range(steps))
        assert begins == list(range(steps + 1))
        for r in _by(mine, "step_begin") + _by(mine, "step_end"):
            assert schema.parse_trace_key(r["key"]) == (rank, r["step"] & 0xFFFF, 0)
        # phases: forward, backward, optimizer in every step, data from step 1 on; begin/end pair up
        phases = Counter((r["s1"], r["step"]) for r in _by(mine, "phase_end"))
        for s in range(steps):
            for ph in ("forward", "backward", "optimizer"):
                assert phases[(ph, s)] == 1, (rank, ph, s, phases)
            assert phases[("data", s)] == (1 if s else 0)
        assert Counter((r["s1"], r["step"], r["key"]) for r in _by(mine, "phase_begin")) == Counter(
            (r["s1"], r["step"], r["key"]) for r in _by(mine, "phase_end")
        )
        for r in _by(mine, "phase_begin"):
            host, step16, op = schema.parse_trace_key(r["key"])
            assert (host, step16) == (rank, r["step"] & 0xFFFF) and op >= 1
        # order inside a step: forward < backward < optimizer (op sequence numbers)
        for s in range(steps):
            ops = {r["s1"]: schema.parse_trace_key(r["key"]).op_seq for r in _by(mine, "phase_begin") if r["step"] == s}
            assert ops["forward"] < ops["backward"] < ops["optimizer"]
        # collectives: every begin has its end; keys carry this step
        cb, ce = _by(mine, "coll_begin"), _by(mine, "coll_end")
        assert sorted((r["s1"], r["seq"], r["s2"], r["key"]) for r in cb) == sorted(
            (r["s1"], r["seq"], r["s2"], r["key"]) for r in ce
        )
        for r in cb:
            host, step16, op = schema.parse_trace_key(r["key"])
            assert host == rank and op >= 1
            assert step16 == (r["step"] & 0xFFFF if r["step"] >= 0 else 0xFFFF)
        colls[rank] = {(r["s1"], r["seq"]): (r["s2"], r["bytes"], r["step"]) for r in cb}
        # DDP's gradient all-reduce (the reducer's bucket) and the logged loss all_reduce, in every step
        for s in range(steps):
            in_step = [v for v in colls[rank].values() if v[2] == s]
            assert sum(1 for op, nbytes, _ in in_step if op == "all_reduce" and nbytes > 4) >= 1
            assert sum(1 for op, nbytes, _ in in_step if op == "all_reduce" and nbytes == 4) == 1
        assert any(op == "barrier" for op, _, _ in colls[rank].values())
        # the thread's key reaches the kernel once per change: step_begin, phase_begin and coll_begin carry
        # it, phase_end puts back the step's key (op_seq 0), tracekey covers the other changes and never
        # repeats the key the thread's previous announcement carried (each site hit is a uprobe trap)
        last: dict = {}
        for r in mine:
            if r["probe"] in ("step_begin", "phase_begin", "coll_begin", "tracekey"):
                if r["probe"] == "tracekey":
                    assert last.get(r["tid"]) != r["key"], r
                last[r["tid"]] = r["key"]
            elif r["probe"] == "phase_end":
                last[r["tid"]] = r["key"] & ~0xFFFFFFFF
        assert _by(mine, "tracekey")  # restores after collectives still need it
    # the same (pg, coll_seq) names the same collective (op, size, step) on both ranks
    assert colls[0] and colls[0] == colls[1]
    seqs = sorted(seq for pg, seq in colls[0] if pg == "0")
    assert seqs == list(range(len(seqs)))


# --------------------------------------------------------------------------------------------------------
def test_non_torch_program_runs_and_exit_code_propagates(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(
        "import sys, json\nprint(json.dumps(sys.argv[1:]))\n"
        "print('torch' in sys.modules, file=sys.stderr)\nsys.exit(int(sys.argv[1]))\n"
    )
    proc = subprocess.run(
        [*OBSHUB, "run", "--job", "x", "--", PY, str(script), "3", "--flag"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3
    assert proc.stdout.strip() == '["3", "--flag"]'
    assert proc.stderr.strip() == "False"  # the bootstrap imported nothing heavy, said nothing


def test_shadowed_sitecustomize_still_runs(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['SHADOWED_RAN'] = 'yes'\n")
    proc = subprocess.run(
        [*OBSHUB, "run", "--", PY, "-c", "import os; print(os.environ.get('SHADOWED_RAN'))"],
        env=_env(PYTHONPATH=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "yes"


def test_missing_command_is_an_error(tmp_path):
    """Exit statuses as a shell's: 127 for a command not found, 126 for one found but not executable."""
    proc = subprocess.run(
        [*OBSHUB, "run", "--", "obshub-no-such-command-xyz"], env=_env(), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 127
    assert "could not start 'obshub-no-such-command-xyz'" in proc.stderr
    script = tmp_path / "train.sh"
    script.write_text("echo hi\n")  # no exec bit
    proc = subprocess.run([*OBSHUB, "run", "--", str(script)], env=_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 126 and "Permission denied" in proc.stderr, proc.stderr


@pytest.mark.parametrize("sig, want", [(signal.SIGTERM, -signal.SIGTERM), (signal.SIGINT, 130)])
def test_signals_reach_the_command(sig, want):
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGINT, lambda *a: sys.exit(130))\n"
        "print('ready', flush=True)\ntime.sleep(60)\n"
    )
    proc = subprocess.Popen([*OBSHUB, "run", "--", PY, "-c", code], env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == want
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


COLLECTIVES_SCRIPT = """
import os, torch, torch.distributed as dist
import obshub.instrument
obshub.instrument.enable(job={job!r})
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1000)
dist.broadcast(t, src=0)
out = [torch.zeros(1000) for _ in range(2)]
dist.all_gather(out, t)
got = torch.zeros(4)
dist.all_to_all_single(got, torch.full((4,), float(rank)))
assert got.tolist() == [0.0, 0.0, 1.0, 1.0]
dist.all_reduce(t, async_op=True).wait()
if rank == 0:
    dist.send(torch.ones(10), dst=1)
    dist.isend(torch.ones(10), dst=1).wait()
else:
    dist.recv(torch.zeros(10), src=0)
    dist.irecv(torch.zeros(10), src=0).wait()
sub = dist.new_group([0, 1])
dist.all_reduce(torch.ones(3), group=sub)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.bpf
@pytest.mark.torch
def test_enable_in_code_collectives_two_ranks(reader):
    job = f"c-{uuid.uuid4().hex[:8]}"
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [PY, "-c", COLLECTIVES_SCRIPT.format(job=job)],
            cwd=REPO,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(
                RANK=str(r),
                WORLD_SIZE="2",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                LOCAL_RANK=str(r),
                OBSHUB_HOST_ID="7",
            ),
        )
        for r in (0, 1)
    ]
    try:
        errs = [p.communicate(timeout=90)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], errs
    recs = reader.of_job(job)
    regs = _by(recs, "register")
    # enable() in code; OBSHUB_HOST_ID names the node, the same for both ranks
    assert sorted(r["i32"] for r in regs) == [[0, 2, 7, 0], [1, 2, 7, 1]]
    rank_of = {r["pid"]: r["i32"][0] for r in regs}
    seen = {}
    for pid, rank in rank_of.items():
        begins = _by(recs, "coll_begin", pid)
        assert sorted((r["s1"], r["seq"]) for r in begins) == sorted(
            (r["s1"], r["seq"]) for r in _by(recs, "coll_end", pid)
        )
        for r in begins:  # outside any step: step -1, key step field 0xFFFF
            assert r["step"] == -1 and schema.parse_trace_key(r["key"])[:2] == (7, 0xFFFF)
        seen[rank] = {(r["s1"], r["seq"]): (r["s2"], r["bytes"]) for r in begins}
    # group collectives: same (pg, seq) -> same op and size on both ranks, seq contiguous per group
    group0 = {k: v for k, v in seen[0].items() if ":p2p:" not in k[0]}
    group1 = {k: v for k, v in seen[1].items() if ":p2p:" not in k[0]}
    assert group0 == group1
    ops = [group0[("0", s)] for s in range(sum(1 for pg, _ in group0 if pg == "0"))]
    assert ops[:4] == [("broadcast", 4000), ("all_gather", 4000), ("all_to_all_single", 16), ("all_reduce", 4000)]
    assert ops[-1] == ("barrier", 0)
    subgroups = {pg for pg, _ in group0} - {"0"}
    assert len(subgroups) == 1 and group0[(subgroups.pop(), 0)] == ("all_reduce", 12)
    # point-to-point: the sender's and the receiver's op share (pair, seq); at the dispatcher isend and
    # irecv are send and recv
    assert {k: v[0] for k, v in seen[0].items() if ":p2p:" in k[0]} == {
        ("0:p2p:0-1", 0): "send",
        ("0:p2p:0-1", 1): "send",
    }
    assert {k: v[0] for k, v in seen[1].items() if ":p2p:" in k[0]} == {
        ("0:p2p:0-1", 0): "recv",
        ("0:p2p:0-1", 1): "recv",
    }


def test_bootstrap_failure_leaves_the_program_running(tmp_path):
    # a stand-in "torch" without torch.distributed: the watcher fires on `import torch`, enable() fails,
    # one obshub line goes to stderr and the program carries on
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("VERSION = 'fake'\n")
    code = "import torch, sys; print(torch.VERSION); sys.exit(5)"
    proc = subprocess.run(
        [*OBSHUB, "run", "--", PY, "-c", code],
        env=_env(PYTHONPATH=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 5
    assert proc.stdout.strip() == "fake"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("obshub: instrumentation not enabled in pid")


GAN_SCRIPT = """
import torch
from obshub.instrument import hooks
gen, disc = torch.nn.Linear(2, 4), torch.nn.Linear(4, 1)
opt_g, opt_d = torch.optim.SGD(gen.parameters(), lr=0.1), torch.optim.SGD(disc.parameters(), lr=0.1)
for _ in range(3):
    fake = gen(torch.randn(3, 2))
    disc(fake.detach()).mean().backward()
    opt_d.step()
    disc(fake).mean().backward()
    opt_g.step()
print(hooks.is_enabled(), hooks._st.next_step)
"""


@pytest.mark.torch
@pytest.mark.parametrize("args, want", [([], "True 5"), (["--optimizers-per-step", "2"], "True 4")])
def test_run_optimizers_per_step(args, want):
    # 3 GAN iterations: learned, the first counts two steps (steps 0..3 ended, 4 open); with the
    # option, one step per iteration (0..2 ended, 3 open); printed: the next step number
    proc = subprocess.run(
        [*OBSHUB, "run", *args, "--", PY, "-c", GAN_SCRIPT], env=_env(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == want.split()


def test_run_rejects_a_bad_optimizers_per_step():
    proc = subprocess.run(
        [*OBSHUB, "run", "--optimizers-per-step", "0", "--", PY, "-c", "pass"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--optimizers-per-step" in proc.stderr


@pytest.mark.parametrize("value, want", [(None, (4, False)), ("12", (12, True)), ("65535", (65535, True))])
def test_host_id_from_environment(monkeypatch, value, want):
    from obshub.instrument import hooks as instrument

    monkeypatch.setenv("RANK", "4")
    if value is None:
        monkeypatch.delenv("OBSHUB_HOST_ID", raising=False)
    else:
        monkeypatch.setenv("OBSHUB_HOST_ID", value)
    assert instrument._host_id_from_env() == want


@pytest.mark.parametrize("value", ["-1", "65536", "node3"])
def test_bad_host_id_is_a_config_error(monkeypatch, value):
    from obshub.core.errors import ConfigError
    from obshub.instrument import hooks as instrument

    monkeypatch.setenv("OBSHUB_HOST_ID", value)
    with pytest.raises(ConfigError, match="OBSHUB_HOST_ID"):
        instrument._host_id_from_env()


def test_run_rejects_bad_options():
    proc = subprocess.run(
        [*OBSHUB, "run", "--host-id", "70000", "--", PY, "-c", "pass"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "70000" in proc.stderr
    proc = subprocess.run([*OBSHUB, "run"], env=_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "COMMAND" in proc.stderr
    # an option `obshub run` does not have is an error of the command line, not a program to start
    proc = subprocess.run(
        [*OBSHUB, "run", "--bogus", "--", PY, "-c", "pass"], env=_env(), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "No such option: --bogus" in proc.stderr, proc.stderr


def test_recording_keeps_every_probe_in_firing_order():
    """``_usdt._record``: the probes fired through the sites come back in order with their arguments (the
    framework tests read the C++ kernel's probes this way); off, nothing is kept; the log empties on read."""
    rec = usdt._usdt
    rec._recorded()
    usdt.tracekey(1, 1)  # not recording
    rec._record(True)
    try:
        usdt.register("job-é", 3, 8, 7, -1)
        usdt.step_begin(-1, 2**64 - 1)
        usdt.phase_next("data", "forward", 5, 10, 11)
        usdt.coll_begin("0:p2p:0-1", 4, "send", 2**40, 5, 12)
        usdt.coll_end("0:p2p:0-1", 4, "send", 2**40, 5, 12, object())  # the done-callback's extra argument
        usdt.step_next(5, 1, 2, "optimizer", 3, "data", 4)
    finally:
        rec._record(False)
    usdt.tracekey(2, 2)
    assert rec._recorded() == [
        ("register", "job-é", 3, 8, 7, -1),
        ("step_begin", -1, 2**64 - 1),
        ("phase_next", "data", "forward", 5, 10, 11),
        ("coll_begin", "0:p2p:0-1", 4, "send", 2**40, 5, 12),
        ("coll_end", "0:p2p:0-1", 4, "send", 2**40, 5, 12),
        ("step_next", 5, 1, 2, "optimizer", 3, "data", 4),
    ]
    assert rec._recorded() == []
