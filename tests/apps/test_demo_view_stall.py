"""The demo's printed verdict of a sporadic ``stall`` fault (walk24): it said "first correct alert at t1 =
t0 + 0.92 s" with the median over the stalls (``Verdict.ttd_s``) while the first alert came 1.023 s after the
first stall. Now the first stall's own delay, each stall's, and median / worst said as such; the verdict's
JSON fields keep their meaning (``ttd_s`` the median, read by bench.ttd)."""

from __future__ import annotations

import io

from rich.console import Console

from obshub.demo.verdict import AlertSeen, judge_stalls
from obshub.demo.view import DemoView

T0 = 1_000_000_000_000


def _alert(at_s: float) -> AlertSeen:
    return AlertSeen(
        received_ns=T0 + int(at_s * 1e9),
        rule="step_stall",
        host="node-00",
        layer="network",
        step="40",
        evidence="e",
        summary="s",
        fingerprint=f"fp{at_s}",
    )


def _printed(v) -> str:
    buf = io.StringIO()
    DemoView(Console(file=buf, width=200, force_terminal=False, highlight=False)).verdict(v, "node-00")
    return buf.getvalue()


def test_a_stall_verdict_prints_the_first_stalls_own_delay_and_median_worst_as_such():
    starts = [T0, T0 + 18_000_000_000, T0 + 36_000_000_000]
    v = judge_stalls("node-00", "network", starts, [_alert(1.023), _alert(18.5), _alert(36.92)], T0 + 60 * 10**9)
    assert v.ok and v.ttd_s == 0.92 and v.worst_s == 1.023  # the JSON fields: unchanged meaning
    out = _printed(v)
    assert "first stall named 1.023 s after its start: node-00 / network step 40 (rule step_stall)" in out
    assert "t0 + 0.92" not in out and "time to detection: 0.92" not in out
    assert "stall 1: named after 1.023 s" in out and "stall 2: named after 0.500 s" in out
    assert "median 0.92 s, worst 1.02 s" in out


def test_a_stall_verdict_with_an_unnamed_stall_says_so():
    starts = [T0, T0 + 18_000_000_000]
    v = judge_stalls("node-00", "network", starts, [_alert(19.0)], T0 + 40 * 10**9)
    out = _printed(v)
    assert "stall 1: not named" in out and "stall 2: named after 1.000 s" in out
    assert "first stall named" not in out and "worst: a stall went unnamed" in out
