"""Replay recorded demo runs through the analysis and the builtin rules, and score the diagnosis.

For tuning detection quality on real data (docs/ANALYSIS.md "Straggler persistence", docs/RULES.md):
each recorded `obshub demo` run (``$OBSHUB_HOME/demo/<run id>/report.json``: job, fault, fault host, t0)
is re-read from a Kafka broker holding its events (``obshub.events.v1``, one msgpack batch per message),
re-joined with ``streams.offline`` (the worker's own join and analysis, with the *current* code), fed to
the rule engine in-process (``rules.engine.Engine`` with the builtin pack, as ``obshub rules test`` does)
in event-time order, and judged with the demo's own ``obshub.demo.verdict.judge``.

Step summaries get ``closed_at_ns`` = the latest STEP_END time (CLOCK_REALTIME ns) of the step over its
hosts, so rule windows and ``for:`` durations see the run's real clock; alert times are the engine's
clock when the alert fired (the live demo uses the Kafka timestamp of the alert record, a little later).
Health rules (consumer lag) are not replayed: they depend on the live consumer, not on the data.

``--worker`` replays as the live stream worker instead: its ingest and fold (``streams.inproc``, the
worker's own state per job: the directed view, the retransmit window, the quiet steps after a hang) fed
each batch at the time its agent sent it (``Batch.sent_ns``), the watch timer's hang and running-step
checks every 0.5 s, and the expire timer's window close; the records go to the engine at the times the
worker made them. A run of ``obshub demo --sequence`` (several faults on one training) is judged per
episode, each against the alerts between its injection and the next one, as the demo does. To compare
two versions of the analysis on the same data, run the tool from a checkout of each (``PYTHONPATH``).

Usage::

    # copy of the demo's Kafka data, on its own port (never the live one)
    cp -a /tmp/demo-home/kafka /tmp/tune-home/kafka
    OBSHUB_HOME=/tmp/tune-home OBSHUB_KAFKA_PORT=39521 obshub up
    .venv/bin/python -m bench.diagnosis_replay --bootstrap 127.0.0.1:39521 \\
        --runs /tmp/demo-home/demo --cache /tmp/tune-home/replay-cache     # matrix of every run
    .venv/bin/python -m bench.diagnosis_replay --cache /tmp/tune-home/replay-cache -v   # from the cache, alerts listed

The cache holds each run's raw batches (``<job>.batches``: length-prefixed msgpack), so later replays need
no broker.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path

from obshub.core import kafka, schema
from obshub.demo.faults import LAYER_OF
from obshub.demo.verdict import AlertSeen, judge
from obshub.rules import fields
from obshub.rules.engine import Engine
from obshub.rules.loader import load_ruleset
from obshub.streams import analysis, offline
from obshub.streams.inproc import InProcess

BUILTIN = Path(__file__).resolve().parent.parent / "obshub" / "rules" / "builtin"


def read_runs(runs_dir: Path) -> list[dict]:
    """The scenarios of the recorded runs under ``runs_dir`` (one ``report.json`` each), oldest first:
    ``{run_id, job, fault, host, hosts, t0_ns, from_ns, until_ns}`` (``host``/``t0_ns`` None for
    ``none``); a sequence run gives one entry per episode (``run_id#<n>``), judged on the alerts from
    ``from_ns`` (its injection; 0 for the first) to ``until_ns`` (the next injection; None: the end)."""
    out = []
    for rep in sorted(runs_dir.glob("*/report.json")):
        r = json.loads(rep.read_text())
        s, v = r["scenario"], r.get("verdict") or {}
        eps = r.get("episodes") or []
        if eps:
            starts = [e.get("t0_ns") for e in eps]
            for i, e in enumerate(eps):
                out.append(
                    {
                        "run_id": f"{s['run_id']}#{i}",
                        "job": s["job"],
                        "fault": e["kind"],
                        "hosts": s["hosts"],
                        "host": e.get("host"),
                        "t0_ns": e.get("t0_ns"),
                        "from_ns": (e.get("t0_ns") or 0) if i else 0,
                        "until_ns": next((t for t in starts[i + 1 :] if t), None) or _end_ns(r, e),
                    }
                )
            continue
        out.append(
            {
                "run_id": s["run_id"],
                "job": s["job"],
                "fault": s["fault"],
                "hosts": s["hosts"],
                "host": s.get("fault_host_name") if s["fault"] != "none" else None,
                "t0_ns": v.get("t0_ns"),
                "from_ns": 0,
                "until_ns": None,
            }
        )
    return out


def _end_ns(report: dict, last: dict) -> int | None:
    """The end of a sequence run's judging (the last removal plus the settle time: what the cluster's
    shutdown fires later is not judged), None when the report lacks it."""
    removed = last.get("removed_ns")
    return removed + int(report["scenario"].get("settle_s", 0) * 1e9) if removed else None


def fetch_batches(bootstrap: str, jobs: set[str], cache: Path) -> None:
    """Read every ``obshub.events.v1`` message of ``jobs`` from the broker at ``bootstrap`` into
    ``cache/<job>.batches`` (4-byte big-endian length + raw msgpack value, per message)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        kafka.consumer_config(
            kafka.KafkaConnection(bootstrap=bootstrap),
            "diagnosis-replay",
            {"enable.auto.commit": False, "auto.offset.reset": "earliest", "enable.partition.eof": True},
        )
    )
    md = c.list_topics(schema.TOPIC_EVENTS, timeout=10)
    parts = [TopicPartition(schema.TOPIC_EVENTS, p, 0) for p in md.topics[schema.TOPIC_EVENTS].partitions]
    c.assign(parts)
    left, files = len(parts), {}
    cache.mkdir(parents=True, exist_ok=True)
    try:
        while left:
            for m in c.consume(1000, timeout=5) or [None]:
                if m is None:
                    raise RuntimeError(f"no message within 5 s from {bootstrap}; is the broker up?")
                if m.error():
                    left -= 1
                    continue
                try:
                    job = schema.decode_batch(m.value()).job
                except (ValueError, TypeError):
                    continue
                if job in jobs:
                    f = files.get(job) or files.setdefault(job, (cache / f"{job}.batches").open("wb"))
                    f.write(struct.pack(">I", len(m.value())) + m.value())
    finally:
        for f in files.values():
            f.close()
        c.close()


def load_batches(cache: Path, job: str) -> list[schema.Batch]:
    """The decoded batches of ``job`` from the cache (empty list when the run has no cached data)."""
    path = cache / f"{job}.batches"
    if not path.exists():
        return []
    data, out, i = path.read_bytes(), [], 0
    while i < len(data):
        (n,) = struct.unpack(">I", data[i : i + 4])
        out.append(schema.decode_batch(data[i + 4 : i + 4 + n]))
        i += 4 + n
    return out


def replay(
    batches: list[schema.Batch], rule_paths: list[Path], th: analysis.Thresholds = analysis.Thresholds()
) -> tuple[dict, list[AlertSeen]]:
    """Summaries (``{(job, step): summary}``) and the firing alerts of one run's batches."""
    summaries = offline.summarize_batches(batches, th)
    end_rt: dict[tuple[str, int], int] = {}
    timeline: list[tuple[int, int, str, dict]] = []
    for b in batches:
        for ev in b.events:
            rec = fields.event_record(b, ev)
            timeline.append((rec["time_ns"], 0, "events", rec))
            if ev.kind == schema.Kind.STEP_END:
                k = (b.job, ev.step)
                end_rt[k] = max(end_rt.get(k, 0), rec["time_ns"])
    for key, s in summaries.items():
        if key in end_rt:
            timeline.append((end_rt[key], 1, "steps", fields.step_record({**s, "closed_at_ns": end_rt[key]})))
    return summaries, _run_engine(timeline, rule_paths, 1_000_000_000)


def _run_engine(timeline: list[tuple[int, int, str, dict]], rule_paths: list[Path], tick_ns: int) -> list[AlertSeen]:
    """The alerts that fire when ``timeline`` (``(time ns, order, signal, record)``) goes through the rules
    in time order, the engine's clock ticked at least every ``tick_ns``."""
    timeline.sort(key=lambda x: (x[0], x[1]))
    fired: list[AlertSeen] = []
    engine = Engine(
        load_ruleset(rule_paths),
        notify=lambda ch: fired.append(AlertSeen.from_record(ch, engine.now_ns)) if ch["status"] == "firing" else None,
    )
    last_tick = 0
    for t, _o, sig, rec in timeline:
        if t - last_tick >= tick_ns:
            engine.tick(t)
            last_tick = t
        engine.process(sig, rec)
    engine.tick(last_tick + 10_000_000_000)
    return fired


def replay_worker(
    batches: list[schema.Batch],
    rule_paths: list[Path],
    th: analysis.Thresholds = analysis.Thresholds(),
    window_s: float = 10.0,
    tick_s: float = 0.5,
) -> tuple[dict, list[AlertSeen]]:
    """Summaries (``{(job, step): summary}``, the closed ones) and the firing alerts of one run's batches,
    replayed as the live worker makes them (module docstring, ``--worker``): batches in the order of
    ``sent_ns``, each folded at that time; every ``tick_s`` the hang and running-step checks (a job's hang
    record at most once a second, as the watch timer sends them) and the close of steps open for
    ``window_s`` (not a hung one younger than ``hang_hold_ns``). Event records go to the engine at their
    own times, step records at the worker's."""
    now = [0]
    pipe = InProcess(partitions=1, th=th, window_ns=int(window_s * 1e9), clock=lambda: now[0])
    timeline: list[tuple[int, int, str, dict]] = []
    for b in batches:
        for ev in b.events:
            rec = fields.event_record(b, ev)
            timeline.append((rec["time_ns"], 0, "events", rec))
    order = sorted(batches, key=lambda b: (b.sent_ns, b.host, b.seq))
    tick = int(tick_s * 1e9)
    next_tick = order[0].sent_ns if order else 0
    hang_sent: dict[str, int] = {}
    done = 0

    def collect() -> None:
        nonlocal done
        for s in pipe.summaries[done:]:
            timeline.append((s["closed_at_ns"], 1, "steps", fields.step_record(s)))
        done = len(pipe.summaries)

    def timers(t: int) -> None:
        now[0] = t
        for _sk, summary, _first in pipe.fold.hangs():
            if t - hang_sent.get(summary["job"], 0) >= 1_000_000_000:
                hang_sent[summary["job"]] = t
                timeline.append((t, 1, "steps", fields.step_record(summary)))
        for _sk, summary in pipe.fold.running():
            timeline.append((t, 1, "steps", fields.step_record(summary)))
        for key, st in list(pipe.fold.open_steps()):
            if key in pipe.fold.hung and t - st["opened_ns"] < th.hang_hold_ns:
                continue
            if t - st["opened_ns"] >= pipe.fold.window_ns:
                pipe.summaries.extend(v for w, _j, v in pipe.fold.close(key, st, st["p"], "window") if w == "summary")
        collect()

    for b in order:
        while next_tick <= b.sent_ns:
            timers(next_tick)
            next_tick += tick
        now[0] = b.sent_ns
        pipe.feed(schema.encode_batch(b))
        collect()
    for _ in range(int(window_s / tick_s) + 2):  # the last steps close by their window
        timers(next_tick)
        next_tick += tick
    fired = _run_engine(timeline, rule_paths, 250_000_000)
    return {(s["job"], s["step"]): s for s in pipe.summaries}, fired


def straggler_profile(summaries: dict) -> str:
    """``host:count`` of named stragglers over the run, most first (how the per-step straggler spreads)."""
    n: dict[str, int] = {}
    for s in summaries.values():
        if s["straggler"]:
            n[s["straggler"]["host"]] = n.get(s["straggler"]["host"], 0) + 1
    return " ".join(f"{h}:{c}" for h, c in sorted(n.items(), key=lambda kv: -kv[1]))


def main(argv: list[str] | None = None) -> int:
    """CLI entry; prints one matrix row per run (and its alerts with ``-v``). Exit 0 when every run's
    verdict is ok."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, default=Path("/tmp/demo-home/demo"), help="recorded demo runs")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/tune-home/replay-cache"))
    ap.add_argument("--bootstrap", help="broker holding the runs' events; fills the cache first")
    ap.add_argument("--rules", type=Path, nargs="*", default=[BUILTIN], help="rule files or folders")
    ap.add_argument("--run", action="append", help="only these run ids")
    ap.add_argument("-v", "--verbose", action="store_true", help="list each run's alerts")
    ap.add_argument(
        "--worker",
        action="store_true",
        help="replay as the live worker (its fold at the batches' send times, hang and running-step checks)",
    )
    a = ap.parse_args(argv)
    runs = [r for r in read_runs(a.runs) if not a.run or r["run_id"].split("#")[0] in a.run]
    if a.bootstrap:
        fetch_batches(a.bootstrap, {r["job"] for r in runs}, a.cache)
    all_ok = True
    replayed: dict[str, tuple[dict, list[AlertSeen]]] = {}  # job -> its replay (episodes share one)
    print(f"{'run':24} {'fault':8} {'host':8} {'steps':>5} {'detected':18} {'ttd_s':>6} {'wrong':>5}  stragglers")
    for r in runs:
        if r["job"] not in replayed:
            batches = load_batches(a.cache, r["job"])
            replayed[r["job"]] = (replay_worker if a.worker else replay)(batches, a.rules) if batches else ({}, [])
        summaries, fired = replayed[r["job"]]
        if not summaries:
            print(f"{r['run_id']:24} {r['fault']:8} (no data)")
            continue
        fired = [x for x in fired if r["from_ns"] <= x.received_ns < (r["until_ns"] or 1 << 63)]
        layer = LAYER_OF[r["fault"]]
        v = judge(r["fault"], r["host"], layer, r["t0_ns"], fired)
        det = f"{v.first_correct['host']}/{v.first_correct['layer']}" if v.first_correct else "-"
        all_ok &= v.ok
        print(
            f"{r['run_id']:24} {r['fault']:8} {r['host'] or '-':8} {len(summaries):5} {det:18} "
            f"{v.ttd_s if v.ttd_s is not None else '-':>6} {v.wrong_count:5}  {straggler_profile(summaries)}"
        )
        if a.verbose:
            t0 = r["t0_ns"] or 0
            for al in fired:
                print(
                    f"    {(al.received_ns - t0) / 1e9 if t0 else 0:+8.1f}s {al.rule:32} {al.host:8} "
                    f"{al.layer:8} step {al.step:5} {al.evidence[:90]}"
                )
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
