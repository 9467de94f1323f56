"""The ``cusum`` window aggregate (obshub/rules/window.py): Page's one-sided CUSUM ``S_n = max(0, S_{n-1} + x_n)``
over the hits of a rule's window in time order (docs/ANALYSIS.md "The test: Page's CUSUM"), computed
from prefix sums as ``P_n - min(P_{a-1}, ..., P_n)`` so that a hit costs O(1): the worked examples of the
docs, the hits that age out, out-of-order hits, large sums, and the time the alarm stops holding."""

from __future__ import annotations

import random

import pytest

from obshub.rules.engine import cusum
from obshub.rules.window import Window

K, H = 1.5, 5.0  # the builtin pack's drift (macro cusum_drift) and threshold (at_least)


def window(xs, t0=0, dt=1):
    w = Window("cusum", 10_000)
    for i, x in enumerate(xs):
        w.add(t0 + i * dt, x)
    return w


def test_page_recursion_on_the_documented_examples():
    # evidence at the clip (4 spreads) twice: 2.5 then 5.0, the alarm fires on the second step
    w = window([4 - K])
    assert w.value(H) == 2.5 and w.value(H) < H  # one freak step never fires alone
    w.add(1, 4 - K)
    assert w.value(H) == 5.0 and w.value(H) >= H
    # evidence of 2.5 spreads adds 1 per step: five steps
    xs = [2.5 - K] * 5
    assert [window(xs[: n + 1]).value(H) for n in range(5)] == [1.0, 2.0, 3.0, 4.0, 5.0]
    # noise: one spread now and then, 0 otherwise: S never leaves 0
    assert window([1 - K, 0 - K, 0 - K, 1 - K, 0 - K]).value(H) == 0.0
    # the sum restarts at 0 after a fall: max(0, .) at each step, not the plain sum (which is -0.5 here)
    assert window([3.0, -10.0, 6.5]).value(H) == 6.5
    assert window([3.0, -1.0, 2.0]).value(H) == 4.0


def test_hits_that_age_out_leave_the_sum():
    w = window([4.0, 4.0, -1.0])  # S: 4, 8, 7
    assert w.value(H) == 7.0
    w.prune(0)  # the first hit ages out: over [4, -1] S is 3
    assert w.value(H) == 3.0 and len(w) == 2
    w.prune(1)
    assert w.value(H) == 0.0 and len(w) == 1
    w.prune(2)
    assert w.value(H) == 0.0 and len(w) == 0
    # a low point inside the window stays the reference after older hits leave
    w = window([5.0, -8.0, 1.0, 1.0])  # S: 5, 0, 1, 2
    w.prune(0)
    assert w.value(H) == 2.0


def test_running_value_equals_the_recursion_over_random_hits_in_and_out_of_order():
    rnd = random.Random(7)
    w, hits, now = Window("cusum", 10_000), [], 0
    for _ in range(2_000):
        now += rnd.choice([0, 1, 1, 2])
        t = now - rnd.choice([0, 0, 0, 1, 4])  # some hits arrive late
        x = rnd.choice([-K, -K, -K, 1 - K, 4 - K, 2.5 - K])
        w.add(t, x)
        hits.append((t, x))
        w.prune(now - 30)
        hits = [h for h in hits if h[0] > now - 30]
        want = cusum([x for _, x in sorted(hits, key=lambda h: h[0])])
        assert w.value(H) == pytest.approx(want, abs=1e-9)


def test_large_sums_are_rebased_and_stay_exact():
    w = window([4e5] * 10 + [-1e6] + [3.0])  # prefix sums pass 1e6: rebuilt on the window's start
    assert w.value(H) == cusum([4e5] * 10 + [-1e6] + [3.0]) == 3_000_003.0


def test_true_until_is_the_end_of_the_window_of_the_last_start_that_still_reaches_the_threshold():
    w = window([2.5, 2.5, -1.5], t0=100, dt=10)  # S: 2.5, 5.0, 3.5
    assert w.value(H) == 3.5
    # hits from t=100 give S 3.5 (< 5); from t=110 or t=120 less still: the alarm does not hold
    assert w.true_until(H, 1_000) == 0
    w.add(130, 2.5)  # S 6.0 over every hit; from t=110: 2.5 - 1.5 + 2.5 = 3.5
    assert w.value(H) == 6.0 and w.true_until(H, 1_000) == 100 + 1_000


def test_snapshot_round_trip_keeps_the_value():
    w = window([4 - K, -K, 4 - K, 4 - K])
    w2 = Window.from_list("cusum", 10_000, w.to_list())
    assert w2.value(H) == w.value(H) == cusum([4 - K, -K, 4 - K, 4 - K])
    shuffled = list(reversed(w.to_list()))
    assert Window.from_list("cusum", 10_000, shuffled).value(H) == w.value(H)
