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
    python -m bench.rules_width --per-rule         # every rule alone and the pack, clean and slow steps,
                                                   # 128 / 1,024 / 2,048 hosts (``slow_case``, ``rule_costs``)
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bench import common, loadgen
from obshub.core import schema
from obshub.rules import fields
from obshub.rules.engine import Engine
from obshub.rules.loader import load_ruleset
from obshub.rules.model import RuleSet
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
TARGET_MS_2048 = 50.0
PER_RULE_WIDTHS = (128, 1024, 2048)
PACK = "(pack)"  # the whole builtin pack in ``rule_costs``'s rows  # the pack's CPU per step summary at 2,048 hosts


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


@dataclass
class SlowCase:
    """One wide job's step summaries as rules see them, built by the real analysis (``slow_case``):
    ``clean`` and ``slow`` records of the same step number (the slow one with a sched straggler at least
    ``net_stall_min`` times the baseline median and network evidence), and ``summarize()``, which
    recomputes the slow summary from its accumulators (the floor every rule is measured against)."""

    hosts: int
    clean: dict
    slow: dict
    summarize: Callable[[], dict]


def slow_case(hosts: int, *, ring_evidence: bool = True, extra_ms: float = 150.0) -> SlowCase:
    """A slow wide step after the job's baseline exists, from ``streams.synthetic`` events joined per host
    (``streams.accumulate``) and summarised by ``streams.analysis.summarize``: 4 clean steps, their
    summaries cycled into 12 entries of history (the baseline: ``baseline_min_n`` = 10), then the step
    in which host ``node2`` spends ``extra_ms`` more in CPU scheduling (stall ratio ~3: a *slowed* step
    for ``network_loss_in_slow_steps``). The analysis gives the straggler, blame and per-host evidence;
    network evidence is then put on the straggler (4.0, the other layers 0, as the analysis files a
    host whose connections explain it) and, with ``ring_evidence``, on every other host (0.001-1.0,
    distinct per host, the whole ring retransmitting): the widest ``evidence.hosts`` a step can carry,
    every host holding network evidence and its own entry, so no per-host shortcut shares work between
    hosts. Records are ``fields.step_record``s 1 s apart at the same step number."""
    scn = synthetic.Scenario(
        job=f"slow-{hosts}",
        hosts=hosts,
        steps=5,
        straggler=min(2, hosts - 1),
        guilty_steps=(4,),
        guilty_layer="sched",
        extra_ms=extra_ms,
    )
    per_step: dict[int, dict[str, dict]] = {}
    for _key, b in synthetic.generate(scn):
        for step, part in accumulate.reduce_batch(b).items():
            accs = per_step.setdefault(step, {})
            if b.host in accs:
                accumulate.merge(accs[b.host], part)
            else:
                accs[b.host] = part
    expected = sorted({scn.host_name(i) for i in range(hosts)})

    def summarize(step: int, history: list[list[int]]) -> dict:
        return analysis.summarize(
            scn.job,
            step,
            per_step[step],
            expected_hosts=expected,
            history=history,
            quality={},
            closed_by="complete",
            closed_at_ns=0,
        )

    clean = [summarize(st, []) for st in range(4)]
    # 12 entries of history below each step number (the analysis reads the entries before its step)
    clean_hist = [[i - 12, *analysis.history_entry(clean[i % 4])[1:]] for i in range(12)]
    slow_hist = [[i - 8, *h[1:]] for i, h in enumerate(clean_hist)]
    at = 20  # the step number both records carry
    clean_rec = summarize(0, clean_hist) | {"step": at}
    slow_sum = summarize(4, slow_hist) | {"step": at}
    ev = slow_sum["evidence"]
    hosts_ev = dict(ev["hosts"])
    if ring_evidence:
        for i, h in enumerate(expected):
            zero = dict.fromkeys(("sched", "memory", "cuda", "nic", "network", "pytorch"), 0.0)
            hosts_ev[h] = {**zero, "network": round(0.001 + (i * 7919 % 1000) / 1000, 3)}
    strag = slow_sum["straggler"]["host"]
    hosts_ev[strag] = {**dict.fromkeys(("sched", "memory", "cuda", "nic", "pytorch"), 0.0), "network": 4.0}
    slow_sum["evidence"] = {**ev, "hosts": dict(sorted(hosts_ev.items()))}
    start = synthetic.Scenario().start_ns
    return SlowCase(
        hosts,
        fields.step_record({**clean_rec, "closed_at_ns": start}),
        fields.step_record({**slow_sum, "closed_at_ns": start}),
        lambda: summarize(4, slow_hist),
    )


def _timed(fn: Callable[[], object], repeats: int) -> float:
    """Median CPU ms (``time.process_time``) of ``repeats`` calls of ``fn``."""
    out = []
    for _ in range(repeats):
        c0 = time.process_time()
        fn()
        out.append(time.process_time() - c0)
    return statistics.median(out) * 1e3


def rule_costs(case: SlowCase, ruleset: RuleSet, *, warm: int = 3, repeats: int = 5) -> dict:
    """CPU ms per record of every rule of ``ruleset`` alone (an engine holding only it) and of the whole
    pack, on the clean and on the slow record of ``case``, side by side with ``case.summarize()`` in the
    same process: ``{"summarize_ms": m, "rules": {rule id or "(pack)": {"clean": ms, "slow": ms}}, "fired":
    {rule id or "(pack)": [(rule, host), ...]}}`` (``fired``: the alerts that reached firing).
    Each engine first takes ``warm`` clean records 1 s apart (its groups and windows exist, as in a
    running job), then ``repeats`` clean and ``repeats`` slow records, 1 s apart, each timed alone
    (``Engine.process`` + ``tick``; the median is reported). The slow records fire what they fire: the
    rendering of annotations is part of a firing step's cost."""
    sets = {rid: RuleSet({rid: r}, [], ruleset.files) for rid, r in ruleset.rules.items()}
    sets[PACK] = ruleset
    out: dict = {"summarize_ms": _timed(case.summarize, repeats), "rules": {}, "fired": {}}
    for name, rs in sets.items():
        changes: list[dict] = []
        eng = Engine(rs, changes.append)
        t = case.clean["time_ns"]
        row = {}
        for phase, n in (("warm", warm), ("clean", repeats), ("slow", repeats)):
            rec0 = case.slow if phase == "slow" else case.clean
            samples = []
            for _ in range(n):
                t += STEP_NS
                rec = {**rec0, "time_ns": t, "closed_at_ns": t}
                c0 = time.process_time()
                eng.process("steps", rec)
                eng.tick(t)
                samples.append(time.process_time() - c0)
            if phase != "warm":
                row[phase] = statistics.median(samples) * 1e3
        out["rules"][name] = row
        out["fired"][name] = sorted(
            {(c["rule"], c["labels"].get("host", "")) for c in changes if c["status"] == "firing"}
        )
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


def run_per_rule(widths: tuple[int, ...] = PER_RULE_WIDTHS, repeats: int = 5) -> dict:
    """Every builtin rule alone and the whole pack on the clean and the slow step of ``slow_case`` at each
    width (``rule_costs``), side by side with ``summarize`` of the slow step: print the table (CPU ms, and
    the slow step's cost as a multiple of ``summarize``), save the JSON."""
    from rich.table import Table

    ruleset = load_ruleset([BUILTIN])
    common.console.rule("[bold]rule engine at width, per rule[/bold]: clean and slow steps after the baseline")
    got = {}
    for h in widths:
        common.console.print(f"[dim]  {h} hosts: building the clean and the slow step[/dim]")
        got[h] = rule_costs(slow_case(h), ruleset, repeats=repeats)
    t = Table(
        title="CPU ms per step summary (median of "
        f"{repeats}): clean / slow step, and slow as a multiple of summarize of the same step",
        caption=common.describe_machine(),
    )
    t.add_column("rule")
    for h in widths:
        t.add_column(f"{h:,} hosts: clean / slow", justify="right")
        t.add_column("x summ.", justify="right")
    names = [n for n in got[widths[0]]["rules"] if n != PACK] + [PACK]
    for n in names:
        cells = []
        for h in widths:
            r, floor = got[h]["rules"][n], got[h]["summarize_ms"]
            cells += [f"{r['clean']:.2f} / {r['slow']:.2f}", f"{r['slow'] / floor:.2f}" if floor else "-"]
        t.add_row(n, *cells)
    t.add_row("summarize (slow step)", *[c for h in widths for c in (f"{got[h]['summarize_ms']:.2f}", "1.00")])
    common.console.print(t)
    for h in widths:
        fired = got[h]["fired"][PACK]
        common.console.print(f"{h:,} hosts, pack fired: " + ("; ".join(f"{r} {x}" for r, x in fired) or "none"))
    worst = max(
        ((n, h, got[h]["rules"][n]["slow"] / got[h]["summarize_ms"]) for h in widths for n in names if n != PACK),
        key=lambda x: x[2],
    )
    common.console.print(f"costliest rule: {worst[0]} at {worst[1]:,} hosts, x{worst[2]:.2f} summarize")
    result = {"widths": list(widths), "per_rule": {str(h): got[h] for h in widths}, "rev": common.git_rev()}
    common.console.print(f"raw results: {common.save('rules_width_per_rule', result)}")
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
    p.add_argument(
        "--per-rule",
        action="store_true",
        help="every rule alone and the pack on a clean and a slow step (straggler, baseline, network "
        f"evidence) vs summarize (default widths {', '.join(map(str, PER_RULE_WIDTHS))})",
    )
    a = p.parse_args(argv)
    if a.hosts and min(a.hosts) < 2:
        p.error("--hosts: a job needs at least 2 hosts")
    if a.per_rule:
        if a.hosts and min(a.hosts) < 3:
            p.error("--hosts: --per-rule needs at least 3 hosts (its straggler is node2)")
        run_per_rule(tuple(sorted(a.hosts)) if a.hosts else PER_RULE_WIDTHS)
        return 0
    run(a.quick, widths=tuple(sorted(a.hosts)) if a.hosts else None)
    return common.exit_code(a.quick)


if __name__ == "__main__":
    raise SystemExit(main())
