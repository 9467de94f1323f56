"""The ``incidents`` window aggregate (obshub/rules/window.py): the runs of consecutive integers among the
values of a group's hits, each run of L values counting ceil(L / 2), so that a rule counting stalled steps
(``of: step``) counts the steps N, N+1 of one stall once and a fault stalling step after step once per two (step_stall_recurring, docs/RULES.md): values that follow each other, out of order, repeated,
aging out (a run split in two when its middle ages out is impossible in time order, but a hit inserted out
of order may join two runs), the time the threshold stops holding, and the state file's round trip."""

from __future__ import annotations

import random

from obshub.rules.window import Window


def runs(values) -> int:
    """The reference: the runs of consecutive distinct integers, each of L values counting ceil(L / 2)."""
    vs = sorted({int(v) for v in values})
    total, i = 0, 0
    while i < len(vs):
        j = i
        while j + 1 < len(vs) and vs[j + 1] == vs[j] + 1:
            j += 1
        total += (j - i + 2) // 2
        i = j + 1
    return total


def window(steps, dt=1):
    w = Window("incidents", 10_000)
    for i, s in enumerate(steps):
        w.add(i * dt, float(s))
    return w


def test_consecutive_steps_count_once_and_gaps_count_again():
    assert window([]).value(3) == 0.0
    assert window([417]).value(3) == 1.0
    assert window([417, 483, 484]).value(3) == 2.0  # 483 and 484: one stall carried into the next step
    assert window([417, 483, 484, 574]).value(3) == 3.0
    assert window([10, 12, 14]).value(3) == 3.0  # a fast step between: three stalls
    assert window([5, 5, 6]).value(3) == 1.0  # a step seen twice counts once
    w = window([417, 483, 484])
    assert w.push(3, 574.0, -1, 3) == 3.0


def test_an_out_of_order_hit_joins_two_runs():
    w = Window("incidents", 10_000)
    w.add(10, 1.0)
    w.add(20, 3.0)
    assert w.value(3) == 2.0
    w.add(15, 2.0)  # step 2 closed late: 1, 2, 3 is one run of three steps: two incidents
    assert w.value(3) == 2.0
    w.add(16, 0.0)  # 0..3: two
    assert w.value(3) == 2.0


def test_a_fault_stalling_step_after_step_counts_one_incident_per_two_steps():
    assert [window(range(100, 100 + n)).value(3) for n in range(1, 7)] == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
    w = window(range(100, 106), dt=10)  # times 0..50
    w.prune(0)  # 101..105: three
    assert w.value(3) == 3.0
    w.prune(10)  # 102..105: two
    assert w.value(3) == 2.0


def test_a_hit_dropped_inside_a_run_splits_it():
    w = Window("incidents", 10_000)
    for t, v in ((0, 1.0), (5, 3.0), (10, 2.0), (20, 4.0), (30, 5.0)):
        w.add(t, v)  # 1..5: three
    assert w.value(3) == 3.0
    w.prune(5)  # 1 and 3 age out (3 closed early): {2}, {4, 5}: two
    assert w.value(3) == 2.0


def test_hits_that_age_out_leave_their_runs():
    w = window([1, 2, 10, 20, 21], dt=10)  # times 0, 10, 20, 30, 40
    assert w.value(3) == 3.0
    w.prune(0)  # step 1 ages out: 2 is still its run
    assert w.value(3) == 3.0
    w.prune(10)
    assert w.value(3) == 2.0
    w.prune(40)
    assert w.value(3) == 0.0 and len(w) == 0


def test_running_value_equals_the_reference_over_random_hits_in_and_out_of_order():
    rng = random.Random(23)
    for _ in range(200):
        w = Window("incidents", 50)
        hits = []
        for _ in range(rng.randrange(1, 80)):
            t = rng.randrange(0, 1_000)
            v = rng.randrange(0, 40)
            w.add(t, float(v))
            hits.append((t, v))
            hits.sort(key=lambda h: h[0])
            hits = hits[-50:]
            assert w.value(3) == runs(v for _t, v in hits)
        horizon = rng.randrange(0, 1_000)
        w.prune(horizon)
        assert w.value(3) == runs(v for t, v in hits if t > horizon)


def test_true_until_is_the_end_of_the_window_of_the_last_start_that_still_reaches_the_threshold():
    w = window([1, 2, 10, 20, 21], dt=10)  # times 0, 10, 20, 30, 40: runs {1,2}, {10}, {20,21}
    assert w.true_until(3, 100) == 10 + 100  # from step 2's hit on, 3 runs; from 10's, 2
    assert w.true_until(2, 100) == 20 + 100  # from 10's hit on, {10} and {20, 21}
    assert w.true_until(4, 100) == 0


def test_snapshot_round_trip_keeps_the_value():
    w = window([1, 2, 10, 20, 21])
    back = Window.from_list("incidents", 10_000, w.to_list())
    assert back.value(3) == w.value(3) == 3.0
    back.add(9, 11.0)
    assert back.value(3) == 3.0  # 10, 11 one run
