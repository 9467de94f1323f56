"""Several ranks per host: the rank rows of the host accumulators, the host view built from them, and the
rank each host-level finding names (docs/ANALYSIS.md "Several ranks per host").

A host accumulator keeps one rank row per registered training process of the host (``accumulate``,
``acc.ranks``: ``{"<global rank>": RankRow}``; a row has the fields of a host accumulator plus ``pid``,
``local_rank`` and ``gpu``; packed, ``acc.rb`` and its ``acc.rt`` table). Two views are built from them:

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

import bisect
import operator
from collections.abc import Iterator, Mapping

import msgspec
import numpy as np

from obshub.streams import accumulate
from obshub.streams.accumulate import HostAcc, RankTable, StepAcc, as_accs
from obshub.streams.analysis.straggler import CollColumns, lateness, layer_table
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


def multi_rank(accs: dict[str, HostAcc]) -> bool:
    """Whether some host of ``accs`` has at least two rank rows."""
    accs = as_accs(accs)
    return any(accumulate.rank_count(a) >= 2 for a in accs.values())


def rank_units(accs: dict[str, HostAcc]) -> dict[str, StepAcc]:
    """``{"<host>#<rank>": RankRow}``: every rank row of every host, with its host's clock uncertainty
    (a rank row has no ``net``: links are per host). A copy of a row only where the uncertainty changes."""
    accs = as_accs(accs)
    out: dict[str, StepAcc] = {}
    for h, a in accs.items():
        hu = a.unc_ns or 0
        for r, row in accumulate.rank_rows(a).items():
            if hu > (row.unc_ns or 0):
                row = msgspec.structs.replace(row, unc_ns=hu)
            out[unit_key(h, r)] = row
    return out


def host_view(accs: dict[str, HostAcc], strict: bool = False) -> dict[str, HostAcc]:
    """``accs`` with every host of two or more rank rows seen through its ranks: its arrival at each
    collective is its last rank's (``[op, arrive_rt, end_rt, duration_ns]`` of that rank's record). With
    ``strict`` (the hang check), a collective one of its ranks has not reached has no arrival, and its
    ``step_ns`` is None until every rank row has one. Other hosts are returned as they are (no copy)."""
    accs = as_accs(accs)
    out = {}
    for h, a in accs.items():
        if a.rb is None and len(a.ranks or ()) < 2:
            out[h] = a
            continue
        rt = a.rt if a.rb is not None else None
        if rt is not None:  # the packed rank table (accumulate.pack_ranks): no rank row decoded
            if accumulate.column_len(rt.r) < 2:
                out[h] = a
            else:
                out[h] = _view_of_table(a, rt, strict)
            continue
        rows = accumulate.rank_rows(a)
        if len(rows) < 2:
            out[h] = a
            continue
        if not strict:
            out[h] = msgspec.structs.replace(a, colls=_last_arrivals(a.colls, rows))
            continue
        colls: dict[str, list] = {}
        for key in a.colls:
            recs = [row.colls.get(key) for row in rows.values()]
            have = [c for c in recs if c is not None and c[1] is not None]
            if not have or (strict and len(have) < len(recs)):
                colls[key] = [a.colls[key][0], None, None, None]
                continue
            colls[key] = list(max(have, key=lambda c: c[1]))
        v = msgspec.structs.replace(a, colls=colls)
        if strict and any(row.step_ns is None for row in rows.values()):
            v.step_ns = None
        out[h] = v
    return out


def view_colls(accs: dict[str, HostAcc]) -> dict[str, dict[str, list]]:
    """``{host: collective records}``: the ``colls`` of each host's :func:`host_view` (not strict),
    without copying the accumulators: a packed rank table's records (``RankTable.hv``) are used as they
    are (read only), so a wide step does not copy 2,048 accumulators to change one field."""
    return view_columns(accs)[0]


def view_columns(accs: dict[str, HostAcc]) -> tuple[dict[str, dict[str, list]], CollColumns | None]:
    """``(view_colls(accs), columns)``: the same records also held column-wise (``straggler.CollColumns``,
    hosts in the order of ``accs``, for ``collectives``, ``compute_many`` and ``LayerColumns``) when every
    host's records are its packed rank table's (two or more ranks) with the same collective keys in the
    same order (a wide step of several ranks per host: one transposition of the n hosts' k records);
    else ``columns`` is None."""
    accs = as_accs(accs)
    out: dict[str, dict | RankTable] = {}  # a packed table's records are zipped with its keys at the end
    keys: list[str] | None = None
    hvs: list[list] | None = []
    for h, a in accs.items():
        rt = a.rt if a.rb is not None else None
        if rt is not None and accumulate.column_len(rt.r) >= 2:
            out[h] = rt
            if hvs is not None:
                if keys is None:
                    keys = rt.k
                if rt.k == keys:
                    hvs.append(rt.hv)
                else:
                    hvs = None
            continue
        hvs = None
        if a.rb is None and len(a.ranks or ()) < 2:
            out[h] = a.colls
        else:
            out[h] = host_view({h: a})[h].colls
    if not hvs or keys is None or len(set(keys)) != len(keys):
        return {h: dict(zip(v.k, v.hv)) if isinstance(v, RankTable) else v for h, v in out.items()}, None
    return ViewColls(keys, dict(zip(out, hvs))), CollColumns(
        list(accs), [a.unc_ns for a in accs.values()], dict(zip(keys, zip(*hvs)))
    )


class ViewColls(Mapping):
    """:func:`view_columns`' per-host records of a wide step whose hosts all share the collective keys
    ``keys`` (k strings): ``{host: {key: record}}`` as ``view_colls`` gives it, each host's dict built when
    first read (and kept) from ``hvs`` (host -> its k records ``[op, arrive_rt, end_rt, duration_ns]``, in
    ``keys`` order, hosts in the accumulators' order). The step's readers take its columns
    (``straggler.CollColumns``) and read a few hosts' records here (the rows ``compact`` keeps): 2,048 dicts
    built per step would be ~1 ms of a 2,048 x 8 close. Read only."""

    __slots__ = ("_keys", "_hvs", "_built")

    def __init__(self, keys: list[str], hvs: dict[str, list]) -> None:
        self._keys, self._hvs = keys, hvs
        self._built: dict[str, dict[str, list]] = {}

    def __getitem__(self, host: str) -> dict[str, list]:
        v = self._built.get(host)
        if v is None:
            v = self._built[host] = dict(zip(self._keys, self._hvs[host]))  # KeyError: no such host
        return v

    def __contains__(self, host: object) -> bool:
        return host in self._hvs

    def __iter__(self) -> Iterator[str]:
        return iter(self._hvs)

    def __len__(self) -> int:
        return len(self._hvs)


def _view_of_table(a: HostAcc, rt: RankTable, strict: bool) -> HostAcc:
    """:func:`host_view` of host accumulator ``a`` from its rank table ``rt`` (``accumulate.rank_table_of``,
    two or more ranks): the same view as from its full rank rows."""
    keys = rt.k
    if not strict:
        return msgspec.structs.replace(a, colls=dict(zip(keys, map(list, rt.hv))))
    rt = accumulate.table_lists(rt)  # packed columns as lists (the hang check: an open step, now and then)
    n = len(keys)
    arr, end, dur = rt.a, rt.e, rt.d
    colls: dict[str, list] = {}
    for i, key in enumerate(keys):
        col = arr[i::n]
        if None in col:  # a rank has not arrived (or has no record of it)
            colls[key] = [a.colls[key][0], None, None, None]
            continue
        t = max(col)
        j = col.index(t) * n + i  # the first rank of the latest arrival, as max over the rows gives
        colls[key] = [a.colls[key][0], t, end[j], dur[j]]
    v = msgspec.structs.replace(a, colls=colls)
    if None in rt.s:
        v.step_ns = None
    return v


def _last_arrivals(host_colls: dict[str, list], rows: dict[str, StepAcc]) -> dict[str, list]:
    """The host view's collectives of a host (:func:`host_view`, not strict): per collective of
    ``host_colls``, a copy of the record of its rank that arrived last (the first such rank row on a
    tie), ``[op, None, None, None]`` when none of its ranks arrived. One pass over the rank rows."""
    best: dict[str, list] = {}
    for row in rows.values():
        for key, c in row.colls.items():
            t = c[1]
            if t is not None:
                b = best.get(key)
                if b is None or t > b[1]:
                    best[key] = c
    out = {}
    for key, c in host_colls.items():
        b = best.get(key)
        out[key] = list(b) if b is not None else [c[0], None, None, None]
    return out


def rank_lateness(units: dict[str, StepAcc]) -> tuple[dict[str, int], dict[str, int]]:
    """``(late, last_n)`` of the rank units: ``late[u]`` = the unit's largest arrival after the median
    arrival of all units at a collective, when beyond the uncertainty of the first and the last arrival's
    clocks (``straggler.lateness``'s rule, without building the per-collective records: a wide job has
    16,384 ranks); ``last_n[u]`` = the collectives it arrived last at by more than the summed uncertainty
    of its clock and the second-latest's. Without any collective joined by two units, lateness is the
    compute time over the median of the other units' (``straggler.lateness``). Ties at the first, second
    and last arrival break by unit key (as sorting ``(arrival, key)`` pairs orders them)."""
    units = as_accs(units)
    keys = list(units)
    unc = [units[u].unc_ns for u in keys]
    late_i, last_i, seen = _lateness_by_index([units[u].colls for u in keys], unc, keys.__getitem__)
    if not seen:
        layers = layer_table(units)
        return lateness(units, [], layers), {}
    return dict(zip(keys, late_i)), {keys[i]: n for i, n in last_i.items()}


def _only(ts: list[int], ids: list[int], t: int, unique: bool, pick, key) -> int:
    """The unit index of arrival ``t`` in ``ts`` (``ids``: their units); among several, ``pick`` (min or
    max) by ``key``."""
    if unique:
        return ids[ts.index(t)]
    return pick((ids[j] for j in range(len(ts)) if ts[j] == t), key=key)


def _lateness_by_index(colls: list[dict], unc: list[int], key_of) -> tuple[list[int], dict[int, int], bool]:
    """:func:`rank_lateness` over units given by index: ``colls[i]`` unit i's collective records, ``unc[i]``
    its clock uncertainty (ns), ``key_of(i)`` its key (breaks ties). Returns ``(late per index (ns),
    {index: last_n}, whether some collective was joined by two units)`` (:func:`_lateness_flat`)."""
    flat: dict[str, tuple[list[int], list[int]]] = {}  # collective -> (arrivals, their unit indices)
    for i, cs in enumerate(colls):
        for key, c in cs.items():
            t = c[1]
            if t is not None:
                v = flat.get(key)
                if v is None:
                    flat[key] = ([t], [i])
                else:
                    v[0].append(t)
                    v[1].append(i)
    return _lateness_flat(flat, len(colls), unc, key_of)


def _lateness_flat(
    flat: dict[str, tuple[list[int], list[int]]], n_units: int, unc: list[int], key_of
) -> tuple[list[int], dict[int, int], bool]:
    """The lateness of ``n_units`` units from ``flat``: per collective, the arrivals (CLOCK_REALTIME ns)
    and the unit index of each (indices ascending within a collective is not required). Per collective a
    sort of its arrival times (ints) for the median and a scan for the units beyond it: O(units x
    collectives) Python steps and no per-arrival tuple (a wide job has 16,384 ranks)."""
    late = [0] * n_units
    last_n: dict[int, int] = {}
    seen = False
    for ts, ids in flat.values():
        n = len(ts)
        if n < 2:
            continue
        seen = True
        s = sorted(ts)
        med = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2
        t_lo, t_hi, t2 = s[0], s[-1], s[-2]
        first = _only(ts, ids, t_lo, s[1] > t_lo, min, key_of)
        last = _only(ts, ids, t_hi, t_hi > t2, max, key_of)
        thr = med + unc[first] + unc[last]
        if t_hi > thr:
            for j in [j for j, t in enumerate(ts) if t > thr]:
                d = ts[j] - med
                i = ids[j]
                if d > late[i]:
                    late[i] = d
        if t_hi > t2:
            second = _only(ts, ids, t2, n == 2 or s[-3] < t2, max, key_of)
            if t_hi - t2 > unc[last] + unc[second]:
                last_n[last] = last_n.get(last, 0) + 1
    return late, last_n, seen


def _summary_row(cols: "_Columns", i: int, late: int, last: int) -> dict:
    """The summary row of unit ``i`` of ``cols`` (:class:`_Columns`), its ``layers`` empty."""
    return {
        "local_rank": _item(cols.l, i),
        "pid": _item(cols.p, i),
        "gpu": _item(cols.g, i),
        "step_ns": cols.s[i],
        "late_ns": late,
        "last_n": last,
        "layers": {},
    }


def _item(col: list | np.ndarray, i: int):
    """``col[i]`` of a :class:`_Columns` column, an int64 array's element as a Python int (``tolist``'s)."""
    v = col[i]
    return v.item() if type(v) is np.int64 else v


class _Columns:
    """Per unit (rank) of a step, in unit order (host after host, each host's ranks in its table's order):
    ``r`` global rank, ``p`` pid, ``l`` local rank, ``g`` GPU index, ``s`` step_ns (None before its
    STEP_END), ``u`` clock uncertainty (ns), all lists of ints; ``ua``: ``u`` as an int64 array when the
    columns were read packed (:func:`_packed_columns`), else None. Read packed, ``p``, ``l`` and ``g`` are
    int64 arrays (a wide step reads them for the few rows it keeps: :func:`_item`) and ``u`` is None (``ua``
    has it)."""

    __slots__ = ("r", "p", "l", "g", "s", "u", "ua")

    def __init__(
        self,
        r: list,
        p: list | np.ndarray,
        l: list | np.ndarray,  # noqa: E741
        g: list | np.ndarray,
        s: list,
        u: list | None,
        ua: np.ndarray | None = None,
    ):
        self.r, self.p, self.l, self.g, self.s, self.u, self.ua = r, p, l, g, s, u, ua


def _host_table(a: HostAcc) -> tuple[RankTable, list[str], list] | None:
    """``(table, keys, arrivals)`` of the rank rows of host accumulator ``a``, None without any: ``table``
    (its columns as lists, ``accumulate.table_lists``) has the per-rank lists ``r``, ``p``, ``l``, ``g``, ``s``, ``u`` of ``accumulate.rank_table_of`` (the
    packed table when there is one: nothing decoded), ``keys`` the host's collective keys and
    ``arrivals`` their arrival per rank then per key (index ``rank_index * len(keys) + key_index``,
    CLOCK_REALTIME ns, None when the rank has no arrival there), as ``RankTable.a``."""
    rt = accumulate.rank_table(a)
    if rt is not None:
        rt = accumulate.table_lists(rt)
        return rt, rt.k, rt.a
    rows = accumulate.rank_rows(a)
    if not rows:
        return None
    vals = list(rows.values())
    t = RankTable(
        r=[int(r) for r in rows],
        p=[row.pid for row in vals],
        l=[row.local_rank for row in vals],
        g=[row.gpu for row in vals],
        s=[row.step_ns for row in vals],
        u=[row.unc_ns or 0 for row in vals],
    )
    cols: dict[str, list] = {}
    for j, row in enumerate(vals):
        for key, c in row.colls.items():
            cols.setdefault(key, [None] * len(vals))[j] = c[1]
    keys = list(cols)
    return t, keys, [cols[k][j] for j in range(len(vals)) for k in keys]


_NONE = accumulate.PACKED_NONE
"""The arrival matrix's mark of "no arrival" (int64's minimum: no CLOCK_REALTIME arrival is that far
before 1970), the packed rank table's mark of None too, so packed arrivals are the matrix as they are."""
_BOUND = 2**62
"""Arrivals (ns) the matrix takes: within +-2**62 (until the year 2116), so that the difference of two fits
int64."""


def _arrival_matrix(blocks: list[tuple[int, list[str], list]], n_units: int) -> tuple[list[str], np.ndarray] | None:
    """``(collective keys, matrix)``: the arrivals of ``n_units`` units as an int64 array of shape (units,
    collectives) (CLOCK_REALTIME ns, ``_NONE`` where a unit has none), the columns in the order the
    collectives first appear. ``blocks``: per host ``(first unit index, its keys, its arrivals rank-major)``
    (:func:`_host_table`), the hosts' units consecutive. Consecutive hosts with the same keys (the usual
    case: every rank joins the same collectives) are converted as one array. None when an arrival does not
    fit in int64 or lies beyond ``_BOUND``."""
    col: dict[str, int] = {}
    for _start, keys, _a in blocks:
        for k in keys:
            if k not in col:
                col[k] = len(col)
    mat = np.full((n_units, len(col)), _NONE, dtype=np.int64)
    i = 0
    try:
        while i < len(blocks):
            start, keys, _a = blocks[i]
            j = i + 1
            while j < len(blocks) and blocks[j][1] == keys:
                j += 1
            flat: list = []
            for _s, _k, a in blocks[i:j]:
                flat += a
            if None in flat:
                flat = [_NONE if x is None else x for x in flat]
            end = blocks[j][0] if j < len(blocks) else n_units
            if keys:
                block = np.array(flat, dtype=np.int64).reshape(end - start, len(keys))
                cols = [col[k] for k in keys]
                if cols == list(range(len(col))):
                    mat[start:end] = block
                else:
                    mat[start:end, cols] = block
            i = j
    except (OverflowError, TypeError, ValueError):
        return None
    present = mat[mat != _NONE]
    if present.size and (int(present.min()) <= -_BOUND or int(present.max()) >= _BOUND):
        return None  # differences of such arrivals could overflow int64: the exact Python ints instead
    return list(col), mat


def _flat_of(blocks: list[tuple[int, list[str], list]]) -> dict[str, tuple[list[int], list[int]]]:
    """``{collective: (arrivals, unit indices)}`` of ``blocks`` (:func:`_arrival_matrix`), for
    :func:`_lateness_flat`."""
    flat: dict[str, tuple[list[int], list[int]]] = {}
    for start, keys, a in blocks:
        n = len(keys)
        for i, key in enumerate(keys):
            v = flat.setdefault(key, ([], []))
            for j, x in enumerate(a[i::n]):
                if x is not None:
                    v[0].append(x)
                    v[1].append(start + j)
    return flat


def _lateness_matrix(
    km: tuple[list[str], np.ndarray], unc: list[int], key_of
) -> tuple[list[int], dict[int, int], bool]:
    """:func:`_lateness_flat` over the arrival matrix ``km`` (:func:`_arrival_matrix`) with numpy: per
    collective a partial sort (``np.partition`` at the ranks the rule reads: first, second, median, the
    last three) and vectorised comparisons instead of Python loops over 16,384 ranks. The same results
    (ints, ns): the median of an even count is the floor of the mean of the two middle arrivals, ties at
    the first, second and last arrival break by ``key_of`` as there."""
    _keys, mat = km
    n_units = mat.shape[0]
    late = np.zeros(n_units, dtype=np.int64)
    last_n: dict[int, int] = {}
    seen = False
    every = None
    for c in range(mat.shape[1]):
        col = mat[:, c]
        present = col != _NONE
        n = int(np.count_nonzero(present))
        if n < 2:
            continue
        seen = True
        if n == n_units:
            if every is None:
                every = np.arange(n_units)
            ts, ids = col, every
        else:
            ids = np.flatnonzero(present)
            ts = col[ids]
        kth = sorted({0, 1, n // 2 - 1 if n > 2 else 0, n // 2, max(0, n - 3), n - 2, n - 1})
        s = np.partition(ts, kth)
        med = int(s[n // 2]) if n % 2 else (int(s[n // 2 - 1]) + int(s[n // 2])) // 2
        t_lo, t_hi, t2 = int(s[0]), int(s[n - 1]), int(s[n - 2])
        if int(s[1]) > t_lo:
            first = int(ids[int(np.argmin(ts))])
        else:
            first = min((int(i) for i in ids[ts == t_lo]), key=key_of)
        if t_hi > t2:
            last = int(ids[int(np.argmax(ts))])
        else:
            last = max((int(i) for i in ids[ts == t_hi]), key=key_of)
        thr = med + unc[first] + unc[last]
        if t_hi > thr:
            over = ts > thr
            j = ids[over]
            late[j] = np.maximum(late[j], ts[over] - med)
        if t_hi > t2:
            if n == 2 or int(s[n - 3]) < t2:
                second = int(ids[int(np.flatnonzero(ts == t2)[0])])
            else:
                second = max((int(i) for i in ids[ts == t2]), key=key_of)
            if t_hi - t2 > unc[last] + unc[second]:
                last_n[last] = last_n.get(last, 0) + 1
    return late.tolist(), last_n, seen


def _unit_unc(us: list[int] | np.ndarray, hus: list[int], spans: list[tuple[str, int, int, RankTable]]) -> list[int]:
    """Per unit (rank), the clock uncertainty its arrivals carry (ns): the larger of its own (``us``: ints,
    or an int64 array) and its host's (``hus``, per host of ``spans``)."""
    try:
        sizes = [end - start for _h, start, end, _t in spans]
        return np.maximum(np.array(us, dtype=np.int64), np.repeat(np.array(hus, dtype=np.int64), sizes)).tolist()
    except OverflowError:  # beyond int64 (bad input): exact ints
        return [u if u > hu else hu for (_h, start, end, _t), hu in zip(spans, hus) for u in us[start:end]]


def _latest_of_hosts(late: list[int], spans: list[tuple[str, int, int, RankTable]]) -> list[int]:
    """Per host of ``spans`` (``(host, first unit index, end index, table)``, consecutive), the unit index
    of its one latest rank by ``late`` (ns per unit), -1 where several share the largest lateness. With
    numpy when every host has as many ranks (one reshape), else per host."""
    sizes = {end - start for _h, start, end, _t in spans}
    if len(sizes) == 1 and spans[0][1] == 0:
        m = sizes.pop()
        try:
            mat = np.array(late, dtype=np.int64).reshape(len(spans), m)
        except OverflowError:  # lateness of arrivals beyond int64 (the Python lists' exact ints)
            mat = None
        if mat is not None:
            top = mat.max(axis=1)
            ties = np.count_nonzero(mat == top[:, None], axis=1)
            best = mat.argmax(axis=1) + np.arange(0, len(spans) * m, m)
            return np.where(ties == 1, best, -1).tolist()
    out = []
    for _h, start, end, _t in spans:
        lt = late[start:end]
        top = max(lt)
        out.append(start + lt.index(top) if lt.count(top) == 1 else -1)
    return out


def host_ranks(
    accs: dict[str, HostAcc],
    th: Thresholds = Thresholds(),
    layers_for: set[str] | None = None,
    rows_for: set[str] | None = None,
) -> dict[str, dict]:
    """Per host with a known rank, the rank its host-level findings name and every rank's row for the
    summary: ``{host: {"rank": int, "rows": {rank: row}}}`` where a summary row is ``{local_rank, pid,
    gpu, step_ns, late_ns, last_n, layers: {layer: {time_ns, count, max_ns}}}`` (``late_ns``, ``last_n``:
    :func:`rank_lateness` over all ranks of the step). The named rank is the host's latest (largest
    ``late_ns``), then the one of the longest step, then the lowest rank. ``layers_for``: the hosts whose
    rows get their ``layers`` (None: every host; a wide step fills the kept hosts' later,
    :func:`fill_layers`). ``rows_for``: the hosts that get every rank's row (None: every host); the others
    get their named rank's row only until :func:`fill_rows` completes them (a wide step keeps the rows of
    a few hosts: 16,384 rows would cost more than the rest of the summary). A host without rank rows but
    with a single known rank (``acc.rank = [rank, local_rank, pid]``) names that rank (no rows). ``th``
    is unused (the thresholds of the host view apply). Reads a packed accumulator's rank table
    (``accumulate.pack_ranks``) and decodes no rank row, except the layers' (:func:`fill_layers`) and a
    step without any collective joined by two ranks."""
    accs = as_accs(accs)
    tables: list[tuple[str, HostAcc, RankTable, list[str], list | bytes]] = []  # (host, acc, table, keys, arrivals)
    for h, a in accs.items():
        t = a.rt if a.rb is not None else None  # the packed rank table (the usual case), else built
        if t is not None:
            keys, flat_a = t.k, t.a
        else:
            ht = _host_table(a)
            if ht is None:
                continue
            t, keys, flat_a = ht
        tables.append((h, a, t, keys, flat_a))
    out: dict[str, dict] = {}
    n_units = 0
    if tables:
        hus = [a.unc_ns or 0 for _h, a, _t, _k, _a in tables]  # per host, its clock uncertainty (ns)
        packed = all([type(t.r) is bytes and type(t.a) is bytes for _h, _a, t, _k, _a2 in tables])  # is_packed
        got = _packed_columns(tables) if packed else None
        if got is not None:  # every table packed (the usual case): one frombuffer per column
            cols, sizes, mat = got
        else:  # a table of int lists (an older worker's, a value beyond int64): the lists
            tl = [accumulate.table_lists(t) for _h, _a, t, _k, _a2 in tables]
            cols = _Columns(*([x for t in tl for x in getattr(t, c)] for c in ("r", "p", "l", "g", "s", "u")))
            sizes = [len(t.r) for t in tl]
            mat = None
        spans: list[tuple[str, int, int, RankTable]] = []  # (host, first index, end index, table) of its ranks
        blocks: list[tuple[int, list[str], list]] = []  # (first index, collective keys, arrivals rank-major)
        for (h, _a, t, keys, flat_a), m in zip(tables, sizes):
            spans.append((h, n_units, n_units + m, t))
            if mat is None:
                blocks.append((n_units, keys, accumulate.column(flat_a)))
            n_units += m
    if n_units:
        rkeys = cols.r
        unc = _unit_unc(cols.u if cols.ua is None else cols.ua, hus, spans)  # the array: no list to convert
        starts = [sp[1] for sp in spans]

        def key_of(i: int) -> str:  # the unit key of unit i (ties break by it)
            return unit_key(spans[bisect.bisect_right(starts, i) - 1][0], rkeys[i])

        if mat is None:
            mat = _arrival_matrix(blocks, n_units)
        elif mat is False:  # packed arrivals beyond _BOUND: the per-collective lists
            blocks = [(sp[1], k, accumulate.column(fa)) for sp, (_h, _a, _t, k, fa) in zip(spans, tables)]
            mat = None
        if mat is not None:
            late_i, last_i, seen = _lateness_matrix(mat, unc, key_of)
        else:  # an arrival beyond int64: the per-collective lists
            late_i, last_i, seen = _lateness_flat(_flat_of(blocks), n_units, unc, key_of)
        if not seen:  # no collective joined by two ranks: compute time over the others' (rank_lateness)
            late_u, last_u = rank_lateness(rank_units(accs))
            keys = [key_of(i) for i in range(n_units)]
            late_i = [int(late_u.get(k, 0)) for k in keys]
            last_i = {i: last_u[k] for i, k in enumerate(keys) if k in last_u}
        latest = _latest_of_hosts(late_i, spans)
        if rows_for is not None and not rows_for and layers_for is not None and not layers_for:
            # a wide step: each host's entry is built when read (the few hosts the summary names)
            lazy = LazyNamed(spans, latest, late_i, last_i, cols)
            for h, a in accs.items():
                one = a.rank  # None for a host of several ranks (all of them in lazy): no lookup
                if one and h not in lazy:
                    lazy.put(h, {"rank": int(one[0]), "rows": {}})
            return lazy  # type: ignore[return-value]
        steps, ranks = cols.s, cols.r
        for (h, start, end, _t), best in zip(spans, latest):
            if best >= 0:  # one latest rank (the usual case): no tie to break
                rank = ranks[best]
            else:
                _l, _s, rank, best = min([(-late_i[i], -(steps[i] or 0), ranks[i], i) for i in range(start, end)])
            if rows_for is None or h in rows_for:
                order = sorted((ranks[i], i) for i in range(start, end))
                rows_out = {r: _summary_row(cols, i, int(late_i[i]), last_i.get(i, 0)) for r, i in order}
                out[h] = {"rank": rank, "rows": rows_out}
            else:  # the named rank's row; fill_rows completes the others from "_late"
                row = _summary_row(cols, best, int(late_i[best]), last_i.get(best, 0))
                out[h] = {"rank": rank, "rows": {rank: row}, "_late": (late_i, last_i, start, end, cols)}
        fill_layers(out, accs, set(out) if layers_for is None else layers_for)
    for h, a in accs.items():
        one = a.rank
        if h not in out and one:
            out[h] = {"rank": int(one[0]), "rows": {}}
    return out


def _named_entry(late_i: list[int], last_i: dict[int, int], cols: _Columns, start: int, end: int, best: int) -> dict:
    """:func:`host_ranks`' entry of a host whose ranks are units ``start..end-1`` (``best``: its one latest
    rank's unit, -1 on a tie) when its rows are left to :func:`fill_rows`: ``{"rank", "rows": {rank:
    named rank's row}, "_late"}``."""
    best = _named_unit(late_i, cols, start, end, best)
    rank = cols.r[best]
    row = _summary_row(cols, best, int(late_i[best]), last_i.get(best, 0))
    return {"rank": rank, "rows": {rank: row}, "_late": (late_i, last_i, start, end, cols)}


def _named_unit(late_i: list[int], cols: _Columns, start: int, end: int, best: int) -> int:
    """The unit of the rank :func:`host_ranks` names on a host whose ranks are units ``start..end-1``:
    ``best`` (its one latest rank's unit) when it is not -1 (a tie), else the latest, then the one of the
    longest step, then the lowest rank."""
    if best < 0:
        steps, ranks = cols.s, cols.r
        _l, _s, _rank, best = min([(-late_i[i], -(steps[i] or 0), ranks[i], i) for i in range(start, end)])
    return best


class LazyNamed(Mapping):
    """:func:`host_ranks`' result for a wide step (no host's rows nor layers asked for): the same
    ``{host: {"rank", "rows", "_late"}}`` entries, each built when first read (and kept, so a change to it
    stays), instead of 2,048 entries of which a summary reads a few dozen (the straggler, blame,
    evidence and the hosts ``compact`` keeps). ``spans``/``latest``/``late_i``/``last_i``/``cols``: as in
    :func:`host_ranks`."""

    def __init__(self, spans: list, latest: list[int], late_i: list[int], last_i: dict[int, int], cols: _Columns):
        self._at = {sp[0]: (sp[1], sp[2], best) for sp, best in zip(spans, latest)}  # host -> (start, end, best)
        self._late, self._last, self._cols = late_i, last_i, cols
        self._built: dict[str, dict] = {}

    def put(self, host: str, entry: dict) -> None:
        """Add ``host``'s entry as it is (a host without a rank table)."""
        self._built[host] = entry

    def rank_of(self, host: str) -> int | None:
        """``self[host]["rank"]`` (None where ``host`` has no entry) without building the entry: the
        summary's evidence names the rank of each of hundreds of hosts whose rows it does not keep."""
        v = self._built.get(host)
        if v is not None:
            return v["rank"]
        at = self._at.get(host)
        if at is None:
            return None
        start, end, best = at
        return self._cols.r[_named_unit(self._late, self._cols, start, end, best)]

    def __getitem__(self, host: str) -> dict:
        v = self._built.get(host)
        if v is None:
            start, end, best = self._at[host]  # KeyError: no such host
            v = self._built[host] = _named_entry(self._late, self._last, self._cols, start, end, best)
        return v

    def __contains__(self, host: object) -> bool:
        return host in self._at or host in self._built

    def __iter__(self) -> Iterator[str]:
        yield from self._at
        yield from (h for h in self._built if h not in self._at)

    def __len__(self) -> int:
        return len(self._at) + sum(1 for h in self._built if h not in self._at)


def _packed_columns(
    tables: list[tuple[str, HostAcc, RankTable, list[str], list | bytes]],
) -> tuple[_Columns, list[int], tuple[list[str], np.ndarray] | bool] | None:
    """``(columns, ranks per host, arrival matrix)`` of packed rank tables (``accumulate.pack_column``):
    each column of every host joined and read with one ``numpy.frombuffer``; the matrix as
    :func:`_arrival_matrix` makes it (the packed mark of None is its ``_NONE``), False when an arrival lies
    beyond ``_BOUND``. None when the columns disagree on the ranks' count (a damaged record: the lists)."""
    cols = {}
    tl = [t for _h, _a, t, _k, _fa in tables]
    try:
        for c in ("r", "p", "l", "g", "s", "u"):
            cols[c] = np.frombuffer(b"".join(map(operator.attrgetter(c), tl)), dtype="<i8")
    except (TypeError, ValueError):  # a column not packed, or not of whole int64s: the lists
        return None
    n_units = len(cols["r"])
    if any(len(v) != n_units for v in cols.values()):
        return None
    sizes = [len(t.r) // 8 for t in tl]
    runs: list[tuple[int, int, list[str]]] = []  # (first table, end, keys) of consecutive tables of the same keys
    i = 0
    while i < len(tables):
        keys = tables[i][3]
        j = i + 1
        while j < len(tables) and tables[j][3] == keys:  # the usual case: every host joined the same collectives
            j += 1
        runs.append((i, j, keys))
        i = j
    col: dict[str, int] = {}
    for _i, _j, keys in runs:
        for k in keys:
            if k not in col:
                col[k] = len(col)
    mat = np.full((n_units, len(col)), _NONE, dtype=np.int64)
    start = 0
    for i, j, keys in runs:
        m = sum(sizes[i:j])
        if keys:
            try:
                block = np.frombuffer(b"".join([fa for _h, _a, _t, _k, fa in tables[i:j]]), dtype="<i8")
            except (TypeError, ValueError):
                return None
            if block.size != m * len(keys):
                return None
            block = block.reshape(m, len(keys))
            cs = [col[k] for k in keys]
            if cs == list(range(len(col))):
                mat[start : start + m] = block
            else:
                mat[start : start + m, cs] = block
        start += m
    present = mat[mat != _NONE]
    matrix: tuple[list[str], np.ndarray] | bool = (list(col), mat)
    if present.size and (int(present.min()) <= -_BOUND or int(present.max()) >= _BOUND):
        matrix = False
    s = cols["s"]
    steps = s.tolist()
    if (s == _NONE).any():
        steps = [None if x == _NONE else x for x in steps]
    columns = _Columns(cols["r"].tolist(), cols["p"], cols["l"], cols["g"], steps, None, cols["u"])
    return columns, sizes, matrix


def fill_rows(named: dict[str, dict], accs: dict[str, HostAcc], hosts: set[str]) -> None:
    """Complete the rank rows of ``hosts`` in ``named`` (:func:`host_ranks` with ``rows_for``: a host
    outside it got its named rank's row only) with every rank's row, as ``host_ranks`` without
    ``rows_for`` makes them; ``layers`` stay empty (:func:`fill_layers`). ``accs`` is unused (the columns
    kept by ``host_ranks`` have what the rows need)."""
    for h in hosts:
        v = named.get(h)
        pend = v.pop("_late", None) if v else None
        if pend is None:
            continue
        late_i, last_i, start, end, cols = pend  # the host's ranks are units start..end-1
        order = sorted((cols.r[i], i) for i in range(start, end))
        v["rows"] = {r: _summary_row(cols, i, int(late_i[i]), last_i.get(i, 0)) for r, i in order}


def fill_layers(named: dict[str, dict], accs: dict[str, HostAcc], hosts: set[str]) -> None:
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
