"""walk24: ``{{ value }}`` of a count / incidents aggregate renders as an int in annotations (the alert's
value stays the aggregate as computed), and ``obshub rules test`` given a rule file says so."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from obshub.cli import cli
from obshub.rules import testing
from obshub.rules.engine import Engine
from obshub.rules.loader import load_ruleset

RULES = """\
version: 1
rules:
  - id: lost_counted
    description: batches lost, counted
    severity: warning
    signal: steps
    condition: quality.lost_batches > 0
    group_by: {job: job}
    threshold: {aggregate: count, at_least: 2}
    window: 1m
    annotations: {summary: "{{ value }} lossy steps in {{ job }}"}
  - id: lost_incidents
    description: batches lost, incidents
    severity: warning
    signal: steps
    condition: quality.lost_batches > 0
    group_by: {job: job}
    threshold: {aggregate: incidents, of: step, at_least: 2}
    window: 1m
    annotations: {summary: "{{ value }} incidents in {{ job }}"}
  - id: lost_summed
    description: batches lost, summed
    severity: warning
    signal: steps
    condition: quality.lost_batches > 0
    group_by: {job: job}
    threshold: {aggregate: sum, of: quality.lost_batches, at_least: 2}
    window: 1m
    annotations: {summary: "{{ value }} batches lost in {{ job }}"}
"""

TESTS = """\
version: 1
rule_files: [rules.yaml]
tests:
  - name: whole aggregates render as ints, a sum keeps its number
    input:
      - at: 0s
        steps: {job: llm, step: 1, quality: {lost_batches: 1}}
      - at: 1s
        steps: {job: llm, step: 5, quality: {lost_batches: 1}}
    expect:
      - at: 2s
        alerts:
          - rule: lost_counted
            annotations: {summary: "2 lossy steps in llm"}
          - rule: lost_incidents
            annotations: {summary: "2 incidents in llm"}
          - rule: lost_summed
            annotations: {summary: "2.0 batches lost in llm"}
"""


def test_count_and_incidents_values_render_as_ints_the_alert_value_stays(tmp_path: Path):
    (tmp_path / "rules.yaml").write_text(RULES)
    (tmp_path / "rules_test.yaml").write_text(TESTS)
    results = testing.run_test_file(tmp_path / "rules_test.yaml")
    assert results and all(r.ok for r in results), [r.__dict__ for r in results]
    # the engine's alert value (JSON, Alertmanager) is still the aggregate as computed
    sent: list[dict] = []
    eng = Engine(load_ruleset([tmp_path / "rules.yaml"]), notify=sent.append)
    for at, step in ((0, 1), (1, 5)):
        now = testing.BASE_NS + at * 10**9
        eng.process(
            "steps", testing._record("steps", {"job": "llm", "step": step, "quality": {"lost_batches": 1}}, now)
        )
    firing = {rec["rule"]: rec for rec in sent if rec["status"] == "firing"}
    assert set(firing) == {"lost_counted", "lost_incidents", "lost_summed"}
    assert all(isinstance(rec["value"], float) and rec["value"] == 2.0 for rec in firing.values()), firing


def test_rules_test_of_a_rule_file_says_it_is_a_rule_file():
    f = "obshub/rules/builtin/10_straggler.yaml"
    res = CliRunner().invoke(cli, ["rules", "test", f])
    assert res.exit_code == 1
    assert f"this is a rule file (it has `rules:`), not a test file: check it with `obshub rules check {f}`" in (
        res.output
    )
    assert "must name at least one rule file" not in res.output and "unknown field 'rules'" not in res.output
