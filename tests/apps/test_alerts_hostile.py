"""`obshub alerts` reads the alerts topic back: generated hostile change records between valid ones are
skipped with their reason, never stop it, and user text never becomes terminal markup. No broker."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from obshub import alerts
from tests.rules.test_rules_intake import HOSTILE, valid_change

RECENT_NS = time.time_ns() - 60 * 10**9  # inside any --since range the tests give


def _change(i: int, **over) -> bytes:
    return json.dumps({**valid_change(), "fingerprint": f"{i:016x}", "updated_at_ns": RECENT_NS + i, **over}).encode()


@pytest.mark.slow
@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(field=st.sampled_from(sorted(valid_change())), value=HOSTILE, junk=st.binary(max_size=40))
def test_hostile_changes_are_skipped_with_a_reason(field, value, junk):
    hostile = json.dumps({**valid_change(), "fingerprint": "f" * 16, field: value}).encode("utf-8", "surrogatepass")
    skipped: list[str] = []
    rows = alerts.latest_alerts([_change(1), hostile, junk, b"[" * 50_000, _change(2)], skipped=skipped)
    fps = {r["fingerprint"] for r in rows}
    assert {f"{1:016x}", f"{2:016x}"} <= fps
    assert len(skipped) >= 2 and all(": " in s for s in skipped)


def test_markup_in_a_summary_is_printed_as_text(monkeypatch):
    recs = [_change(1, annotations={"summary": "[/red] [bold]x[/bold] [link=http://e]"}, labels={"job": "[red]"})]
    monkeypatch.setattr("obshub.export.source.snapshot", lambda *a, **k: iter(recs))
    res = CliRunner().invoke(alerts.alerts_command, ["--since", "1000d"])
    assert res.exit_code == 0, res.output
    assert "[/red] [bold]x[/bold]" in res.output


def test_the_alerts_piped_are_a_short_line_each_with_the_summary_whole_below(tmp_path):
    """`obshub alerts | less` printed the table as wide as its longest summary plus the frame (every row of
    a stall alert over 300 columns). Through a real pipe (the command's stdout is an OS pipe, as with `|`)
    each alert is now one aligned line of the short columns, and its summary whole on the next line."""
    import os
    import subprocess
    import sys

    summary = "node-01 stalled the job for 1.62 s (x15.1 the median step 0.107 s) at step 812: " + "network " * 30
    recs = [
        _change(1, annotations={"summary": summary}, labels={"job": "llama", "host": "node-01", "layer": "network"}),
        _change(2, rule="rank_hang", status="resolved", ends_at_ns=RECENT_NS, labels={"job": "llama"}),
    ]
    code = (
        "import sys, json; import obshub.export.source as s; "
        f"recs = [r.encode() for r in json.loads({json.dumps(json.dumps([r.decode() for r in recs]))!s})]; "
        "s.snapshot = lambda *a, **k: iter(recs); "
        "from obshub.cli import main; main(['alerts', '--since', '1000d'])"
    )
    env = {**os.environ, "OBSHUB_HOME": str(tmp_path)}
    env.pop("FORCE_COLOR", None)
    r = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "alerts since 1000d (1 firing)" and lines[1].split() == [
        "status",
        "since",
        "rule",
        "job",
        "host",
        "layer",
        "severity",
    ], lines
    assert "    " + summary.strip() in lines  # whole, on its own line: grep finds it
    assert lines[2].split()[:1] == ["firing"] and "node-01" in lines[2] and "network" in lines[2], lines
    assert lines[4].split()[0] == "resolved" and "rank_hang" in lines[4], lines
    assert all(len(ln) <= 100 for ln in lines if not ln.startswith("    ")), lines  # no frame as wide as a summary
    assert "…" not in r.stdout and "│" not in r.stdout and "━" not in r.stdout
