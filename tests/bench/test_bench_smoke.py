"""Smoke test of the benchmarks: ``python -m bench`` runs the cheapest benchmark with
``--quick`` tiny sizes as a user would and prints its table, verdict lines are well-formed, raw results
are saved (to a temporary folder, never over bench/results/), and the scale projection's arithmetic holds.
No timing assertions: the numbers themselves are the benchmarks' business, not the test's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _bench(tmp_path: Path, *args: str, timeout: int = 50) -> subprocess.CompletedProcess:
    env = {**os.environ, "OBSHUB_BENCH_RESULTS": str(tmp_path), "COLUMNS": "160"}
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_list_names_every_benchmark(tmp_path):
    proc = _bench(tmp_path, "--list")
    assert proc.returncode == 0, proc.stderr
    names = [ln.split()[0] for ln in proc.stdout.splitlines() if ln.strip()]
    assert names == [
        "training_overhead",
        "agent_throughput",
        "stream_throughput",
        "fold_width",
        "summary_size",
        "rules_throughput",
        "ttd",
        "width",
        "scale",
    ]


def test_unknown_benchmark_is_refused(tmp_path):
    proc = _bench(tmp_path, "no_such_bench")
    assert proc.returncode == 2
    assert "unknown benchmark(s) no_such_bench" in proc.stderr


@pytest.mark.slow
def test_rules_quick_prints_table_and_saves(tmp_path):
    proc = _bench(tmp_path, "rules_throughput", "--quick")
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "builtin rule pack" in out and "rule evaluations/s" in out and "records/s" in out
    assert "┏" in out and "median (per s)" in out  # the rich table, with its header
    assert "cores" in out and "Linux" in out  # the machine line
    saved = json.loads((tmp_path / "rules_throughput.json").read_text())
    assert saved["machine"]["cores"] == os.cpu_count()
    assert saved["counts"]["steps"] > 0 and saved["counts"]["events"] > 0
    # the pack's event rules read the guilty layers' events, so evaluations happen on both signals
    assert saved["evaluations_per_pass"]["steps"] > 0 and saved["evaluations_per_pass"]["events"] > 0
    assert all(v > 0 for v in saved["records_per_s"].values())


def test_scale_projection_arithmetic():
    from bench import scale

    inputs = {"E": (100.0, "t"), "W": (10_000.0, "t"), "C": (4.0, "t"), "T_toy": (0.05, "t")}
    rows = scale.projection(inputs, b_raw=40.0, b_lz4=10.0)
    assert [(r["gpus"], r["T_s"]) for r in rows] == [(1024, 0.05), (1024, 1.0), (16384, 0.05), (16384, 1.0)]
    r = rows[1]  # 1,024 GPUs, 1 s steps
    assert r["nodes"] == 128 and r["events_per_s"] == pytest.approx(102_400)
    assert r["mb_per_s_lz4"] == pytest.approx(1.024) and r["mb_per_s_raw"] == pytest.approx(4.096)
    assert r["workers"] == 11  # ceil(102,400 / 10,000)
    assert r["messages_per_s"] == 128 * 5
    assert r["agent_cores_per_node"] == pytest.approx(8 * 100 * 4 / 1e6)


def test_interleave_and_table_shape():
    from rich.console import Console

    from bench import common

    order = []
    series = common.interleave(
        {"a": lambda: order.append("a") or 2.0, "b": lambda: order.append("b") or 3.0}, rounds=3, progress=False
    )
    assert order == ["a", "b"] * 3  # interleaved, not a a a b b b
    assert series["b"].median == 3.0 and series["a"].mad == 0.0
    con = Console(width=200, record=True)
    con.print(common.table("t", series, "ms", baseline="a"))
    text = con.export_text()
    assert "1.5000" in text and "ratio to a" in text


def test_loadgen_batches_are_agent_shaped():
    from collections import Counter

    from bench import loadgen
    from obshub.core import schema
    from obshub.streams import offline

    load = loadgen.build(3, 7, events_per_step=40, steps_per_batch=3)
    batches = [schema.decode_batch(v) for _k, v in load.messages]  # every message is a valid v1 batch
    assert sum(len(b.events) for b in batches) == load.events
    seqs: dict[str, list[int]] = {}
    for (key, _v), b in zip(load.messages, batches):
        assert key == b.host.encode()
        seqs.setdefault(b.agent_id, []).append(b.seq)
    assert all(s == list(range(len(s))) for s in seqs.values()) and len(seqs) == 3  # contiguous per agent
    per_host_step = Counter((b.host, e.step) for b in batches for e in b.events if e.step >= 0)
    assert set(per_host_step.values()) == {40} and len(per_host_step) == 3 * 7
    summaries = offline.summarize_batches(batches)
    assert len(summaries) == 7 and all(len(s["hosts"]) == 3 for s in summaries.values())
