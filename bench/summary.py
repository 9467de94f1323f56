"""The targets at a glance, from the latest raw results (bench/results/*.json, or ``$OBSHUB_BENCH_RESULTS``):
one Markdown table (target, measured, met) for docs/BENCHMARKS.md, so the page states exactly what the
run measured.

    python -m bench.summary            # Markdown table on stdout
"""

from __future__ import annotations

import json
import statistics
import sys

from bench import common


def _load(name: str) -> dict:
    try:
        return json.loads((common.results_dir() / f"{name}.json").read_text())
    except (OSError, ValueError):
        return {}


def rows() -> list[tuple[str, str, str, str]]:
    """(benchmark, target, measured, met) for every target whose results exist."""
    out = []
    to = _load("training_overhead")
    if to and "ratios_vs_B" in to:
        r = to["ratios_vs_B"]
        c, u = r.get("C + agent (every probe)"), r.get("U + agent (USDT probes only)")

        def pct(x) -> str:
            return f"{(x[0] - 1) * 100:+.2f} % [{(x[1] - 1) * 100:+.2f}, {(x[2] - 1) * 100:+.2f}]"

        ev = (to.get("events_per_rank_step") or {}).get("C + agent (every probe)")
        out.append(
            (
                "1 training overhead",
                "agent CPU overhead, upper 95 % bound <= 1 %",
                f"every probe {pct(c['cpu'])}, USDT alone {pct(u['cpu']) if u else '-'} (ranks' + agent CPU per "
                f"step vs obshub run; wall {pct(c['wall'])}; {to['rounds']} rounds x {to['steps']} steps)"
                if c
                else "configuration C not run",
                "yes" if to.get("target_met") else "no",
            )
        )
        if ev is not None:
            out.append(
                (
                    "1 training overhead",
                    "<= 25 events per rank-step, every probe",
                    f"{ev:.1f} events per rank-step",
                    "yes" if ev <= 25 else "no",
                )
            )
    at = _load("agent_throughput")
    if at and "best_rate" in at:
        out.append(
            (
                "2 agent throughput",
                ">= 1,000,000 events/s per core without loss, <= 1 CPU s per M",
                f"{at['best_rate']:,.0f} events/s lossless, {at['cpu_s_per_M']:.2f} CPU s per million events; "
                f"lost at 2x: {at['lost_at_2x']:,} of {at['at_2x']['fired']:,}",
                "yes" if at.get("target_met") else "no",
            )
        )
    st = _load("stream_throughput")
    if st:
        s = {k: statistics.median(v) for k, v in st["samples"].items()}
        one, plain = s["faust, 1 worker"], s["plain confluent-kafka loop"]
        cpu = st.get("events_per_cpu_s", {})
        out.append(
            (
                "3 stream throughput",
                ">= 50,000 events/s per worker",
                f"1 worker {one:,.0f}/s, 2 workers {st['per_worker']['faust, 2 workers']:,.0f}/s each "
                f"({cpu.get('faust, 1 worker', float('nan')):,.0f} events per worker CPU-second)",
                "yes" if one >= st["targets"]["per_worker"] else "no",
            )
        )
        out.append(
            (
                "3 stream throughput",
                "within 3x of a plain confluent-kafka loop",
                f"plain loop {plain:,.0f}/s = {plain / one:.2f}x (per CPU-second: "
                f"{cpu.get('plain confluent-kafka loop', float('nan')) / cpu.get('faust, 1 worker', float('nan')):.2f}x)",
                "yes" if one * st["targets"]["vs_plain"] >= plain else "no",
            )
        )
    ru = _load("rules_throughput")
    if ru:
        rt = ru.get("rates", {})
        out.append(
            (
                "4 rule engine",
                "(no target) rule evaluations/s, builtin pack",
                f"step summaries {rt.get('step summaries: rule evaluations/s', 0):,.0f}/s "
                f"({rt.get('step summaries: records/s', 0):,.0f} summaries/s); events a rule reads "
                f"{rt.get('events a rule reads: rule evaluations/s', 0):,.0f}/s; kind filter "
                f"{rt.get('all events (most skipped by kind): records/s', 0):,.0f} events/s"
                + "".join(
                    f"; {k.split(':')[0]} {1 / v:.2f} s each"
                    for k, v in rt.items()
                    if k.startswith("step summaries of") and k.endswith("records/s") and v
                ),
                "-",
            )
        )
    td = _load("ttd")
    if td and "per_kind" in td and "clean" in td:
        parts = [
            f"{k} {v['named']}/{v['episodes']} named, {v['wrong']} wrong, median "
            + (f"{v['median_s']:.2f} s" if v["median_s"] is not None else "-")
            + " (worst "
            + (f"{v['worst_s']:.2f} s" if v["worst_s"] is not None else "missed")
            + ")"
            for k, v in td["per_kind"].items()
        ]
        c = td["clean"]
        parts.append(f"clean {c['seconds'] / 60:.1f} min: {len(c['alerts'])} alerts ({c['per_hour']:.1f}/h)")
        out.append(
            (
                "5 accuracy, time to detection",
                "every fault named right, no wrong alert, none on clean runs, median <= 3 s and worst <= 5 s per kind",
                f"{'; '.join(parts)}; {td['rounds']} round(s) x {td['hosts']} hosts",
                "yes" if td["target_met"] else "no",
            )
        )
    wd = _load("width")
    for row in wd.get("target_rows") or []:
        out.append(("7 width", row["target"], row["measured"], "yes" if row["met"] else "no"))
    sc = _load("scale")
    if sc:
        rep = sc["replay"]
        out.append(
            (
                "6 scale",
                "128 hosts at the real step rate: consumer lag bounded",
                f"{rep['events_per_s']:,.0f} events/s into {rep.get('workers', 1)} worker(s): max backlog "
                f"{rep['max_backlog_events']:,.0f} events (bound {rep['bound_events']:,.0f}), "
                f"{rep['summaries']:.0f}/{rep['steps']} steps summarised",
                "yes" if rep["bounded"] else "no",
            )
        )
    return out


def markdown() -> str:
    """The Markdown table."""
    lines = ["| benchmark | target | measured | met |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows()]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(markdown() + "\n")
