"""The agent follows a training process into its own mount namespace (a container): the process runs
under `unshare --mount` with its own copy of the instrumentation package on a tmpfs that only its
namespace sees, so the probes the agent attached to its own copy never fire there. The process registers
before the agent finds it (as after an agent restart). The event source (only `--registered`) finds the
copy in the process's /proc/<pid>/maps, opens it through /proc/<pid>/root and attaches the same USDT
handlers; the process sees the breakpoint at its register probe, registers again at its next step
boundary with the job it named itself, and the agent sees every step from then on."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from obshub.core.schema import Kind
from obshub.producer.probes import Target
from tests.support.probes_util import REPO, Child, drain, event_source, need_bpf

pytestmark = pytest.mark.bpf
STEPS = 6

# runs in its own mount namespace: a tmpfs at PRIVATE (visible only there) gets a copy of the
# instrumentation package, which is imported from it
CHILD = (
    """
import os, shutil, subprocess, sys, time
PRIVATE, REPO = sys.argv[1], sys.argv[2]
subprocess.run(["mount", "-t", "tmpfs", "obshub-private", PRIVATE], check=True)
skip = shutil.ignore_patterns("__pycache__")
os.makedirs(PRIVATE + "/obshub")
shutil.copy(REPO + "/obshub/__init__.py", PRIVATE + "/obshub/")
for sub in ("core", "instrument"):
    shutil.copytree(REPO + "/obshub/" + sub, PRIVATE + "/obshub/" + sub, ignore=skip)
sys.path.insert(0, PRIVATE)
from obshub.instrument import hooks, usdt

# the instrumentation's own step and registration code, driven without torch: step 0 begins and the
# process registers before the agent follows its copy, so that registration reaches no tracer
hooks._st.host_id, hooks._st.reg_site = 5, usdt.probe_site("register")
with hooks._lock:
    hooks._begin_step_locked()
print("ready", usdt.library_path(), flush=True)
sys.stdin.readline()
for _ in range(%d):
    time.sleep(0.02)
    with hooks._lock:
        hooks._end_step_locked()
        hooks._begin_step_locked()
with hooks._lock:
    hooks._end_step_locked()
print("done", flush=True)
"""
    % STEPS
)


def wait_for_followed(src, pid: int, timeout_s: float):
    """Poll the source (which scans for library copies as it polls) until it followed a copy that
    process ``pid`` maps; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        src.poll(50)
        hit = [f for f in src.followed if f.pid == pid]
        if hit:
            return hit[0]
    raise AssertionError(f"no library copy of pid {pid} followed in {timeout_s} s: {src.followed}")


def test_training_process_in_its_own_mount_namespace(tmp_path):
    need_bpf()
    from obshub.core.usdt import library_path

    if library_path() is None:
        pytest.skip("obshub.instrument._usdt is not built")
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    private = tmp_path / "private"
    private.mkdir()
    child = Child(
        CHILD.replace("sys.argv[1], sys.argv[2]", f"{str(private)!r}, {str(REPO)!r}"),
        prefix=["unshare", "--mount", "--propagation", "private"],
        env={"OBSHUB_JOB": "mntns-job", "PYTHONPATH": ""},
    )
    try:
        with event_source(
            tmp_path,
            Target(registered=True),
            probes=("pytorch",),
            usdt_library=library_path(),
            follow_scan_ms=100,
        ) as (src, table):
            assert all(s.attached for s in table), table
            line = child.proc.stdout.readline().split()
            assert line[:1] == ["ready"], (line, child.proc.stderr.read() if child.proc.poll() is not None else "")
            inside = line[1]
            assert inside.startswith(str(private)) and not list(private.iterdir())  # invisible from here
            followed = wait_for_followed(src, child.pid, 20)
            assert followed.attached and followed.key == "usdt", followed
            assert followed.path == inside and followed.host_path == f"/proc/{child.pid}/root{inside}"
            child.go()
            events = drain(src, 20, until=lambda evs: sum(e.kind == Kind.STEP_END for e in evs) >= STEPS)
            assert child.wait().split() == ["done"]
            regs = src.registrations()
    finally:
        child.kill()
    mine = [e for e in events if e.pid == child.pid]
    # registered again at the first step boundary after the agent attached: steps 1.. are all seen
    assert [r["job"] for r in regs if r["pid"] == child.pid] == ["mntns-job"]
    assert sorted(e.step for e in mine if e.kind == Kind.STEP_BEGIN) == list(range(1, STEPS + 1))
    assert sorted(e.step for e in mine if e.kind == Kind.STEP_END) == list(range(1, STEPS + 1))


# loads its own copy of a CUDA runtime library (on a tmpfs of its own mount namespace) when told, then
# calls into it
LIB_CHILD = """
import ctypes, os, shutil, subprocess, sys, time
PRIVATE, LIB = sys.argv[1], sys.argv[2]
subprocess.run(["mount", "-t", "tmpfs", "obshub-private", PRIVATE], check=True)
shutil.copy(LIB, PRIVATE + "/libcudart.so.12")
if sys.argv[3] == "later":
    print("ready", flush=True)
    sys.stdin.readline()
L = ctypes.CDLL(PRIVATE + "/libcudart.so.12")
print("loaded", PRIVATE + "/libcudart.so.12", flush=True)
sys.stdin.readline()
for _ in range(5):
    L.cudaDeviceSynchronize()
    time.sleep(0.01)
print("done", flush=True)
"""


def test_cuda_library_copies_in_other_mount_namespaces(tmp_path):
    """Two processes, each with its own copy of libcudart in its own mount namespace: the one that
    loaded it before the agent started is probed through /proc/<pid>/root from the start, the one that
    loads it later is followed; the calls of both are seen."""
    need_bpf()
    if shutil.which("unshare") is None or shutil.which("gcc") is None:
        pytest.skip("unshare (util-linux) and gcc are needed")
    lib_dir = tmp_path / "lib"
    lib_dir.mkdir()
    (tmp_path / "cudart.c").write_text("int cudaDeviceSynchronize(void) { return 0; }\n")
    lib = lib_dir / "libcudart.so.12"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "cudart.c")], check=True)
    children = {}
    for when in ("before", "later"):
        private = tmp_path / when
        private.mkdir()
        code = LIB_CHILD.replace("sys.argv[1], sys.argv[2]", f"{str(private)!r}, {str(lib)!r}")
        children[when] = Child(code.replace("sys.argv[3]", repr(when)), prefix=["unshare", "--mount"])
    try:
        before, later = children["before"], children["later"]
        assert before.proc.stdout.readline().split()[0] == "loaded"
        assert later.proc.stdout.readline().split() == ["ready"]
        with event_source(
            tmp_path,
            Target(pids={before.pid, later.pid}),
            probes=("cuda_cudaDeviceSynchronize",),
            lib_dirs=(lib_dir,),
            thresholds={"cuda_ns": 0},
            follow_scan_ms=100,
        ) as (src, table):
            assert all(s.attached for s in table), table
            inside = f"{tmp_path}/before/libcudart.so.12"
            assert src.libs["cudart"] == Path(f"/proc/{before.pid}/root{inside}")  # probed from the start
            later.go()
            assert later.proc.stdout.readline().split()[0] == "loaded"
            followed = wait_for_followed(src, later.pid, 20)
            assert followed.key == "cudart" and followed.attached, followed
            assert followed.host_path == f"/proc/{later.pid}/root{tmp_path}/later/libcudart.so.12"
            before.go()
            later.go()
            events = drain(src, 20, until=lambda evs: sum(e.kind == Kind.CUDA_SYNC for e in evs) >= 10)
            assert before.wait().split() == later.wait().split() == ["done"]
    finally:
        for c in children.values():
            c.kill()
    assert not list((tmp_path / "before").iterdir()) and not list((tmp_path / "later").iterdir())
    for c in children.values():
        syncs = [e for e in events if e.kind == Kind.CUDA_SYNC and e.pid == c.pid]
        assert len(syncs) == 5 and all(e.payload["symbol"] == "cudaDeviceSynchronize" for e in syncs), syncs
