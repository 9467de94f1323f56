"""The straggler of one closed step: per-host layer times, collective arrivals and their pairing check,
lateness, the straggler itself and its layer blame (docs/ANALYSIS.md)."""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping, Sequence
from typing import NamedTuple

import numpy as np

from obshub.core.schema import Layer
from obshub.streams.accumulate import as_accs
from obshub.streams.analysis.stats import LeaveOneOut, median_int, union_ns
from obshub.streams.analysis.thresholds import Thresholds


def compute_ns(acc: dict, colls: dict | None = None) -> int | None:
    """A host's compute time in the step, ns: ``step_ns - |union of its collective intervals|`` where a
    collective's interval is ``[end_rt - duration_ns, end_rt]`` from COLLECTIVE_END. Without a STEP_END,
    the sum of the PHASE durations minus the same union (None when there is neither). ``colls``: the
    collective records to read instead of ``acc.colls`` (the host view's, ``ranks.view_colls``)."""
    recs = (acc.colls if colls is None else colls).values()
    ivals = [(c[2] - c[3], c[2]) for c in recs if c[2] is not None and c[3] is not None]
    waited = union_ns(ivals)
    if acc.step_ns is not None:
        return max(0, acc.step_ns - waited)
    if acc.phases:
        return max(0, sum(acc.phases.values()) - waited)
    return None


_ARRIVE, _END, _DURATION = operator.itemgetter(1), operator.itemgetter(2), operator.itemgetter(3)
"""A collective record's (``[op, arrive_rt, end_rt, duration_ns]``) arrival, end and duration."""
_CELL_TIME, _CELL_COUNT = operator.itemgetter(0), operator.itemgetter(1)
"""A :class:`LayerColumns` cell's (``(time_ns, count, max_ns)``) time and count."""


class CollColumns(NamedTuple):
    """The host view's collective records of a wide step held column-wise (``ranks.view_columns``), built in
    one pass when every host has the same collective keys in the same order: ``hosts`` every host of the
    step in the accumulators' order (n), ``uncs`` their clocks' uncertainty (n, ns), ``recs`` per
    collective key (k keys, in the hosts' key order) the n hosts' records ``[op, arrive_rt, end_rt,
    duration_ns]`` in ``hosts`` order (ns; arrive, end or duration may be None). Read by ``collectives``,
    ``compute_many`` and ``LayerColumns`` instead of transposing the per-host records each. Read only."""

    hosts: list[str]
    uncs: list[int]
    recs: dict[str, Sequence[list]]


_BOUND = 2**62
"""Collective ends and durations (ns) the vectorised union takes: within +-2**62, so that no difference
overflows int64 (beyond: ``compute_ns`` in Python ints)."""


def compute_many(
    accs: dict[str, dict],
    hosts: list[str],
    colls_of: dict[str, dict] | None = None,
    columns: CollColumns | None = None,
) -> list[int | None]:
    """``[compute_ns(accs[h], colls_of[h]) for h in hosts]`` (ns, None where unknown), the union of each
    host's collective intervals taken with numpy for the hosts of a step time and as many collective
    records, all with an end and a duration (the usual step: one ``(hosts, collectives)`` matrix, sorted
    per row by ``(start, end)`` as ``union_ns`` sorts, then merged column by column). The same ints as
    ``compute_ns``; other hosts, and values beyond ``_BOUND``, take ``compute_ns``. ``columns``: the same
    records as ``colls_of`` held column-wise (:class:`CollColumns`); when its hosts are ``hosts`` in that
    order, every one with a step time and two or more records, the matrix is read from its columns."""
    n = len(hosts)
    if columns is not None and len(columns.recs) >= 2 and columns.hosts == hosts:
        steps = [accs[h].step_ns for h in hosts]
        if None not in steps:
            cols = list(columns.recs.values())
            got = _union_of(
                [list(map(_END, c)) for c in cols], [list(map(_DURATION, c)) for c in cols], n, len(cols), True
            )
            if got is not None:
                return [max(0, s - w) for s, w in zip(steps, got)]
    out: list[int | None] = [None] * n
    groups: dict[int, list[int]] = {}
    recs: dict[int, list] = {}
    for i, h in enumerate(hosts):
        a = accs[h]
        cs = a.colls if colls_of is None else colls_of[h]
        if a.step_ns is None or len(cs) < 2:
            out[i] = compute_ns(a, cs)
            continue
        k = len(cs)
        if k not in groups:
            groups[k], recs[k] = [], []
        groups[k].append(i)
        recs[k].extend(cs.values())
    for k, idx in groups.items():
        rs = recs[k]
        ws = _union_of(list(map(_END, rs)), list(map(_DURATION, rs)), len(idx), k, False)
        if ws is None:  # an unknown end or duration, or beyond int64
            for i in idx:
                h = hosts[i]
                out[i] = compute_ns(accs[h], None if colls_of is None else colls_of[h])
            continue
        for i, w in zip(idx, ws):
            out[i] = max(0, accs[hosts[i]].step_ns - w)
    return out


def _union_of(ends: list, durs: list, n: int, k: int, by_column: bool) -> list[int] | None:
    """Per host the length of the union of its ``k`` collective intervals ``[end - duration, end]`` (ns),
    for ``n`` hosts: ``ends`` and ``durs`` hold ``n * k`` values row by row (host by host), or with
    ``by_column`` ``k`` lists of ``n`` (one per collective, hosts in order). None when a value is unknown
    (None), no int, or beyond ``_BOUND`` (the caller takes ``compute_ns``)."""
    try:
        e = np.array(ends, dtype=np.int64)
        d = np.array(durs, dtype=np.int64)
        if int(np.abs(e).max()) >= _BOUND or int(np.abs(d).max()) >= _BOUND:
            return None
    except (TypeError, ValueError, OverflowError):
        return None
    if by_column:
        e, d = e.T, d.T
    else:
        e, d = e.reshape(n, k), d.reshape(n, k)
    st = e - d
    order = np.lexsort((e, st), axis=1)
    st = np.take_along_axis(st, order, 1)
    e = np.take_along_axis(e, order, 1)
    cur_s, cur_e = st[:, 0], e[:, 0]
    total = np.zeros(n, dtype=np.int64)
    for j in range(1, k):
        sj, ej = st[:, j], e[:, j]
        gap = sj > cur_e
        total += np.where(gap, cur_e - cur_s, 0)
        cur_s = np.where(gap, sj, cur_s)
        cur_e = np.where(gap, ej, np.maximum(cur_e, ej))
    total += cur_e - cur_s
    return total.tolist()


def layer_table(accs: dict[str, dict], colls_of: dict[str, dict] | None = None) -> dict[str, dict[str, dict]]:
    """``{host: {layer: {time_ns, count, max_ns}}}``; the pytorch layer's time is ``compute_ns`` (of the
    host's records in ``colls_of`` when given: the host view's, ``ranks.view_colls``)."""
    accs = as_accs(accs)
    out: dict[str, dict[str, dict]] = {}
    pytorch = Layer.PYTORCH.value
    for host in sorted(accs):  # host names are unique: the order of sorted(accs.items())
        acc = accs[host]
        ls = acc.layers
        row = {
            layer: {"time_ns": t, "count": c, "max_ns": m}
            for layer, (t, c, m) in (sorted(ls.items()) if len(ls) > 1 else ls.items())
        }
        comp = compute_ns(acc, None if colls_of is None else colls_of[host])
        if comp is not None:
            cell = row.get(pytorch)
            if cell is None:
                row[pytorch] = {"time_ns": comp, "count": 0, "max_ns": 0}
            else:
                cell["time_ns"] = comp
        out[host] = row
    return out


class LayerColumns(Mapping):
    """The layer table of a step (``layer_table``'s ``{host: {layer: {time_ns, count, max_ns}}}``) held
    column-wise, for a wide step (thousands of hosts): ``cells[layer]`` maps each host that has the layer
    (hosts in sorted order) to its ``(time_ns, count, max_ns)``, the pytorch layer's time being
    ``compute_ns`` as in ``layer_table``. Built in one pass over the host accumulators ``accs``, without
    one dict per host and layer: the job-wide statistics (peer medians, ``compact.layer_stats``, the
    outlier hosts, the evidence's leave-one-out medians) read the columns, and a host's row (the same dict
    ``layer_table`` gives, same key order) is built only when read (``layers[host]``), e.g. for the few
    hosts a wide summary keeps. Iterating ``items()``/``values()`` builds every row (``layer_table``'s
    result: 65-75 ms at 2,048 x 8, so the close's readers of a column, ``culprit`` included, use ``cells``,
    ``full`` or ``value``).

    Read-only: the rows it returns are cached; a reader must not change them."""

    __slots__ = ("_accs", "_colls", "_hosts", "_rows", "cells")

    def __init__(
        self, accs: dict[str, dict], colls_of: dict[str, dict] | None = None, columns: CollColumns | None = None
    ) -> None:
        accs = as_accs(accs)
        self._accs = accs
        self._colls = colls_of  # per host the collective records its compute time reads (None: acc.colls)
        self._hosts = sorted(accs)
        self._rows: dict[str, dict] = {}
        pytorch = Layer.PYTORCH.value
        hosts = self._hosts
        comps = compute_many(accs, hosts, colls_of, columns)
        rows = [accs[h].layers for h in hosts]  # layer -> [time_ns, count, max_ns], read only
        # the columns in the order a host-by-host pass meets them: each host's layers, then pytorch when
        # it has a compute time (every host has the same layers but a few: one pass of C calls per host)
        order: dict[str, None] = {}
        for layers, comp in zip(rows, comps):
            if len(order) < len(layers) or not order.keys() >= layers.keys():
                order.update(dict.fromkeys(layers))
            if comp is not None and pytorch not in order:
                order[pytorch] = None
        cells: dict[str, dict[str, Sequence]] = {}
        for layer in order:  # each column in host order (hosts are sorted)
            if layer != pytorch:
                cells[layer] = {h: lay[layer] for h, lay in zip(hosts, rows) if layer in lay}
                continue
            col: dict[str, Sequence] = {}
            for h, lay, comp in zip(hosts, rows, comps):
                have = lay.get(pytorch)
                if comp is not None:
                    col[h] = (comp, 0, 0) if have is None else (comp, have[1], have[2])
                elif have is not None:
                    col[h] = have
            cells[layer] = col
        self.cells = cells  # every column in host order: hosts are visited sorted

    def __getitem__(self, host: str) -> dict:
        row = self._rows.get(host)
        if row is None:
            if host not in self._accs:
                raise KeyError(host)
            row = self._rows[host] = self._table([host])[host]
        return row

    def __iter__(self) -> Iterator[str]:
        return iter(self._hosts)

    def __len__(self) -> int:
        return len(self._hosts)

    def __contains__(self, host: object) -> bool:
        return host in self._accs

    def table(self) -> dict[str, dict[str, dict]]:
        """Every host's row: ``layer_table``'s result (built once, then cached)."""
        if len(self._rows) < len(self._hosts):
            self._rows.update(self._table([h for h in self._hosts if h not in self._rows]))
        return {h: self._rows[h] for h in self._hosts}

    def _table(self, hosts: list[str]) -> dict[str, dict[str, dict]]:
        """``layer_table`` of ``hosts`` (their collective records as given)."""
        colls = self._colls
        return layer_table({h: self._accs[h] for h in hosts}, None if colls is None else {h: colls[h] for h in hosts})

    def items(self):  # type: ignore[override]
        return self.table().items()

    def values(self):  # type: ignore[override]
        return self.table().values()

    def value(self, host: str, layer: str, field: int) -> int:
        """``layers[host][layer][field]`` without building the row: ``field`` 0 time_ns, 1 count, 2
        max_ns; 0 where the host has no such layer."""
        cell = self.cells.get(layer, _NO_COLUMN).get(host)
        return 0 if cell is None else cell[field]

    def full(self, layer: str, field: int) -> list[int]:
        """``field`` (0 time_ns, 1 count, 2 max_ns) of ``layer`` for every host in sorted order, 0 where
        a host has no such layer (as ``layers[h].get(layer, {}).get(field_name, 0)``)."""
        col = self.cells.get(layer, _NO_COLUMN)
        if len(col) == len(self._hosts):
            return [v[field] for v in col.values()]
        return [col[h][field] if h in col else 0 for h in self._hosts]


_NO_COLUMN: dict = {}  # a layer no host has (read only)


def layers_of(
    accs: dict[str, dict], wide: bool, colls_of: dict[str, dict] | None = None, columns: CollColumns | None = None
) -> "dict[str, dict[str, dict]] | LayerColumns":
    """The step's layer table: ``layer_table(accs, colls_of)``, or for a ``wide`` step the same held
    column-wise (:class:`LayerColumns`; ``columns``: ``colls_of`` column-wise, :class:`CollColumns`)."""
    return LayerColumns(accs, colls_of, columns) if wide else layer_table(accs, colls_of)


def pytorch_times(layers: "dict | LayerColumns", hosts) -> dict[str, int | None]:
    """``{host: layers[host]["pytorch"]["time_ns"]}`` for each of ``hosts`` (None where the host has no
    pytorch cell): its compute time (ns). ``layers`` may be a :class:`LayerColumns`."""
    if isinstance(layers, LayerColumns):
        col = layers.cells.get(Layer.PYTORCH.value, _NO_COLUMN)
        return {h: (col[h][0] if h in col else None) for h in hosts}
    return {h: layers.get(h, {}).get("pytorch", {}).get("time_ns") for h in hosts}


def _pair_check(key: str, arr: dict[str, tuple], th: Thresholds, last_h: str | None = None) -> str | None:
    """Why the per-host records ``arr`` (``{host: (arrive_rt, unc_ns, op, end_rt, duration_ns)}``) of
    collective ``key`` cannot be one collective, or None when they can. A host's collective lasted
    ``end_rt - arrive_rt`` (both on its own clock; the COLLECTIVE_END ``duration_ns`` when the end is
    unknown). Two checks, neither needs the hosts' clocks to agree beyond their stated uncertainty:
    (1) a rank cannot wait longer than its collective lasted: ``arrival(last) - arrival(h) <=
    lasted(h)``; (2) the paired intervals overlap: no host's collective ended before the last one began.
    Both with a tolerance of the two clocks' uncertainty plus ``pair_slack_ns``. Hosts whose collective has
    no known end or duration are not checked. ``last_h``: the last arriver (latest arrival, then the
    largest name), when the caller knows it."""
    if last_h is None:
        last_h = max(arr, key=lambda h: (arr[h][0], h))
    last_t, last_u = arr[last_h][0], arr[last_h][1]
    slack = last_u + th.pair_slack_ns
    bad = None  # the first host by name that fails (one pass in any order: a wide step has thousands)
    for h, (t, u, _op, end, dur) in arr.items():
        lasted = end - t if end is not None else dur
        if not lasted or lasted <= 0 or h == last_h:
            continue
        if last_t - t > lasted + u + slack and (bad is None or h < bad):
            bad = h
    if bad is None:
        return None
    return _pair_why(bad, arr[bad], last_h, last_t)


def _pair_why(bad: str, rec: tuple, last_h: str, last_t: int) -> str:
    """``_pair_check``'s words for host ``bad`` (its record ``rec``: ``(arrive_rt, unc_ns, op, end_rt,
    duration_ns)``) against the last arriver ``last_h`` (arrival ``last_t``)."""
    t, _u, _op, end, dur = rec
    if end is not None:
        return f"{bad}'s collective ended {(last_t - end) / 1e6:.3f} ms before {last_h}'s began"
    lasted = dur
    return f"{bad} waited {(last_t - t) / 1e6:.3f} ms for {last_h} but its collective lasted {lasted / 1e6:.3f} ms"


def _order_stats(arr: dict[str, tuple]) -> tuple[str, str, str, int]:
    """``(first, second-latest, last, median arrival)`` of the per-host records ``arr`` (``{host:
    (arrive_rt, ...)}``, two or more) as the order by ``(arrival, host)`` gives them (ties break by host
    name; the median as ``median_int``), from one sort of the arrivals (ints) instead of the pairs."""
    return _order_stats_of(list(arr), [v[0] for v in arr.values()])


def _order_stats_of(hs: list[str], ts: list[int]) -> tuple[str, str, str, int]:
    """:func:`_order_stats` of hosts ``hs`` and their arrivals ``ts`` (same order, two or more)."""
    s = sorted(ts)
    n = len(s)
    t_lo, t_hi, t2 = s[0], s[-1], s[-2]
    first = hs[ts.index(t_lo)] if s[1] > t_lo else min(h for h, t in zip(hs, ts) if t == t_lo)
    if t2 < t_hi:
        last = hs[ts.index(t_hi)]
        if n == 2 or s[-3] < t2:
            second = hs[ts.index(t2)]
        else:
            second = max(h for h, t in zip(hs, ts) if t == t2)
    else:  # several at the latest arrival: the two largest names
        tied = sorted(h for h, t in zip(hs, ts) if t == t_hi)
        last, second = tied[-1], tied[-2]
    med = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2  # median_int
    return first, second, last, med


def _order_stats_arr(hs: list[str], ts: list[int], t: np.ndarray) -> tuple[str, str, str, int]:
    """:func:`_order_stats_of` of hosts ``hs`` and their arrivals ``ts`` (ns, three or more) with ``t`` the
    same arrivals as an int64 array (each within +-2**61): one numpy sort instead of Python's, the first
    index of a value by ``argmin``/``argmax``; ties at the first, second-latest or last arrival take
    :func:`_order_stats_of`. The same result."""
    s = np.sort(t)
    n = len(s)
    t_lo, t1, t3, t2, t_hi = (int(x) for x in s[[0, 1, -3, -2, -1]])
    if not (t1 > t_lo and t_hi > t2 > t3):
        return _order_stats_of(hs, ts)
    i2 = int(np.argmax(t == t2))
    lo, hi = int(s[n // 2 - 1]), int(s[n // 2])
    med = hi if n % 2 else (lo + hi) // 2  # median_int
    return hs[int(np.argmin(t))], hs[i2], hs[int(np.argmax(t))], med


def collectives(
    accs: dict[str, dict],
    th: Thresholds = Thresholds(),
    colls_of: dict[str, dict] | None = None,
    columns: CollColumns | None = None,
) -> list[dict]:
    """Per collective seen (COLLECTIVE_BEGIN) by at least two hosts: ``{pg, coll_seq, op, skew_ns,
    uncertainty_ns, last_host, lead_ns, lead_uncertainty_ns, late, consistent, why}`` sorted by (pg,
    coll_seq). ``lead_ns`` is the last arriver's lead over the second-latest arrival (how long it alone kept
    the others waiting) and ``lead_uncertainty_ns`` the summed uncertainty of those two clocks. ``late`` maps
    each host to its arrival minus the median arrival (ns, >= 0 only for the later half). ``consistent``
    is False (and ``why`` says why) when the pairing check (``_pair_check``) fails. Ties break by host
    name. ``colls_of``: per host the collective records to read instead of ``acc.colls`` (the host
    view's, ``ranks.view_colls``); ``columns``: the same records column-wise (:class:`CollColumns`, hosts in
    the order of ``accs``), read instead."""
    accs = as_accs(accs)
    by_key = _by_key(columns) if columns is not None else {}  # key -> (hosts, records, their unc_ns)
    for host, acc in accs.items() if columns is None else ():
        for key, rec in (acc.colls if colls_of is None else colls_of[host]).items():
            if rec[1] is not None:
                v = by_key.get(key)
                if v is None:
                    v = by_key[key] = ([], [], [])
                v[0].append(host)
                v[1].append(rec)
                v[2].append(acc.unc_ns)
    out = []
    for key, (hs, recs, uncs) in by_key.items():
        if len(hs) < 2:
            continue
        pg, _, seq = key.rpartition("#")
        got = _wide_collective(hs, recs, uncs, th) if len(hs) >= WIDE_COLLECTIVE else None
        if got is not None:  # numpy over the hosts' columns
            arr = None
            first, second, last, last_h, late, why = got
        else:
            arr = {h: (r[1], u, r[0], r[2], r[3]) for h, r, u in zip(hs, recs, uncs)}
            first_h, second_h, last_h, med = _order_stats(arr)
            first, second, last = arr[first_h], arr[second_h], arr[last_h]
            why = _pair_check(key, arr, th, last_h)
            late = {h: v[0] - med for h, v in arr.items()}
        out.append(
            {
                "pg": pg,
                "coll_seq": int(seq),
                "op": last[2],
                "skew_ns": last[0] - first[0],
                "uncertainty_ns": last[1] + first[1],
                "last_host": last_h,
                "lead_ns": last[0] - second[0],
                "lead_uncertainty_ns": last[1] + second[1],
                "late": late,
                "consistent": why is None,
                "why": why,
            }
        )
    out.sort(key=lambda c: (c["pg"], c["coll_seq"]))
    return out


def _by_key(columns: CollColumns) -> dict[str, tuple[Sequence[str], Sequence, Sequence[int]]]:
    """``collectives``' ``{key: (hosts, records, their unc_ns)}`` from ``columns``: per key the hosts whose
    record has an arrival, in ``columns.hosts`` order (the columns' lists as they are when all have one)."""
    out: dict[str, tuple[Sequence[str], Sequence, Sequence[int]]] = {}
    hosts, uncs = columns.hosts, columns.uncs
    for key, recs in columns.recs.items():
        if None not in map(_ARRIVE, recs):
            out[key] = (hosts, recs, uncs)
            continue
        keep = [i for i, r in enumerate(recs) if r[1] is not None]
        if keep:
            out[key] = ([hosts[i] for i in keep], [recs[i] for i in keep], [uncs[i] for i in keep])
    return out


WIDE_COLLECTIVE = 64
"""A collective joined by at least this many hosts is read with numpy (``_wide_collective``)."""
_SMALL = 2**61  # arrivals, ends, durations and uncertainties the numpy pairing check takes (no overflow)


def _wide_collective(
    hs: list[str], recs: list, uncs: list[int], th: Thresholds
) -> tuple[tuple, tuple, tuple, str, dict[str, int], str | None] | None:
    """One collective of ``collectives`` from its hosts' columns with numpy: ``(first, second, last, last
    host, late, why)`` (records as ``(arrive_rt, unc_ns, op, end_rt, duration_ns)``), exactly as the
    per-host records give them (:func:`_order_stats_of`, :func:`_pair_check`). ``hs``: the hosts that
    arrived, ``recs`` their records ``[op, arrive_rt, end_rt, duration_ns]``, ``uncs`` their clocks'
    uncertainty (ns). None (the caller takes the per-host records) when a value lies beyond +-2**61 or
    is not an int."""
    ts = list(map(_ARRIVE, recs))
    ends = list(map(_END, recs))
    durs = list(map(_DURATION, recs))
    try:
        t = np.array(ts, dtype=np.int64)
        u = np.array(uncs, dtype=np.int64)
        e_none = None in ends
        e = np.array([0 if x is None else x for x in ends] if e_none else ends, dtype=np.int64)
        d = np.array([0 if x is None else x for x in durs] if None in durs else durs, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return None
    for a in (t, u, e, d):
        if int(np.abs(a).max()) >= _SMALL:
            return None
    first_h, second_h, last_h, med = _order_stats_arr(hs, ts, t) if len(hs) >= 3 else _order_stats_of(hs, ts)
    at = {h: hs.index(h) for h in (first_h, second_h, last_h)}  # the three hosts' indices (hosts are unique)
    i_last = at[last_h]

    def rec(i: int) -> tuple:
        r = recs[i]
        return (r[1], uncs[i], r[0], r[2], r[3])

    last_t = ts[i_last]
    slack = uncs[i_last] + th.pair_slack_ns
    # a host's collective lasted end - arrival (its duration when the end is unknown, an unknown one read
    # as 0); 0 or less: unchecked
    lasted = e - t
    if e_none:
        lasted = np.where(np.array([x is not None for x in ends]), lasted, d)
    bad_mask = (lasted > 0) & (last_t - t > lasted + u + slack)
    bad_mask[i_last] = False
    why = None
    if bad_mask.any():
        bad_i = min(np.flatnonzero(bad_mask).tolist(), key=hs.__getitem__)
        why = _pair_why(hs[bad_i], rec(bad_i), last_h, last_t)
    late = dict(zip(hs, (t - med).tolist()))
    return rec(at[first_h]), rec(at[second_h]), rec(i_last), last_h, late, why


def lateness(accs: dict[str, dict], colls: list[dict], layers: dict) -> dict[str, int]:
    """Per host, how late it was in the step (ns, >= 0): the largest ``late`` over the collectives it
    joined beyond the two clocks' uncertainty (its arrival minus the median arrival); without any
    collective, its compute time minus the median compute time of its peers. Arrivals only: the pairing
    check is not applied here, because the end of an asynchronous collective may be when it was queued
    (the DDP comm hook's future), which fails the check although the pairing is right; the sequential
    test needs the same host late step after step, which a wrong pairing does not give."""
    accs = as_accs(accs)
    good = colls
    out = dict.fromkeys(accs, 0)
    if good:
        for c in good:
            for h, late in c["late"].items():
                if late > c["uncertainty_ns"]:
                    out[h] = max(out[h], late)
        return out
    comp = pytorch_times(layers, accs)
    known = {h: v for h, v in comp.items() if v is not None}
    if len(known) >= 2:
        peers = LeaveOneOut(known.values())
        for h, v in known.items():
            out[h] = max(0, v - peers.median_without(v))
    return out


def find_straggler(accs: dict[str, dict], colls: list[dict], layers: dict, th: Thresholds) -> dict | None:
    """The host that kept the others waiting, or None on a clean step (shape ``{host, score, excess_ns,
    reason, group}``). Only collectives that pass the pairing check count.

    1. ``excess_ns`` = the largest lead (over the second-latest arrival) among the collectives it arrived
       last at with a lead beyond the clock uncertainty;
    2. else (no single host leads: several ranks late together) the last arriver of the collective with the
       largest lateness over the median arrival, that lateness as ``excess_ns``;
    3. without any collective joined across hosts, its compute time minus the median compute time of its
       peers.

    Named when ``excess_ns >= max(straggler_min_ns, straggler_rel * median host step time)``; no baseline
    is needed. ``group`` lists every host at least that late at the straggler's collective (itself
    included) as ``{host, late_ns}``, latest first (one entry when it was late alone). ``score`` = excess
    / median host step time, rounded to 3 places (the fraction of a step the others lost)."""
    accs = as_accs(accs)
    if len(accs) < 2:
        return None
    step_times = [a.step_ns for a in accs.values() if a.step_ns is not None]
    if isinstance(layers, LayerColumns):  # a wide step's columns: no row built
        comp = pytorch_times(layers, accs)
        ref = median_int(step_times) if step_times else median_int([v or 0 for v in comp.values()])
    else:
        ref = (
            median_int(step_times)
            if step_times
            else median_int([layers[h].get("pytorch", {}).get("time_ns", 0) for h in accs])
        )
        comp = {h: layers[h].get("pytorch", {}).get("time_ns") for h in accs}
    floor = max(th.straggler_min_ns, th.straggler_rel * ref)
    good = [c for c in colls if c["consistent"]]
    lead: dict[str, int] = {}
    last_n: dict[str, int] = {}
    for c in good:
        if c["lead_ns"] > c["lead_uncertainty_ns"]:
            h = c["last_host"]
            lead[h] = max(lead.get(h, 0), c["lead_ns"])
            last_n[h] = last_n.get(h, 0) + 1
    group: list[dict] = []
    if good:
        host = min(lead, key=lambda h: (-lead[h], h)) if lead else None
        if host is not None and lead[host] >= floor:
            excess = lead[host]
            at = max((c for c in good if c["last_host"] == host), key=lambda c: c["lead_ns"])
            reason = f"last at {last_n[host]}/{len(good)} collectives, kept peers waiting up to {excess / 1e6:.3f} ms"
        else:
            at = max(good, key=lambda c: (c["late"][c["last_host"]], -c["coll_seq"]))
            host, excess = at["last_host"], at["late"][at["last_host"]]
            if excess <= at["uncertainty_ns"]:
                return None
            reason = (
                f"last at {at['op']} pg={at['pg']} seq={at['coll_seq']}, {excess / 1e6:.3f} ms after the median arrival"
            )
        if excess < floor:
            return None
        group = sorted(
            ({"host": h, "late_ns": v} for h, v in at["late"].items() if v >= floor),
            key=lambda g: (-g["late_ns"], g["host"]),
        )
        if len(group) > 1:
            reason += f"; late group of {len(group)}: " + ", ".join(
                f"{g['host']} +{g['late_ns'] / 1e6:.3f} ms" for g in group
            )
    else:
        known = {h: v for h, v in comp.items() if v is not None}
        if len(known) < 2:
            return None
        loo = LeaveOneOut(known.values())
        excesses = {h: v - loo.median_without(v) for h, v in known.items()}
        host = min(excesses, key=lambda h: (-excesses[h], h))
        excess = excesses[host]
        reason = f"no collectives joined; compute {excess / 1e6:.3f} ms over the peer median"
        if excess < floor:
            return None
    if comp.get(host) is not None:
        peers = [v for h, v in comp.items() if h != host and v is not None]
        if peers and good:
            reason += f"; compute {(comp[host] - median_int(peers)) / 1e6:+.3f} ms vs peer median"
    score = round(excess / ref, 3) if ref > 0 else 0.0
    return {
        "host": host,
        "score": score,
        "excess_ns": excess,
        "reason": reason,
        "group": group or [{"host": host, "late_ns": excess}],
    }


_NO_CELL: dict = {}  # a peer without the layer (read only)


def blame(straggler: str, layers: dict[str, dict[str, dict]], excess_ns: int, th: Thresholds) -> list[dict]:
    """Layer blame for ``straggler``: entries ``{host, layer, excess_ns, straggler_ns, peer_median_ns, count,
    max_ns}``, time-blamed layers by excess (largest first), then count-blamed layers by count excess.

    Per layer L: ``excess = time(straggler, L) - median(time(peer, L))`` (a peer without L counts 0). The
    pytorch layer's excess is what is left after subtracting the positive excesses of the other layers
    (its time is the whole compute time, which includes them). Time-blamed when ``excess >=
    max(blame_min_ns, blame_rel * excess_ns)``; count-blamed (``excess_ns`` 0) when the straggler's count is
    ``>= count_min`` and ``>= count_factor *`` the peers' median count.
    """
    mine = layers.get(straggler, {})
    stats = {}
    if isinstance(layers, LayerColumns):  # a wide step: the peers' medians from the columns
        n_peers = len(layers) - (straggler in layers)
        if not n_peers:
            return []
        for name in sorted(layers.cells):  # every layer some host has
            m = mine.get(name, {"time_ns": 0, "count": 0, "max_ns": 0})
            col = layers.cells[name]
            zeros = n_peers - (len(col) - (straggler in col))  # peers without the layer count 0
            vs = [v for h, v in col.items() if h != straggler] if straggler in col else col.values()
            ts = list(map(_CELL_TIME, vs))
            cs = list(map(_CELL_COUNT, vs))
            pt = median_int(ts + [0] * zeros)
            pc = median_int(cs + [0] * zeros)
            stats[name] = (m, pt, pc, m["time_ns"] - pt)
    else:
        peers = [h for h in layers if h != straggler]
        if not peers:
            return []
        names = sorted(set(mine) | {name for h in peers for name in layers[h]})
        for name in names:
            m = mine.get(name, {"time_ns": 0, "count": 0, "max_ns": 0})
            cells = [layers[h].get(name, _NO_CELL) for h in peers]
            pt = median_int([c.get("time_ns", 0) for c in cells])
            pc = median_int([c.get("count", 0) for c in cells])
            stats[name] = (m, pt, pc, m["time_ns"] - pt)
    lower = sum(max(0, ex) for name, (_m, _pt, _pc, ex) in stats.items() if name != Layer.PYTORCH.value)
    floor = max(th.blame_min_ns, th.blame_rel * excess_ns)
    timed, counted = [], []
    for name, (m, pt, pc, ex) in stats.items():
        if name == Layer.PYTORCH.value:
            ex = max(0, ex - lower)
        entry = {
            "host": straggler,
            "layer": name,
            "excess_ns": ex,
            "straggler_ns": m["time_ns"],
            "peer_median_ns": pt,
            "count": m["count"],
            "max_ns": m["max_ns"],
        }
        if ex >= floor:
            timed.append(entry)
        elif m["count"] >= th.count_min and m["count"] >= th.count_factor * pc:
            counted.append((m["count"] - pc, dict(entry, excess_ns=0)))
    timed.sort(key=lambda e: (-e["excess_ns"], e["layer"]))
    counted.sort(key=lambda ce: (-ce[0], ce[1]["layer"]))
    return timed + [e for _, e in counted]
