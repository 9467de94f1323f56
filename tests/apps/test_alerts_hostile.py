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
