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

from obshub.streams.analysis.straggler import lateness, layer_table
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


def rank_lateness(units: dict[str, dict]) -> tuple[dict[str, int], dict[str, int]]:
    """``(late, last_n)`` of the rank units: ``late[u]`` = the unit's largest arrival after the median
    arrival of all units at a collective, when beyond the uncertainty of the first and the last arrival's
    clocks (``straggler.lateness``'s rule, without building the per-collective records: a wide job has
    16,384 ranks); ``last_n[u]`` = the collectives it arrived last at by more than the summed uncertainty
    of its clock and the second-latest's. Without any collective joined by two units, lateness is the
    compute time over the median of the other units' (``straggler.lateness``)."""
    by_key: dict[str, list[tuple[int, str]]] = {}
    for u, a in units.items():
        for key, c in a["colls"].items():
            if c[1] is not None:
                by_key.setdefault(key, []).append((c[1], u))
    late = dict.fromkeys(units, 0)
    last_n: dict[str, int] = {}
    seen = False
    for arr in by_key.values():
        if len(arr) < 2:
            continue
        seen = True
        arr.sort()
        n = len(arr)
        med = arr[n // 2][0] if n % 2 else (arr[n // 2 - 1][0] + arr[n // 2][0]) // 2
        unc = units[arr[0][1]]["unc_ns"] + units[arr[-1][1]]["unc_ns"]
        for t, u in reversed(arr):
            d = t - med
            if d <= unc:
                break
            if d > late[u]:
                late[u] = d
        (t2, u2), (t1, u1) = arr[-2], arr[-1]
        if t1 - t2 > units[u1]["unc_ns"] + units[u2]["unc_ns"]:
            last_n[u1] = last_n.get(u1, 0) + 1
    if not seen:
        layers = layer_table(units)
        late = lateness(units, [], layers)
    return late, last_n


def host_ranks(
    accs: dict[str, dict], th: Thresholds = Thresholds(), layers_for: set[str] | None = None
) -> dict[str, dict]:
    """Per host with a known rank, the rank its host-level findings name and every rank's row for the
    summary: ``{host: {"rank": int, "rows": {rank: row}}}`` where a summary row is ``{local_rank, pid,
    gpu, step_ns, late_ns, last_n, layers: {layer: {time_ns, count, max_ns}}}`` (``late_ns``, ``last_n``:
    :func:`rank_lateness` over all ranks of the step). The named rank is the host's latest (largest
    ``late_ns``), then the one of the longest step, then the lowest rank. ``layers_for``: the hosts whose
    rows get their ``layers`` (None: every host; a wide step fills the kept hosts' later,
    :func:`fill_layers`). A host without rank rows but with a single known rank (``acc["rank"] = [rank,
    local_rank, pid]``) names that rank (no rows). ``th`` is unused (the thresholds of the host view
    apply)."""
    units = rank_units(accs)
    out: dict[str, dict] = {}
    if units:
        late, last_n = rank_lateness(units)
        for u, a in units.items():
            h, r = split_unit(u)
            rows = out.setdefault(h, {"rank": None, "rows": {}})["rows"]
            rows[r] = {
                "local_rank": int(a.get("local_rank", 0)),
                "pid": int(a.get("pid", 0)),
                "gpu": int(a.get("gpu", -1)),
                "step_ns": a["step_ns"],
                "late_ns": int(late.get(u, 0)),
                "last_n": last_n.get(u, 0),
                "layers": {},
            }
        for v in out.values():
            v["rows"] = dict(sorted(v["rows"].items()))
            v["rank"] = min(
                v["rows"],
                key=lambda r: (-v["rows"][r]["late_ns"], -(v["rows"][r]["step_ns"] or 0), r),
            )
        fill_layers(out, accs, set(out) if layers_for is None else layers_for)
    for h, a in accs.items():
        one = a.get("rank")
        if h not in out and one:
            out[h] = {"rank": int(one[0]), "rows": {}}
    return out


def fill_layers(named: dict[str, dict], accs: dict[str, dict], hosts: set[str]) -> None:
    """Fill the ``layers`` of the rank rows of ``hosts`` in ``named`` (:func:`host_ranks`) from their rank
    units (``layer_table``: the pytorch layer's time is the rank's compute time)."""
    units = rank_units({h: accs[h] for h in hosts if h in accs})
    for u, row in layer_table(units).items():
        h, r = split_unit(u)
        if h in named and r in named[h]["rows"]:
            named[h]["rows"][r]["layers"] = row


def rank_fields(named: dict[str, dict], host: str) -> dict:
    """``{rank, local_rank, gpu}`` of the rank ``named`` (:func:`host_ranks`) names on ``host``; each None
    (gpu -1) when unknown."""
    v = named.get(host)
    if not v or v["rank"] is None:
        return {"rank": None, "local_rank": None, "gpu": -1}
    row = v["rows"].get(v["rank"]) or {}
    return {"rank": v["rank"], "local_rank": row.get("local_rank"), "gpu": row.get("gpu", -1)}
