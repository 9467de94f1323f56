"""When the worker's ``progress`` timer writes its ``read`` report (obshub/streams/app.py ``ReadReports``):
every tick while input moves, a window and two read margins after it, or while the fold holds an open
step; an idle worker at most every ``READ_IDLE_EVERY_S`` (it wrote twice a second to every partition of
its internal topic forever before). The live count on a real broker is tests/streams/test_streams_worker.py's
``test_an_idle_worker_writes_its_read_report_rarely``."""

from __future__ import annotations

from obshub.streams.app import READ_IDLE_EVERY_S, ReadReports


def ticks(r: ReadReports, start: float, end: float, positions: dict, others_new_s: float = 1e9, open_steps=False):
    """The 0.5 s ticks from ``start`` to ``end`` (s) at which a report is sent."""
    sent, t = [], start
    while t < end:
        if r.due(t, positions, others_new_s, open_steps)[0]:
            sent.append(t)
        t += 0.5
    return sent


def test_new_input_is_reported_every_tick_for_the_window_and_margins_then_rarely():
    r = ReadReports(active_s=12.0)
    assert r.due(0.0, {0: 5}, 1e9, False) == (True, True)  # new input: sent, flagged new
    assert r.due(0.5, {0: 5}, 1e9, False) == (True, False)  # still within the window: every tick
    busy = ticks(r, 1.0, 12.0, {0: 5})
    assert len(busy) == 22  # every tick up to 12 s after the input moved
    idle = ticks(r, 12.0, 62.0, {0: 5})
    assert 8 <= len(idle) <= 11  # then one report per READ_IDLE_EVERY_S (5 s): 10 in 50 s, not 100
    assert all(b - a >= READ_IDLE_EVERY_S for a, b in zip(idle, idle[1:]))
    assert r.due(62.5, {0: 6}, 1e9, False) == (True, True)  # input moves again: at once, every tick
    assert r.due(63.0, {0: 6}, 1e9, False)[0]


def test_an_open_step_or_another_workers_new_input_keeps_reports_every_tick():
    r = ReadReports(active_s=12.0)
    r.due(0.0, {0: 5}, 1e9, False)
    assert len(ticks(r, 20.0, 40.0, {0: 5}, open_steps=True)) == 40  # a hang, a step waiting for its window
    assert len(ticks(r, 40.0, 50.0, {0: 5}, others_new_s=3.0)) == 20  # another worker's input moves
    assert len(ticks(r, 50.0, 60.0, {1: 0})) == 20  # another assignment is news too: 12 s of ticks


def test_a_new_assignment_or_a_partition_read_again_to_its_end_is_reported():
    r = ReadReports(active_s=12.0)
    assert r.due(0.0, {0: 5, 1: 7}, 1e9, False)[1]
    assert not r.due(0.5, {0: 5, 1: 7}, 1e9, False)[1]
    assert r.due(1.0, {0: 5}, 1e9, False)[1]  # partition 1 not at its end (or gone): what is reported changed
