"""``python -m bench.ttd --combine``: the campaign run in chunks (one fault host each, ``--json``) is
reported as one campaign. Pure arithmetic over result files: no demo runs here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KINDS = ["net-slow", "cpu", "net-loss", "mem", "hang", "exit"]


def _episode(kind: str, host: str, ttd: float | None, wrong: int = 0) -> dict:
    ok = ttd is not None and wrong == 0
    return {
        "round": 0,
        "kind": kind,
        "host": host,
        "ok": ok,
        "ttd_s": ttd,
        "wrong_count": wrong,
        "reason": f"{host} / x named {ttd} s after the fault" if ok else f"no alert named {host}",
    }


def _chunk(path: Path, host: int, ttds: dict[str, list[float | None]], clean_alerts: list[str], wrong=None) -> Path:
    name = f"node-{host:02d}"
    episodes = [
        _episode(k, name, t, (wrong or {}).get(k, 0) if i == 0 else 0) for k in KINDS for i, t in enumerate(ttds[k])
    ]
    path.write_text(
        json.dumps(
            {
                "rounds": 2,
                "hosts": 4,
                "fault_hosts": [host],
                "kinds": KINDS,
                "clean_s_per_run": 150.0,
                "episodes": episodes,
                "runs": [
                    {"round": 0, "host": host, "job": f"demo-{host}", "clean_alerts": clean_alerts, "wall_s": 600}
                ],
                "clean": {"seconds": 150.0, "alerts": clean_alerts, "per_hour": 0.0},
                "rev": "abc1234",
            }
        )
    )
    return path


def _combine(tmp_path: Path, *paths: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OBSHUB_BENCH_RESULTS": str(tmp_path / "results"), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "bench.ttd", "--combine", *map(str, paths)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_chunks_pool_into_one_campaign(tmp_path):
    fast = {k: [1.0, 2.0] for k in KINDS} | {"exit": [1.0]}
    slow = {k: [1.0, 2.0] for k in KINDS} | {"net-loss": [4.0, 6.0], "exit": [2.0]}
    a = _chunk(tmp_path / "h0.json", 0, fast, [])
    b = _chunk(tmp_path / "h1.json", 1, slow, [])
    proc = _combine(tmp_path, a, b)
    assert proc.returncode == 1, proc.stderr  # a target missed: exit 1 (it was 0), for CI
    out = json.loads((tmp_path / "results" / "ttd-combined.json").read_text())
    nl = out["per_kind"]["net-loss"]
    assert nl["episodes"] == 4 and nl["named"] == 4
    assert nl["median_s"] == 3.0  # median of 1, 2, 4, 6: pooled, not a median of the chunks' medians
    assert nl["worst_s"] == 6.0
    assert out["per_kind"]["exit"]["episodes"] == 2
    assert out["clean"]["seconds"] == 300.0 and out["clean"]["alerts"] == []
    assert out["fault_hosts"] == [0, 1] and out["revs"] == ["abc1234", "abc1234"]
    assert out["target_met"] is False  # net-loss: worst 6.0 s > 5 s
    assert "worst time to detection <= 5 s for every kind: target missed" in proc.stdout
    assert "median time to detection <= 3 s for every kind: target met" in proc.stdout
    assert "node-00: 600 s; net-slow pass 1.00 s" in proc.stdout  # each run's own line


def test_a_miss_a_wrong_alert_or_a_clean_alert_in_one_chunk_fails_the_campaign(tmp_path):
    ok = {k: [1.0, 2.0] for k in KINDS} | {"exit": [1.0]}
    missed = ok | {"mem": [1.0, None]}
    a = _chunk(tmp_path / "h2.json", 2, ok, ["tcp_retransmits_on_straggler@node-01/network"])
    b = _chunk(tmp_path / "h3.json", 3, missed, [], wrong={"cpu": 1})
    proc = _combine(tmp_path, a, b)
    assert proc.returncode == 1, proc.stderr
    out = json.loads((tmp_path / "results" / "ttd-combined.json").read_text())
    assert out["per_kind"]["mem"]["named"] == 3 and out["per_kind"]["mem"]["worst_s"] is None
    assert out["per_kind"]["cpu"]["wrong"] == 1
    assert out["clean"]["alerts"] == ["tcp_retransmits_on_straggler@node-01/network"]
    assert out["target_met"] is False
    assert "no alert on clean training: target missed — 1 in 5.0 min" in proc.stdout
    assert "no wrong alert: target missed" in proc.stdout


def test_every_target_met_exits_0(tmp_path):
    """The exit code is the verdicts' (0 every target met, 1 one missed, 2 bad input), so CI can gate on it."""
    fast = {k: [1.0, 2.0] for k in KINDS} | {"exit": [1.0]}
    proc = _combine(tmp_path, _chunk(tmp_path / "h0.json", 0, fast, []), _chunk(tmp_path / "h1.json", 1, fast, []))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert "target missed" not in proc.stdout and "target met" in proc.stdout


def test_chunks_of_different_campaigns_are_refused(tmp_path):
    a = _chunk(tmp_path / "h0.json", 0, {k: [1.0, 2.0] for k in KINDS}, [])
    data = json.loads(a.read_text())
    b = tmp_path / "h1.json"
    b.write_text(json.dumps({**data, "rounds": 1}))
    proc = _combine(tmp_path, a, b)
    assert proc.returncode == 2
    assert "h1.json: 1 round(s)" in proc.stderr
    c = tmp_path / "other.json"
    c.write_text(json.dumps({"machine": {}}))
    proc = _combine(tmp_path, a, c)
    assert proc.returncode == 2 and "not the results of python -m bench.ttd" in proc.stderr


def test_keep_copies_a_runs_output_report_and_logs(tmp_path):
    """``--keep DIR``: what explains a run's verdicts outlives the benchmark's temporary home: the demo's
    output, its report and its run folder (agent, worker and rule engine logs)."""
    sys.path.insert(0, str(REPO))
    from bench import ttd

    run_dir = tmp_path / "home" / "demo" / "run-1"
    run_dir.mkdir(parents=True)
    (run_dir / "streams.log").write_text("worker log\n")
    log = tmp_path / "h2.log"
    log.write_text("fault: exit on node-02 injected\n")
    report = {"scenario": {"job": "demo-1"}, "logs": str(run_dir), "episodes": []}
    dest = tmp_path / "kept" / "node-02"
    dest.mkdir(parents=True)
    (dest / "stale.txt").write_text("from an earlier run")
    assert ttd.keep_run(report, log, dest, steps=False) == dest
    assert (dest / "demo.log").read_text() == "fault: exit on node-02 injected\n"
    assert json.loads((dest / "report.json").read_text())["scenario"]["job"] == "demo-1"
    assert (dest / "run" / "streams.log").read_text() == "worker log\n"
    assert not (dest / "stale.txt").exists()
    out = subprocess.run(
        [sys.executable, "-m", "bench.ttd", "--help"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert "--keep DIR" in out
    # a folder that cannot be made is refused before any run starts
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    bad = subprocess.run(
        [sys.executable, "-m", "bench.ttd", "--fault-hosts", "2", "--keep", str(blocker / "kept")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and f"--keep {blocker / 'kept'}: cannot create the folder" in bad.stderr, bad.stderr


def test_a_stall_run_of_one_layer_is_one_episode():
    """``--stall net``: a sequence of one fault, which the demo reports as a single run (a top-level
    ``verdict``, no ``episodes``), is still judged (it was read as no episode at all: 0/0 named)."""
    from bench import ttd

    verdict = {"host": "node-00", "layer": "network", "named": 4, "stalls": [{"t0_ns": 1, "ttd_s": 2.2}] * 4}
    single = {"scenario": {"sequence": [["stall:net", 0]]}, "verdict": verdict, "evidence": {"steps": 3}}
    assert ttd.stall_episodes(single) == [
        {"kind": "stall:net", "host": "node-00", "evidence": {"steps": 3}, "verdict": verdict}
    ]
    several = {"episodes": [{"kind": "stall:cpu", "host": "node-01", "verdict": verdict}], "verdict": verdict}
    assert ttd.stall_episodes(several) == several["episodes"]
    assert ttd.stall_episodes({"scenario": {"sequence": [["stall:net", 0], ["stall:cpu", 0]]}}) == []


def test_a_stall_campaign_the_demo_would_refuse_is_refused_before_it_starts(tmp_path):
    """``--stall`` options that ``obshub demo`` refuses (a ``--fault-rank`` with a net or mem stall, a
    ``--stall-param`` that no layer of the run reads, a stall not shorter than its period) are refused
    before the broker starts and a demo is waited for (it was a RuntimeError traceback after the wait:
    the demo exited 2 and wrote no report); so is a ``--keep`` folder that cannot be made (it was made
    by the first kept run, after minutes of it)."""
    import argparse

    from bench import ttd

    def opts(rph=1, rank=None):
        return argparse.Namespace(ranks_per_host=rph, fault_rank=rank)

    base = {"stall_ms": 300.0, "period_s": 12.0}
    for layers, params, a, what in (
        (("net",), base, opts(2, 1), "--fault-rank with --stall net: only a cpu or process stall"),
        (("cpu", "mem"), base, opts(4, 3), "--fault-rank with --stall cpu,mem: only a cpu or process stall"),
        (("net",), {**base, "procs": 4.0}, opts(), "--stall-param procs: read by cpu or stall (layer=cpu) only"),
        (("cpu",), {**base, "stall_ms": 12000.0}, opts(), "--stall-param stall_ms=12000 is not shorter"),
        (("cpu",), {**base, "shape": "sideways"}, opts(), "shape"),
    ):
        try:
            ttd.check_stall_options((2,), layers, params, a)
        except ValueError as exc:
            assert str(exc).startswith("obshub demo would refuse this campaign: ") and what in str(exc), str(exc)
        else:
            raise AssertionError(f"{layers} {params} {a} was accepted")
    # what the demo runs is accepted: a cpu and a process stall on local rank 3 of 4, a net stall's loss burst
    ttd.check_stall_options((1, 3), ("cpu", "process"), {**base, "procs": 4.0}, opts(4, 3))
    ttd.check_stall_options((0,), ("net",), {**base, "loss_pct": 40.0}, opts())
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    bad = subprocess.run(  # --fault-hosts 9: nothing can start, whichever check comes first
        [sys.executable, "-m", "bench.ttd", "--stall", "cpu", "--fault-hosts", "9", "--keep", str(blocker / "kept")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and f"--keep {blocker / 'kept'}: cannot create the folder" in bad.stderr, bad.stderr
