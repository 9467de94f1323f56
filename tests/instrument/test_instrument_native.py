"""The C++ collective kernel (obshub/instrument/_c10d_kernel.cpp) against the Python one, in this process on a
gloo world of one: the same collectives counted, one op sequence shared with the phases, the thread's key
restored after each collective; the switch ``OBSHUB_COLLECTIVE_KERNEL``. The probe arguments it fires are
read by a real tracer in test_instrument_usdt.py and tests/producer/ (the default kernel is this one)."""

from __future__ import annotations

import socket

import pytest

from obshub.core.errors import ConfigError

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def _native():
    try:
        from obshub.instrument import _c10d_kernel
    except ImportError:
        pytest.skip("the C++ collective kernel is not built (python -m obshub.instrument.native_build)")
    return _c10d_kernel


@pytest.fixture
def world(monkeypatch):
    import torch.distributed as dist

    from obshub.instrument import hooks

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    yield dist, hooks
    hooks.disable()
    hooks._st.__init__()
    hooks._tls.__dict__.clear()
    if dist.is_initialized():
        dist.destroy_process_group()


def _backend_seq(dist) -> int:
    return dist.group.WORLD._get_backend(torch.device("cpu"))._get_sequence_number_for_group()


@pytest.mark.parametrize("choice", ["native", "python"])
def test_both_kernels_count_every_collective_and_share_the_op_sequence(world, monkeypatch, choice):
    dist, hooks = world
    native = _native()
    monkeypatch.setenv("OBSHUB_COLLECTIVE_KERNEL", choice)
    hooks.enable(job="j", host_id=3)
    dist.init_process_group("gloo", rank=0, world_size=1)
    assert hooks.collective_kernel() == choice
    calls0 = native.calls()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.randn(4, 8)).sum().backward()  # forward + backward phases, one bucket all-reduce
        opt.step()
    before = hooks.current_trace_key()
    dist.all_reduce(torch.ones(4))
    work = dist.all_reduce(torch.ones(4), async_op=True)
    work.wait()
    assert hooks.current_trace_key() == before  # the collective's key was the thread's for its duration only
    seen = native.calls() - calls0
    assert seen == (_backend_seq(dist) if choice == "native" else 0)
    # the data phase of step 2 is open; step 2's ops so far: data (1), two all-reduces (2, 3); the next
    # phase counts after them in both kernels
    with hooks._lock:
        hooks._phase_begin_locked("forward")
        assert (hooks._st.step, hooks._st.op_seq) == (2, 4)
        assert hooks.current_trace_key() == (hooks._key(2, 4), 2)


def test_one_probe_per_collective_while_coll_is_traced(world, monkeypatch):
    """While the ``coll`` site is traced (forced here: ``_force_coll``), the C++ kernel fires one ``coll``
    per collective at its end, carrying what coll_begin and coll_end carried plus the begin time and the
    issuing thread, and no coll_begin, coll_end nor tracekey; untraced, the three as before."""
    import threading
    import time

    from obshub.instrument import _usdt

    dist, hooks = world
    _native()
    monkeypatch.setenv("OBSHUB_COLLECTIVE_KERNEL", "native")
    hooks.enable(job="j", host_id=3)
    dist.init_process_group("gloo", rank=0, world_size=1)
    me = threading.get_native_id()
    _usdt._record(True)
    try:
        _usdt._force_coll(True)
        t0 = time.monotonic_ns()
        dist.all_reduce(torch.ones(4))
        dist.all_reduce(torch.ones(8), async_op=True).wait()
        t1 = time.monotonic_ns()
        _usdt._force_coll(False)
        dist.all_reduce(torch.ones(4))
        got = _usdt._recorded()
    finally:
        _usdt._force_coll(False)
        _usdt._record(False)
    probes = [r[0] for r in got]
    assert probes == ["coll", "coll", "coll_begin", "tracekey", "coll_end"], probes
    (_, pg0, seq0, op0, n0, step0, key0, b0, tid0), (_, pg1, seq1, op1, n1, step1, key1, b1, tid1) = got[:2]
    assert (pg0, op0, n0, tid0) == (pg1, op1, 16, me) and (n1, tid1) == (32, me)
    assert seq1 == seq0 + 1 and got[2][2] == seq1 + 1  # one sequence per group, whichever probe
    assert key1 == key0 + 1 and got[2][6] == key1 + 1  # one op sequence (TraceKey) too
    assert t0 <= b0 <= b1 <= t1  # CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns


def test_a_collective_still_in_flight_gets_its_begin_from_the_watchdog(world, monkeypatch):
    """On the one-probe path a collective that waits (here: rank 1 joins 0.4 s late) gets its begin from
    the kernel's watchdog after ~100 ms (``coll_late``, the true begin time and issuing thread), so a hang
    still shows who arrived; its ``coll`` then carries the thread negated (the end only)."""
    import os
    import subprocess
    import sys
    import threading
    import time

    from obshub.instrument import _usdt

    dist, hooks = world
    _native()
    monkeypatch.setenv("OBSHUB_COLLECTIVE_KERNEL", "native")
    peer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time, torch, torch.distributed as dist\n"
            "dist.init_process_group('gloo', rank=1, world_size=2)\n"
            "time.sleep(0.4)\ndist.all_reduce(torch.ones(4))\ndist.destroy_process_group()\n",
        ],
        env={**os.environ, "OBSHUB_INSTRUMENT": "0"},
    )
    try:
        hooks.enable(job="j", host_id=3)
        dist.init_process_group("gloo", rank=0, world_size=2)
        _usdt._record(True)
        _usdt._force_coll(True)
        t0 = time.monotonic_ns()
        dist.all_reduce(torch.ones(4))
        waited = time.monotonic_ns() - t0
        got = _usdt._recorded()
    finally:
        _usdt._force_coll(False)
        _usdt._record(False)
        assert peer.wait(60) == 0
    me = threading.get_native_id()
    assert [r[0] for r in got] == ["coll_late", "coll"], got
    late, end = got
    assert late[1:7] == end[1:7] and late[7] == end[7]  # the same collective, the same begin time
    assert late[8] == me and end[8] == -me and waited >= 200_000_000


def test_a_bad_kernel_choice_is_a_config_error(monkeypatch):
    from obshub.instrument import hooks

    monkeypatch.setenv("OBSHUB_COLLECTIVE_KERNEL", "fast")
    with pytest.raises(ConfigError, match="OBSHUB_COLLECTIVE_KERNEL='fast'"):
        hooks._load_native()


def test_a_failed_build_says_why_and_does_not_fail_setup(monkeypatch, capsys):
    """`make setup` runs native_build: a compiler error prints its tail and exits 0 (the Python kernel is
    used); --strict exits 1. The built extension, if any, is left as it was."""
    from obshub.instrument import native_build

    before = native_build.target().stat().st_mtime_ns if native_build.target().exists() else None
    monkeypatch.setattr(
        native_build, "command", lambda out: ["sh", "-c", "echo 'fatal error: torch/library.h' >&2; exit 3", str(out)]
    )
    assert native_build.main(["--force"]) == 0
    err = capsys.readouterr().err
    assert "not built, obshub uses its Python kernel" in err and "exit 3" in err and "torch/library.h" in err
    assert native_build.main(["--force", "--strict"]) == 1
    after = native_build.target().stat().st_mtime_ns if native_build.target().exists() else None
    assert after == before


def test_the_build_cache_key_ignores_the_clones_paths_and_follows_the_source(monkeypatch, tmp_path):
    """A fresh clone on the same machine (CI's) finds the extension another clone built: the cache key of
    ``native_build`` leaves out the clone's own paths (its .venv's headers and libraries, the output) but
    changes with the flags and the source."""
    pytest.importorskip("torch")
    from obshub.instrument import native_build as nb

    monkeypatch.setenv("OBSHUB_CACHE", str(tmp_path))
    a = [
        "g++",
        "-O2",
        "-I/clone-a/.venv/include",
        "/clone-a/src.cpp",
        "-o",
        "/clone-a/x.so",
        "-L/clone-a/lib",
        "-Wl,-rpath,/clone-a/lib",
    ]
    b = [
        "g++",
        "-O2",
        "-I/clone-b/.venv/include",
        "/clone-b/src.cpp",
        "-o",
        "/clone-b/x.so",
        "-L/clone-b/lib",
        "-Wl,-rpath,/clone-b/lib",
    ]
    ka, kb = nb._cached(a, nb.Path("/clone-a/x.so")), nb._cached(b, nb.Path("/clone-b/x.so"))
    if ka is None:
        pytest.skip("g++ is not installed")
    assert ka == kb and ka.parent.parent == tmp_path / "native"
    assert nb._cached([*a[:1], "-O0", *a[2:]], nb.Path("/clone-a/x.so")) != ka  # other flags, other build
    src = tmp_path / "k.cpp"
    src.write_text("// another source\n")
    monkeypatch.setattr(nb, "SOURCE", src)
    assert nb._cached(a, nb.Path("/clone-a/x.so")) != ka
