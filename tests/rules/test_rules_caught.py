"""Errors the rule engine catches and goes on from are narrowed to what can be raised, or counted in a
metric (issue #29 item 5): a CEL runtime error of any kind is an ``EvalError``; a template that fails
is shown in the alert and counted (``Engine.template_errors``, ``obshub_rules_template_errors``); a
silences file that cannot be applied is logged, counted (``obshub_rules_silence_errors``) and the alert
goes out unsilenced."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from obshub.rules import fields
from obshub.rules.dispatch import SILENCE_ERRORS, Dispatcher
from obshub.rules.engine import Engine
from obshub.rules.expr import Compiled, EvalError, compile_expr
from obshub.rules.lifecycle import fingerprint
from obshub.rules.loader import load_ruleset
from obshub.rules.silences import SilenceStore
from obshub.rules.sinks.base import DeliveryPolicy
from obshub.rules.sinks.config import Route
from obshub.rules.sinks.console import ConsoleSink

S = 1_000_000_000
BASE_NS = 1_767_225_600 * S


@pytest.mark.parametrize(
    "src, act",
    [
        ("a.b", {}),  # missing key: RuntimeError
        ("a.b", {"a": 1}),  # member of an int: TypeError
        ("1 / x", {"x": 0}),  # ZeroDivisionError
        ("9223372036854775807 + x", {"x": 1}),  # OverflowError
        ("a[3] == 1", {"a": [1]}),  # IndexError
        ("x + 1", {"x": "s"}),  # TypeError
    ],
)
def test_every_cel_runtime_error_is_an_eval_error(src, act):
    with pytest.raises(EvalError):
        Compiled(src, compile_expr(src)).eval(act)


def test_a_failing_template_is_shown_and_counted(tmp_path: Path):
    p = tmp_path / "r.yaml"
    p.write_text(
        """\
version: 1
rules:
  - id: slow_sync
    description: one slow sync
    severity: warning
    signal: events
    kinds: [CUDA_SYNC]
    condition: duration_ns > 1000
    group_by: {host: host}
    window: 10s
    annotations: {ratio: "{{ 1 // (duration_ns - duration_ns) }}", ok: "{{ duration_ns }}"}
"""
    )
    changes: list[dict] = []
    eng = Engine(load_ruleset([p]), changes.append)
    rec = fields.event_record_from_test({"kind": "CUDA_SYNC", "ts_ns": BASE_NS, "host": "a", "duration_ns": 5000})
    eng.process("events", rec)
    eng.tick(BASE_NS + S)
    fired = [c for c in changes if c["status"] == "firing"]
    assert fired and fired[-1]["annotations"]["ok"] == "5000"
    assert fired[-1]["annotations"]["ratio"].startswith("(template error: ZeroDivisionError")
    assert eng.template_errors >= 1


def test_an_unreadable_silences_file_is_counted_and_the_alert_goes_out(tmp_path: Path):
    bad = tmp_path / "silences.json"
    bad.write_text('{"silences": [{"id": "x", "no_such_field": 1}]}')  # Silence(**d): TypeError
    d = Dispatcher(
        [ConsoleSink("console", stream=io.StringIO())],
        Route(group_by=["alertname"], group_wait="10s", group_interval="1m", repeat_interval="1h"),
        [],
        SilenceStore(bad),
        DeliveryPolicy(max_attempts=1, max_elapsed_s=1, timeout_s=1, backoff_initial_s=0.01, backoff_max_s=0.01),
        lambda tokens: None,
    )
    labels = {"alertname": "r", "severity": "warning", "host": "n2"}
    try:
        before = SILENCE_ERRORS._value.get()
        muted = d._muted({"labels": labels, "status": "firing", "fingerprint": fingerprint(labels)}, BASE_NS)
        assert muted is None and SILENCE_ERRORS._value.get() == before + 1
    finally:
        d.close()
