"""``summarize``: the per-host accumulators of one closed step -> the step summary (straggler, blame,
network blame, baseline, evidence), composed from the other modules of this package."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from obshub.core import schema
from obshub.streams import accumulate, compact
from obshub.streams.accumulate import as_accs
from obshub.streams.analysis.culprit import culprit
from obshub.streams.analysis.evidence import Evidence, HostEvidence, baseline, evidence
from obshub.streams.analysis.network import NetStats, net_blame, net_stats
from obshub.streams.analysis.ranks import (
    LazyNamed,
    fill_layers,
    fill_rows,
    host_ranks,
    host_view,
    rank_fields,
    rank_units,
    split_unit,
    view_columns,
)
from obshub.streams.analysis.running import past_data
from obshub.streams.analysis.straggler import blame, collectives, find_straggler, lateness, layer_table, layers_of
from obshub.streams.analysis.thresholds import Thresholds

_builtins = msgspec.to_builtins


class Collective(msgspec.Struct):
    """One consistent collective of the step, an entry of the summary's ``collectives`` (its fields in
    this order): process group ``pg``, its sequence number ``coll_seq``, the operation ``op``; ``skew_ns``
    the latest minus the earliest offset-corrected arrival (ns), ``uncertainty_ns`` the clock uncertainty
    of those two hosts together (ns), ``last_host`` the last arriver."""

    pg: str
    coll_seq: int
    op: str
    skew_ns: int
    uncertainty_ns: int
    last_host: str


class Inconsistent(msgspec.Struct):
    """A collective that failed the pairing check (never used to blame a host), an entry of the
    summary's ``inconsistent``: ``pg``, ``coll_seq``, ``op`` as in ``Collective``, ``why`` the check it
    failed, in words."""

    pg: str
    coll_seq: int
    op: str
    why: str


class Quality(msgspec.Struct):
    """The summary's ``quality`` map: counts of agent batches lost (a gap in an agent's sequence
    numbers) and received twice, of events that came after their step closed, and of events the agents'
    BPF ring buffers dropped (summed over the step's hosts)."""

    lost_batches: int = 0
    duplicate_batches: int = 0
    late_events: int = 0
    ringbuf_lost: int = 0


def _ranks_of(named: dict[str, dict], hosts: Iterable[str]) -> dict[str, int]:
    """``{host: rank}`` of each of ``hosts`` whose entry in ``named`` (``host_ranks``) names a rank, in the
    order of ``hosts``; a wide step's lazy entries (``LazyNamed``) are read without being built."""
    if isinstance(named, LazyNamed):
        ranks = {h: named.rank_of(h) for h in hosts}
    else:
        ranks = {h: named.get(h, {}).get("rank") for h in hosts}
    return {h: r for h, r in ranks.items() if r is not None}


def _with_net(entries: list[dict], accs: dict[str, dict], th: Thresholds, stats: NetStats | None) -> list[dict]:
    """``entries`` plus the connection-based network blame (as its summary map), unless that host already
    has a network entry."""
    have = {(e["host"], e["layer"]) for e in entries}
    return entries + [_builtins(e) for e in net_blame(accs, th, stats=stats) if (e.host, e.layer) not in have]


def _unit_straggler(ustrag: dict | None, named: dict) -> dict | None:
    """The straggler over rank units (one-node job) with its host and rank: ``{host, rank, unit, ...}``
    (``unit`` is dropped by ``_with_rank``); the group lists ranks (``{host, rank, late_ns}``)."""
    if ustrag is None:
        return None
    host, rank = split_unit(ustrag["host"])
    named.setdefault(host, {"rank": rank, "rows": {}})["rank"] = rank
    group = []
    for g in ustrag["group"]:
        gh, gr = split_unit(g["host"])
        group.append({"host": gh, "rank": gr, "late_ns": g["late_ns"]})
    reason = ustrag["reason"]
    for u in sorted({g["host"] for g in ustrag["group"]} | {ustrag["host"]}, key=len, reverse=True):
        reason = reason.replace(u, f"rank {split_unit(u)[1]}")
    return dict(ustrag, host=host, rank=rank, unit=ustrag["host"], group=group, reason=reason)


def _with_rank(strag: dict | None, named: dict) -> dict | None:
    """``strag`` with the rank its host names (``rank``, ``local_rank``, ``gpu``) and each group entry's."""
    if strag is None:
        return None
    out = {k: v for k, v in strag.items() if k != "unit"}
    fields = rank_fields(named, out["host"])
    if out.get("rank") is not None:
        row = (named.get(out["host"]) or {}).get("rows", {}).get(out["rank"]) or {}
        fields = {"rank": out["rank"], "local_rank": row.get("local_rank"), "gpu": row.get("gpu", -1)}
    out.update(fields)
    out["group"] = [
        g if "rank" in g else dict(g, rank=rank_fields(named, g["host"])["rank"]) for g in out.get("group") or []
    ]
    return out


def _blame_rank(entry: dict, named: dict) -> dict:
    """A blame entry with ``rank``: the rank its host names, None for a host's link (``network``: its
    ranks share it) and when unknown."""
    if "rank" in entry:
        return entry
    rank = None if entry["layer"] == "network" else rank_fields(named, entry["host"])["rank"]
    return dict(entry, rank=rank)


def stopped_ranks(accs: dict[str, dict]) -> dict[str, dict]:
    """The summary's ``stopped``: ``{host: {"ns": int, "rank": int | None}}`` from the host accumulators
    ``{host: acc}`` (``accumulate`` ``stopped_ns``: the longest off-CPU time of a stopped or traced thread
    in the step, ns), with the global rank whose row holds it (a one-rank host's rank; None when unknown).
    Only hosts with a stop; the rank rows are decoded only for them (a stop is rare)."""
    accs = as_accs(accs)
    out: dict[str, dict] = {}
    for h in sorted([h for h, acc in accs.items() if acc.stopped_ns]):  # the few with a stop, sorted
        acc = accs[h]
        ns = int(acc.stopped_ns or 0)
        if ns <= 0:
            continue
        rank = None
        if acc.rank:
            rank = int(acc.rank[0])
        else:
            rows = accumulate.rank_rows(acc)
            best = max(rows.items(), key=lambda kv: (kv[1].stopped_ns or 0, -int(kv[0])), default=None)
            if best is not None and (best[1].stopped_ns or 0) > 0:
                rank = int(best[0])
        out[h] = {"ns": ns, "rank": rank}
    return out


def culprit_rank(c: dict | None, summary: dict) -> dict | None:
    """Culprit ``c`` (``analysis.culprit``) with ``rank``: a stopped rank's own (``source`` "stopped"); for
    ``source`` "layers" on a host of several rank rows the rank with the most time in that layer; else the
    straggler's rank when it is the straggler's host, else the rank its evidence names
    (``evidence.ranks``); None for the network layer or when unknown."""
    if c is None:
        return None
    rank = None
    strag = summary.get("straggler") or {}
    rows = (summary.get("ranks") or {}).get(c["host"]) or {}
    if c.get("source") == "stopped" or c.get("rank") is not None:
        rank = c.get("rank")  # a stopped rank, or the starved rank of hosts late alike (``_alike_starved``)
    elif c.get("source") == "layers" and len(rows) >= 2:
        # a host's layer time over its peers' (a burst inside a collective): the rank whose own time in
        # that layer is the largest (a burst pinned to one rank's CPU starves that rank)
        rank = int(
            max(
                rows.items(),
                key=lambda kv: ((kv[1].get("layers") or {}).get(c["layer"], {}).get("time_ns", 0), -int(kv[0])),
            )[0]
        )
    elif c.get("layer") != "network":
        if strag.get("host") == c["host"] and strag.get("rank") is not None:
            rank = strag["rank"]
        else:
            rank = ((summary.get("evidence") or {}).get("ranks") or {}).get(c["host"])
    return dict(c, rank=rank)


def one_rank_culprit(c: dict | None, accs: dict) -> dict | None:
    """Culprit ``c`` (the step's final one, after every charge) with ``rank`` set to its host's one rank when
    it names none: its layer is not ``network`` (a host's link, which its ranks share, names no rank) and its
    host ran one registered training process in the step (its accumulator names that rank, ``acc.rank =
    [rank, local_rank, pid]``: ``accumulate.reduce_batch``). ``accs``: the step's ``{host: accumulator}``.
    ``culprit_rank`` and the fold's charges take a culprit's rank from the straggler (on its host) or the
    evidence's ranks, which a one-rank host is not always part of (a memory cgroup at its limit, a
    persistent fault's charge, a host late at its layer while another host was the straggler), so the
    alerts of a job of one rank per host carried a ``rank`` label on some steps and episodes and not on
    others (docs/RULES.md "Builtin pack and runbooks"). Returns ``c`` itself when nothing changes (None
    stays None); a host of several ranks keeps an unknown rank (its fault may be the host's)."""
    if c is None or c.get("rank") is not None or c.get("layer") == "network":
        return c
    acc = accs.get(c.get("host"))
    one = None if acc is None else (acc.get("rank") if isinstance(acc, dict) else getattr(acc, "rank", None))
    if not one:
        return c
    return dict(c, rank=int(one[0]))


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
    """The step summary (the keys of ``schema.STEP_SUMMARY_FIELDS`` but ``STEP_HELD_FIELDS``, which the worker adds
    to a held step) of ``job``/``step`` from its host accumulators ``{host: acc}``. ``history`` is the job's
    ``[[step, step_time_max_ns, late_max_ns], ...]`` (``history_entry``); ``quality`` holds ``lost_batches``,
    ``duplicate_batches``, ``late_events`` (``ringbuf_lost`` is summed here from the accumulators);
    ``world_size`` the job's registered world size (0 unknown: then the number of expected hosts);
    ``recent_directed``: a recent step of the job had ``net_directed`` (``net_stats``); ``window``: the
    retransmits of the job's previous closed steps (``net_window``), read with this step's when it is slowed
    (its longest host step time at least ``net_window_stall`` times the baseline median); ``life``: the job's
    life (0 for its first run; docs/STREAMS.md "Restarts, resumes and world-size changes"). Deterministic: the
    same inputs give the same output."""
    accs = as_accs(accs)
    wide = len(accs) > compact.FULL_ROWS  # rank rows' layers only for the hosts compact keeps (below)
    # a wide step: each host's named rank's row now, every row of the hosts compact keeps later
    named = host_ranks(accs, th, layers_for=set() if wide else None, rows_for=set() if wide else None)
    one_node = len(accs) == 1 and accumulate.rank_count(next(iter(accs.values()))) >= 2
    raw = accs
    if wide:  # the host view's collective records only (no accumulator copied), layers column-wise
        # a host arrives with its last rank (docs/ANALYSIS.md "Several ranks per host"); its records also
        # column-wise (one transposition of the hosts' records, read by the collectives and compute times)
        vc, cols = view_columns(accs)
        layers = layers_of(accs, wide, vc, cols)  # rows built only for the hosts the summary keeps
        colls = collectives(accs, th, vc, cols)
    else:
        accs = host_view(accs)  # a host arrives with its last rank (docs/ANALYSIS.md "Several ranks per host")
        layers = layer_table(accs)
        colls = collectives(accs, th)
    step_time = {h: a.step_ns for h, a in sorted(accs.items()) if a.step_ns is not None}
    tmax = max(step_time.values(), default=0)
    strag = find_straggler(accs, colls, layers, th)
    bl = baseline(history, step, th)
    late = lateness(accs, colls, layers)
    slowed = bl.n >= th.baseline_min_n and tmax >= th.net_window_stall * bl.median_ns > 0
    stats = net_stats(accs, th, recent_directed) if len(accs) >= 3 else None
    wstats = net_stats(accs, th, recent_directed, window) if stats and slowed and window is not None else None
    if one_node:  # one host of several ranks: its ranks are compared with each other
        units = rank_units(raw)
        ulayers = layer_table(units)
        ucolls = collectives(units, th)
        ustrag = find_straggler(units, ucolls, ulayers, th)
        ulate = lateness(units, ucolls, ulayers)
        host = next(iter(accs))
        late = {host: max(ulate.values(), default=0)}
        ev = evidence(units, ulate, ulayers, bl, th)
        ev_hosts: dict[str, HostEvidence] = {}
        for u, zs in ev.hosts.items():  # the host's evidence is its rank's of the largest evidence
            if zs.top() > (ev_hosts[host].top() if host in ev_hosts else 0.0):
                ev_hosts[host] = zs
                named[host]["rank"] = split_unit(u)[1]
        ev = Evidence(ev.spread_ns, ev_hosts)
        strag = _unit_straggler(ustrag, named)
        bl_entries = (
            [dict(e, host=host, rank=strag["rank"]) for e in blame(ustrag["host"], ulayers, ustrag["excess_ns"], th)]
            if ustrag and strag
            else []
        )
    else:
        lost = max(0, tmax - bl.median_ns) if bl.n >= th.baseline_min_n else 0
        ev = evidence(accs, late, layers, bl, th, recent_directed, stats, wstats, lost)
        bl_entries = blame(strag["host"], layers, strag["excess_ns"], th) if strag else []
    if strag is not None and not step_time and not colls and not any(past_data(a) for a in raw.values()):
        # the step after a training loop's last: its data phases only (opened at the last optimizer step,
        # closed at exit), nobody waited for anybody; a rank that saved a checkpoint after the loop is no
        # straggler (docs/ANALYSIS.md "Hangs")
        strag, bl_entries = None, []
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
        "straggler": _with_rank(strag, named),
        "blame": [_blame_rank(e, named) for e in _with_net(bl_entries, accs, th, stats)],
        "collectives": [
            _builtins(Collective(c["pg"], c["coll_seq"], c["op"], c["skew_ns"], c["uncertainty_ns"], c["last_host"]))
            for c in colls
            if c["consistent"]
        ],
        "inconsistent": [
            _builtins(Inconsistent(c["pg"], c["coll_seq"], c["op"], c["why"])) for c in colls if not c["consistent"]
        ],
        "late_max_ns": max(late.values(), default=0),
        "evidence": _builtins(
            Evidence(
                ev.spread_ns,
                ev.hosts,
                _ranks_of(named, ev.hosts),
                ev.net_view,
            )
        ),
        "net_directed": bool(stats and stats.directed),
        "hang": None,
        "culprit": None,
        "layers": layers,
        "ranks": {}
        if wide
        else {h: {str(r): row for r, row in v["rows"].items()} for h, v in sorted(named.items()) if v["rows"]},
        "baseline": _builtins(bl),
        "stall": bool(bl.n >= th.baseline_min_n and tmax > bl.p99_ns),
        "stall_ratio": round(tmax / bl.median_ns, 3) if bl.median_ns > 0 else 0.0,
        "stopped": stopped_ranks(raw),
        "quality": _builtins(
            Quality(
                int(quality.get("lost_batches", 0)),
                int(quality.get("duplicate_batches", 0)),
                int(quality.get("late_events", 0)),
                sum(a.ringbuf_lost for a in accs.values()),
            )
        ),
    }
    if not ev.net_view:  # which view of the connections gave each network evidence: absent without any
        del out["evidence"]["net_view"]
    out["life"] = int(life)
    out["culprit"] = culprit_rank(culprit(out), out)
    compact.compact(out)  # wide steps keep layer rows of their outlier hosts only, plus layer_stats
    if wide:  # and the rank rows of the same hosts, with their layers
        kept = {h for h in out["layers"] if h in named and named[h]["rows"]}
        fill_rows(named, raw, kept)
        fill_layers(named, raw, kept)
        out["ranks"] = {h: {str(r): row for r, row in named[h]["rows"].items()} for h in sorted(kept)}
    assert set(out) == set(schema.STEP_SUMMARY_FIELDS) - schema.STEP_HELD_FIELDS, "summary drifted from the schema"
    return out
