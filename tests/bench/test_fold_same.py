"""bench/fold_same.py: a pinned dump of the width run's summaries gives summaries whatever the date (its
clock starts near the real time), two dumps of one tree compare equal, and dumps without any summary do
not pass as equal. A small fleet (16 hosts x 2 ranks); no timing assertions."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec

HOUR_NS = 3_600 * 10**9


def test_t0_is_the_real_time_to_the_hour():
    from bench import fold_same

    assert fold_same.t0_now(500_000 * HOUR_NS + 123_456_789) == 500_000 * HOUR_NS
    now = time.time_ns()
    t0 = fold_same.t0_now()
    assert t0 % HOUR_NS == 0 and 0 <= now - t0 < HOUR_NS + 60 * 10**9


def test_dumps_summaries_at_the_default_clock_and_compares_them(tmp_path: Path):
    from bench import fold_same

    a, b, c = tmp_path / "a.mp", tmp_path / "b.mp", tmp_path / "c.mp"
    assert fold_same.dump(a, 16, 2, "straggler") == 15  # every step of the case closed, whatever the date
    assert len(msgspec.msgpack.decode(a.read_bytes())) == 15
    t0 = fold_same.t0_now()
    assert fold_same.dump(b, 16, 2, "straggler", t0) == 15
    assert fold_same.dump(c, 16, 2, "straggler", t0) == 15
    assert fold_same.compare(b, c) == []
    # a clock far from the real time: the worker drops the data, and an empty comparison is no pass
    assert fold_same.dump(c, 16, 2, "straggler", t0 - 10 * 365 * 24 * HOUR_NS) == 0
    assert "nothing compared" in fold_same.compare(c, c)[0]
