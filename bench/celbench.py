"""Measure the two maintained Python CEL implementations on the builtin pack's expressions:
``common-expression-language`` (module ``cel``, Rust) and ``cel-python`` (module ``celpy``, pure Python).

For every expression of the builtin pack (conditions, group_by, threshold ``of``, correlation keys,
after macro/list expansion) it times compile, and evaluation on one representative record of the
expression's signal. Prints a table and the totals; used for docs/RULES.md.

    python -m bench.celbench            # default: 2000 evaluations per expression
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import cel
import celpy

from obshub.rules import fields
from obshub.rules.loader import load_ruleset
from obshub.rules.testing import BASE_NS

N_EVAL = 2000
BUILTIN = Path(__file__).resolve().parent.parent / "obshub" / "rules" / "builtin"

STEP = fields.step_record(
    {
        "job": "llm",
        "step": 7,
        "stall": True,
        "stall_ratio": 2.5,
        "closed_at_ns": BASE_NS,
        "straggler": {"host": "node2", "score": 3.0, "excess_ns": 150_000_000, "reason": "slow"},
        "blame": [
            {
                "host": "node2",
                "layer": "sched",
                "excess_ns": 8e7,
                "straggler_ns": 9e7,
                "peer_median_ns": 1e7,
                "count": 4,
                "max_ns": 9e6,
            }
        ],
        "collectives": [
            {
                "pg": "0",
                "coll_seq": 1,
                "op": "all_reduce",
                "skew_ns": 80_000_000,
                "uncertainty_ns": 1,
                "last_host": "node5",
            }
        ],
        "missing_hosts": ["node3"],
        "quality": {"lost_batches": 1, "ringbuf_lost": 3},
    }
)
EVENT = fields.event_record_from_test(
    {
        "kind": "RDMA_CQ_DONE",
        "job": "llm",
        "host": "node2",
        "step": 7,
        "duration_ns": 45000,
        "payload": {"qp": 1, "status": 0, "dev": "x", "severity": 2, "probe": "p"},
    }
)
HEALTH = fields.health_record("obshub.steps.v1", "g", 5, 1.0, 10.0, BASE_NS)
RECORDS = {"steps": STEP, "events": EVENT, "health": HEALTH}


def expressions() -> list[tuple[str, str, str]]:
    """(rule id, signal, expanded source) of every expression in the builtin pack."""
    out = []
    for r in load_ruleset([BUILTIN]).rules.values():
        exprs = (
            [r.condition] + list(r.group_by.values()) + ([r.of] if r.of else []) + ([r.foreach] if r.foreach else [])
        )
        out += [(r.id, r.signal, e.source) for e in exprs]
        if r.correlate:
            out += [(r.id, r.correlate.signal, r.correlate.condition.source)]
            out += [(r.id, r.signal, e.source) for e in r.correlate.this_keys.values()]
            out += [(r.id, r.correlate.signal, e.source) for e in r.correlate.other_keys.values()]
    return out


def _activation(signal: str, source: str) -> dict:
    rec = dict(RECORDS[signal])
    if "item" in source:
        rec["item"] = STEP["collectives"][0] if "skew" in source or "last_host" in source else "node3"
    return rec


def bench(n_eval: int = N_EVAL) -> dict[str, dict[str, float]]:
    """Total compile seconds and mean eval µs per implementation over the pack's expressions."""
    env = celpy.Environment()
    totals = {
        "cel (Rust)": {"compile_s": 0.0, "eval_us": 0.0, "errors": 0},
        "celpy": {"compile_s": 0.0, "eval_us": 0.0, "errors": 0},
    }
    exprs = expressions()
    for _rid, signal, src in exprs:
        act = _activation(signal, src)
        t0 = time.perf_counter()
        prog = cel.compile(src)
        totals["cel (Rust)"]["compile_s"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(n_eval):
            try:
                prog.execute(act)
            except Exception:
                totals["cel (Rust)"]["errors"] += 1
        totals["cel (Rust)"]["eval_us"] += (time.perf_counter() - t0) / n_eval * 1e6
        t0 = time.perf_counter()
        pprog = env.program(env.compile(src))
        totals["celpy"]["compile_s"] += time.perf_counter() - t0
        pact = celpy.json_to_cel(act)
        n_py = max(1, n_eval // 20)
        t0 = time.perf_counter()
        for _ in range(n_py):
            try:
                pprog.evaluate(pact)
            except Exception:
                totals["celpy"]["errors"] += 1
        totals["celpy"]["eval_us"] += (time.perf_counter() - t0) / n_py * 1e6
    for t in totals.values():
        t["eval_us"] /= len(exprs)
    totals["cel (Rust), one Context per record"] = _shared_context(exprs, n_eval)
    totals["_n"] = {"expressions": len(exprs)}
    return totals


def _shared_context(exprs: list[tuple[str, str, str]], n_eval: int) -> dict[str, float]:
    """What the engine does: convert each record once (``expr.Activation``) and evaluate every expression
    of its signal on it. Reports the mean per expression, conversion included."""
    from obshub.rules.expr import Activation

    progs: dict[str, list] = {}
    for _rid, signal, src in exprs:
        if "item" not in src:
            progs.setdefault(signal, []).append(cel.compile(src))
    total_us, count, errors = 0.0, 0, 0
    for signal, plist in progs.items():
        t0 = time.perf_counter()
        for _ in range(n_eval):
            act = Activation(RECORDS[signal])
            for p in plist:
                try:
                    p.execute(act.ctx)
                except Exception:
                    errors += 1
        total_us += (time.perf_counter() - t0) * 1e6
        count += n_eval * len(plist)
    return {"compile_s": 0.0, "eval_us": total_us / count, "errors": errors}


def main(argv: list[str] | None = None) -> None:
    n = int((argv or sys.argv[1:] or [N_EVAL])[0])
    res = bench(n)
    print(f"{res.pop('_n')['expressions']} expressions of the builtin pack; {n} evaluations each (celpy: n/20)")
    print(f"{'implementation':36} {'compile all (ms)':>18} {'mean eval (µs)':>16} {'eval errors':>12}")
    for name, t in res.items():
        print(f"{name:36} {t['compile_s'] * 1e3:18.2f} {t['eval_us']:16.2f} {int(t['errors']):12d}")


if __name__ == "__main__":
    main()
