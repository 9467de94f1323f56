"""The builtin rule pack on the width benchmark's own step summaries, outside the pipeline: the
summaries of one ``bench.fleet`` job (64 events per host-step, one batch per host-step, the sched
straggler ``node2`` from step 10 on), joined and summarised offline (``streams.offline``), kept as the
JSON the stream app publishes, then fed in step order to one ``rules.engine.Engine`` with the builtin
pack, as ``obshub rules serve`` runs it (the heap frozen after start-up, ``rules.engine.freeze_heap``;
nothing else of the benchmark alive). Prints per summary the CPU time (``time.process_time``) of
``intake.decode_step`` (JSON -> record) and of ``Engine.process`` + ``tick`` (the pack), its JSON size and
whether it names the straggler, the alerts that fired, and the largest pack time against the 50 ms target.
What ``bench.width`` cannot time when its engine falls behind.

``--events``: also the engine's CPU per step for the events topic, side by side in one run, on the
job's batches of one clean and one slow step (2,048 batches each at 2,048 hosts): *every event
decoded* (what the engine did before it filtered by kind: ``schema.decode_batch``, one
``fields.event_record`` per event, each record through ``Engine.process``, which skips it by kind),
*every kind, msgspec* (``intake.decode_event_batch`` with ``kinds=None``: what a pack with a rule
reading every kind costs), and *the pack's kinds* (``intake.decode_event_batch`` with
``intake.event_kinds`` of the builtin pack: what the engine does; batches without a read kind are
skipped whole). Median of ``--rounds`` interleaved rounds.

    python -m bench.rules_fleet --hosts 2048 --steps 16
    python -m bench.rules_fleet --hosts 2048 --steps 16 --events
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

from bench import common, fleet
from obshub.core import schema
from obshub.rules import fields, intake
from obshub.rules.engine import Engine, freeze_heap
from obshub.rules.loader import load_ruleset
from obshub.streams import offline

BUILTIN = Path(__file__).resolve().parent.parent / "obshub" / "rules" / "builtin"
TARGET_MS = 50.0  # the rule pack's CPU per step summary at 2,048 hosts (docs/BENCHMARKS.md, 7 width)


def _inputs(hosts: int, steps: int, events: bool) -> tuple[list[bytes], dict[str, list[bytes]]]:
    """The job's step summaries as JSON (``closed_at_ns`` 1 s apart), and for ``events`` the event
    batches of step 1 (clean) and step 10 (the first slow one)."""
    shape = fleet.Shape(hosts, steps, guilty_from=10)
    f = fleet.Fleet(shape, time.time_ns() - (steps + 10) * 10**9)
    encoded = f.encode_all()
    batches = [schema.decode_batch(v) for _k, v in f.register_messages()]
    batches += [schema.decode_batch(v) for st in encoded for _d, msgs, _n in st for _k, v in msgs]
    raw_events = {}
    if events:
        for name, s in (("clean", 1), ("slow", min(10, steps - 1))):
            raw_events[name] = [v for _d, msgs, _n in encoded[s] for _k, v in msgs]
    summaries = offline.summarize_batches(batches)
    out = []
    for key in sorted(summaries, key=lambda k: k[1]):
        s = dict(summaries[key])
        s["closed_at_ns"] = f.start_ns + (key[1] + 1) * 10**9
        out.append(json.dumps(s, separators=(",", ":")).encode())
    return out, raw_events


def run(hosts: int, steps: int, events: bool = False, rounds: int = 3) -> dict:
    """One row per summary: ``step``, ``straggler``, ``decode_ms``, ``ms`` (CPU of the pack), ``kb``
    (compact JSON); with ``events`` also ``events`` (CPU ms per step of each way of reading the events)."""
    raws, raw_events = _inputs(hosts, steps, events)
    gc.collect()
    changes: list[dict] = []
    ruleset = load_ruleset([BUILTIN])
    eng = Engine(ruleset, changes.append)
    freeze_heap()  # as `obshub rules serve` does once its rules and state are loaded
    rows = []
    for raw in raws:
        c0 = time.process_time()
        rec = intake.decode_step(raw)
        c1 = time.process_time()
        eng.process("steps", rec)
        eng.tick(rec["time_ns"])
        c2 = time.process_time()
        rows.append(
            {
                "step": rec["step"],
                "straggler": (rec.get("straggler") or {}).get("host"),
                "decode_ms": (c1 - c0) * 1e3,
                "ms": (c2 - c1) * 1e3,
                "kb": len(raw) / 1e3,
            }
        )
    fired = sorted({(c["rule"], c["labels"].get("host", "")) for c in changes if c["status"] == "firing"})
    for r in rows:
        print(
            f"step {r['step']:3d}  straggler {r['straggler'] or '-':6s}  pack {r['ms']:7.1f} ms  "
            f"(decode {r['decode_ms']:5.1f} ms)  {r['kb']:6.0f} kB"
        )
    print("fired:", ", ".join(f"{a} {h}" for a, h in fired) or "nothing")
    worst = max(rows, key=lambda r: r["ms"])
    slow = [r["ms"] for r in rows if r["straggler"]]
    clean = [r["ms"] for r in rows if not r["straggler"]]
    print(
        f"pack per summary: clean median {statistics.median(clean) if clean else float('nan'):.1f} ms, "
        f"slow median {statistics.median(slow) if slow else float('nan'):.1f} ms, "
        f"max {worst['ms']:.1f} ms (step {worst['step']}); target <= {TARGET_MS:.0f} ms on every step: "
        + ("met" if worst["ms"] <= TARGET_MS else "NOT met")
    )
    result: dict = {"hosts": hosts, "rows": rows, "fired": fired}
    if events:
        result["events"] = _events(ruleset, raw_events, rounds)
    return result


def _every_event(ruleset, batches: list[bytes]) -> float:
    """CPU s: every event decoded and validated, one record each, each through ``Engine.process``."""
    eng = Engine(ruleset, lambda _c: None)
    c0 = time.process_time()
    for v in batches:
        b = schema.decode_batch(v)
        for i, ev in enumerate(b.events):
            rt = schema.to_realtime_ns(ev.ts_ns, b.clock)
            if not 0 <= rt <= schema.I64_MAX:
                raise schema.SchemaError(f"events[{i}].ts_ns", "outside")
            eng.process("events", fields.event_record(b, ev))
    return time.process_time() - c0


def _filtered(ruleset, batches: list[bytes], kinds: frozenset[int] | None) -> float:
    """CPU s: ``intake.decode_event_batch`` with ``kinds``, the records through ``Engine.process``."""
    eng = Engine(ruleset, lambda _c: None)
    c0 = time.process_time()
    for v in batches:
        for rec in intake.decode_event_batch(v, kinds).records:
            eng.process("events", rec)
    return time.process_time() - c0


def _events(ruleset, raw_events: dict[str, list[bytes]], rounds: int) -> dict:
    kinds = intake.event_kinds(ruleset)
    ways = {
        "every event decoded (before)": lambda bs: _every_event(ruleset, bs),
        "every kind, msgspec": lambda bs: _filtered(ruleset, bs, None),
        "the pack's kinds (now)": lambda bs: _filtered(ruleset, bs, kinds),
    }
    out: dict = {}
    for step, batches in raw_events.items():
        samples: dict[str, list[float]] = {w: [] for w in ways}
        for _ in range(rounds):
            for w, fn in ways.items():
                samples[w].append(fn(batches) * 1e3)
        n_events = sum(len(schema.decode_batch(v).events) for v in batches)
        print(f"events of one {step} step ({len(batches):,} batches, {n_events:,} events), CPU ms per step:")
        base = statistics.median(samples["every event decoded (before)"])
        for w, xs in samples.items():
            med = statistics.median(xs)
            print(f"  {w:32s} {med:8.1f} ms  (min {min(xs):.1f}, max {max(xs):.1f})  x{base / med:.1f} faster")
        out[step] = {w: statistics.median(xs) for w, xs in samples.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module docstring)."""
    p = argparse.ArgumentParser(
        prog="python -m bench.rules_fleet", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--hosts", type=int, default=2048)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--events", action="store_true", help="also time the events topic, side by side")
    p.add_argument("--rounds", type=common.positive_int, default=3, help="interleaved rounds of --events (median)")
    a = p.parse_args(argv)
    run(a.hosts, a.steps, a.events, a.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
