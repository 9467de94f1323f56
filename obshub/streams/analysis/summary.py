"""``summarize``: the per-host accumulators of one closed step -> the step summary (straggler, blame,
network blame, baseline, evidence), composed from the other modules of this package."""

from __future__ import annotations

from obshub.core import schema
from obshub.streams import compact
from obshub.streams.analysis.culprit import culprit
from obshub.streams.analysis.evidence import baseline, evidence
from obshub.streams.analysis.network import net_blame, net_stats
from obshub.streams.analysis.straggler import blame, collectives, find_straggler, lateness, layer_table
from obshub.streams.analysis.thresholds import Thresholds


def _with_net(entries: list[dict], accs: dict[str, dict], th: Thresholds, stats: tuple | None) -> list[dict]:
    """``entries`` plus the connection-based network blame, unless that host already has a network entry."""
    have = {(e["host"], e["layer"]) for e in entries}
    return entries + [e for e in net_blame(accs, th, stats=stats) if (e["host"], e["layer"]) not in have]


def summarize(
    job: str,
    step: int,
    accs: dict[str, dict],
    *,
    expected_hosts: list[str],
    history: list[list[int]],
    quality: dict,
    closed_by: str,
    closed_at_ns: int,
    th: Thresholds = Thresholds(),
    world_size: int = 0,
    recent_directed: bool = False,
    window: dict[str, list[int]] | None = None,
    life: int = 0,
) -> dict:
    """The step summary (exactly the keys of ``schema.STEP_SUMMARY_FIELDS``) of ``job``/``step`` from its
    host accumulators ``{host: acc}``. ``history`` is the job's ``[[step, step_time_max_ns,
    late_max_ns], ...]`` (``history_entry``); ``quality`` holds ``lost_batches``, ``duplicate_batches``,
    ``late_events`` (``ringbuf_lost`` is summed here from the accumulators); ``world_size`` the job's
    registered world size (0 unknown: then the number of expected hosts); ``recent_directed``: a recent
    step of the job had ``net_directed`` (``net_stats``); ``window``: the retransmits of the job's
    previous closed steps (``net_window``), read with this step's when it is slowed (its longest host
    step time at least ``net_window_stall`` times the baseline median); ``life``: the job's life (0 for
    its first run; docs/STREAMS.md "Restarts, resumes and world-size changes"). Deterministic: the same
    inputs give the same output."""
    layers = layer_table(accs)
    colls = collectives(accs, th)
    step_time = {h: a["step_ns"] for h, a in sorted(accs.items()) if a["step_ns"] is not None}
    tmax = max(step_time.values(), default=0)
    strag = find_straggler(accs, colls, layers, th)
    bl = baseline(history, step, th)
    late = lateness(accs, colls, layers)
    slowed = bl["n"] >= th.baseline_min_n and tmax >= th.net_window_stall * bl["median_ns"] > 0
    stats = net_stats(accs, th, recent_directed) if len(accs) >= 3 else None
    wstats = net_stats(accs, th, recent_directed, window) if stats and slowed and window else None
    out = {
        "v": schema.SCHEMA_VERSION,
        "job": job,
        "step": step,
        "closed_by": closed_by,
        "closed_at_ns": closed_at_ns,
        "hosts": sorted(accs),
        "expected_hosts": sorted(expected_hosts),
        "missing_hosts": sorted(set(expected_hosts) - set(accs)),
        "world_size": int(world_size) or len(set(expected_hosts) | set(accs)),
        "step_time_ns": step_time,
        "step_time_max_ns": tmax,
        "straggler": strag,
        "blame": _with_net(blame(strag["host"], layers, strag["excess_ns"], th) if strag else [], accs, th, stats),
        "collectives": [
            {k: c[k] for k in ("pg", "coll_seq", "op", "skew_ns", "uncertainty_ns", "last_host")}
            for c in colls
            if c["consistent"]
        ],
        "inconsistent": [
            {"pg": c["pg"], "coll_seq": c["coll_seq"], "op": c["op"], "why": c["why"]}
            for c in colls
            if not c["consistent"]
        ],
        "late_max_ns": max(late.values(), default=0),
        "evidence": evidence(accs, late, layers, bl, th, recent_directed, stats, wstats),
        "net_directed": bool(stats and stats[2]),
        "hang": None,
        "culprit": None,
        "layers": layers,
        "baseline": bl,
        "stall": bool(bl["n"] >= th.baseline_min_n and tmax > bl["p99_ns"]),
        "stall_ratio": round(tmax / bl["median_ns"], 3) if bl["median_ns"] > 0 else 0.0,
        "quality": {
            "lost_batches": int(quality.get("lost_batches", 0)),
            "duplicate_batches": int(quality.get("duplicate_batches", 0)),
            "late_events": int(quality.get("late_events", 0)),
            "ringbuf_lost": sum(a["ringbuf_lost"] for a in accs.values()),
        },
    }
    out["life"] = int(life)
    out["culprit"] = culprit(out)
    compact.compact(out)  # wide steps keep layer rows of their outlier hosts only, plus layer_stats
    assert set(out) == set(schema.STEP_SUMMARY_FIELDS), "summary drifted from schema.STEP_SUMMARY_FIELDS"
    return out
