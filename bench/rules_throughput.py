"""Rule engine throughput: rule evaluations per second of the builtin pack (rules/builtin) on recorded
inputs, side by side for the two signals the engine reads at volume:

- ``step summaries``: the summaries the stream application computes (``streams.offline`` over
  bench/loadgen.py batches of 8 hosts, with a straggler every 10th step guilty of memory, CUDA or NIC
  time in turn (a third of the run each), so the straggler and layer rules really match and alerts go
  through their lifecycle);
- ``events``: every event of the same batches as the rule engine sees it (``rules.fields.event_record``).

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
from obshub import schema
from rules import fields
from rules.engine import Engine
from rules.loader import load_ruleset
from streams import offline, synthetic

BUILTIN = Path(__file__).resolve().parent.parent / "rules" / "builtin"
HOSTS, STEPS, ROUNDS = 8, 300, 5
QUICK_STEPS = 30
GUILTY_EVERY = 10
GUILTY_LAYERS = ("memory", "cuda", "nic")   # layers whose events the builtin pack's event rules read


def record_inputs(path: Path, hosts: int, steps: int) -> dict:
    """Write ``{"signal", "record"}`` lines for the summaries and events of a synthetic run to ``path``.
    Returns counts per signal."""
    third = max(1, steps // len(GUILTY_LAYERS))
    batches, step_ms = [], 0.0
    for i, layer in enumerate(GUILTY_LAYERS):   # one job per guilty layer, so each has its own baseline
        load = loadgen.build(hosts, third, job=f"bench-{layer}",
                             guilty_steps=tuple(range(3, third, GUILTY_EVERY)), guilty_layer=layer)
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


def load_inputs(path: Path) -> dict[str, list[dict]]:
    """The recorded records grouped by signal, in file order."""
    out: dict[str, list[dict]] = {"steps": [], "events": []}
    with path.open() as f:
        for line in f:
            d = json.loads(line)
            out[d["signal"]].append(d["record"])
    return out


def evaluations(ruleset, signal: str, records: list[dict]) -> int:
    """Rule evaluations one pass over ``records`` makes: per record, the rules that read it."""
    return sum(sum(1 for r in ruleset.rules.values() if r.reads(signal, rec.get("kind") if signal == "events" else None))
               for rec in records)


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
    evals = {sig: evaluations(ruleset, sig, recs) for sig, recs in inputs.items()}
    common.console.print(f"[dim]  recorded {counts['steps']:,} step summaries and {counts['events']:,} events "
                         f"({size / 1e6:.1f} MB JSON lines); {len(ruleset.rules)} builtin rules; "
                         f"{evals['steps']:,} and {evals['events']:,} rule evaluations per pass[/dim]")
    changes: dict[str, list[int]] = {"steps": [], "events": []}
    secs = common.interleave({f"{sig}": (lambda sig=sig: one_pass(ruleset, sig, inputs[sig], changes[sig]))
                              for sig in ("steps", "events")}, rounds)
    ev_rate = {f"{k} (evaluations/s)": common.Series(f"{k}: rule evaluations/s", [evals[k] / s for s in v.samples])
               for k, v in secs.items()}
    rec_rate = {f"{k} (records/s)": common.Series(f"{k}: records/s", [len(inputs[k]) / s for s in v.samples])
                for k, v in secs.items()}
    common.console.print(common.table(f"builtin rule pack, {rounds} interleaved passes per signal",
                                      {**ev_rate, **rec_rate}, "per s", lower_is_better=False, fmt="{:,.0f}"))
    common.console.print(f"alert state changes per pass: steps {changes['steps'][:1]}, events {changes['events'][:1]}")
    result = {"rounds": rounds, "steps": steps, "counts": counts, "evaluations_per_pass": evals,
              "rules": sorted(ruleset.rules), "seconds": {k: v.samples for k, v in secs.items()},
              "evaluations_per_s": {k: v.median for k, v in ev_rate.items()},
              "records_per_s": {k: v.median for k, v in rec_rate.items()}, "alert_changes": changes,
              "rev": common.git_rev()}
    common.console.print(f"raw results: {common.save('rules_throughput', result)}")
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m bench.rules_throughput [--quick] [--rounds N]``."""
    p = argparse.ArgumentParser(prog="python -m bench.rules_throughput", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: 30 steps, 1 round")
    p.add_argument("--rounds", type=int, default=None, help=f"interleaved passes (default {ROUNDS})")
    a = p.parse_args(argv)
    run(a.quick, a.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
