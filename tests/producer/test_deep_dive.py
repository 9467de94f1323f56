"""The deep-dive tier end to end: a real agent (real BPF, the torch wheel's libcudart) against the session's
real broker. By default the per-launch CUDA uprobes are not attached (a process launching kernels yields
no CUDA_STEP_SUM); `obshub deep-dive --host` (the control topic) attaches them for N steps: the launch
aggregates arrive on obshub.events.v1 within a bounded time of the request, and stop after the window. The
automatic trigger (the rule engine's deep_dive sink, built from an alerting config, handed a firing
straggler alert that names the host) asks through the same topic: the listener test reads its request."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from obshub.core.schema import Kind
from obshub.core.settings import agent_config
from obshub.producer.control import ControlListener, parse_request
from obshub.producer.probes import ProbeOptions, Target
from obshub.rules.sinks.base import DeliveryPolicy, Notification
from obshub.rules.sinks.config import SinkSpec, build_sink
from tests.conftest import REPO
from tests.support.probes_util import build_so, ctypes_child, need_bpf, settings
from tests.support.transport_helpers import AgentThread, read_batches, wait_for

pytestmark = [pytest.mark.bpf, pytest.mark.kafka]
STEPS = 3
TRIGGER_BOUND_S = 10.0  # request -> first launch aggregate on the events topic


def _lib(pattern: str) -> Path | None:
    for d in ProbeOptions().lib_dirs:
        hits = sorted(Path(d).glob(pattern))
        if hits:
            return hits[0]
    return None


def _cudart() -> Path | None:
    return _lib("libcudart.so*")


def test_deep_dive_attaches_for_n_steps_and_its_data_arrives(kafka, tmp_path):
    need_bpf()
    cudart, nccl = _cudart(), _lib("libnccl.so*")
    if cudart is None or nccl is None:
        pytest.skip("the torch wheel's libcudart/libnccl are not installed")
    from obshub.producer.agent import Agent
    from obshub.producer.loader import DEEP_DIVE_REASON, BpfEventSource

    usdt = build_so("fakeusdt", tmp_path)
    # steps of ~0.1 s, 5 kernel launches and one NCCL call each, for up to 120 s
    body = (
        "C = ctypes.CDLL(%r)\nN = ctypes.CDLL(%r)\nimport time\n"
        "for s in range(1, 1200):\n"
        "    L.fake_step_begin(ctypes.c_int64(s), ctypes.c_uint64(s))\n"
        "    for _ in range(5):\n        C.cudaLaunchKernel(None, None, None, None, None, None)\n"
        "    N.ncclGroupEnd()\n"
        "    L.fake_step_end(ctypes.c_int64(s), ctypes.c_uint64(s))\n"
        "    time.sleep(0.1)\n"
    ) % (str(cudart), str(nccl))
    child = ctypes_child(usdt, body)
    host = f"dd-{uuid.uuid4().hex[:8]}"
    cfg = agent_config(
        job="ddjob",
        host=host,
        host_id=9,
        kafka={"bootstrap": kafka.bootstrap_servers},
        batch={"max_age_ms": 200, "step_min_age_ms": 0},
        spool={"dir": tmp_path / "spool"},
    )
    src = BpfEventSource(
        settings(tmp_path),
        Target(pids={child.pid}),
        ProbeOptions(
            probes=("pytorch_step", "cuda_cudaLaunchKernel", "cuda_ncclGroupEnd"), usdt_library=usdt, sysfs=False
        ),
    )
    agent = Agent(cfg, src, say=lambda _m: None)
    run = AgentThread(agent)
    try:
        wait_for(lambda: agent._control is not None and agent._control.ready.is_set(), 60, "the control listener")
        table = {s.name: s for s in agent.probe_status}
        assert not table["cuda_cudaLaunchKernel"].attached
        assert table["cuda_cudaLaunchKernel"].reason == DEEP_DIVE_REASON
        # the NCCL uprobes are the deep-dive tier too (issue #34: the c10d kernel reports the collectives)
        assert not table["cuda_ncclGroupEnd"].attached
        assert src.deep_dive_probes() == ["cuda_cudaLaunchKernel", "cuda_ncclGroupEnd"] and not src.deep_diving
        child.go()

        def mine(batches, kind):
            return [e for b in batches for e in b.events if e.kind == kind and e.pid == child.pid]

        # default: steps arrive, launch aggregates do not (the launch uprobes are not attached)
        before = read_batches(
            kafka.bootstrap_servers, hosts={host}, until=lambda bs: len(mine(bs, Kind.STEP_END)) >= 5, timeout_s=60
        )
        assert mine(before, Kind.CUDA_STEP_SUM) == [] and mine(before, Kind.NCCL_COLL) == []

        # the operator's path (the automatic trigger asks through the same topic: the listener test)
        t0 = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "obshub.cli", "deep-dive", "--host", host, "--steps", str(STEPS)],
            cwd=REPO,
            check=True,
            capture_output=True,
            env={"OBSHUB_BOOTSTRAP": kafka.bootstrap_servers, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        )
        try:
            got = read_batches(
                kafka.bootstrap_servers, hosts={host}, until=lambda bs: mine(bs, Kind.CUDA_STEP_SUM), timeout_s=60
            )
        except AssertionError as exc:  # say where the request stopped: listener, agent loop or probes
            ctl = agent._control
            raise AssertionError(
                f"{exc}; listener alive {ctl is not None and ctl._thread.is_alive()}, request pending "
                f"{agent._dd_request}, window {agent._dd}, windows {agent.deep_dives}, probes on {src.deep_diving}, "
                f"deep-dive points {getattr(src, '_deep', None)}"
            ) from exc
        first_data_s = time.monotonic() - t0  # includes the CLI's own start (~1 s of Python imports)
        print(f"deep dive: first launch aggregate on the events topic {first_data_s:.2f} s after the request")
        assert first_data_s < TRIGGER_BOUND_S, first_data_s
        agg = mine(got, Kind.CUDA_STEP_SUM)[0]
        assert 1 <= agg.value <= 5 and agg.duration_ns > 0  # launches of one step (the first may be partial)

        wait_for(lambda: agent.deep_dives, 60, "the end of the deep-dive window")
        window = agent.deep_dives[0]
        assert window["step_ends"] >= STEPS and not src.deep_diving
        assert window["attach_s"] < 1.0
        # after the window: more steps, and exactly the window's launch aggregates (the first may be partial):
        # the kernel keeps the step budget, however late the agent sees the step ends and detaches
        n_end = len(mine(got, Kind.STEP_END))
        after = read_batches(
            kafka.bootstrap_servers,
            hosts={host},
            until=lambda bs: len(mine(bs, Kind.STEP_END)) >= n_end + STEPS + 10,
            timeout_s=60,
        )
        sums = mine(after, Kind.CUDA_STEP_SUM)
        ncc = mine(after, Kind.NCCL_COLL)  # one call a step, within the window's steps
        assert 1 <= len(ncc) <= STEPS + 1 and all(e.payload["symbol"] == "ncclGroupEnd" for e in ncc), ncc
        assert len(sums) == STEPS, [(e.step, e.value) for e in sums]
        assert [e.step for e in sums] == list(range(sums[0].step, sums[0].step + STEPS)), [e.step for e in sums]
        assert all(e.value == 5 for e in sums[1:]), [(e.step, e.value) for e in sums]
    finally:
        child.kill()
        assert run.stop() == 0


def test_control_messages_are_checked():
    ok = b'{"action": "deep_dive", "host": "h1", "steps": 5, "max_s": 30, "ts_ns": 1}'
    assert parse_request(ok).steps == 5
    for bad, what in (
        (b"not json", "not JSON"),
        (b'{"action": "reboot"}', "action"),
        (b'{"action": "deep_dive", "host": "", "steps": 5, "max_s": 30, "ts_ns": 1}', "host"),
        (b'{"action": "deep_dive", "host": "h", "steps": 0, "max_s": 30, "ts_ns": 1}', "steps"),
        (b'{"action": "deep_dive", "host": "h", "steps": 2, "max_s": -1, "ts_ns": 1}', "max_s"),
        (b'{"action": "deep_dive", "host": "h", "steps": 2, "max_s": 3, "ts_ns": "x"}', "ts_ns"),
    ):
        with pytest.raises(ValueError, match=what):
            parse_request(bad)


def test_listener_skips_bad_old_and_foreign_requests(kafka):
    from obshub.core.kafka import KafkaConnection
    from obshub.producer.control import request_deep_dive

    conn = KafkaConnection(bootstrap=kafka.bootstrap_servers)
    host = f"dl-{uuid.uuid4().hex[:8]}"
    request_deep_dive(conn, host, steps=2, max_s=30)  # made before the listener started: not acted on
    got = []
    listener = ControlListener(conn, host, got.append, poll_s=0.05)
    try:
        wait_for(listener.ready.is_set, 30, "the listener")
        request_deep_dive(conn, "some-other-host", steps=2, max_s=30)
        # the operator's path: the CLI
        subprocess.run(
            [sys.executable, "-m", "obshub.cli", "deep-dive", "--host", host, "--steps", "7", "--max-s", "30"],
            cwd=REPO,
            check=True,
            capture_output=True,
            env={"OBSHUB_BOOTSTRAP": kafka.bootstrap_servers, "PATH": "/usr/bin:/bin", "HOME": "/tmp"},
        )
        wait_for(lambda: got, 30, "the request")
        # the automatic trigger: the deep_dive sink of an alerting config, handed a firing straggler alert
        # that names the host, asks through the same topic; the same alert again at once is rate-limited
        sink = build_sink(
            SinkSpec(name="dive", type="deep_dive", steps=5, bootstrap=kafka.bootstrap_servers, min_severity="warning")
        )
        alert = {"status": "firing", "rule": "straggler_persistent", "severity": "warning", "labels": {"host": host}}
        assert sink.send(None, Notification("g", {}, [alert], "dive"), DeliveryPolicy()).ok
        assert sink.send(None, Notification("g", {}, [alert], "dive"), DeliveryPolicy()).ok
        assert len(sink.trigger.sent) == 1 and sink.trigger.limited == 1
        wait_for(lambda: len(got) >= 2, 30, "the sink's request")
        time.sleep(0.5)
        assert [(r.host, r.steps, r.by) for r in got] == [
            (host, 7, "obshub deep-dive"),
            (host, 5, "rule straggler_persistent"),
        ]
        assert got[0].max_s == 30.0
    finally:
        listener.close()


def test_trigger_rate_limits_and_the_sink_asks_only_for_named_firing_hosts(kafka):
    """The hub's trigger against the real broker: one request per host per host_every, at most
    max_per_hour overall; the sink asks for firing alerts with a host label only."""
    from obshub.core.control import DeepDiveTrigger
    from obshub.core.kafka import KafkaConnection
    from obshub.rules.sinks.deep_dive import DeepDiveSink

    now = [1000.0]
    trig = DeepDiveTrigger(
        KafkaConnection(bootstrap=kafka.bootstrap_servers),
        steps=4,
        max_s=30,
        host_every_s=600,
        max_per_hour=2,
        clock=lambda: now[0],
    )
    sink = DeepDiveSink("dive", trig)
    p = uuid.uuid4().hex[:6]
    alerts = [
        {"status": "firing", "rule": "r1", "labels": {"host": f"a-{p}"}},
        {"status": "firing", "rule": "r2", "labels": {"host": f"a-{p}"}},  # the same host: one request
        {"status": "resolved", "rule": "r1", "labels": {"host": f"x-{p}"}},
        {"status": "firing", "rule": "r3", "labels": {"job": "j"}},  # names no host
    ]
    assert sink.send(None, Notification("g", {}, alerts, "dive"), DeliveryPolicy()).ok
    assert [(r.host, r.by, r.steps) for r in trig.sent] == [(f"a-{p}", "rule r1", 4)]
    assert trig.request(f"a-{p}") is None and "per 600 s" in trig.allowed(f"a-{p}")  # per host
    assert trig.request(f"b-{p}") is not None
    assert trig.request(f"c-{p}") is None and "last hour" in trig.allowed(f"c-{p}")  # overall
    now[0] += 601
    assert trig.request(f"a-{p}") is None  # the hour's budget still holds
    now[0] += 3600
    assert trig.request(f"a-{p}") is not None and trig.limited == 3
    with pytest.raises(ValueError, match="host"):
        trig.request("")
