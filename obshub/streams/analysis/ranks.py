"""Several ranks per host: the rank rows of the host accumulators, the host view built from them, and the
rank each host-level finding names (docs/ANALYSIS.md "Several ranks per host").

A host accumulator keeps one rank row per registered training process of the host (``accumulate``,
``acc["ranks"]``: ``{"<global rank>": row}``; a row has the shape of a host accumulator plus ``pid``,
``local_rank`` and ``gpu``). Two views are built from them:

- the **host view** (:func:`host_view`): a host arrives at a collective when its *last* rank arrives (the
  host accumulator keeps the first arrival, which hides a slow rank behind its fast peers), and, for the
  hang check (``strict``), has not arrived while one of its ranks has not, and is not done with the step
  while one of its ranks is not. A host without rank rows (one rank per host, or ranks unknown) is
  unchanged, so a one-rank-per-host job's summaries keep their meaning;
- the **rank units** (:func:`rank_units`): every rank row as an accumulator of its own, keyed
  ``"<host>#<rank>"``: the straggler, blame and evidence of a one-node job (nothing to compare across
  hosts) and the rank each host-level finding names (the rank of the host that was latest at the
  collectives, :func:`host_ranks`).

Everything here is pure and deterministic (ties break by rank number).
"""

from __future__ import annotations

from obshub.streams.analysis.straggler import collectives, lateness, layer_table
from obshub.streams.analysis.thresholds import Thresholds

SEP = "#"
"""Separator of a rank unit key ``"<host>#<rank>"`` (host names never end in ``#<digits>``)."""


def unit_key(host: str, rank: int | str) -> str:
    """The key of rank ``rank`` of ``host`` among the rank units: ``"<host>#<rank>"``."""
    return f"{host}{SEP}{rank}"


def split_unit(key: str) -> tuple[str, int]:
    """``(host, global rank)`` of a rank unit key."""
    host, _, rank = key.rpartition(SEP)
    return host, int(rank)


def multi_rank(accs: dict[str, dict]) -> bool:
    """Whether some host of ``accs`` has at least two rank rows."""
    return any(len(a.get("ranks") or ()) >= 2 for a in accs.values())


def rank_units(accs: dict[str, dict]) -> dict[str, dict]:
    """``{"<host>#<rank>": accumulator}``: every rank row of every host, with its host's clock
    uncertainty (a rank row has no ``net``: links are per host)."""
    out = {}
    for h, a in accs.items():
        for r, row in (a.get("ranks") or {}).items():
            unit = dict(row)
            unit["unc_ns"] = max(int(row.get("unc_ns") or 0), int(a.get("unc_ns") or 0))
            out[unit_key(h, r)] = unit
    return out


def host_view(accs: dict[str, dict], strict: bool = False) -> dict[str, dict]:
    """``accs`` with every host of two or more rank rows seen through its ranks: its arrival at each
    collective is its last rank's (``[op, arrive_rt, end_rt, duration_ns]`` of that rank's record). With
    ``strict`` (the hang check), a collective one of its ranks has not reached has no arrival, and its
    ``step_ns`` is None until every rank row has one. Other hosts are returned as they are (no copy)."""
    out = {}
    for h, a in accs.items():
        rows = a.get("ranks") or {}
        if len(rows) < 2:
            out[h] = a
            continue
        v = dict(a)
        colls: dict[str, list] = {}
        for key in a["colls"]:
            recs = [row["colls"].get(key) for row in rows.values()]
            have = [c for c in recs if c is not None and c[1] is not None]
            if not have or (strict and len(have) < len(recs)):
                colls[key] = [a["colls"][key][0], None, None, None]
                continue
            colls[key] = list(max(have, key=lambda c: c[1]))
        v["colls"] = colls
        if strict and any(row["step_ns"] is None for row in rows.values()):
            v["step_ns"] = None
        out[h] = v
    return out


def host_ranks(accs: dict[str, dict], th: Thresholds = Thresholds()) -> dict[str, dict]:
    """Per host with a known rank, the rank its host-level findings name and every rank's row for the
    summary: ``{host: {"rank": int, "rows": {rank: row}}}`` where a summary row is ``{local_rank, pid,
    gpu, step_ns, late_ns, last_n, layers: {layer: {time_ns, count, max_ns}}}`` (``late_ns``: the rank's
    largest arrival after the median arrival of all ranks at a collective, beyond the clocks'
    uncertainty; ``last_n``: the collectives it arrived last at among all ranks). The named rank is the
    host's latest (largest ``late_ns``), then the one of the longest step, then the lowest rank. A host
    without rank rows but with a single known rank (``acc["rank"] = [rank, local_rank, pid]``) names
    that rank (no rows)."""
    units = rank_units(accs)
    out: dict[str, dict] = {}
    if units:
        layers = layer_table(units)
        colls = collectives(units, th)
        late = lateness(units, colls, layers)
        last_n: dict[str, int] = {}
        for c in colls:
            if c["consistent"] and c["lead_ns"] > c["lead_uncertainty_ns"]:
                last_n[c["last_host"]] = last_n.get(c["last_host"], 0) + 1
        for u, a in sorted(units.items()):
            h, r = split_unit(u)
            rows = out.setdefault(h, {"rank": None, "rows": {}})["rows"]
            rows[r] = {
                "local_rank": int(a.get("local_rank", 0)),
                "pid": int(a.get("pid", 0)),
                "gpu": int(a.get("gpu", -1)),
                "step_ns": a["step_ns"],
                "late_ns": int(late.get(u, 0)),
                "last_n": last_n.get(u, 0),
                "layers": layers.get(u, {}),
            }
        for v in out.values():
            v["rank"] = min(
                v["rows"],
                key=lambda r: (-v["rows"][r]["late_ns"], -(v["rows"][r]["step_ns"] or 0), r),
            )
    for h, a in accs.items():
        one = a.get("rank")
        if h not in out and one:
            out[h] = {"rank": int(one[0]), "rows": {}}
    return out


def rank_fields(named: dict[str, dict], host: str) -> dict:
    """``{rank, local_rank, gpu}`` of the rank ``named`` (:func:`host_ranks`) names on ``host``; each None
    (gpu -1) when unknown."""
    v = named.get(host)
    if not v or v["rank"] is None:
        return {"rank": None, "local_rank": None, "gpu": -1}
    row = v["rows"].get(v["rank"]) or {}
    return {"rank": v["rank"], "local_rank": row.get("local_rank"), "gpu": row.get("gpu", -1)}
