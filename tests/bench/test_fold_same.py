"""bench/fold_same.py: a pinned dump of the width run's summaries gives summaries whatever the date (its
clock starts near the real time), two dumps of one tree compare equal, and dumps without any summary do
not pass as equal. A small fleet (16 hosts x 2 ranks); no timing assertions."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest

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


def test_bad_input_exits_2_naming_it_and_a_run_that_closed_nothing_exits_1(tmp_path: Path, capsys):
    from bench import fold_same

    (tmp_path / "text").write_text("hello")
    small = ["--hosts", "4", "--ranks-per-host", "1"]
    for argv, frag in (
        (["dump", str(tmp_path / "a.mp"), "--hosts", "0"], "argument --hosts: 0 is not 1 or more"),
        (["dump", str(tmp_path / "a.mp"), "--ranks-per-host", "-1"], "--ranks-per-host: -1 is not 1 or more"),
        (["dump", str(tmp_path / "a.mp"), "--t0-ns", "soon"], "argument --t0-ns: 'soon' is not a whole number"),
        (["dump", str(tmp_path / "no" / "a.mp"), *small], f"no folder {tmp_path / 'no'} to write it in"),
        (["compare", str(tmp_path / "none"), str(tmp_path / "none")], "none: cannot read it (No such file"),
        (["compare", str(tmp_path / "text"), str(tmp_path / "text")], "text: not a fold_same dump"),
    ):
        with pytest.raises(SystemExit) as exc:
            fold_same.main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and frag in err and "Traceback" not in err, (argv, err)
    far = fold_same.t0_now() - 10 * 365 * 24 * HOUR_NS
    assert fold_same.main(["dump", str(tmp_path / "a.mp"), *small, "--t0-ns", str(far)]) == 1
    assert "no step closed" in capsys.readouterr().err
