"""A problem of what an override appended is reported at the override's file:line:col (mends24). On cfd471b
`append: {labels: {severity: page}}` in a user's file was refused (right) at the builtin rule's `labels:`
line, obshub/rules/builtin/15_stall.yaml:242:7, a file the user never wrote, and an appended annotation's
template error at the builtin rule's `annotations:`."""

from __future__ import annotations

import pytest

from obshub.rules.errors import RuleValidationError
from obshub.rules.loader import BUILTIN_DIR, load_ruleset

OVERRIDE = """version: 1
overrides:
  - rule: step_stall
    append:
      labels:
        team: ml
        severity: page
  - rule: straggler_slow_compute
    append:
      labels: {alertname: x}
"""


def _problems(tmp_path, text: str) -> list[str]:
    f = tmp_path / "team.yaml"
    f.write_text(text)
    with pytest.raises(RuleValidationError) as exc:
        load_ruleset([BUILTIN_DIR, f])
    return [f"{p.file}:{p.line}:{p.col}: {p.message}" for p in exc.value.problems]


def test_an_appended_engine_label_is_refused_at_the_override(tmp_path):
    f = tmp_path / "team.yaml"
    problems = _problems(tmp_path, OVERRIDE)
    assert len(problems) == 2, problems
    assert any(p.startswith(f"{f}:7:19: labels/severity: the engine sets") for p in problems), problems
    assert any(p.startswith(f"{f}:10:27: labels/alertname: the engine sets") for p in problems), problems


def test_a_label_the_builtin_rule_has_stays_at_the_builtin_rule(tmp_path):
    """Appending another label leaves a problem of the rule's own labels where it was written."""
    f = tmp_path / "team.yaml"
    f.write_text("version: 1\noverrides:\n  - rule: step_stall\n    append:\n      labels: {team: ml}\n")
    assert "step_stall" in load_ruleset([BUILTIN_DIR, f]).rules


def test_an_appended_annotation_template_problem_is_at_the_override(tmp_path):
    f = tmp_path / "team.yaml"
    problems = _problems(
        tmp_path,
        "version: 1\noverrides:\n  - rule: step_stall\n    append:\n      annotations:\n"
        '        extra: "{{ nosuchname }}"\n        broken: "{{ oops"\n',
    )
    assert len(problems) == 2, problems
    assert any(p.startswith(f"{f}:6:16: annotations/extra: unknown name(s) nosuchname") for p in problems), problems
    assert any(p.startswith(f"{f}:7:17: annotations/broken: template syntax error") for p in problems), problems


def test_a_route_an_override_gave_to_no_sink_is_refused_at_the_override(tmp_path):
    """`rules serve` refuses a route to a sink the alerting config lacks; one an override appended (or
    replaced) was reported at the builtin rule's id line on cfd471b. A rule's own route stays at its rule."""
    from obshub.core.settings import load_settings
    from obshub.rules.errors import SinkConfigError
    from obshub.rules.service import RuleService
    from obshub.rules.sinks.config import AlertingConfig, SinkSpec

    f = tmp_path / "team.yaml"
    f.write_text(
        "version: 1\noverrides:\n  - rule: step_stall\n    append:\n      routes: [oncall-slak]\n"
        "  - rule: straggler_slow_compute\n    replace:\n      routes:\n        - pager\n        - oncall-slak\n"
    )
    config = AlertingConfig(
        sinks=[SinkSpec(name="oncall-slack", type="console"), SinkSpec(name="pager", type="console")]
    )
    with pytest.raises(SinkConfigError) as exc:
        RuleService(load_settings(home=tmp_path / "home"), [BUILTIN_DIR, f], config)
    text = str(exc.value)
    assert f"{f}:5:16: rule \"step_stall\": routes to sink 'oncall-slak'" in text, text
    assert f"{f}:10:11: rule \"straggler_slow_compute\": routes to sink 'oncall-slak'" in text, text
    assert "did you mean 'oncall-slack'?" in text and str(BUILTIN_DIR) not in text, text
