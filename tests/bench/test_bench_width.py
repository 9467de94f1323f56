"""The width benchmark (bench/width.py): its synthetic agents send valid agent-shaped batches with a
straggler the analysis names, its arithmetic holds, and ``python -m bench width --quick`` runs the whole
pipeline (private broker, stream worker, rule engine) end to end, prints its tables and saves its raw
results. No timing assertions: the numbers are the benchmark's business, not the test's."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_fleet_batches_are_agent_shaped_and_name_the_straggler():
    from bench import fleet
    from obshub.core import schema
    from obshub.streams import offline

    shape = fleet.Shape(6, 5, job="w", guilty_from=2)
    f = fleet.Fleet(shape, start_ns=1_790_000_000_000_000_000)
    steps = f.encode_all()
    reg = [schema.decode_batch(v) for _k, v in f.register_messages()]
    batches = reg + [schema.decode_batch(v) for st in steps for _due, msgs, _n in st for _k, v in msgs]
    assert sum(n for st in steps for _d, _m, n in st) == 6 * 5 * 64  # events reported per group add up
    seqs: dict[str, list[int]] = {}
    for b in batches:
        seqs.setdefault(b.agent_id, []).append(b.seq)
    assert all(s == list(range(len(s))) for s in seqs.values()) and len(seqs) == 6  # contiguous from 0
    per_host_step = Counter((b.host, e.step) for b in batches for e in b.events if e.step >= 0)
    assert set(per_host_step.values()) == {64} and len(per_host_step) == 6 * 5
    # one batch per host and step, as the agent seals them: at the step's STEP_END, its last event,
    # published after it (0.74 s into a clean step, 0.94 s into a guilty one)
    assert len(batches) == 6 + 6 * 5
    for b in batches[6:]:
        assert len({e.step for e in b.events}) == 1
        end = max(e.ts_ns for e in b.events)
        step_end = [e.ts_ns for e in b.events if e.kind == schema.Kind.STEP_END]
        assert len(step_end) == 1 and end - step_end[0] < 1_000_000  # the optimizer phase ends with it
        end += b.clock.offset_ns
        assert 0 < b.sent_ns - end < 20_000_000
    for st in steps:
        assert len(st) == 1 and 0.7 < st[0][0] < 0.97
    for b in batches[6:]:  # TraceKey step bits follow the step
        for e in b.events:
            assert schema.parse_trace_key(e.trace_key).step16 == e.step & 0xFFFF
    begins = sorted(
        {
            e.ts_ns + b.clock.offset_ns
            for b in batches
            if b.host == "node0"
            for e in b.events
            if e.kind == schema.Kind.STEP_BEGIN
        }
    )
    assert [round((y - x) / 1e9, 2) for x, y in zip(begins, begins[1:])] == [1.0] * 4  # 1 s steps
    summaries = offline.summarize_batches(batches)
    assert len(summaries) == 5
    for (_job, step), s in summaries.items():
        if step >= 2:
            assert s["straggler"]["host"] == "node2" and s["blame"][0]["layer"] == "sched"
        else:
            assert s["straggler"] is None


def test_memory_case_charges_the_straggler_over_an_episode():
    """``bench.width --inproc --case mem10``'s load: node2's rank stalls in reclaim from the case's first slow
    step (after the memory episode's quiet steps), 10 % of the other hosts' ranks stall in reclaim every
    step (2 of their 64 events per rank-step), and the worker's fold names node2 / memory on every slow step
    as one episode, which memory_stall_episode reports."""
    from bench import fleet, width
    from obshub.core import schema

    layer, steps, g_from, share = width.CASES["mem10"]
    shape = fleet.Shape(21, 3, job="m", guilty_from=1, ranks_per_host=2, guilty_layer=layer, mem_hosts=2)
    assert shape.mem_set == {0, 11} and shape.straggler == 2
    f = fleet.Fleet(shape, start_ns=1_790_000_000_000_000_000)
    reclaim: Counter = Counter()
    for st in f.encode_all():
        for _due, msgs, _n in st:
            for _k, v in msgs:
                b = schema.decode_batch(v)
                assert len(b.events) == 2 * 64
                for e in b.events:
                    if e.kind == schema.Kind.MEM_RECLAIM:
                        reclaim[(b.host, e.step, e.pid)] += 1
    filler = {k: n for k, n in reclaim.items() if k[0] != "node2"}
    assert filler == {(h, s, pid): 2 for h in ("node0", "node11") for s in range(3) for pid in (1000, 1001)}
    assert {k[1] for k in reclaim if k[0] == "node2"} == {1, 2}  # the straggler's own stalls, slow steps only
    with pytest.raises(ValueError, match="mem_hosts=21"):
        fleet.Fleet(fleet.Shape(21, 3, mem_hosts=21), start_ns=1_790_000_000_000_000_000)
    r = width.inproc_cost(21, 2, steps, g_from, say=lambda *_a: None, guilty_layer=layer, mem_share=share)
    assert r["case"] == {"guilty_layer": "memory", "mem_hosts": 2, "steps": steps, "from": g_from}
    assert r["named"] == r["episodes"] == r["steps_judged"] == steps - g_from - 1
    assert "memory_stall_episode" in r["fired"]


def test_growth_exponent():
    from bench.width import exponent

    assert exponent([128, 512, 2048], [1.0, 4.0, 16.0]) == pytest.approx(1.0)
    assert exponent([128, 512, 2048], [1.0, 16.0, 256.0]) == pytest.approx(2.0)
    assert math.isnan(exponent([128], [3.0]))
    assert math.isnan(exponent([128, 512], [1.0, float("nan")]))


def test_topic_classes():
    from bench.width import topic_class

    assert topic_class("obshub.events.v1", "bench-width-8") == "events (agents)"
    assert topic_class("bench-width-8-steps", "bench-width-8") == "repartition steps"
    assert topic_class("bench-width-8-open-changelog", "bench-width-8") == "changelog open"
    assert topic_class("bench-width-128-open-changelog", "bench-width-8") is None  # another size's app
    assert topic_class("__consumer_offsets", "bench-width-8") is None


@pytest.mark.kafka
def test_width_quick_runs_the_pipeline(tmp_path):
    env = {**os.environ, "OBSHUB_BENCH_RESULTS": str(tmp_path), "COLUMNS": "200"}
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "width", "--quick"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-3000:]
    for text in (
        "4 hosts",
        "16 hosts",
        "summaries behind at each step's end",
        "last event -> summary",
        "CPU per step of each stage",
        "bytes per step on each topic",
        "RSS peak of each process",
    ):
        assert text in out, text
    saved = json.loads((tmp_path / "width.json").read_text())
    sizes = {s["hosts"]: s for s in saved["sizes"]}
    assert set(sizes) == {4, 16}
    for s in sizes.values():
        assert not s["ended"], s["ended"]
        assert s["samples"] and s["publish"], "sampled and published"
        assert s["cpu_ms_per_step"]["worker"] > 0 and s["cpu_ms_per_step"]["engine"] > 0
        assert s["bytes_per_step"]["events (agents)"] > 0 and s["rss_peak_mb"]["worker"] > 0
        assert s["summarize_ms"] > 0
    small = sizes[4]
    last = small["samples"][-1]
    assert last["summaries"] > 0 and last["engine_steps"] > 0 and last["ingested"] > 0  # metrics wired
    # the straggler runs from step 10 on: every summary of a later step names node2, blamed for sched
    slow = {int(k): v for k, v in small["summaries"].items() if int(k) >= small["guilty_from"]}
    assert slow and all(v["straggler"] == "node2" and v["layer"] == "sched" for v in slow.values())
    assert small["pause"] is not None  # run, or skipped with the reason


def test_stage_split_of_sampled_stacks():
    from bench import stages

    raw = "\n".join(
        [
            "_run_once (asyncio/base_events.py:1);ingest (obshub/streams/app.py:270);ingest_one (obshub/streams/app.py:220) 5",
            "_run_once (asyncio/base_events.py:1);fold (obshub/streams/app.py:390);fold_one (obshub/streams/app.py:370);"
            "close (obshub/streams/app.py:290);summarize (obshub/streams/analysis/:310) 3",
            "_run_once (asyncio/base_events.py:1);fold_agent (obshub/streams/app.py:390);Fold.part (obshub/streams/fold.py:340) 2",
            "_run_once (asyncio/base_events.py:1);fold_agent (obshub/streams/app.py:390);"
            "Table.__setitem__ (faust/tables/table.py:80) 1",
            "_run_once (asyncio/base_events.py:1);fold_agent (obshub/streams/app.py:390);"
            "Stream.take_events (faust/streams.py:600) 4",
            "_run_once (asyncio/base_events.py:1);fold_agent (obshub/streams/app.py:390);"
            "send_closed (obshub/streams/app.py:380);dumps (json/__init__.py:1) 1",
            "_run_once (asyncio/base_events.py:1);ingest (obshub/streams/app.py:270);WriteBack.__setitem__ "
            "(obshub/streams/fold.py:115) 1",
            "_run_once (asyncio/base_events.py:1);_SelectorSocketTransport.write (asyncio/selector_events.py:1) 10",
        ]
    )
    assert stages.parse(raw, "worker") == {
        "ingest": 6,
        "close": 4,
        "fold": 3,
        "fold transport": 4,
        "kafka client + faust": 10,
    }
    eng = "\n".join(
        [
            "run_engine (obshub/rules/service.py:1);_decode (obshub/rules/service.py:2);event_record (obshub/rules/fields.py:3) 4",
            "run_engine (obshub/rules/service.py:1);Engine.process (obshub/rules/engine.py:9);Compiled.eval (celpy/x.py:1) 6",
            "Thread.run (threading.py:1);RuleService.run_notify (obshub/rules/service.py:5) 1",
        ]
    )
    assert stages.parse(eng, "engine") == {"decode": 4, "rules": 6, "notify": 1}


def test_report_judges_the_targets_from_measured_numbers():
    from rich.console import Console

    from bench.width import SizeResult, report

    def size(hosts, worker_ms, engine_ms, rss, fold_share, rules_share, kept_up=True):
        r = SizeResult(hosts, 20, hosts * 64, summarize_ms=hosts / 100)
        r.cpu_ms_per_step = {"worker": worker_ms, "engine": engine_ms, "broker": 5.0}
        r.cpu_complete = {"worker": True, "engine": True, "broker": True}
        r.work = {"published": 20, "ingested": 20, "summaries": 20, "engine": 20, "engine_events": 20}
        r.cpu_s = {k: v * 20 / 1000 for k, v in r.cpu_ms_per_step.items()}
        r.rss_peak_mb = {"worker": rss, "engine": rss / 2, "broker": 900.0}
        r.profile = {
            "worker": {"shares": {"fold": fold_share / 2, "close": fold_share / 2, "ingest": 1 - fold_share}},
            "engine": {"shares": {"rules": rules_share, "decode": 1 - rules_share}},
        }
        r.bytes_per_step = {"events (agents)": hosts * 1600.0}
        r.kept_up, r.why_not = kept_up, ([] if kept_up else ["summaries up to 9 steps behind"])
        return r

    con = Console(width=200, record=True)
    out = report(
        [
            size(128, 100.0, 20.0, 90.0, 0.1, 0.5),
            size(512, 400.0, 80.0, 120.0, 0.1, 0.5),
            size(2048, 1600.0, 400.0, 600.0, 0.05, 0.1),
        ],
        say=con.print,
    )
    v = out["verdicts"]
    # fold = 5 % of 1,600 ms = 80 ms (met); rules = 10 % of 400 ms = 40 ms (met); worker RSS 600 MB (missed)
    assert v == {"keep_up_512": True, "fold_2048": True, "rules_2048": True, "rss_2048": False}
    assert out["growth"]["worker"] == pytest.approx(1.0) and out["growth"]["summarize"] == pytest.approx(1.0)
    assert out["bytes_growth"]["events (agents)"] == pytest.approx(1.0)
    assert [r["met"] for r in out["target_rows"]] == [True, True, True, False]
    text = con.export_text()
    assert "worker: fold" in text and "events (agents)" in text and "RSS peak" in text
    slow = report([size(512, 400.0, 80.0, 120.0, 0.1, 0.5, kept_up=False)], say=Console(record=True).print)
    assert slow["verdicts"] == {"keep_up_512": False}
    assert "9 steps behind" in slow["target_rows"][0]["measured"]
    # a worker that ingested but summarised nothing has not met the fold target, however small its share
    stuck = size(2048, 300_000.0, 800.0, 120.0, 0.0, 0.3)
    stuck.work = {"published": 5, "ingested": 0.1, "summaries": 0, "engine": 0, "engine_events": 4}
    stuck.cpu_complete = {"worker": True, "engine": True, "broker": True}
    v = report([stuck], say=Console(record=True).print)["verdicts"]
    assert v["fold_2048"] is False and v["rules_2048"] is False


def test_stage_split_follows_classes_and_modules():
    from bench import stages

    raw = "\n".join(
        [
            "ingest (obshub/streams/app.py:188);one (obshub/streams/app.py:161);Ingest.handle (obshub/streams/ingest.py:50) 4",
            "fold_agent (obshub/streams/app.py:204);Fold.apply (obshub/streams/fold.py:90);Fold.part (obshub/streams/fold.py:200) 3",
            "fold_agent (obshub/streams/app.py:204);Fold.apply (obshub/streams/fold.py:90);Fold.close (obshub/streams/fold.py:250);"
            "summarize (obshub/streams/analysis/:302) 2",
        ]
    )
    assert stages.parse(raw, "worker") == {"ingest": 4, "fold": 3, "close": 2}


def test_the_step_length_reaches_the_jobs_shape_and_a_bad_one_is_refused(monkeypatch, capsys, tmp_path):
    """``--step-s`` (to measure RSS at 2,048 x 8, whose 1 s steps this machine cannot carry) reaches
    ``run`` and the size's fleet shape (the agents' ``--step-s``); 0 or less is refused by argparse
    naming it. Nothing is started: ``run`` and the processes are replaced."""
    from types import SimpleNamespace

    from bench import width

    got: dict = {}
    monkeypatch.setattr(width, "run", lambda *a, **kw: got.update(kw) or {})
    assert width.main(["--sizes", "2048", "--ranks-per-host", "8", "--step-s", "5", "--pause-s", "0"]) == 0
    assert got["step_s"] == 5.0 and got["ranks_per_host"] == 8 and got["sizes"] == (2048,)
    for bad in ("0", "-1"):
        with pytest.raises(SystemExit) as exc:
            width.main(["--step-s", bad])
        assert exc.value.code == 2
        assert f"--step-s {float(bad)}: expected a positive number of seconds" in capsys.readouterr().err
    monkeypatch.setattr(width.SizeRun, "start", lambda self, workers, tmp: None)
    size = width.SizeRun(
        SimpleNamespace(kafka_dir=tmp_path), 2048, 15, pause_s=0, workers=1, tmp=tmp_path, say=print, step_s=5.0
    )
    assert size.shape.step_s == 5.0 and size.shape.hosts == 2048


def test_the_rates_printed_for_a_run_of_longer_steps_are_per_second():
    """A run at ``--step-s 5`` (2,048 x 8: 1,048,576 events a step) publishes 209,715 events and 410 batches a
    second: the per-size block says so (it said 1,048,576 events/s, the events of one step), and the
    projection keeps its 1 s steps (events per step per second) beside the run's own rate."""
    from rich.console import Console

    from bench.width import SizeResult, print_size, projection

    r = SizeResult(2048, 15, 2048 * 8 * 64, step_s=5.0)
    r.cpu_ms_per_step = {"worker": 2986.0, "engine": 260.0, "broker": 590.0}
    r.cpu_complete = {"worker": True, "engine": True, "broker": True}
    r.bytes_per_step = {"events (agents)": 23e6}
    r.bytes_complete = {"events (agents)": True}
    con = Console(width=300, record=True)
    print_size(r, con.print)
    head = con.export_text().splitlines()[0]
    assert "209,715 events/s in 410 batches/s: 1,048,576 events a step of 5 s" in head, head
    con = Console(width=300, record=True)
    (row,) = projection([r], con.print)
    assert row["events_per_s"] == 1_048_576 and row["events_per_s_run"] == pytest.approx(209_715.2)
    assert row["step_s"] == 5.0 and row["worker_cores"] == pytest.approx(2.986)  # CPU per step at 1 s steps
    text = con.export_text()
    assert "at 5 s steps" in text and "(209,715 at 5 s)" in text, text


def test_the_inproc_fold_figure_leaves_out_the_parts_encoding(monkeypatch):
    """``inproc_cost``'s ``fold_ms`` is the fold agent's own work: the parts' msgpack encoding (the real
    worker's ingest does it, ``Round.add``) is shown apart (``encode_ms``) and only in ``fold_enc_ms``. Made
    visible by an encoding that burns 3 ms of CPU per part message: the fold stays below it (it included
    it before ``fold23``)."""
    from bench import width
    from obshub.streams import wire

    real = wire.packb

    def slow(v):
        if sys._getframe(1).f_code.co_name == "inproc_cost":  # the bench's encoding of the parts only
            c = time.process_time()
            while time.process_time() - c < 0.003:
                pass
        return real(v)

    monkeypatch.setattr(wire, "packb", slow)
    r = width.inproc_cost(4, 2, 4, 1, say=lambda *_a: None)
    assert r["encode_ms"] >= 3 * 4  # at least one part per host and step
    assert r["fold_ms"] < r["encode_ms"] and r["fold_max_ms"] < r["encode_ms"], r
    assert r["encode_ms"] <= r["fold_enc_ms"], r
