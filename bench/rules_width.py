"""Rule engine cost per step summary as jobs grow wide: the builtin pack (obshub/rules/builtin) on the step
summaries of one job of 8, 128, 512 and 2,048 hosts, side by side with ``streams.analysis.summarize`` of
the same step (the floor: the analysis that produced the summary), with the growth exponent of each.

Inputs: ``bench.loadgen`` batches of one job (64 events per host and step, every step's straggler
guilty of CPU scheduling; the table shows which alerts the pack fired), joined
per host like the stream worker does (``streams.accumulate``) and summarised by ``streams.analysis``.
``REAL_STEPS`` real steps are built; the summaries are then repeated with shifted step numbers and 1 s
apart (a job at 1 s steps) to ``STEADY_STEPS`` summaries, so every window of the pack (20 s) is full and
the measurement sees the steady state, not a cold start.

Measured per width, in CPU time of this process (``time.process_time``): one ``Engine.process`` of each
summary after the first ``WARM`` ones (the median over the rest), and ``summarize`` of the last real
step (median of ``SUMMARIZE_REPEATS`` calls). Also the summary's JSON size and the RSS growth of the
engine over the run. The growth exponent is the least-squares slope of log(cost) over log(hosts):
1 = linear, 2 = quadratic.

    python -m bench.rules_width                    # 8, 128, 512, 2,048 hosts
    python -m bench.rules_width --quick            # 8, 128, 512 hosts, fewer steps
    python -m bench.rules_width --hosts 8 128      # chosen widths
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import time
from pathlib import Path

from bench import common, loadgen
from obshub.core import schema
from obshub.rules import fields
from obshub.rules.engine import Engine
from obshub.rules.loader import load_ruleset
from obshub.streams import accumulate, analysis, synthetic

BUILTIN = Path(__file__).resolve().parent.parent / "obshub" / "rules" / "builtin"
WIDTHS = (8, 128, 512, 2048)
QUICK_WIDTHS = (8, 128, 512)
SMOKE_WIDTHS = (8, 32)  # what ``python -m bench rules_throughput --quick`` runs
REAL_STEPS = 4  # real steps built per width (the loadgen's first steps have no baseline)
STEADY_STEPS = 40  # summaries fed to the engine (window 20 s at 1 s steps: the last 20 are steady)
QUICK_STEADY_STEPS = 26
WARM = 20  # summaries not measured (windows filling)
STEP_NS = 1_000_000_000  # a job at 1 s steps
SUMMARIZE_REPEATS = 5
TARGET_MS_2048 = 50.0  # the pack's CPU per step summary at 2,048 hosts


def build(hosts: int, steps: int = REAL_STEPS) -> tuple[list[dict], dict, list[str], list[list[int]]]:
    """The step summaries of one ``hosts``-host job (every step guilty of sched on the straggler), plus
    the host accumulators, expected hosts and baseline history of its last step (for ``summarize``)."""
    load = loadgen.build(hosts, steps, job=f"wide-{hosts}", guilty_steps=tuple(range(steps)))
    per_step: dict[int, dict[str, dict]] = {}
    expected: set[str] = set()
    for _key, value in load.messages:
        b = schema.decode_batch(value)
        expected.add(b.host)
        for step, part in accumulate.reduce_batch(b).items():
            accs = per_step.setdefault(step, {})
            if b.host in accs:
                accumulate.merge(accs[b.host], part)
            else:
                accs[b.host] = part
    summaries, history = [], []
    for step in sorted(per_step):
        s = analysis.summarize(
            load.job,
            step,
            per_step[step],
            expected_hosts=sorted(expected),
            history=list(history),
            quality={},
            closed_by="complete",
            closed_at_ns=0,
        )
        summaries.append(s)
        last_history = list(history)
        history.append([step, s["step_time_max_ns"]])
    last = max(per_step)
    return summaries, per_step[last], sorted(expected), last_history


def steady(summaries: list[dict], n: int) -> list[dict]:
    """``n`` rule records: the real summaries repeated in order, step numbers continuing and closed 1 s
    apart (``time_ns``)."""
    start = synthetic.Scenario().start_ns
    out = []
    for i in range(n):
        s = dict(summaries[i % len(summaries)])
        s["step"], s["closed_at_ns"] = i, start + (i + 1) * STEP_NS
        out.append(fields.step_record(s))
    return out


def _rss_mb() -> float:
    try:
        for ln in Path("/proc/self/status").read_text().splitlines():
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(hosts: int, ruleset, steady_steps: int) -> dict:
    """Per-summary CPU of the pack and of ``summarize`` at one width (see the module docstring)."""
    summaries, accs, expected, history = build(hosts)
    records = steady(summaries, steady_steps)
    changes: list[dict] = []
    eng = Engine(ruleset, changes.append)
    rss0 = _rss_mb()
    per = []
    for i, rec in enumerate(records):
        c0 = time.process_time()
        eng.process("steps", rec)
        eng.tick(rec["time_ns"])
        if i >= min(WARM, steady_steps - 1):
            per.append(time.process_time() - c0)
    rss1 = _rss_mb()
    summ = []
    for _ in range(SUMMARIZE_REPEATS):
        c0 = time.process_time()
        analysis.summarize(
            summaries[-1]["job"],
            summaries[-1]["step"],
            accs,
            expected_hosts=expected,
            history=history,
            quality={},
            closed_by="complete",
            closed_at_ns=0,
        )
        summ.append(time.process_time() - c0)
    fired = sorted({(c["rule"], c["labels"].get("host", "")) for c in changes if c["status"] == "firing"})
    return {
        "hosts": hosts,
        "rules_ms": statistics.median(per) * 1e3,
        "rules_ms_min": min(per) * 1e3,
        "rules_ms_max": max(per) * 1e3,
        "samples": len(per),
        "summarize_ms": statistics.median(summ) * 1e3,
        "summary_kb": len(json.dumps(summaries[-1]).encode()) / 1e3,
        "rss_growth_mb": rss1 - rss0,
        "fired": [f"{r} {h}" for r, h in fired],
        "eval_errors": eng.eval_errors,
    }


def exponent(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of log(y) over log(x): the growth exponent (nan with fewer than 2 points)."""
    pts = [(math.log(x), math.log(y)) for x, y in points if x > 0 and y > 0]
    if len(pts) < 2:
        return float("nan")
    mx, my = statistics.fmean(p[0] for p in pts), statistics.fmean(p[1] for p in pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / den if den else float("nan")


def run(quick: bool = False, rounds: int | None = None, widths: tuple[int, ...] | None = None) -> dict:
    """Run the benchmark, print the table and verdict, save the JSON. ``rounds`` is accepted for
    ``python -m bench`` and ignored (each width is one run of ``STEADY_STEPS`` summaries)."""
    from rich.table import Table

    widths = tuple(widths or (QUICK_WIDTHS if quick else WIDTHS))
    steady_steps = QUICK_STEADY_STEPS if quick else STEADY_STEPS
    common.console.rule("[bold]rule engine at width[/bold]: builtin pack per step summary vs summarize")
    ruleset = load_ruleset([BUILTIN])
    rows = []
    for h in widths:
        common.console.print(f"[dim]  {h} hosts: building {REAL_STEPS} steps, feeding {steady_steps} summaries[/dim]")
        rows.append(measure(h, ruleset, steady_steps))
    t = Table(
        title=f"builtin rule pack ({len(ruleset.rules)} rules) per step summary, CPU ms (median of "
        f"{rows[0]['samples']} steady-state summaries)",
        caption=common.describe_machine(),
    )
    for col in (
        "hosts",
        "rule pack ms",
        "min .. max",
        "summarize ms",
        "ratio pack/summarize",
        "summary KB",
        "RSS growth MB",
        "alerts fired",
    ):
        t.add_column(col)
    for r in rows:
        t.add_row(
            f"{r['hosts']:,}",
            f"{r['rules_ms']:.2f}",
            f"{r['rules_ms_min']:.2f} .. {r['rules_ms_max']:.2f}",
            f"{r['summarize_ms']:.2f}",
            f"{r['rules_ms'] / r['summarize_ms']:.2f}" if r["summarize_ms"] else "-",
            f"{r['summary_kb']:.0f}",
            f"{r['rss_growth_mb']:.1f}",
            "; ".join(r["fired"]) or "none",
        )
    common.console.print(t)
    exp_rules = exponent([(r["hosts"], r["rules_ms"]) for r in rows])
    exp_summ = exponent([(r["hosts"], r["summarize_ms"]) for r in rows])
    common.console.print(
        f"growth exponent over {', '.join(str(r['hosts']) for r in rows)} hosts: rule pack "
        f"{exp_rules:.2f}, summarize {exp_summ:.2f} (1 = linear, 2 = quadratic)"
    )
    widest = rows[-1]
    if widest["hosts"] >= 2048:
        common.verdict(
            f"rule pack at {widest['hosts']:,} hosts <= {TARGET_MS_2048:.0f} ms CPU per step summary",
            widest["rules_ms"] <= TARGET_MS_2048,
            f"{widest['rules_ms']:.1f} ms",
        )
    result = {
        "widths": list(widths),
        "steady_steps": steady_steps,
        "rows": rows,
        "exponent_rules": exp_rules,
        "exponent_summarize": exp_summ,
        "rev": common.git_rev(),
    }
    common.console.print(f"raw results: {common.save('rules_width', result)}")
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m bench.rules_width [--quick] [--hosts N ...]``."""
    p = argparse.ArgumentParser(
        prog="python -m bench.rules_width", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: {', '.join(map(str, QUICK_WIDTHS))} hosts, {QUICK_STEADY_STEPS} summaries each",
    )
    p.add_argument(
        "--hosts", type=int, nargs="+", metavar="N", help=f"widths to measure (default: {', '.join(map(str, WIDTHS))})"
    )
    a = p.parse_args(argv)
    if a.hosts and min(a.hosts) < 2:
        p.error("--hosts: a job needs at least 2 hosts")
    run(a.quick, widths=tuple(sorted(a.hosts)) if a.hosts else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
