"""Rule files: strict YAML (positions, duplicate keys, YAML 1.1 surprises), JSON Schema, CEL syntax and
field references, macro cycles, overrides and file order; `obshub rules check` as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from obshub.rules.errors import RuleValidationError
from obshub.rules.loader import load_ruleset

REPO = Path(__file__).resolve().parents[2]
OBSHUB = [sys.executable, "-m", "obshub.cli"]

GOOD = """\
version: 1
macros:
  stalled: stall == true && straggler != null
rules:
  - id: slow_step
    description: a stalled step
    severity: warning
    signal: steps
    condition: stalled
    group_by: {job: job, host: straggler.host}
    annotations: {step: "{{ step }}"}
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def problems(*paths: Path) -> list[str]:
    with pytest.raises(RuleValidationError) as exc:
        load_ruleset(list(paths))
    return [str(p) for p in exc.value.problems]


def test_good_file_loads(tmp_path):
    rs = load_ruleset([write(tmp_path, "a.yaml", GOOD)])
    assert list(rs.rules) == ["slow_step"]
    assert rs.rules["slow_step"].condition.source == "(stall == true && straggler != null)"


def test_calls_of_functions_cel_does_not_have_are_rejected_with_position(tmp_path):
    """A misspelt or missing CEL function compiles but would fail on every record: `rules check` names
    it at its position, with the nearest function; the implementation's own functions pass."""
    text = GOOD.replace("condition: stalled", "condition: stalled && sizee(job) > 0 && job.startWith('a')")
    f = write(tmp_path, "f.yaml", text)
    got = problems(f)
    assert any(p.startswith(f"{f}:9:27: ") and "unknown function 'sizee'; did you mean 'size'?" in p for p in got), got
    assert any("unknown function 'startWith'; did you mean 'startsWith'?" in p for p in got), got
    assert any(
        "unknown function 'round' (docs/RULES.md lists" in p
        for p in problems(write(tmp_path, "g.yaml", GOOD.replace("condition: stalled", "condition: round(step) > 1")))
    )
    ok = "condition: size(job) > 0 && job.startsWith('a') && [1].exists(x, x > 0) && has(straggler.host)"
    load_ruleset([write(tmp_path, "h.yaml", GOOD.replace("condition: stalled", ok))])


def test_a_mistyped_value_is_named_by_its_yaml_type(tmp_path):
    text = GOOD.replace(
        "severity: warning", "severity: warning\n    window: 1m\n    threshold: {aggregate: count, at_least: 'five'}"
    )
    got = problems(write(tmp_path, "t.yaml", text))
    assert any("at_least: expected number, got string 'five'" in p for p in got), got


def test_a_huge_wrong_value_is_quoted_cut_with_its_size_at_its_field_and_position(tmp_path):
    """A 50,000-character duration, a list of 300 long strings for a severity, a 50,000-character field
    name in group_by: each problem keeps its file:line:col and field and quotes the start of the value
    and its size (the whole value was printed before: 81 kB for two problems)."""
    big, items = "x" * 50_000, "[" + ", ".join(["a" * 100] * 300) + "]"
    f = write(tmp_path, "big.yaml", GOOD.replace("severity: warning", f"severity: {items}\n    for: {big}"))
    got = problems(f)
    assert len("\n".join(got)) < 1_000, [p[:300] for p in got]
    assert got[0].startswith(f"{f}:7:15: ") and "severity: ['aaaa" in got[0], got
    assert "... (300 items) is not one of critical" in got[0], got
    assert got[1].startswith(f"{f}:8:10: ") and "for: 'xxxx" in got[1], got
    assert "... (50,000 characters) is not a duration" in got[1], got
    f = write(tmp_path, "id.yaml", GOOD.replace("id: slow_step", f"id: {big}"))  # an id was taken at any length
    (got,) = problems(f)
    assert got.startswith(f'{f}:5:9: rule "xxxx') and "rules/0/id: 'xxxx" in got, got[:500]
    assert got.endswith("... (50,000 characters) is longer than the 128 characters it may have"), got[:500]
    f = write(tmp_path, "field.yaml", GOOD.replace("host: straggler.host}", f"host: {big}}}"))
    (got,) = problems(f)
    assert len(got) < 500 and got.startswith(f"{f}:10:") and "unknown field 'xxxx" in got, got[:500]
    assert got.endswith("... (50,002 characters)"), got[:500]  # the quotes counted


@pytest.mark.parametrize(
    "old, new, why",
    [
        ("    severity", "\tseverity", "7:1: YAML: a tab character: YAML indents with spaces only"),
        ("a stalled step", "a\tstalled step", "6:19: YAML: a tab character: YAML indents with spaces only"),
        (
            'annotations: {step: "{{ step }}"}\n',
            "annotations: {}\n---\nversion: 1\n",
            "12:1: YAML: a second YAML document",
        ),
        (
            "group_by: {job: job, host: straggler.host}",
            "group_by: [job]",
            "10:15: rule \"slow_step\": rules/0/group_by: expected mapping, got list ['job']",
        ),
        (
            "group_by: {job: job, host: straggler.host}",
            "group_by:",
            '10:5: rule "slow_step": rules/0/group_by: expected mapping, got null (an empty value)',
        ),
    ],
)
def test_tabs_a_second_document_and_wrong_types_are_named_in_yaml_words(tmp_path, old, new, why):
    """ruamel's own words were printed ("found character '\\t' that cannot start any token", "but found
    another document") and JSON Schema's type names ("expected object, got null None") for a YAML file."""
    assert old in GOOD
    f = write(tmp_path, "odd.yaml", GOOD.replace(old, new, 1))
    got = problems(f)
    assert any(p.startswith(f"{f}:{why}") for p in got), got


def test_yaml11_surprises_rejected_with_position(tmp_path):
    text = GOOD.replace("severity: warning", "severity: warning\n    labels: {team: no, mode: 0755, at: 1:30}")
    f = write(tmp_path, "s.yaml", text)
    got = problems(f)
    assert any(p.startswith(f"{f}:8:20: ") and "'no' is a boolean in YAML 1.1" in p for p in got), got
    assert any(p.startswith(f"{f}:8:30: ") and "leading zero (0755)" in p for p in got), got
    assert any(p.startswith(f"{f}:8:40: ") and "base-60" in p for p in got), got
    # quoted, the same values are fine
    ok = GOOD.replace("severity: warning", "severity: warning\n    labels: {team: 'no', mode: '0755', at: '1:30'}")
    load_ruleset([write(tmp_path, "q.yaml", ok)])


def test_yes_where_a_boolean_is_expected_is_rejected(tmp_path):
    f = write(tmp_path, "b.yaml", GOOD.replace("severity: warning", "severity: warning\n    enabled: yes"))
    got = problems(f)
    assert any(p.startswith(f"{f}:8:14: ") and "true/false" in p for p in got), got


def test_duplicate_key_reported_at_second_occurrence(tmp_path):
    f = write(tmp_path, "d.yaml", GOOD.replace("    signal: steps\n", "    signal: steps\n    signal: events\n"))
    got = problems(f)
    assert len(got) == 1 and got[0].startswith(f"{f}:9:5: ") and "duplicate key" in got[0], got


def test_flow_nesting_beyond_the_limit_is_refused_at_its_bracket_and_quoted_brackets_do_not_count(tmp_path):
    from obshub.rules.yamlfile import MAX_FLOW_DEPTH, flow_too_deep

    deep = "[" * (MAX_FLOW_DEPTH + 1) + "]" * (MAX_FLOW_DEPTH + 1)
    f = write(tmp_path, "n.yaml", GOOD + f"lists:\n  l: {deep}\n")
    line = GOOD.count("\n") + 2
    got = problems(f)
    assert got == [
        f"{f}:{line}:{6 + MAX_FLOW_DEPTH}: YAML: nested too deeply (more than 64 levels of [ or {{; a rule file needs a few)"
    ]
    ok = "[" * MAX_FLOW_DEPTH + "]" * MAX_FLOW_DEPTH
    assert flow_too_deep(f"l: {ok}\n") is None
    # brackets in quoted scalars, comments and after an apostrophe of a plain scalar are text
    many = "[" * 3 * MAX_FLOW_DEPTH
    text = f"a: '{many} it''s'\nb: \"{many} \\\" {many}\"\n# {many}\nc: it's [x]\nd: [{{e: '{many}'}}]\n"
    assert flow_too_deep(text) is None
    assert flow_too_deep(text + f"f: {deep}\n") == (6, 3 + MAX_FLOW_DEPTH + 1)


def alias_bomb(levels: int) -> str:
    """Lists of nine aliases of the list before, ``levels`` deep: 9**levels strings from a few hundred bytes."""
    out = ['  l0: &l0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    out += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "lists:\n" + "\n".join(out) + "\n"


def test_aliases_that_multiply_and_an_oversized_file_are_refused_before_they_are_walked(tmp_path):
    """YAML's "billion laughs": aliases of aliases expand a file of a few hundred bytes into millions of
    values that every reader walks (nine levels: 387 million, minutes of CPU and gigabytes before). It is
    refused at the first value that holds more than MAX_EXPANDED_NODES, the file's whole count named; a
    file larger than MAX_FILE_BYTES is refused before it is parsed. The same holds for the alerting config."""
    from obshub.rules.errors import SinkConfigError
    from obshub.rules.sinks.config import load_config
    from obshub.rules.yamlfile import MAX_EXPANDED_NODES, MAX_FILE_BYTES

    # l4 holds 1 + 9 * (1 + 9 * (1 + 9 * (1 + 9 * 10))) = 66,430 values, l5 597,871: the first over the limit
    assert 66_430 <= MAX_EXPANDED_NODES < 597_871
    f = write(tmp_path, "bomb.yaml", "version: 1\n" + alias_bomb(7) + "rules: []\n")
    assert problems(f) == [
        f"{f}:8:7: YAML: lists/l5 holds more than {MAX_EXPANDED_NODES:,} values (the file: 6,053,457, each alias "
        "*name counted as the copy of its anchor's value it makes; aliases of aliases multiply): a rule file "
        "needs a few hundred; alias fewer levels or split the file"
    ]
    cfg = write(tmp_path, "alerting.yaml", "version: 1\nroute:\n  group_by: [alertname]\n" + alias_bomb(7))
    with pytest.raises(SinkConfigError, match=f"{cfg}:10:7: YAML: lists/l5 holds more than"):
        load_config(cfg)
    # aliases that repeat a little are fine, and a value that holds its own anchor counts once
    small = write(tmp_path, "small.yaml", "version: 1\n" + alias_bomb(3) + "  me: &me [*me]\nrules: []\n")
    assert "holds more than" not in "\n".join(problems(small))
    big = write(tmp_path, "big.yaml", "version: 1\nrules: []\n" + "#" * MAX_FILE_BYTES)
    assert problems(big) == [
        f"{big}:1:1: the file is {MAX_FILE_BYTES + 21:,} bytes, more than the {MAX_FILE_BYTES:,} a YAML file of "
        "obshub may have (a rule file needs a few kB): split it into several files, or check that this is the file "
        "meant"
    ]


def _limited_cli(*args: str, mem_bytes: int = 1 << 30, timeout: float = 30) -> subprocess.CompletedProcess:
    """`obshub ...` with its address space capped (a reader without limit ends in MemoryError, not in
    gigabytes of this machine's memory) and a timeout (a reader that blocks fails the test)."""
    import resource

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))

    return subprocess.run([*OBSHUB, *args], capture_output=True, text=True, cwd=REPO, timeout=timeout, preexec_fn=cap)


def test_a_device_or_fifo_given_as_a_yaml_file_is_refused_at_once_naming_it(tmp_path):
    """`rules check /dev/zero` read without end (2.9 GB in 20 s; the size limit was checked on `stat`'s size,
    0 for a device), `rules test /dev/zero` ended in MemoryError and a FIFO blocked forever waiting for a
    writer (walk25). Every one is refused before a byte is read, the file and its kind named, exit 1 as
    for any bad file; the alerting config's reader is the same."""
    import os

    from obshub.rules.errors import SinkConfigError
    from obshub.rules.sinks.config import load_config

    fifo = tmp_path / "rules.yaml"
    os.mkfifo(fifo)
    for path, kind in (("/dev/zero", "a character device"), (str(fifo), "a FIFO, a named pipe")):
        for cmd in ("check", "test"):
            res = _limited_cli("rules", cmd, path)
            assert res.returncode == 1, (cmd, path, res.stderr[-2000:])
            assert f"{path}: cannot read: not a regular file ({kind}); give the path of a YAML file" in res.stderr, (
                cmd,
                res.stderr[-2000:],
            )
            assert "Traceback" not in res.stderr and "MemoryError" not in res.stderr
    with pytest.raises(SinkConfigError, match="not a regular file"):
        load_config(fifo)


def test_an_override_of_a_misspelt_rule_names_the_rule_meant(tmp_path):
    """`rule: step_stal` said only that no earlier file defines it (walk25): the nearest rule id of the
    earlier files is suggested (difflib, as `silence add` suggests an alertname); an id like none is not."""
    mine = write(
        tmp_path, "mine.yaml", "version: 1\noverrides:\n  - rule: step_stal\n    replace: {severity: critical}\n"
    )
    got = problems("builtin", mine)
    assert got == [
        f'{mine}:3:11: rule "step_stal": override of a rule that no earlier file defines (check the file order '
        "and the id); did you mean 'step_stall'?"
    ], got
    far = write(tmp_path, "far.yaml", "version: 1\noverrides:\n  - rule: zzzz_qqq\n    replace: {severity: info}\n")
    assert not any("did you mean" in p for p in problems("builtin", far))


def test_unknown_field_wrong_type_and_every_error_at_once(tmp_path):
    text = GOOD.replace("severity: warning", "severity: loud\n    colour: red\n    window: 5")
    f = write(tmp_path, "u.yaml", text)
    got = problems(f)
    assert any(p.startswith(f"{f}:7:15: ") and "'loud' is not one of" in p for p in got), got
    assert any(p.startswith(f"{f}:8:5: ") and "unknown field 'colour'" in p and 'rule "slow_step"' in p for p in got)
    assert any(p.startswith(f"{f}:9:13: ") and "expected string, got int" in p for p in got), got


def test_every_unknown_field_of_a_rule_is_reported_with_the_nearest_name(tmp_path):
    """A rule with three unknown keys gets three problems, each at its own line, not one per rule; a typo of
    an allowed name says which one was meant (a new user fixed one typo per `rules check` run)."""
    text = GOOD.replace("severity: warning", "serverity: warning\n    aaa: 1\n    bbb: 2")
    f = write(tmp_path, "m.yaml", text)
    got = problems(f)
    assert any(
        p.startswith(f"{f}:7:5: ") and "unknown field 'serverity'" in p and "did you mean 'severity'?" in p for p in got
    ), got
    assert any(p.startswith(f"{f}:8:5: ") and "unknown field 'aaa'" in p and "(allowed: " in p for p in got), got
    assert any(p.startswith(f"{f}:9:5: ") and "unknown field 'bbb'" in p for p in got), got


def test_a_misspelt_required_setting_is_one_problem_at_its_key(tmp_path):
    """`severty:` for `severity:` was reported twice: "'severity' is a required property" at the rule's first
    line and "unknown field 'severty'" at its own; once now, at the key, saying the field is required. A
    required field that is simply absent (no near key) is still reported at the mapping."""
    text = GOOD.replace("severity: warning", "severty: warning").replace("condition: stalled", "conditon: stalled")
    text = text.replace("    group_by:", "    renotify: {limt: 2}\n    group_by:")
    f = write(tmp_path, "s.yaml", text)
    got = problems(f)
    assert got == [
        f"{f}:7:5: rule \"slow_step\": unknown field 'severty' in rules/0: did you mean 'severity'? (a required field)",
        f"{f}:9:5: rule \"slow_step\": unknown field 'conditon' in rules/0: did you mean 'condition'? (a required field)",
        f"{f}:10:16: rule \"slow_step\": unknown field 'limt' in rules/0/renotify: did you mean 'limit'? (a required field)",
    ], got
    absent = problems(write(tmp_path, "a.yaml", GOOD.replace("    severity: warning\n", "")))
    required = f"{tmp_path / 'a.yaml'}:5:5: rule \"slow_step\": rules/0: 'severity' is a required property"
    assert absent == [required], absent


def test_missing_version_and_wrong_version(tmp_path):
    assert any("version" in p for p in problems(write(tmp_path, "v.yaml", GOOD.replace("version: 1\n", ""))))
    assert any("must be 1" in p for p in problems(write(tmp_path, "w.yaml", GOOD.replace("version: 1", "version: 2"))))


def test_cel_syntax_error_points_into_the_expression(tmp_path):
    f = write(tmp_path, "c.yaml", GOOD.replace("condition: stalled", "condition: stalled &&"))
    got = problems(f)
    assert len(got) == 1 and "CEL syntax error" in got[0], got
    assert got[0].startswith(f"{f}:9:"), got


@pytest.mark.parametrize(
    "cond, hint",
    [
        ("stall_ratio > 5 and stalled", "; CEL writes `&&` for and"),
        ("stalled or stall_ratio > 5", "; CEL writes `||` for or"),
        ('"not stalled"', "; CEL writes `!` for not"),
        ('"stalled and not stalled"', "; CEL writes `&&` for and, `!` for not"),
    ],
)
def test_python_and_or_not_in_a_condition_get_the_cel_operator_in_the_syntax_error(tmp_path, cond, hint):
    """A new user's first condition is Python's `and`: the syntax error ("mismatched input 'and' expecting
    {<EOF>, '==', ...}") now ends with CEL's spelling. A word only inside a string gives no hint."""
    got = problems(write(tmp_path, "p.yaml", GOOD.replace("condition: stalled", f"condition: {cond}")))
    assert len(got) == 1 and "CEL syntax error" in got[0] and got[0].endswith(hint), got
    quoted = problems(write(tmp_path, "q.yaml", GOOD.replace("condition: stalled", "condition: \"job == 'and' &&\"")))
    assert len(quoted) == 1 and "CEL syntax error" in quoted[0] and "CEL writes" not in quoted[0], quoted


def test_unknown_fields_in_conditions_are_rejected_with_suggestions(tmp_path):
    text = GOOD.replace("condition: stalled", "condition: stalled && straggler.hots == 'x' && stall_ration > 1.0")
    got = problems(write(tmp_path, "f.yaml", text))
    assert any("unknown field 'straggler.hots'" in p and "did you mean 'host'" in p for p in got), got
    assert any("unknown field 'stall_ration'" in p and "did you mean 'stall_ratio'" in p for p in got), got


def test_event_fields_and_payload_keys_are_checked_per_kind(tmp_path):
    text = """\
version: 1
rules:
  - id: slow_rdma
    description: x
    severity: info
    signal: events
    kinds: [RDMA_CQ_DONE, NOT_A_KIND]
    condition: duration_us > 20.0 && payload.qpp == 1 && straggler.host == 'x'
"""
    got = problems(write(tmp_path, "e.yaml", text))
    assert any("unknown event kind 'NOT_A_KIND'" in p for p in got), got
    assert any("payload.qpp" in p and "did you mean 'qp'" in p for p in got), got
    assert any("unknown field 'straggler'" in p for p in got), got


def test_macro_cycle_detected(tmp_path):
    text = GOOD.replace(
        "  stalled: stall == true && straggler != null", "  stalled: stall == true && again\n  again: stalled || stall"
    )
    got = problems(write(tmp_path, "m.yaml", text))
    assert any(
        "macro cycle: again -> stalled -> again" in p or "macro cycle: stalled -> again -> stalled" in p for p in got
    ), got


def test_lists_expand_and_events_need_kinds(tmp_path):
    text = """\
version: 1
lists:
  busy_hosts: [node1, node2]
rules:
  - id: busy
    description: x
    severity: info
    signal: events
    condition: host in busy_hosts
"""
    got = problems(write(tmp_path, "l.yaml", text))
    assert any("needs `kinds:`" in p for p in got), got
    rs = load_ruleset(
        [write(tmp_path, "l2.yaml", text.replace("signal: events", "signal: events\n    kinds: [SCHED_RUNQ]"))]
    )
    assert rs.rules["busy"].condition.source == 'host in ["node1", "node2"]'


def test_overrides_append_and_replace_in_file_order(tmp_path):
    a = write(tmp_path, "a.yaml", GOOD)
    b = write(
        tmp_path,
        "b.yaml",
        """\
version: 1
overrides:
  - rule: slow_step
    append: {condition: "&& job != 'scratch'", labels: {team: ml}}
    replace: {severity: critical}
""",
    )
    rs = load_ruleset([a, b])
    r = rs.rules["slow_step"]
    assert r.severity == "critical" and r.labels == {"team": "ml"}
    assert r.condition.source.endswith("&& job != 'scratch'")
    # in the other order the override has nothing to override: reported at the override
    got = problems(b, a)
    assert any(p.startswith(f"{b}:3:11: ") and "no earlier file defines" in p for p in got), got
    assert not any("did you mean" in p for p in got), got  # nothing earlier to suggest
    # redefining a rule instead of overriding it is an error
    got = problems(a, write(tmp_path, "c.yaml", GOOD))
    assert any("already defined" in p for p in got), got
    # disabling by override removes the rule
    d = write(tmp_path, "d.yaml", "version: 1\noverrides:\n  - rule: slow_step\n    replace: {enabled: false}\n")
    assert load_ruleset([a, d]).rules == {}


def test_annotation_templates_checked(tmp_path):
    got = problems(
        write(tmp_path, "t.yaml", GOOD.replace('{step: "{{ step }}"}', '{step: "{{ stepp }}", x: "{% if %}"}'))
    )
    assert any("unknown name(s) stepp" in p for p in got), got
    assert any("template syntax error" in p for p in got), got


def test_builtin_pack_is_valid():
    rs = load_ruleset([REPO / "obshub" / "rules" / "builtin"])
    assert "rdma_slow_completion_on_straggler" in rs.rules and len(rs.rules) >= 10
    assert rs.inhibit and rs.inhibit[0].equal == ["job", "host"]


def run_cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([*OBSHUB, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.mark.slow
def test_rules_check_cli_exit_codes(tmp_path):
    ok = run_cli("rules", "check", "obshub/rules/builtin")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("OK: ")
    bad = write(tmp_path, "bad.yaml", GOOD.replace("severity: warning", "severity: warning\n    enabled: no"))
    res = run_cli("rules", "check", "obshub/rules/builtin", str(bad))
    assert res.returncode == 1
    assert f"{bad}:8:14: " in res.stderr and "FAILED: 1 problem(s)" in res.stderr
    # a file without rules is refused ("no rules", exit 1: a wrong or truncated file served would watch
    # nothing while it looks healthy), unless it says `rules: []` (it passed with a warning before)
    for name, text in (("empty.yaml", "# nothing here yet\n"), ("blank.yaml", "\n\n"), ("v.yaml", "version: 1\n")):
        empty = write(tmp_path, name, text)
        res = run_cli("rules", "check", "obshub/rules/builtin", str(empty))
        assert res.returncode == 1 and f"{empty}: no rules: the file " in res.stderr, res.stderr
        assert "`rules: []`" in res.stderr and "FAILED: 1 problem(s)" in res.stderr, res.stderr
    meant = write(tmp_path, "meant.yaml", "version: 1\n# the team's rules go here\nrules: []\n")
    res = run_cli("rules", "check", "obshub/rules/builtin", str(meant))
    assert res.returncode == 0 and f"note: {meant}: no rules (`rules: []`, as written)" in res.stderr, res.stderr
    gone = run_cli("rules", "check", str(tmp_path / "missing.yaml"))
    assert gone.returncode == 1
    assert f"{tmp_path / 'missing.yaml'}: cannot read: No such file" in gone.stderr, gone.stderr  # no :0:0


def test_measurements_are_rejected_as_labels(tmp_path):
    got = problems(
        write(
            tmp_path,
            "g.yaml",
            GOOD.replace(
                "group_by: {job: job, host: straggler.host}",
                "group_by: {job: job, step: step, ex: straggler.excess_ns}",
            ),
        )
    )
    assert any(p.startswith(f"{tmp_path}/g.yaml:10:32: ") and "'step' is a measurement" in p for p in got), got
    assert any("'excess_ns' is a measurement" in p for p in got), got


def test_settings_that_mean_something_else_are_rejected_with_position(tmp_path):
    """A window of 0 keeps no match (never fires), a non-finite at_least, a count below 1 or a CUSUM at 0
    (any match reaches it), a condition that gives a number and a `max` of a string are each reported at
    the setting's line:column; the same rules with sensible settings load."""
    rule = """\
  - id: {id}
    description: d
    severity: warning
    signal: {signal}
    condition: {cond}
{extra}"""
    cases = [
        ("win0", "steps", "stall", "    window: 0s\n", "window: 0s keeps no match"),
        ("nan", "steps", "stall", "    threshold: {at_least: .nan}\n", "nan is not a finite number (no aggregate"),
        ("ninf", "steps", "stall", "    threshold: {at_least: -.inf}\n", "-inf is not a finite number (any match"),
        ("cnt0", "steps", "stall", "    threshold: {at_least: 0}\n", "0 is below 1"),
        ("cus0", "steps", "stall", "    threshold: {aggregate: cusum, of: stall_ratio, at_least: 0}\n", "CUSUM"),
        ("num", "steps", "step_time_max_ns", "", "condition: gives an int, not true or false, on a steps record"),
        ("str", "health", "topic", "", "condition: gives a string"),
        (
            "maxhost",
            "events\n    kinds: [RDMA_CQ_DONE]",
            "duration_us > 20.0",
            "    threshold: {aggregate: max, of: host, at_least: 5}\n",
            "threshold/of: gives a string on an events record; aggregate 'max' needs a number",
        ),
    ]
    text = "version: 1\nrules:\n" + "".join(
        rule.format(id=i, signal=sig, cond=c, extra=extra) for i, sig, c, extra, _ in cases
    )
    f = write(tmp_path, "bad.yaml", text)
    got = problems(f)
    lines = text.splitlines()
    for rid, _, _, _, want in cases:
        hit = [p for p in got if f'rule "{rid}"' in p and want in p]
        assert len(hit) == 1, (rid, got)
        line, col = (int(x) for x in hit[0].split(":")[1:3])
        key = "condition" if "condition:" in want else ("window" if rid == "win0" else "threshold")
        assert key in lines[line - 1], (rid, lines[line - 1])
        assert col > 1
    assert len(got) == len(cases), got
    fixed = (
        text.replace("0s", "30s")
        .replace(".nan", "2")
        .replace("-.inf", "2")
        .replace("at_least: 0}", "at_least: 1}")
        .replace("condition: step_time_max_ns", "condition: step_time_max_ns > 0")
        .replace("condition: topic", "condition: topic != ''")
        .replace("of: host", "of: duration_us")
    )
    rs = load_ruleset([write(tmp_path, "good.yaml", fixed)])
    assert len(rs.rules) == len(cases)


def test_a_condition_that_fails_on_the_neutral_record_is_not_reported(tmp_path):
    """Only a result is judged: a member of a null straggler, an index past an empty list, a key a map of
    the sample lacks fail on the sample record, as they do at run time on some records, and load."""
    text = GOOD.replace(
        "condition: stalled",
        "condition: straggler.score > 2.0 || blame[0].excess_ns > 5 || layers['h'].cuda.time_ns > 1",
    )
    rs = load_ruleset([write(tmp_path, "a.yaml", text)])
    assert list(rs.rules) == ["slow_step"]


def test_comparisons_of_a_field_with_a_literal_of_another_type_are_rejected(tmp_path):
    """`host == 78` is false on every record (CEL never finds a string equal to a number), `!=` true on
    every record, `duration_ns > "20"` fails on every record: each is reported at the comparison, in the
    rule's own condition, through a macro and in a correlated condition; a correlation `within: 0s` at its
    value."""
    text = """\
version: 1
macros:
  on_node: host == 78
rules:
  - id: direct
    description: d
    severity: warning
    signal: events
    kinds: [RDMA_CQ_DONE]
    condition: duration_us > 20.0 && host == 78
  - id: ordering
    description: d
    severity: warning
    signal: events
    kinds: [RDMA_CQ_DONE]
    condition: duration_ns > "20000"
  - id: via_macro
    description: d
    severity: warning
    signal: events
    kinds: [RDMA_CQ_DONE]
    condition: on_node
  - id: correlated
    description: d
    severity: warning
    signal: events
    kinds: [RDMA_CQ_DONE]
    condition: duration_us > 20.0
    correlate:
      signal: steps
      condition: stall != 0
      this_keys: {job: job}
      other_keys: {job: job}
      within: 0s
"""
    f = write(tmp_path, "m.yaml", text)
    got = problems(f)
    want = {
        "direct": f"{f}:10:38: rule \"direct\": condition: `host == 78` compares the string field 'host' with an "
        "int: false on every record",
        "ordering": "`duration_ns > \"20000\"` compares the int field 'duration_ns' with a string: an error on every",
        "via_macro": "condition (in a macro it uses): `host == 78` compares the string field 'host'",
        "correlated": "correlate/condition: `stall != 0` compares the bool field 'stall' with an int: true on every",
    }
    for rid, msg in want.items():
        assert sum(f'rule "{rid}"' in p and msg in p for p in got) == 1, (rid, got)
    within = f'{f}:34:15: rule "correlated": correlate/within: 0s pairs only records of the very same ns time'
    assert sum(p.startswith(within) for p in got) == 1, got
    assert len(got) == len(want) + 1, got


@pytest.mark.parametrize(
    "expr",
    [
        'host == "node-078"',
        "duration_ns > 20.0",  # int and double compare
        "gpu == 1u",
        "gpu == -1",
        "host + 1 == 5",  # a larger operand: not judged
        "x - 1 == host",
        "size(host) == 3",
        "payload.qp == 5",  # a member: its type is not known here
        "[1, 2].exists(host, host == 2)",  # a comprehension variable shadows the field
        "kind == 'RDMA_CQ_DONE' && (5 < duration_ns)",
    ],
)
def test_comparisons_of_matching_types_or_unknown_operands_are_not_judged(expr):
    from obshub.rules.expr import mismatched_comparisons
    from obshub.rules.loader import sample_record

    assert mismatched_comparisons(expr, sample_record("events", frozenset({"RDMA_CQ_DONE"}))) == []


def test_number_literals_with_suffix_or_exponent_are_not_names(tmp_path):
    """`1u`, `1.5e-3` and `0x1Fu` are number literals: their letters are no unknown fields (and a macro
    named `e3` does not expand inside `1e3`)."""
    text = GOOD.replace("macros:\n", "macros:\n  e3: 'true'\n").replace(
        "condition: stalled",
        "condition: stalled && step >= 1e3 && stall_ratio > 1.5e-3 && uint(step_time_max_ns) > 0x1Fu && step != 2u",
    )
    rs = load_ruleset([write(tmp_path, "n.yaml", text)])
    assert "1e3" in rs.rules["slow_step"].condition.source


@pytest.mark.parametrize("signal", ["steps", "events", "health"])
def test_every_documented_field_is_in_the_record_a_rule_sees(signal):
    """`rules check` accepts exactly the documented fields, so each must be in the record the engine
    evaluates (a field missing there would pass the check and fail on every record)."""
    from obshub.rules import fields
    from obshub.rules.loader import sample_record

    assert set(fields.SIGNAL_VARS[signal]) <= set(sample_record(signal, frozenset({"RDMA_CQ_DONE"})))


def test_comments_and_in_with_parentheses_are_cel_not_names(tmp_path):
    """A `//` comment (to the end of its line, apostrophes and all) is no code, also inside a macro that
    is expanded in parentheses; `x in (list)` is the operator, not a call of a function `in`."""
    text = """\
version: 1
macros:
  watched: "['node1', 'node2'] // the hosts we watch"
rules:
  - id: c
    description: d
    severity: warning
    signal: events
    kinds: [CUDA_SYNC]
    condition: |
      // only real GPUs; the host's sync doesn't count
      gpu >= 0 && duration_ns > 20000000 // gpu == "none" is -1
      && host in watched && gpu in ([0, 1])
"""
    rs = load_ruleset([write(tmp_path, "c.yaml", text)])
    assert "//" not in rs.rules["c"].condition.source
    bad = write(tmp_path, "b.yaml", text.replace("gpu in ([0, 1])", "host == 78 // wrong"))
    assert [p.split(": ", 1)[0] for p in problems(bad)] == [f"{bad}:13:29"]


def test_problems_of_overridden_settings_are_at_the_override(tmp_path):
    """A problem in a part an override wrote (an appended condition, a replaced window or threshold) is
    reported in the override's file at that value; a problem of the rule's own condition stays there."""
    base = write(
        tmp_path,
        "base.yaml",
        "version: 1\nrules:\n"
        "  - {id: r, description: d, severity: warning, signal: events, kinds: [CUDA_SYNC],\n"
        "     condition: host == 78 && duration_ns > 20000000, window: 1m}\n"
        "  - {id: s, description: d, severity: warning, signal: events, kinds: [CUDA_SYNC],\n"
        "     condition: duration_ns > 20000000}\n",
    )
    ov = write(
        tmp_path,
        "ov.yaml",
        "version: 1\noverrides:\n"
        "  - rule: r\n"
        "    append:\n"
        '      condition: "&& gpu >= 0 && host == 79"\n'
        "    replace:\n"
        "      window: 0s\n"
        "  - rule: s\n"
        "    replace:\n"
        "      threshold: {at_least: 0}\n",
    )
    got = [p.split(": rule ")[0] for p in problems(base, ov)]
    assert got == [f"{base}:4:17", f"{ov}:5:34", f"{ov}:7:15", f"{ov}:10:29"], got


def test_positions_inside_expressions_over_several_lines(tmp_path):
    """An expression's problem is found at its line:col in the file however YAML wrote the expression:
    a plain or double-quoted scalar folded over two lines, a `|` block whose lines repeat the same text,
    a `>` block, a single-quoted scalar with '' escapes."""
    head = "  - id: {}\n    description: d\n    severity: warning\n    signal: events\n    kinds: [CUDA_SYNC]\n"
    bodies = {
        "plain": "    condition: duration_ns > 20000000\n      && host == 78\n",
        "dq": "    condition: \"duration_ns > 20000000\n      && duration_ns > '5'\"\n",
        "block": '    condition: |\n      duration_ns > 5000 && gpu == 0 ||\n      duration_ns > "5000"\n',
        "sq": "    condition: 'host == ''x'' && gpu == ''0'''\n",
        "folded": '    condition: >\n      duration_ns > 5000 &&\n      hostt == "x"\n',
    }
    text = "version: 1\nrules:\n" + "".join(head.format(rid) + body for rid, body in bodies.items())
    f = write(tmp_path, "ml.yaml", text)
    got = {p.split('rule "')[1].split('"')[0]: p.split(": rule")[0] for p in problems(f)}
    assert got == {
        "plain": f"{f}:9:10",
        "dq": f"{f}:16:10",
        "block": f"{f}:24:7",
        "sq": f"{f}:30:34",
        "folded": f"{f}:38:7",
    }, got


def test_a_correlated_condition_and_an_aggregate_of_a_duration_are_judged_too(tmp_path):
    text = """\
version: 1
rules:
  - id: corr
    description: d
    severity: warning
    signal: steps
    condition: stall
    correlate: {signal: events, kinds: [CUDA_SYNC], condition: duration_ns, this_keys: {job: job},
                other_keys: {job: job}, within: 30s}
  - id: dur
    description: d
    severity: warning
    signal: events
    kinds: [CUDA_SYNC]
    condition: duration_ns > 5
    threshold: {aggregate: max, of: "duration('1s')", at_least: 5}
"""
    f = write(tmp_path, "b.yaml", text)
    got = problems(f)
    assert len(got) == 2, got
    assert got[0].startswith(f'{f}:8:64: rule "corr": correlate/condition: gives an int, not true or false, on an'), got
    assert got[1].startswith(f'{f}:16:37: rule "dur": threshold/of: gives a duration on an events record'), got


def test_an_unclosed_quote_is_named_where_it_opens_and_a_count_no_window_holds_is_refused(tmp_path):
    """The scanner reads an unclosed quote to the end of the file: the problem is where the quote opens.
    A count threshold above the matches a group's window keeps can never be reached."""
    f = write(tmp_path, "q.yaml", GOOD.replace('step: "{{ step }}"', 'step: "{{ step }}'))
    assert problems(f) == [
        f"{f}:11:25: YAML: a quoted string starts here and is never closed (its closing quote is missing)"
    ]
    big = GOOD.replace("severity: warning", "severity: warning\n    window: 1m\n    threshold: {at_least: 1e300}")
    got = problems(write(tmp_path, "big.yaml", big))
    assert any(":9:27: " in p and "above 10,000, the most matches a group keeps" in p for p in got), got
    ok = big.replace("1e300", "10000")
    assert list(load_ruleset([write(tmp_path, "ok.yaml", ok)]).rules) == ["slow_step"]


def test_a_rules_own_empty_routes_is_refused_because_it_means_every_sink(tmp_path):
    """`routes: []` reads as "no sink", but an empty list is what no `routes:` is: every sink. It passed the
    check, so a rule meant to notify nobody paged every sink (newuser19). An override's `replace: {routes:
    []}` resets routes an earlier file gave: that one stays allowed."""
    p = write(tmp_path, "a.yaml", GOOD.replace("    annotations:", "    routes: []\n    annotations:"))
    (problem,) = problems(p)
    assert problem.startswith(f"{p}:11:13: ") and "routes: [] sends this rule's alerts to every sink" in problem, (
        problem
    )
    assert "enabled: false" in problem
    routed = write(tmp_path, "b.yaml", GOOD.replace("    annotations:", "    routes: [pager]\n    annotations:"))
    assert load_ruleset([routed]).rules["slow_step"].routes == ["pager"]
    reset = write(tmp_path, "c.yaml", "version: 1\noverrides:\n  - rule: slow_step\n    replace: {routes: []}\n")
    assert load_ruleset([routed, reset]).rules["slow_step"].routes == []


def test_an_id_with_a_newline_or_tab_stays_on_its_problem_line(tmp_path):
    """`id: "a\\nb"` (an id no rule may have) printed its problem over two lines: the `rule "..."` prefix held
    the raw newline, so a CI step reading one problem per line saw a line without file:line:col (newuser20)."""
    f = write(tmp_path, "r.yaml", GOOD.replace("id: slow_step", 'id: "slow\\nstep\\there"'))
    got = problems(f)
    assert len(got) == 1 and "\n" not in got[0] and "\t" not in got[0], got
    assert got[0].startswith(f'{f}:5:9: rule "slow\\nstep\\there": rules/0/id: '), got
    res = subprocess.run([*OBSHUB, "rules", "check", str(f)], capture_output=True, text=True, timeout=120, cwd=REPO)
    lines = (res.stdout + res.stderr).strip().splitlines()
    assert res.returncode == 1 and len(lines) == 2 and lines[0].startswith(f"{f}:5:9: "), lines
