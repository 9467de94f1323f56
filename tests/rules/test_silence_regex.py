"""Silence regex matchers run on the rule conditions' linear-time engine (RE2 syntax, as Alertmanager),
not Python's backtracking ``re`` (newuser23): a matcher an operator types can neither stall the rule
engine's notifications nor use syntax Alertmanager refuses."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from obshub.rules.errors import SilenceError
from obshub.rules.silences import Matcher, SilenceStore

REPO = Path(__file__).resolve().parents[2]

# Catastrophic backtracking for Python's re: 22 zeros took 30 s on this machine (2 cores), each two more x4-7.
REDOS = "host=~node-(0|0?0)*1"
HOST = "node-" + "0" * 26


def test_a_backtracking_pattern_matches_in_linear_time():
    """On the base, re.fullmatch ran for minutes on this 31-character host (the process was killed at 60 s);
    the fix answers at once. A child process, so a regression fails instead of hanging the suite."""
    code = (
        "from obshub.rules.silences import Matcher\n"
        f"m = Matcher.parse({REDOS!r})\n"
        f"print(m.matches({{'host': {HOST!r}}}), m.matches({{'host': 'node-0001'}}))\n"
    )
    try:
        res = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"matching {REDOS!r} against {HOST!r} did not end within 60 s (backtracking regex engine)")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["False", "True"]


@pytest.mark.parametrize(
    ("matcher", "why"),
    [
        ("host=~(?!node2).*", "look-around"),
        (r"host=~(node)\1", "backreferences"),
        ("host=~node(", "unclosed group"),
    ],
)
def test_regexes_the_engine_cannot_run_are_refused_with_the_reason(matcher, why):
    """Python's re took look-ahead and backreferences (Alertmanager's RE2 refuses them): refused when the
    silence is made, naming the matcher and the parser's reason."""
    with pytest.raises(SilenceError) as exc:
        Matcher.parse(matcher)
    assert repr(matcher) in str(exc.value) and why in str(exc.value) and "RE2" in (exc.value.hint or "")


def test_anchored_as_alertmanager_and_a_hand_edited_bad_regex_mutes_nothing_with_an_error(tmp_path):
    assert Matcher.parse("alertname=~.*straggler").matches({"alertname": "sched_straggler"})
    assert not Matcher.parse("alertname=~straggler").matches({"alertname": "sched_straggler_x"})
    assert Matcher.parse("host=~node1|node2").matches({"host": "node2"})  # the alternation stays anchored
    assert not Matcher.parse("host=~node1|node2").matches({"host": "node22"})
    assert Matcher.parse("host!~node[0-9]+").matches({"host": "gpu7"})
    store = SilenceStore(tmp_path / "s.json")
    now = time.time_ns()
    s = store.add(["host=~node2"], now - 1, now + 10**12, "a", "c")
    text = store.path.read_text().replace('"host=~node2"', '"host=~(?=node2)"')  # edited by hand
    store.path.write_text(text)
    assert store.muted_by({"host": "node2"}, now) == []  # it mutes nothing (logged), and raises nothing
    assert s.id


def test_a_silence_this_version_refuses_leaves_the_others_muting(tmp_path, caplog):
    """walk23: a look-around silence kept from f174a23 (Python's re took it) made ``muted_by`` raise for
    every alert, and the notifier then applied no silence at all: a valid maintenance silence stopped
    muting. Now the bad one mutes nothing, logged once naming its id; the others apply."""
    store = SilenceStore(tmp_path / "s.json")
    now = time.time_ns()
    maint = store.add(["host=node-01"], now - 1, now + 10**12, "a", "maintenance")
    legacy = store.add(["host=~legacyx"], now - 1, now + 10**12, "a", "old")
    store.path.write_text(store.path.read_text().replace('"host=~legacyx"', '"host=~(?!node-03).*x"'))
    with caplog.at_level("ERROR"):
        assert store.muted_by({"host": "node-01"}, now) == [maint.id]
        assert store.muted_by({"host": "node-02"}, now) == []
    bad = [r for r in caplog.records if legacy.id in r.getMessage()]
    assert len(bad) == 1 and "look-around" in bad[0].getMessage()


@pytest.mark.parametrize("pattern", ["node-0)|(x", "a)(b", "(a))"])
def test_a_regex_cannot_balance_itself_with_the_anchors(pattern):
    """walk23: ``node-0)|(x`` was accepted, anchored as ``^(?:node-0)|(x)$``, and muted every host starting
    with node-0: a pattern is checked on its own before it is anchored (Alertmanager and Python refuse it)."""
    with pytest.raises(SilenceError, match="bad regex"):
        Matcher.parse(f"host=~{pattern}")
