"""Order statistics of small integer lists (ns): median, p99 and quantiles (nearest rank), leave-one-out
medians and spreads, the union of intervals."""

from __future__ import annotations

import bisect
import math
from typing import Iterable


def median_int(values: list[int]) -> int:
    """Median of integers, as an integer (mean of the two middle values, rounded down). 0 for none."""
    if not values:
        return 0
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2


class LeaveOneOut:
    """Medians of a per-host value over every host but one (the ``peer median`` of each host), after one
    sort: ``median_without(v)`` equals ``median_int`` of the values with one occurrence of ``v`` removed,
    in O(log n) instead of O(n log n), so all hosts' peer medians of a step cost O(n log n), not O(n^2).

    ``values``: the value of every host (ints, any order). ``median_without(v)`` needs ``v`` to be one of
    them (raises ``ValueError`` otherwise)."""

    __slots__ = ("_s",)

    def __init__(self, values: Iterable[int]) -> None:
        self._s = sorted(values)

    def median_without(self, v: int) -> int:
        s = self._s
        n = len(s) - 1
        i = bisect.bisect_left(s, v)
        if i == len(s) or s[i] != v:
            raise ValueError(f"{v!r} is not one of the values")
        if n <= 0:
            return 0

        def at(k: int) -> int:  # the k-th smallest once s[i] is left out
            return s[k] if k < i else s[k + 1]

        return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) // 2

    def median_without_all(self, vs: list[int]) -> int:
        """``median_int`` of the values with one occurrence of each of ``vs`` removed (each must be one of
        them, counted with multiplicity), in O(len(vs) log n): a host's few connections out of a job's
        thousands. 0 when nothing is left."""
        s = self._s
        r = sorted(vs)
        m = len(s) - len(r)
        if m <= 0:
            return 0

        def kth(k: int) -> int:  # the k-th smallest (from 0) once r is left out
            # the smallest value with at least k + 1 of the remaining values at or below it lies at one
            # of the indices k .. k + len(r) of the sorted values
            for i in range(k, min(len(s), k + len(r) + 1)):
                x = s[i]
                if bisect.bisect_right(s, x) - bisect.bisect_right(r, x) >= k + 1:
                    return x
            return s[-1]

        return kth(m // 2) if m % 2 else (kth(m // 2 - 1) + kth(m // 2)) // 2


def p99_int(values: list[int]) -> int:
    """99th percentile by the nearest-rank method: the ``ceil(0.99 n)``-th smallest value. 0 for none."""
    if not values:
        return 0
    s = sorted(values)
    return s[max(0, math.ceil(0.99 * len(s)) - 1)]


def union_ns(intervals: list[tuple[int, int]]) -> int:
    """Total length in ns of the union of ``[start, end]`` intervals (overlaps counted once)."""
    it = iter(sorted(intervals))
    first = next(it, None)
    if first is None:
        return 0
    total = 0
    cur_s, cur_e = first
    for s, e in it:
        if s > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    return total + cur_e - cur_s


def quantile_int(values: list[int], q: float) -> int:
    """The ``q`` quantile (0 < q <= 1) by the nearest-rank method: the ``ceil(q n)``-th smallest value.
    0 for none."""
    if not values:
        return 0
    s = sorted(values)
    return s[min(len(s), max(1, math.ceil(q * len(s)))) - 1]
