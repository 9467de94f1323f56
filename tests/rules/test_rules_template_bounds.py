"""An annotation template cannot stall the rule engine (newuser23): on f174a23 `rules check` accepted
`{{ "x" * 10**9 }}` (a gigabyte per render; `rules test` did not finish in 30 s) and nested
`{% for %}` loops over `range(99999)` (10**10 iterations per alert change). Renders are bounded now
(loader.BoundedSandbox): past a bound the annotation shows a template error, the engine goes on; nested
loops are refused at the file's line."""

from __future__ import annotations

import time

import jinja2
import pytest

from obshub.rules.errors import RuleValidationError
from obshub.rules.loader import MAX_TEMPLATE_TEXT, load_ruleset, template_env
from tests.support.rulefile import one_rule


@pytest.mark.parametrize(
    "text",
    [
        '{{ "x" * 10**9 }}',
        "{{ [1] * 1000000000 }}",
        "{{ 10 ** 1000000 }}",
        "{{ 7 ** 400000 }}",
        "{% for i in range(10**6) %}{% endfor %}",
    ],
)
def test_a_render_past_a_bound_fails_fast_naming_it(text):
    env = template_env()
    t0 = time.monotonic()
    with pytest.raises(jinja2.exceptions.SecurityError) as exc:
        env.from_string(text).render()
    assert time.monotonic() - t0 < 1.0
    assert "at most" in str(exc.value)


def test_what_templates_need_still_renders():
    env = template_env()
    assert env.from_string('{{ "-" * 40 }}').render() == "-" * 40
    assert env.from_string("{{ 2 ** 10 }} {{ 1.5 ** 2 }} {{ 3 * 4 }}").render() == "1024 2.25 12"
    assert len(env.from_string('{{ "ab" * n }}').render(n=MAX_TEMPLATE_TEXT // 2)) == MAX_TEMPLATE_TEXT
    assert env.from_string("{% for i in range(3) %}{{ i }}{% endfor %}").render() == "012"


def test_nested_loops_are_refused_at_the_annotations_line(tmp_path):
    f = tmp_path / "r.yaml"
    nested = "{% for i in range(99999) %}{% for j in range(99999) %}x{% endfor %}{% endfor %}"
    f.write_text(one_rule(summary=nested))
    with pytest.raises(RuleValidationError) as exc:
        load_ruleset([f])
    text = str(exc.value)
    assert f"{f}:10:" in text and "annotations/summary: {% for %} loops nested 2 deep" in text, text
    f.write_text(one_rule(summary="{% for i in range(3) %}{{ i }}{% endfor %}"))
    assert load_ruleset([f]).rules["a"].annotations["summary"].render() == "012"
