"""Rule engine throughput: rule evaluations per second of the builtin pack (obshub/rules/builtin) on recorded
inputs, side by side for the two signals the engine reads at volume:

- ``step summaries``: the summaries the stream application computes (``streams.offline`` over
  bench/loadgen.py batches of 8 hosts, with a straggler every 10th step guilty of memory, CUDA or NIC
  time in turn (a third of the run each), so the straggler and layer rules really match and alerts go
  through their lifecycle);
- ``events``: every event of the same batches as the rule engine sees it (``rules.fields.event_record``):
  all of them (most are skipped by kind: the records/s of the filter), and those of kinds a builtin rule
  reads (memory stalls, CUDA synchronize, RDMA completions, ...), replicated with shifted times to at
  least ``READ_EVENTS_MIN`` records so their evaluation cost can be timed.

- ``step summaries of 128 hosts``: one job as wide as the scale target's 128 nodes (5 steps, 1 pass), because
  rules that iterate over a summary's hosts or collectives (``foreach``) cost more per summary as jobs grow;
  then ``bench.rules_width``: the CPU per summary at 8 to 2,048 hosts next to ``summarize`` of the same
  step, with the growth exponent (8 and 32 hosts with ``--quick``).

Inputs are recorded to a JSON-lines file first and read back, so the engine runs on recorded data, as
``obshub rules`` would replay it. One sample = one pass of ``rules.engine.Engine.process`` over all
records of a signal (``tick`` every 100 records, on record time; alert changes go to a counting
``notify``). A *rule evaluation* is one rule that reads the record's signal and kind (``Rule.reads``):
its condition, group-by and window work for that record. Reported: evaluations/s and records/s.

    python -m bench.rules_throughput            # 300 steps, 5 interleaved rounds
    python -m bench.rules_throughput --quick    # 30 steps, 1 round
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from bench import common, loadgen
from obshub.core import schema
from obshub.rules import fields
from obshub.rules.engine import Engine
from obshub.rules.loader import load_ruleset
from obshub.streams import offline, synthetic

BUILTIN = Path(__file__).resolve().parent.parent / "obshub" / "rules" / "builtin"
HOSTS, STEPS, ROUNDS = 8, 300, 5
WIDE_HOSTS, WIDE_STEPS = 128, 5  # one job as wide as the scale target's 128 nodes (1 pass)
QUICK_WIDE_HOSTS, QUICK_WIDE_STEPS = 16, 6
QUICK_STEPS = 30
GUILTY_EVERY = 10
READ_EVENTS_MIN = 2_000  # events of kinds a rule reads, replicated to at least this many for timing
REPLICA_GAP_NS = 1_000_000_000  # copies 1 s apart: the originals' matching events once per second
GUILTY_LAYERS = ("memory", "cuda", "nic")  # layers whose events the builtin pack's event rules read


def record_inputs(path: Path, hosts: int, steps: int) -> dict:
    """Write ``{"signal", "record"}`` lines for the summaries and events of a synthetic run to ``path``.
    Returns counts per signal."""
    third = max(1, steps // len(GUILTY_LAYERS))
    batches, step_ms = [], 0.0
    for layer in GUILTY_LAYERS:  # one job per guilty layer, so each has its own baseline
        load = loadgen.build(
            hosts, third, job=f"bench-{layer}", guilty_steps=tuple(range(3, third, GUILTY_EVERY)), guilty_layer=layer
        )
        batches += [schema.decode_batch(v) for _k, v in load.messages]
        step_ms = load.step_ms
    start = synthetic.Scenario().start_ns
    counts = {"steps": 0, "events": 0}
    with path.open("w") as f:
        for (_job, step), s in sorted(offline.summarize_batches(batches).items()):
            s["closed_at_ns"] = start + int((step + 1) * step_ms * 1e6)
            f.write(json.dumps({"signal": "steps", "record": fields.step_record(s)}) + "\n")
            counts["steps"] += 1
        for b in batches:
            for e in b.events:
                f.write(json.dumps({"signal": "events", "record": fields.event_record(b, e)}) + "\n")
                counts["events"] += 1
    return counts


def record_wide(path: Path, hosts: int, steps: int) -> int:
    """Write the step summaries of one ``hosts``-host job (a sched straggler every 5th step) to ``path``;
    returns their count. Shows how the per-summary cost grows with the hosts of a job."""
    load = loadgen.build(hosts, steps, job="bench-wide", guilty_steps=tuple(range(2, steps, 5)))
    start = synthetic.Scenario().start_ns
    n = 0
    with path.open("w") as f:
        for (_job, step), s in sorted(
            offline.summarize_batches(schema.decode_batch(v) for _k, v in load.messages).items()
        ):
            s["closed_at_ns"] = start + int((step + 1) * load.step_ms * 1e6)
            f.write(json.dumps({"signal": "steps", "record": fields.step_record(s)}) + "\n")
            n += 1
    return n


def load_inputs(path: Path) -> dict[str, list[dict]]:
    """The recorded records grouped by signal, in file order."""
    out: dict[str, list[dict]] = {"steps": [], "events": []}
    with path.open() as f:
        for line in f:
            d = json.loads(line)
            out[d["signal"]].append(d["record"])
    return out


def replicate(records: list[dict], at_least: int) -> list[dict]:
    """``records`` repeated until there are ``at_least``, each copy shifted later in time by the span of the
    originals, at least ``REPLICA_GAP_NS`` (so windows and lifecycles see a longer run at a steady rate,
    not the same instants again)."""
    if not records:
        return []
    t0 = min(r["time_ns"] for r in records)
    span = max(max(r["time_ns"] for r in records) - t0 + 1_000_000, REPLICA_GAP_NS)
    out, k = [], 0
    while len(out) < at_least:
        out += [{**r, "time_ns": r["time_ns"] + k * span, "ts_ns": r["ts_ns"] + k * span} for r in records]
        k += 1
    return out


def evaluations(ruleset, signal: str, records: list[dict]) -> int:
    """Rule evaluations one pass over ``records`` makes: per record, the rules that read it."""
    return sum(
        sum(1 for r in ruleset.rules.values() if r.reads(signal, rec.get("kind") if signal == "events" else None))
        for rec in records
    )


def one_pass(ruleset, signal: str, records: list[dict], changes: list[int]) -> float:
    """Seconds for a fresh Engine to process ``records`` (ticking every 100 on record time)."""
    n = [0]
    eng = Engine(ruleset, lambda _change: n.__setitem__(0, n[0] + 1))
    t0 = time.perf_counter()
    for i, rec in enumerate(records):
        eng.process(signal, rec)
        if i % 100 == 99:
            eng.tick(eng.now_ns)
    dt = time.perf_counter() - t0
    changes.append(n[0])
    return dt


def run(quick: bool = False, rounds: int | None = None) -> dict:
    """Run the benchmark, print the table, save the JSON. Returns the results dict."""
    rounds = rounds or (1 if quick else ROUNDS)
    steps = QUICK_STEPS if quick else STEPS
    common.console.rule("[bold]4. rule engine[/bold]: builtin pack on recorded step summaries and events")
    ruleset = load_ruleset([BUILTIN])
    with tempfile.TemporaryDirectory(prefix="obshub-bench-rules-") as tmp:
        path = Path(tmp) / "inputs.jsonl"
        counts = record_inputs(path, HOSTS, steps)
        size = path.stat().st_size
        inputs = load_inputs(path)
        wide_hosts, wide_steps = (QUICK_WIDE_HOSTS, QUICK_WIDE_STEPS) if quick else (WIDE_HOSTS, WIDE_STEPS)
        record_wide(Path(tmp) / "wide.jsonl", wide_hosts, wide_steps)
        inputs["wide_steps"] = load_inputs(Path(tmp) / "wide.jsonl")["steps"]
    read = [r for r in inputs["events"] if any(rule.reads("events", r["kind"]) for rule in ruleset.rules.values())]
    inputs["read_events"] = replicate(read, READ_EVENTS_MIN)
    signal_of = {"steps": "steps", "events": "events", "read_events": "events", "wide_steps": "steps"}
    evals = {name: evaluations(ruleset, signal_of[name], recs) for name, recs in inputs.items()}
    common.console.print(
        f"[dim]  recorded {counts['steps']:,} step summaries and {counts['events']:,} events "
        f"({size / 1e6:.1f} MB JSON lines); {len(ruleset.rules)} builtin rules; {len(read):,} of the "
        f"events are of kinds a rule reads (replayed {len(inputs['read_events']) // max(1, len(read))}x "
        f"with shifted times for timing)[/dim]"
    )
    labels = {
        "steps": "step summaries",
        "events": "all events",
        "read_events": "events a rule reads",
        "wide_steps": f"step summaries of {wide_hosts} hosts",
    }
    changes: dict[str, list[int]] = {name: [] for name in labels}
    secs = common.interleave(
        {
            name: (lambda n=name: one_pass(ruleset, signal_of[n], inputs[n], changes[n]))
            for name in labels
            if name != "wide_steps"
        },
        rounds,
    )
    # the wide job costs seconds per summary: one pass of a few summaries, not one per round
    secs.update(
        common.interleave(
            {"wide_steps": lambda: one_pass(ruleset, "steps", inputs["wide_steps"], changes["wide_steps"])}, 1
        )
    )
    rows = {
        "steps evals": common.Series(
            "step summaries: rule evaluations/s", [evals["steps"] / x for x in secs["steps"].samples]
        ),
        "steps records": common.Series(
            "step summaries: records/s", [len(inputs["steps"]) / x for x in secs["steps"].samples]
        ),
        "read evals": common.Series(
            "events a rule reads: rule evaluations/s", [evals["read_events"] / x for x in secs["read_events"].samples]
        ),
        "read records": common.Series(
            "events a rule reads: records/s", [len(inputs["read_events"]) / x for x in secs["read_events"].samples]
        ),
        "all records": common.Series(
            "all events (most skipped by kind): records/s", [len(inputs["events"]) / x for x in secs["events"].samples]
        ),
        "wide evals": common.Series(
            f"step summaries of {wide_hosts} hosts: rule evaluations/s",
            [evals["wide_steps"] / x for x in secs["wide_steps"].samples],
        ),
        "wide records": common.Series(
            f"step summaries of {wide_hosts} hosts: records/s",
            [len(inputs["wide_steps"]) / x for x in secs["wide_steps"].samples],
        ),
    }
    common.console.print(
        common.table(
            f"builtin rule pack ({len(ruleset.rules)} rules), {rounds} interleaved passes per input",
            rows,
            "per s",
            lower_is_better=False,
            fmt="{:,.1f}",
        )
    )
    per_eval_ms = 1000 / rows["steps evals"].median if rows["steps evals"].median else float("nan")
    wide_ms = 1000 / rows["wide records"].median if rows["wide records"].median else float("nan")
    common.console.print(
        f"a step summary of {HOSTS} hosts costs {per_eval_ms:.2f} ms per rule evaluation "
        f"({evals['steps'] / max(1, len(inputs['steps'])):.0f} rules read each summary); "
        f"one of {wide_hosts} hosts {wide_ms:.1f} ms for the whole pack; "
        f"alert state changes per pass: " + ", ".join(f"{labels[k]} {v[0] if v else 0}" for k, v in changes.items())
    )
    result = {
        "rounds": rounds,
        "steps": steps,
        "counts": counts,
        "evaluations_per_pass": evals,
        "rules": sorted(ruleset.rules),
        "seconds": {k: v.samples for k, v in secs.items()},
        "rates": {v.name: v.median for v in rows.values()},
        "alert_changes": changes,
        "records_per_s": {v.name: v.median for k, v in rows.items() if "records" in k},
        "rev": common.git_rev(),
    }
    common.console.print(f"raw results: {common.save('rules_throughput', result)}")
    from bench import rules_width

    result["width"] = rules_width.run(quick, widths=rules_width.SMOKE_WIDTHS if quick else None)
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m bench.rules_throughput [--quick] [--rounds N]``."""
    p = argparse.ArgumentParser(
        prog="python -m bench.rules_throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 30 steps, 1 round")
    p.add_argument("--rounds", type=common.positive_int, default=None, help=f"interleaved passes (default {ROUNDS})")
    a = p.parse_args(argv)
    run(a.quick, a.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
