"""The builtin rule pack on the width benchmark's own step summaries, outside the pipeline: the
summaries of one ``bench.fleet`` job (64 events per host-step, one batch per host-step, the sched
straggler ``node2`` from step 10 on), joined and summarised offline (``streams.offline``), then fed in
step order to one ``rules.engine.Engine`` with the builtin pack. Prints the CPU time
(``time.process_time``) of ``Engine.process`` + ``tick`` per summary, its JSON size and whether it names
the straggler, and the alerts that fired. What ``bench.width`` cannot time when its engine falls behind.

    python -m bench.rules_fleet --hosts 2048 --steps 16
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench import fleet
from obshub.core import schema
from rules import fields
from rules.engine import Engine
from rules.loader import load_ruleset
from streams import offline

BUILTIN = Path(__file__).resolve().parent.parent / "rules" / "builtin"


def run(hosts: int, steps: int) -> list[dict]:
    """One row per summary: ``step``, ``straggler``, ``ms`` (CPU of the pack), ``kb`` (compact JSON)."""
    shape = fleet.Shape(hosts, steps, guilty_from=10)
    f = fleet.Fleet(shape, time.time_ns() - (steps + 10) * 10**9)
    batches = [schema.decode_batch(v) for _k, v in f.register_messages()]
    batches += [schema.decode_batch(v) for st in f.encode_all() for _d, msgs, _n in st for _k, v in msgs]
    summaries = offline.summarize_batches(batches)
    changes: list[dict] = []
    eng = Engine(load_ruleset([BUILTIN]), changes.append)
    rows = []
    for key in sorted(summaries, key=lambda k: k[1]):
        s = dict(summaries[key])
        s["closed_at_ns"] = f.start_ns + (key[1] + 1) * 10**9
        rec = fields.step_record(s)
        c0 = time.process_time()
        eng.process("steps", rec)
        eng.tick(rec["time_ns"])
        rows.append(
            {
                "step": key[1],
                "straggler": (s.get("straggler") or {}).get("host"),
                "ms": (time.process_time() - c0) * 1e3,
                "kb": len(json.dumps(summaries[key], separators=(",", ":")).encode()) / 1e3,
            }
        )
    fired = sorted({(c["rule"], c["labels"].get("host", "")) for c in changes if c["status"] == "firing"})
    for r in rows:
        print(f"step {r['step']:3d}  straggler {r['straggler'] or '-':6s}  {r['ms']:7.1f} ms  {r['kb']:6.0f} kB")
    print("fired:", ", ".join(f"{a} {h}" for a, h in fired) or "nothing")
    return rows


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m bench.rules_fleet", description=__doc__)
    p.add_argument("--hosts", type=int, default=2048)
    p.add_argument("--steps", type=int, default=16)
    a = p.parse_args(argv)
    run(a.hosts, a.steps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
