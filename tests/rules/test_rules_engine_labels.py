"""A rule cannot set the labels the engine sets (newuser23). On f174a23 `labels: {alertname: other,
severity: critical}` on a warning rule was accepted: its alerts carried alertname=other (so `obshub alerts
--rule a`, silences, routes and inhibitions by alertname missed them, and two rules so labelled shared
fingerprints) and severity=critical beside the alert's own severity warning; `group_by: {alertname: ...}`
renamed every alert after a record's value."""

from __future__ import annotations

import pytest

from obshub.rules.errors import RuleValidationError
from obshub.rules.loader import load_ruleset
from tests.support.rulefile import one_rule


@pytest.mark.parametrize(
    ("group_by", "labels", "where", "what"),
    [
        ("{host: straggler.host}", "{alertname: other}", "9:25", "labels/alertname: the engine sets label 'alertname'"),
        ("{host: straggler.host}", "{team: ml, severity: critical}", "9:34", "labels/severity: the engine sets"),
        ("{alertname: straggler.host}", "{}", "8:27", "group_by/alertname: the engine sets label 'alertname'"),
        ("{host: straggler.host, severity: job}", "{}", "8:48", "group_by/severity"),
    ],
)
def test_alertname_and_severity_are_refused_at_their_key(tmp_path, group_by, labels, where, what):
    f = tmp_path / "r.yaml"
    f.write_text(one_rule(group_by, labels))
    with pytest.raises(RuleValidationError) as exc:
        load_ruleset([f])
    text = str(exc.value)
    assert f"{f}:{where}: " in text and what in text, text
    assert len(exc.value.problems) == 1


def test_other_labels_and_a_label_also_grouped_by_stay_valid(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text(one_rule("{host: straggler.host, layer: \"'x'\"}", "{team: ml, layer: static}"))
    assert "a" in load_ruleset([f]).rules
