"""The hits of one alert group within a rule's ``window``, with running aggregates.

A hit is ``(t_ns, value)``. The window keeps its hits ordered by time (an out-of-order hit is inserted
in place) and maintains, as hits arrive and age out, the running sum and count, and for ``max``/``min``
a monotonic queue (the candidates for the extreme, front = current extreme; the sliding-window maximum
of Lemire, "Streaming maximum-minimum filter using no more than three comparisons per element", 2006).
Adding a hit and pruning cost O(1) amortised instead of a pass over every hit of the window.

Aggregates: ``count`` (number of hits), ``sum``, ``avg``, ``max``, ``min`` of the values, ``cusum`` (Page's
one-sided CUSUM of the values in time order, ``rules.engine.cusum``), ``incidents`` (the runs of consecutive
integers among the distinct values, a run of L values counting ceil(L / 2): hits whose values are a job's
step numbers N, N+1 count once, so one stall that spans or is carried into the next step is one incident,
and a fault stalling step after step counts one per two steps; a value repeated counts once); 0.0 for an
empty window. ``incidents`` keeps a count per distinct value and its runs (``_Runs``), updated in O(1) as a
value appears or its last hit ages out. The
CUSUM of the hits ``a..n`` equals ``P_n - min(P_{a-1}, ..., P_n)`` with ``P`` the running sum of the
values (Lindley's recursion unrolled), so the window keeps the prefix sums of its hits, the prefix sum
before its first hit, and a monotonic queue of the smallest prefix sums: O(1) amortised per hit. A running float sum can differ from a fresh sum in the last bits; ``value`` and
``true_until`` recompute exactly (Python's ``sum`` over the hits in time order) whenever a running
value lies within ``EXACT_BAND`` of the threshold, so a threshold decision never depends on rounding.
"""

from __future__ import annotations

import bisect
import math
from collections import deque

MAX_HITS_PER_GROUP = 10_000  # matches one group of a rule keeps in its window (oldest dropped first)

EXACT_BAND = 1e-9  # relative distance to the threshold below which sums are recomputed exactly


class Window:
    """Hits of one group; ``kind`` is the rule's aggregate. ``maxlen`` bounds the hits kept (oldest
    dropped first, like a bounded deque)."""

    __slots__ = (
        "kind",
        "maxlen",
        "times",
        "values",
        "total",
        "extreme",
        "prefixes",
        "prefix",
        "base",
        "pmins",
        "seen",
    )

    def __init__(self, kind: str, maxlen: int) -> None:
        self.kind, self.maxlen = kind, maxlen
        self.times: deque[int] = deque()
        self.values: deque[float] = deque()
        self.total = 0.0
        self.extreme: deque[tuple[int, float]] | None = deque() if kind in ("max", "min") else None
        # cusum: prefix sum after each hit, the last one, the one before the first hit, queue of minima
        self.prefixes: deque[float] | None = deque() if kind == "cusum" else None
        self.prefix = self.base = 0.0
        self.pmins: deque[float] = deque()
        # incidents: hits per distinct integer value, the runs of consecutive values, their incidents
        self.seen: _Runs | None = _Runs() if kind == "incidents" else None

    def _seen_add(self, v: float) -> None:
        self.seen.add(_int(v))

    def _seen_drop(self, v: float) -> None:
        self.seen.drop(_int(v))

    def __len__(self) -> int:
        return len(self.times)

    def _better(self, a: float, b: float) -> bool:
        # strict: equal values stay queued, so dropping the oldest hit finds its own entry at the front
        return a > b if self.kind == "max" else a < b

    def add(self, t: int, v: float) -> None:
        """Add the hit ``(t, v)``."""
        times = self.times
        if times and t < times[-1]:
            self._insert(t, v)
        else:
            times.append(t)
            self.values.append(v)
            self.total += v
            ext = self.extreme
            if ext is not None:
                while ext and self._better(v, ext[-1][1]):
                    ext.pop()
                ext.append((t, v))
            if self.prefixes is not None:
                self._push_prefix(v)
            if self.seen is not None:
                self._seen_add(v)
        if len(times) > self.maxlen:
            self._pop_oldest()

    def _insert(self, t: int, v: float) -> None:
        i = bisect.bisect_right(self.times, t)
        self.times.insert(i, t)
        self.values.insert(i, v)
        self.total += v
        if self.extreme is not None:
            self._rebuild_extreme()
        if self.prefixes is not None:
            self._rebuild_prefixes()
        if self.seen is not None:
            self._seen_add(v)

    def _push_prefix(self, v: float) -> None:
        p = self.prefix = self.prefix + v
        self.prefixes.append(p)
        mins = self.pmins
        while mins and mins[-1] > p:  # strict, as in the extreme queue
            mins.pop()
        mins.append(p)
        if abs(p) > 1e6:  # keep the running sums small (and exact enough): rebase on the window's start
            self._rebuild_prefixes()

    def _rebuild_prefixes(self) -> None:
        self.prefix = self.base = 0.0
        self.prefixes, self.pmins = deque(), deque()
        for v in self.values:
            p = self.prefix = self.prefix + v
            self.prefixes.append(p)
            while self.pmins and self.pmins[-1] > p:
                self.pmins.pop()
            self.pmins.append(p)

    def _cusum_value(self, at_least: float) -> float:
        low = min(self.base, self.pmins[0]) if self.pmins else self.base
        v = self.prefix - low
        if not math.isfinite(v) or abs(v - at_least) <= EXACT_BAND * max(1.0, abs(at_least)):
            return _cusum(self.values)
        return v

    def _rebuild_extreme(self) -> None:
        ext = self.extreme = deque()
        for t, v in zip(self.times, self.values):
            while ext and self._better(v, ext[-1][1]):
                ext.pop()
            ext.append((t, v))

    def _pop_oldest(self) -> None:
        t = self.times.popleft()
        v = self.values.popleft()
        self.total -= v
        if self.prefixes is not None:
            p = self.base = self.prefixes.popleft()
            if self.pmins and self.pmins[0] == p:
                self.pmins.popleft()
        ext = self.extreme
        if ext is not None and ext and ext[0][0] == t and ext[0][1] == v:
            ext.popleft()
        if self.seen is not None:
            self._seen_drop(v)
        if not self.times:
            self.total = 0.0

    def prune(self, horizon: int) -> None:
        """Drop the hits at or before ``horizon`` (ns)."""
        times = self.times
        while times and times[0] <= horizon:
            self._pop_oldest()

    def push(self, t: int, v: float, horizon: int, at_least: float) -> float:
        """``add(t, v)``, ``prune(horizon)`` and ``value(at_least)`` in one call (the engine's per-hit path)."""
        times, values, prefixes = self.times, self.values, self.prefixes
        if self.extreme is None and self.seen is None and (not times or t >= times[-1]):
            times.append(t)
            values.append(v)
            self.total += v
            if prefixes is not None:  # cusum, in time order: _push_prefix inlined (a wide job's per-host path)
                p = self.prefix = self.prefix + v
                prefixes.append(p)
                mins = self.pmins
                while mins and mins[-1] > p:
                    mins.pop()
                mins.append(p)
                if abs(p) > 1e6:
                    self._rebuild_prefixes()
            if len(times) > self.maxlen:
                self._pop_oldest()
        else:
            self.add(t, v)
        while times and times[0] <= horizon:
            self._pop_oldest()
        n = len(times)
        if not n:
            self.total = 0.0
            return 0.0
        kind = self.kind
        if kind == "count":
            return float(n)
        if kind == "incidents":
            return float(self.seen.incidents)
        if kind == "cusum":  # _cusum_value inlined
            low, mins = self.base, self.pmins
            if mins and mins[0] < low:
                low = mins[0]
            agg = self.prefix - low
            if math.isfinite(agg) and abs(agg - at_least) > EXACT_BAND * max(1.0, abs(at_least)):
                return agg
            return _cusum(self.values)
        if kind == "sum":
            agg = self.total
            if abs(agg - at_least) > EXACT_BAND * max(1.0, abs(at_least)) and math.isfinite(agg):
                return agg
        return self.value(at_least)

    def _exact(self) -> float:
        vals = list(self.values)
        if not vals:
            return 0.0
        if self.kind == "sum":
            return float(sum(vals))
        return float(sum(vals) / len(vals))

    def value(self, at_least: float = math.nan) -> float:
        """The aggregate of the hits (0.0 when empty); exact near ``at_least`` (see the module docstring)."""
        n = len(self.times)
        if not n:
            return 0.0
        k = self.kind
        if k == "count":
            return float(n)
        if k == "incidents":
            return float(self.seen.incidents)
        if k in ("max", "min"):
            return float(self.extreme[0][1])
        if k == "cusum":
            return self._cusum_value(at_least)
        v = self.total if k == "sum" else self.total / n
        if not math.isfinite(v) or abs(v - at_least) <= EXACT_BAND * max(1.0, abs(at_least)):
            return self._exact()
        return float(v)

    def true_until(self, at_least: float, window_ns: int) -> int:
        """The time the aggregate stops reaching ``at_least`` given the hits known now: the latest
        ``t + window_ns`` over the hits ``t`` such that the hits at or after ``t`` (those still alive just
        before ``t`` ages out) reach ``at_least``; 0 when none does. Scans from the newest hit and stops
        at the first time that qualifies."""
        times, values, n = self.times, self.values, len(self.times)
        if not n:
            return 0
        k = self.kind
        if k == "count":
            need = max(1, math.ceil(at_least))
            return times[-need] + window_ns if n >= need else 0
        if k == "incidents":  # the incidents among the hits from the newest back: the first time they reach it
            back, i = _Runs(), n - 1
            while i >= 0:
                t = times[i]
                while i >= 0 and times[i] == t:
                    back.add(_int(values[i]))
                    i -= 1
                if back.incidents >= at_least:
                    return t + window_ns
            return 0
        if k == "cusum":
            vals = list(values)
            i = n - 1
            while i >= 0:
                t = times[i]
                while i >= 0 and times[i] == t:
                    i -= 1
                if _cusum(vals[i + 1 :]) >= at_least:
                    return t + window_ns
            return 0
        s, c, ext = 0.0, 0, None
        i = n - 1
        while i >= 0:
            t = times[i]
            while i >= 0 and times[i] == t:  # every hit at the same time ages out together
                v = values[i]
                s += v
                c += 1
                if ext is None or (v > ext if k == "max" else v < ext):
                    ext = v
                i -= 1
            if k in ("max", "min"):
                agg = ext
            else:
                agg = s if k == "sum" else s / c
                if not math.isfinite(agg) or abs(agg - at_least) <= EXACT_BAND * max(1.0, abs(at_least)):
                    tail = [values[j] for j in range(i + 1, n)]
                    agg = float(sum(tail)) if k == "sum" else float(sum(tail) / len(tail))
            if agg >= at_least:
                return t + window_ns
        return 0

    def to_list(self) -> list[list]:
        """``[[t, v], ...]`` in time order (for the state file)."""
        return [[t, v] for t, v in zip(self.times, self.values)]

    @classmethod
    def from_list(cls, kind: str, maxlen: int, hits: list) -> "Window":
        """Inverse of ``to_list`` (hits in any order)."""
        w = cls(kind, maxlen)
        pairs = [(int(h[0]), float(h[1])) for h in hits]
        if all(pairs[i][0] <= pairs[i + 1][0] for i in range(len(pairs) - 1)) and w.extreme is None:
            w.times.extend(t for t, _ in pairs[-maxlen:])  # in order already (what snapshots hold)
            w.values.extend(v for _, v in pairs[-maxlen:])
            w.total = float(sum(w.values))
            if w.prefixes is not None:
                w._rebuild_prefixes()
            if w.seen is not None:
                for v in w.values:
                    w._seen_add(v)
            return w
        for t, v in sorted(pairs, key=lambda h: h[0]):
            w.add(t, v)
        return w


def _int(v: float) -> int:
    """An ``incidents`` value as the integer it stands for (a step number; a non-finite value is -1)."""
    return int(round(v)) if math.isfinite(v) else -1


class _Runs:
    """The ``incidents`` of a multiset of integers (a group's step numbers): the runs of consecutive values
    among the distinct ones, each run of ``L`` values counting ``ceil(L / 2)``. One stall lengthens the step
    it starts in and at most the next one (a stall that spans a step boundary, or that a framework's
    collective at the step's start carries into the next step: frame22's 483 and 484), so two consecutive
    stalled steps are one incident, while a fault that stalls step after step still counts one incident per
    two steps (a persistent fault escalates after 5 stalled steps in a row instead of 3). ``add`` and
    ``drop`` cost O(1) (the runs kept as start -> end and end -> start maps), except a drop inside a run
    (a hit aged out of order: not in time-ordered windows), which rebuilds the runs from the values."""

    __slots__ = ("counts", "end_of", "start_of", "incidents")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.end_of: dict[int, int] = {}  # run start -> run end
        self.start_of: dict[int, int] = {}  # run end -> run start
        self.incidents = 0

    @staticmethod
    def _worth(start: int, end: int) -> int:
        return (end - start + 2) // 2  # ceil((end - start + 1) / 2)

    def _open(self, start: int, end: int) -> None:
        self.end_of[start], self.start_of[end] = end, start
        self.incidents += self._worth(start, end)

    def _close(self, start: int, end: int) -> None:
        del self.end_of[start], self.start_of[end]
        self.incidents -= self._worth(start, end)

    def add(self, k: int) -> None:
        """One more hit of value ``k``."""
        counts = self.counts
        if k in counts:
            counts[k] += 1
            return
        counts[k] = 1
        start = end = k
        if k - 1 in counts:
            start = self.start_of[k - 1]
            self._close(start, k - 1)
        if k + 1 in counts:
            end = self.end_of[k + 1]
            self._close(k + 1, end)
        self._open(start, end)

    def drop(self, k: int) -> None:
        """One hit of value ``k`` fewer (``k`` must have been added)."""
        counts = self.counts
        n = counts.get(k, 0)
        if n > 1:
            counts[k] = n - 1
            return
        counts.pop(k, None)
        if k in self.end_of:  # the run's first value (time-ordered windows drop these)
            end = self.end_of[k]
            self._close(k, end)
            if end > k:
                self._open(k + 1, end)
        elif k in self.start_of:  # its last value
            start = self.start_of[k]
            self._close(start, k)
            self._open(start, k - 1)
        else:  # inside a run: rebuild
            values = sorted(counts)
            self.end_of.clear()
            self.start_of.clear()
            self.incidents = 0
            i = 0
            while i < len(values):
                j = i
                while j + 1 < len(values) and values[j + 1] == values[j] + 1:
                    j += 1
                self._open(values[i], values[j])
                i = j + 1


def _cusum(values) -> float:
    """Page's one-sided CUSUM of ``values`` in order: ``S = max(0, S + v)``, the final ``S``."""
    acc = 0.0
    for v in values:
        acc = max(0.0, acc + v)
    return acc
