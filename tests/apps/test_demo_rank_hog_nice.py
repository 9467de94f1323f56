"""``RANK_HOG_NICE`` (docs/DEMO.md "Several ranks per host"): the nice value of a one-rank ``cpu`` fault's busy
loops, from the environment (0: the mild fault of issue #30's mildrank25 runs), else the module's -5; a value that
is no nice value is a FaultError naming the variable and the value, never a traceback mid-run."""

from __future__ import annotations

import pytest

from obshub.demo.errors import FaultError
from obshub.demo.faults import RANK_HOG_NICE, rank_hog_nice


@pytest.mark.parametrize("raw, nice", [(None, RANK_HOG_NICE), ("", RANK_HOG_NICE), ("0", 0), (" 7 ", 7), ("-20", -20)])
def test_rank_hog_nice_reads_the_environment_else_the_default(monkeypatch, raw, nice):
    if raw is None:
        monkeypatch.delenv("RANK_HOG_NICE", raising=False)
    else:
        monkeypatch.setenv("RANK_HOG_NICE", raw)
    assert rank_hog_nice() == nice


@pytest.mark.parametrize("raw", ["20", "-21", "low", "1.5"])
def test_a_rank_hog_nice_that_is_no_nice_value_is_refused_naming_it(monkeypatch, raw):
    monkeypatch.setenv("RANK_HOG_NICE", raw)
    with pytest.raises(FaultError) as exc:
        rank_hog_nice()
    assert f"RANK_HOG_NICE='{raw}'" in str(exc.value), str(exc.value)
    assert "-20 to 19" in (exc.value.hint or ""), exc.value.hint
