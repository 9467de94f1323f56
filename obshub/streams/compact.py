"""Wide step summaries: the per-host layer table only for the hosts that matter, quantiles for all.

A step summary's ``layers`` field (``{host: {layer: {time_ns, count, max_ns}}}``) is about 200 bytes of
JSON per host: at 4,096 hosts it alone would be some 800 KB, close to the broker's default 1 MB message
limit. :func:`compact` keeps that field's rows for every host of a narrow step (at most ``full_rows``
hosts) and, in a wider one, only for the outlier hosts:

- the straggler and every host of its late group, every host named in ``blame``, and the ``top``
  hosts of ``evidence.hosts`` with the largest evidence (the rules read the evidence itself, which stays
  complete; in a step every rank waited in, half of a wide job's hosts can carry a trace of lateness),
- the last host to arrive at each collective (``collectives[*].last_host``),
- per layer, the ``top`` hosts with the largest ``time_ns`` and the ``top`` with the largest ``count``
  (so a count-only layer such as TCP retransmits shows its worst hosts too),
- the ``top`` hosts with the longest step time.

Two fields describe every host whatever the width: ``layer_stats`` (per layer: how many hosts reported
it and the nearest-rank p50/p90/p99/max of ``time_ns`` and of ``count`` over those hosts, the host with the
largest ``time_ns``) and ``layers_omitted`` (how many hosts' rows ``layers`` leaves out; 0 in a narrow
step). The other per-host fields (``hosts``, ``expected_hosts``, ``step_time_ns``) stay complete: about
60 bytes per host, 250 KB at 4,096 hosts. Every event behind a left-out row stays on the events topic,
where rules with ``signal: events`` and ``obshub trace export`` read it (docs/STREAMS.md "Wide steps").
"""

from __future__ import annotations

import heapq
import math
import operator

import numpy as np

FULL_ROWS = 64  # a step of at most this many hosts keeps every host's layer row
TOP = 8  # per layer (by time and by count) and by step time: the outlier hosts kept in a wider step
QUANTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99))


def _rank(values: list[int], q: float) -> int:
    """Nearest-rank quantile ``q`` (0 < q <= 1) of the sorted non-empty ``values``."""
    return values[max(0, math.ceil(q * len(values)) - 1)]


def _columns(layers) -> dict[str, tuple[list[int], list[str], list[int]]]:
    """``{layer: (time_ns per host, hosts, count per host)}`` of every host of ``layers`` (a dict or a wide
    step's column-wise ``analysis.LayerColumns``, read by its columns) that has a row for the layer, hosts
    in the table's order; times in ns (ints), counts in events."""
    cols: dict[str, tuple[list[int], list[str], list[int]]] = {}
    cells = getattr(layers, "cells", None)  # a wide step's column-wise table (analysis.LayerColumns)
    if cells is not None:
        time_of, count_of = operator.itemgetter(0), operator.itemgetter(1)
        for layer, col in cells.items():
            vs = col.values()
            cols[layer] = (list(map(int, map(time_of, vs))), list(col), list(map(int, map(count_of, vs))))
        return cols
    for host, row in layers.items():
        for layer, cell in row.items():
            v = cols.get(layer)
            if v is None:
                v = cols[layer] = ([], [], [])
            v[0].append(int(cell["time_ns"]))
            v[1].append(host)
            v[2].append(int(cell["count"]))
    return cols


def _top_hosts(values: list[int], hosts: list[str], top: int) -> list[str]:
    """The hosts of the ``top`` largest ``values`` (ints, one per host of ``hosts``), the smaller name
    first on a tie: ``[h for _v, h in heapq.nsmallest(top, zip(-values, hosts))]``, with one
    ``numpy.argpartition`` to find the ``top``-th largest value, a sort of the fewer hosts above it and the
    smallest names of those at it, instead of a heap of every host. Values beyond int64: the heap."""
    n = len(values)
    if n > top > 0:
        try:
            arr = np.array(values, dtype=np.int64)
        except (OverflowError, TypeError, ValueError):  # beyond int64, or not numbers: the heap
            arr = None
        if arr is not None:
            kth = arr[np.argpartition(arr, n - top)[n - top]]
            above = sorted([(-values[i], hosts[i]) for i in np.flatnonzero(arr > kth).tolist()])  # < top
            tied = [hosts[i] for i in np.flatnonzero(arr == kth).tolist()]  # at the top-th value: by name
            return [h for _v, h in above] + (sorted(tied) if len(tied) <= 4 * top else heapq.nsmallest(top, tied))[
                : top - len(above)
            ]
    return [h for _v, h in heapq.nsmallest(top, zip([-v for v in values], hosts))]


def layer_stats(
    layers: dict[str, dict[str, dict]], cols: dict[str, tuple[list[int], list[str], list[int]]] | None = None
) -> dict[str, dict]:
    """``{layer: {hosts, time_p50_ns, time_p90_ns, time_p99_ns, time_max_ns, max_host, count_p50,
    count_p90, count_p99, count_max}}`` over every host of ``layers`` (``summary["layers"]``, a dict or a
    wide step's column-wise ``analysis.LayerColumns``, read by its columns) that has a row for the layer. Quantiles are nearest-rank (the smallest value with at least q of the hosts at or
    below it); ``max_host`` is the host with the largest ``time_ns`` (the first by name on a tie). Times in
    ns, counts in events. O(hosts x layers x log hosts). ``cols``: ``_columns(layers)``, when the caller
    has it."""
    cols = _columns(layers) if cols is None else cols
    out: dict[str, dict] = {}
    for layer in sorted(cols):
        tl, hl, cl = cols[layer]
        t = sorted(tl)
        c = sorted(cl)
        top_t = t[-1]
        st: dict = {"hosts": len(t)}
        for name, q in QUANTILES:
            st[f"time_{name}_ns"] = _rank(t, q)
        st["time_max_ns"] = top_t
        st["max_host"] = hl[tl.index(top_t)] if tl.count(top_t) == 1 else min(h for h, x in zip(hl, tl) if x == top_t)
        for name, q in QUANTILES:
            st[f"count_{name}"] = _rank(c, q)
        st["count_max"] = c[-1]
        out[layer] = st
    return out


def outlier_hosts(
    summary: dict, top: int = TOP, cols: dict[str, tuple[list[int], list[str], list[int]]] | None = None
) -> set[str]:
    """The hosts whose layer rows a wide ``summary`` keeps (module docstring): named by the analysis
    (straggler, late group, blame, last arrivals), the ``top`` hosts with the largest evidence, plus the
    ``top`` largest per layer time, per layer count and by step time (the smaller name first on a tie).
    ``cols``: ``_columns(summary["layers"])``, when the caller has it."""
    keep: set[str] = set()
    strag = summary.get("straggler")
    if strag:
        keep.add(strag["host"])
        keep.update(g["host"] for g in strag.get("group") or ())
    keep.update(b["host"] for b in summary.get("blame") or ())
    evidence = (summary.get("evidence") or {}).get("hosts") or {}
    strongest = heapq.nsmallest(
        top,
        [
            (-max((v for v in (z or {}).values() if isinstance(v, (int, float))), default=0), h)
            for h, z in evidence.items()
        ],
    )
    keep.update(h for _z, h in strongest)
    keep.update(c["last_host"] for c in summary.get("collectives") or () if c.get("last_host"))
    layers = summary.get("layers") or {}
    # the top ones by value then name (a host once per layer): a partial selection, not a sort of thousands
    for times, hosts, counts in (_columns(layers) if cols is None else cols).values():
        keep.update(_top_hosts(times, hosts, top))
        keep.update(_top_hosts(counts, hosts, top))
    st = summary.get("step_time_ns") or {}
    keep.update(_top_hosts(list(st.values()), list(st), top))
    return keep & set(layers)


def compact(summary: dict, full_rows: int = FULL_ROWS, top: int = TOP) -> dict:
    """``summary`` (from ``streams.analysis.summarize``, with every host's ``layers`` row, as a dict or as
    ``analysis.LayerColumns``, whose rows are built only for the hosts kept) made wide-safe,
    in place and returned: adds ``layer_stats`` (:func:`layer_stats`, over all hosts) and
    ``layers_omitted``, and when ``layers`` has more than ``full_rows`` hosts keeps only the rows of
    :func:`outlier_hosts`. Deterministic; O(hosts x layers x log hosts)."""
    layers = summary.get("layers") or {}
    cols = _columns(layers)  # read once for the statistics and the outliers
    summary["layer_stats"] = layer_stats(layers, cols)
    if len(layers) <= full_rows:
        if not isinstance(layers, dict):  # a column-wise table (analysis.LayerColumns): every row
            summary["layers"] = dict(layers.items())
        summary["layers_omitted"] = 0
        return summary
    keep = outlier_hosts(summary, top, cols)
    summary["layers"] = {h: layers[h] for h in sorted(keep)}
    summary["layers_omitted"] = len(layers) - len(keep)
    return summary
