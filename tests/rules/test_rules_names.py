"""Rule files: a route may name any sink a config may define (``oncall-slack``), and a tab between a value
and its comment (valid YAML 1.2) is accepted without changing any value or any reported position."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from obshub.rules.errors import RuleValidationError
from obshub.rules.loader import load_ruleset
from obshub.rules.sinks.config import SINK_NAME_PATTERN, SinkSpec
from obshub.rules.yamlfile import load_yaml

RULE = """\
version: 1
rules:
  - id: lost\t# the rule id
    description: "lost\t# not a comment"
    severity: warning\t\t # tabs, then a space
    signal: steps
    condition: quality.lost_batches > 0
    group_by: {job: job}
    window: 10s
    routes: [oncall-slack, team_b]
    annotations:
      summary: |
        kept\t# inside a block scalar
"""


def test_route_names_accept_what_sink_names_accept(tmp_path):
    schema = json.loads((Path(__file__).resolve().parents[2] / "obshub" / "rules" / "schema.json").read_text())
    assert schema["$defs"]["sink_name"]["pattern"] == SINK_NAME_PATTERN
    SinkSpec(name="oncall-slack", type="console")
    f = tmp_path / "r.yaml"
    f.write_text(RULE)
    rs = load_ruleset([f])
    assert rs.rules["lost"].routes == ["oncall-slack", "team_b"]
    for name in ("Oncall", "on call", "-x", "x!"):
        assert not re.match(SINK_NAME_PATTERN, name)
        f.write_text(RULE.replace("oncall-slack", json.dumps(name)))
        with pytest.raises(RuleValidationError, match="routes/0"):
            load_ruleset([f])


def test_tab_before_comment_is_valid_and_changes_nothing():
    doc, problems = load_yaml(RULE, "r.yaml")
    assert problems == []
    rule = doc["rules"][0]
    assert rule["id"] == "lost" and rule["severity"] == "warning"
    assert rule["description"] == "lost\t# not a comment"
    assert rule["annotations"]["summary"] == "kept\t# inside a block scalar\n"


def test_positions_after_a_tab_comment_stay_exact():
    text = "version: 1\t# v\nrules:\n  - id: a\t# x\n    severity: [unclosed\n"
    doc, problems = load_yaml(text, "r.yaml")
    assert doc is None and len(problems) == 1
    spaced = load_yaml(text.replace("\t", " "), "r.yaml")[1][0]
    assert (problems[0].line, problems[0].col) == (spaced.line, spaced.col)
    assert problems[0].line == 5
