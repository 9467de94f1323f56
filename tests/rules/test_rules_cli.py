"""`obshub rules test` and `obshub silence` as a user runs them: exit codes, PASS/FAIL lines, expected
vs got on failure; the builtin pack's own unit tests pass; silences add/list/expire and matching."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from obshub.rules.errors import SilenceError
from obshub.rules.silences import Matcher, SilenceStore

pytestmark = pytest.mark.slow  # each test runs the obshub command line in a subprocess

REPO = Path(__file__).resolve().parents[2]
OBSHUB = [sys.executable, "-m", "obshub.cli"]

RULE = """\
version: 1
rules:
  - id: lost_batches
    description: batches lost
    severity: error
    signal: steps
    condition: quality.lost_batches > 0
    group_by: {job: job}
    annotations: {summary: "{{ quality.lost_batches }} lost in {{ job }}"}
"""

TEST_OK = """\
version: 1
rule_files: [rules.yaml]
tests:
  - name: loss fires
    input:
      - at: 0s
        steps: {job: llm, step: 1, quality: {lost_batches: 2}}
    expect:
      - at: 1s
        alerts:
          - rule: lost_batches
            labels: {job: llm}
            annotations: {summary: "2 lost in llm"}
      - at: 5m
        alerts: []
"""

LAST = "        alerts: []\n"  # the last line of TEST_OK
INPUT = "    input:\n      - at: 0s\n        steps: {job: llm, step: 1, quality: {lost_batches: 2}}\n"


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*OBSHUB, *args], capture_output=True, text=True, cwd=REPO, timeout=120, env={**os.environ, **(env or {})}
    )


def test_builtin_pack_tests_pass_via_cli():
    files = sorted(str(p) for p in (REPO / "obshub" / "rules" / "builtin" / "tests").glob("*.yaml"))
    assert len(files) >= 3
    res = run("rules", "test", *files)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "FAIL" not in res.stdout and " 0 failed" in res.stdout
    assert res.stdout.count("PASS ") >= 10


def test_rules_test_pass_and_fail_with_expected_vs_got(tmp_path):
    (tmp_path / "rules.yaml").write_text(RULE)
    ok = tmp_path / "ok_test.yaml"
    ok.write_text(TEST_OK)
    res = run("rules", "test", str(ok))
    assert res.returncode == 0 and "PASS" in res.stdout and "1 passed, 0 failed" in res.stdout, res.stdout
    bad = tmp_path / "bad_test.yaml"
    bad.write_text(TEST_OK.replace("labels: {job: llm}", "labels: {job: other}").replace("at: 5m", "at: 10s"))
    res = run("rules", "test", str(bad))
    assert res.returncode == 1
    out = res.stdout
    assert "FAIL" in out and "0 passed, 1 failed" in out
    assert "expected:\n      lost_batches [firing] {job=other}" in out, out
    assert "got:\n      lost_batches [firing] {alertname=lost_batches, job=llm, severity=error}" in out, out
    # at 10 s the alert still fires although "no alerts" was expected
    assert "at 10s:" in out and "(no alerts)" in out


def test_rules_test_names_an_expected_rule_id_no_rule_file_defines(tmp_path):
    """A misspelt rule id under `expect:` can never match: the failure says that no rule has it, and the
    nearest id, beside the expected and got alerts (newuser18: only 'expected ... got ...' was shown)."""
    from obshub.rules.testing import run_test_file

    (tmp_path / "rules.yaml").write_text(RULE)
    t = tmp_path / "t_test.yaml"
    t.write_text(TEST_OK.replace("rule: lost_batches", "rule: lost_batch"))
    [res] = run_test_file(t)
    assert not res.ok and res.failures[-1] == (
        "rule lost_batch: no rule of this id in the test's rule_files (did you mean 'lost_batches'?)"
    ), res.failures
    t.write_text(TEST_OK)
    assert [r.failures for r in run_test_file(t)] == [[]]


def test_rules_test_reports_malformed_test_file_and_broken_rules(tmp_path):
    (tmp_path / "rules.yaml").write_text(RULE.replace("severity: error", "severity: error\n    foo: 1"))
    t = tmp_path / "t_test.yaml"
    t.write_text(TEST_OK)
    res = run("rules", "test", str(t))
    assert res.returncode == 1 and "unknown field 'foo'" in res.stderr and "rules.yaml:6:5" in res.stderr
    (tmp_path / "rules.yaml").write_text(RULE)
    t.write_text(TEST_OK.replace("    input:", "    inputs:"))
    res = run("rules", "test", str(t))
    assert res.returncode == 1 and "unknown field 'inputs'" in res.stderr and "t_test.yaml:5:5" in res.stderr


def test_rules_test_refuses_event_inputs_outside_the_event_schemas_ranges(tmp_path):
    """`duration_ns: -5`, `gpu: -3` and `step: -7` passed silently into the rules, though production's
    decoder (obshub/core/schema.py, EVENT_INT_RANGES) refuses such an event (walk25): each is refused at
    its own file:line:col, naming the field and its range; the edge values the schema allows (`step: -1`,
    not within a step; `gpu: -1`, no GPU) pass."""
    (tmp_path / "rules.yaml").write_text(RULE)
    t = tmp_path / "t_test.yaml"
    event = (
        "        events:\n          kind: CUDA_SYNC\n          duration_ns: D\n          gpu: G\n"
        "          step: S\n          host_id: H\n"
    )
    body = TEST_OK.replace(INPUT, "    input:\n      - at: 0s\n" + event)
    t.write_text(body.replace("D", "-5").replace("G", "-3").replace("S", "-7").replace("H", "70000"))
    res = run("rules", "test", str(t))
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    for where, why in (
        ("9:24", "events.duration_ns: -5 outside 0..9223372036854775807"),
        ("10:16", "events.gpu: -3 outside -1..65535"),
        ("11:17", "events.step: -7 outside -1..9223372036854775807"),
        ("12:20", "events.host_id: 70000 outside 0..65535"),
    ):
        assert f"{t}:{where}: {why}: the event schema (obshub/core/schema.py) refuses such an event" in res.stderr, (
            why,
            res.stderr,
        )
    t.write_text(body.replace("D", "0").replace("G", "-1").replace("S", "-1").replace("H", "0"))
    res = run("rules", "test", str(t))
    assert "outside" not in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_rules_test_refuses_a_test_file_of_the_wrong_shape(tmp_path):
    (tmp_path / "rules.yaml").write_text(RULE)
    t = tmp_path / "t_test.yaml"
    t.write_bytes(b"version: 1\nrule_files: [rules.yaml]\n\xf1\xff junk\n")
    res = run("rules", "test", str(t))
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert f"{t}:3:1: not UTF-8: byte 0xf1" in res.stderr, res.stderr
    t.write_text(TEST_OK.replace("rule_files: [rules.yaml]", "rule_files: rules.yaml"))
    res = run("rules", "test", str(t))
    assert res.returncode == 1 and "`rule_files:` is a list of rule files, not string 'rules.yaml'" in res.stderr
    assert f"{t}:2:13" in res.stderr, res.stderr
    t.write_text(TEST_OK.replace("rule_files: [rules.yaml]", "rule_files: [rules.yaml, 7]"))
    res = run("rules", "test", str(t))
    assert res.returncode == 1 and "a rule file is a path, not integer 7" in res.stderr, res.stderr
    t.write_text("version: 1\nrule_files: [rules.yaml]\ntests: {name: x}\n")
    res = run("rules", "test", str(t))
    assert res.returncode == 1 and "`tests:` is a list of tests" in res.stderr, res.stderr
    # a file without tests runs nothing: that must not pass
    t.write_text("version: 1\nrule_files: [rules.yaml]\ntests: []\n")
    res = run("rules", "test", str(t))
    assert res.returncode == 1 and "no test ran" in res.stderr and "0 passed, 0 failed" in res.stdout


@pytest.mark.parametrize(
    "old, new, where, why",
    [
        ("step: 1,", 'step: "one",', "7:16", "steps.step: expected an integer, got str 'one'"),
        ("step: 1,", "stepp: 1,", "7:16", "steps: unknown field 'stepp'; did you mean 'step'?"),
        (
            "steps: {job: llm, step: 1, quality: {lost_batches: 2}}",
            "events: {kind: CUDA_SYNC, duration_ns: thirty}",
            "7:17",
            "events.duration_ns: expected a 64-bit integer, got string 'thirty'",
        ),
        (
            "steps: {job: llm, step: 1, quality: {lost_batches: 2}}",
            "events: {kind: CUDA_SYNC, host: {a: 1}}",
            "7:17",
            "events.host: expected a non-empty string, got mapping {'a': 1}",
        ),
        ("steps: {job: llm, step: 1, quality: {lost_batches: 2}}", "events: 5", "7:17", "events: expected a mapping"),
        (
            "steps: {job: llm, step: 1, quality: {lost_batches: 2}}",
            "health: {lag_messages: lots}",
            "7:17",
            "health.lag_messages: expected an integer",
        ),
        # below the top level: the type the rules read each member as (rules.typecheck.STEP_TYPES), at the
        # wrong value's own position; these reached the rules and failed their conditions silently
        (
            "lost_batches: 2",
            'lost_batches: "2"',
            "7:60",
            "steps.quality.lost_batches: expected an integer, got string '2'",
        ),
        (
            "step: 1,",
            "step: 1, culprit: {host: node1, layer: network, evidence: high},",
            "7:85",
            "steps.culprit.evidence: expected a number, got string 'high'",
        ),
        (
            "step: 1,",
            "step: 1, evidence: {hosts: {node1: [4.0]}},",
            "7:62",
            "steps.evidence.hosts.node1: expected a map, got list [4.0]",
        ),
        (
            "step: 1,",
            "step: 1, evidence: {hosts: {node1: {netwrk: 4.0}}},",
            "7:63",
            "steps.evidence.hosts.node1: unknown field 'netwrk'; did you mean 'network'?",
        ),
        ("step: 1,", "step: 1, straggler: {hots: node1},", "7:48", "steps.straggler: unknown field 'hots'; did you"),
        (
            "step: 1,",
            "step: 1, blame: [{host: node1, layer: network, excess_ns: 5.5}],",
            "7:85",
            "steps.blame[0].excess_ns: expected an integer, got number 5.5",
        ),
        ("step: 1,", "step: 1, closed_by: done,", "7:47", "steps.closed_by: 'done' is not one of complete, hang,"),
        ("step: 1,", "step: 1, step_time_ns: {0: 5},", "7:51", "steps.step_time_ns: key 0 is integer: a map's keys"),
        ("- at: 0s\n", "- at: 0s\n        repeat: 100000000\n", "7:17", "`repeat:` must be 1..100000"),
        ("- at: 5m", "- at: 16 s", "14:13", "`at:` "),  # its own line, not the test case's
        (
            "steps: {job: llm, step: 1, quality: {lost_batches: 2}}",
            "events: {kind: CUDA_SYNCC}",
            "7:24",
            "`kind: CUDA_SYNCC` is not one (did you mean 'CUDA_SYNC'?); known kinds: ",
        ),
        (
            "labels: {job: llm}",
            "labels: {job: llm}\n            state: fring",
            "13:20",
            "`state:` is pending or firing",
        ),
        # a repeated name, a test that expects nothing, an expectation without `alerts:` (newuser12)
        (LAST, LAST + "  - name: loss fires\n    expect: []\n", "16:11", "duplicate test name 'loss fires'"),
        (LAST, LAST + "  - name: nothing\n", "16:5", "test 'nothing' expects nothing"),
        (LAST, LAST + "  - name: none\n    input: []\n", "16:5", "test 'none' expects nothing"),
        (LAST, LAST + "  - name: ' '\n    expect: [{at: 1s}]\n", "16:11", "a test needs a `name:`"),
        (LAST, "", "14:9", "an expectation needs `alerts:`"),
        # a mapping or a string where a list is expected was walked as its keys or characters
        (INPUT, "    input: nope\n", "5:12", "`input:` is a list of records (`- at: ...`), not string 'nope'"),
        (INPUT, "    input: {at: 0s}\n", "5:12", "`input:` is a list of records (`- at: ...`), not mapping"),
        (LAST, "        alerts: {rule: x}\n", "15:17", "`alerts:` is a list of alerts (`- rule: ...`), not mapping"),
        # an expected alert without `rule:`, or labels / annotations that are no mapping, were a traceback
        # (KeyError, AttributeError) once compared; a `rule:` or label that is a list matched nothing (newuser18)
        ("- rule: lost_batches", "- state: firing", "11:13", "an expected alert needs `rule:`"),
        ("rule: lost_batches", "rule: [lost_batches]", "11:19", "`rule:` is the id of a rule, not list"),
        ("labels: {job: llm}", "labels: [job]", "12:21", "`labels:` is a mapping of name: value, not list ['job']"),
        ('annotations: {summary: "2 lost in llm"}', "annotations: two", "13:26", "`annotations:` is a mapping"),
        ("labels: {job: llm}", "labels: {job: [llm]}", "12:27", "`labels.job:` is a value (text or a number)"),
    ],
)
def test_rules_test_names_a_bad_input_record_at_its_position(tmp_path, old, new, where, why):
    """A test input production would refuse (wrong type, misspelt field, absurd repeat) is an error at
    its file:line:col naming the field, never a traceback or a silently dropped field."""
    from obshub.rules.errors import RuleTestError
    from obshub.rules.testing import run_test_file

    (tmp_path / "rules.yaml").write_text(RULE)
    t = tmp_path / "t_test.yaml"
    assert old in TEST_OK
    t.write_text(TEST_OK.replace(old, new, 1))
    with pytest.raises(RuleTestError) as exc:
        run_test_file(t)
    assert f"{t}:{where}: " in str(exc.value) and why in str(exc.value), str(exc.value)


def test_rules_test_names_every_problem_of_a_test_file_not_only_the_first(tmp_path):
    """Three mistakes in three places of one test file (a misspelt field in one case, a bad record and an
    unknown state in another, a test without expectations): one run names them all at their
    file:line:col, in file order, and exits 1 (it stopped at the first before)."""
    (tmp_path / "rules.yaml").write_text(RULE)
    t = tmp_path / "t_test.yaml"
    t.write_text(
        TEST_OK.replace("step: 1,", 'step: "one",').replace(
            "labels: {job: llm}", "labels: {job: llm}\n            state: fring"
        )
        + "  - name: nothing\n"
        + "  - name: other\n    inputs: []\n    expect: [{at: 1s, alerts: []}]\n"
    )
    res = run("rules", "test", str(t))
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    want = [
        f"{t}:7:16: steps.step: expected an integer",
        f"{t}:13:20: `state:` is pending or firing",
        f"{t}:17:5: test 'nothing' expects nothing",
        f"{t}:19:5: unknown field 'inputs' in a test",
    ]
    at = [res.stderr.find(w) for w in want]
    assert all(a >= 0 for a in at) and at == sorted(at), res.stderr


def test_rules_test_shows_a_condition_that_fails_to_evaluate_and_runs_a_directory(tmp_path):
    """A failing test whose rule's condition raised on the records says so (the likeliest reason for
    "(no alerts)"); a directory runs its test files in name order."""
    from obshub.rules.testing import run_test_file

    (tmp_path / "rules.yaml").write_text(
        RULE.replace("quality.lost_batches > 0", "quality.lost_batches > 0 && step_time_ns['nohost'] > 0")
    )
    t = tmp_path / "t_test.yaml"
    t.write_text(TEST_OK)
    (res,) = run_test_file(t)
    assert not res.ok
    assert "rule lost_batches: its condition failed to evaluate 1 time(s), counted as false; last:" in res.failures[-1]
    (tmp_path / "rules.yaml").write_text(RULE)
    (tmp_path / "notes.txt").write_text("not a test file")
    got = run("rules", "test", str(tmp_path))
    assert got.returncode == 0 and "1 passed, 0 failed" in got.stdout, got.stdout + got.stderr
    # test files in subdirectories count too; a directory without any is an error, not "0 passed"
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "u_test.yaml").write_text(TEST_OK.replace("[rules.yaml]", "[../rules.yaml]"))
    (tmp_path / "empty").mkdir()
    got = run("rules", "test", str(tmp_path / "more"), str(tmp_path / "empty"))
    assert got.returncode == 1 and "1 passed, 0 failed, some files could not run" in got.stdout, got.stdout
    assert f"ERROR {tmp_path / 'empty'}: no *_test.yaml or *_test.yml file in it or below it" in got.stderr
    got = run("rules", "test", str(tmp_path))
    assert got.returncode == 0 and "2 passed, 0 failed" in got.stdout, got.stdout + got.stderr


def test_help_has_examples():
    res = run("rules", "--help")
    assert res.returncode == 0 and "obshub rules check builtin" in res.stdout and "#" in res.stdout
    res = run("silence", "add", "--help")
    assert res.returncode == 0 and "obshub silence add -m host=node2" in res.stdout


def test_silence_cli_add_list_expire(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from obshub.cli import cli

    env = {"OBSHUB_HOME": str(tmp_path / "home")}
    res = run(
        "silence",
        "add",
        "-m",
        "host=node2",
        "-m",
        "alertname=~.*straggler",
        "-d",
        "2h",
        "-a",
        "alice",
        "-c",
        "maintenance OPS-1",
        "--json",
        env=env,
    )
    assert res.returncode == 0, res.stderr
    sil = json.loads(res.stdout)
    bad = run("silence", "add", "-m", "host", "-a", "a", "-c", "c", env=env)
    assert bad.returncode == 2 and "is not NAME=VALUE" in bad.stderr and "--matcher" in bad.stderr  # a usage error
    runner = CliRunner()
    listed = runner.invoke(cli, ["silence", "list"], env=env)
    assert sil["id"] in listed.output and "active" in listed.output and "alice" in listed.output
    assert runner.invoke(cli, ["silence", "expire", sil["id"]], env=env).exit_code == 0
    assert sil["id"] not in runner.invoke(cli, ["silence", "list"], env=env).output
    assert "expired" in runner.invoke(cli, ["silence", "list", "--all"], env=env).output
    assert isinstance(runner.invoke(cli, ["silence", "expire", "nope"], env=env).exception, SilenceError)


def test_silence_matching(tmp_path):
    store = SilenceStore(tmp_path / "s.json")
    now = time.time_ns()
    s = store.add(["host=node2", "alertname=~.*straggler", "job!=scratch"], now - 1, now + 10**12, "a", "c")
    assert store.muted_by({"host": "node2", "alertname": "sched_straggler", "job": "llm"}, now) == [s.id]
    assert store.muted_by({"host": "node3", "alertname": "sched_straggler", "job": "llm"}, now) == []
    assert store.muted_by({"host": "node2", "alertname": "sched_straggler", "job": "scratch"}, now) == []
    assert store.muted_by({"host": "node2", "alertname": "sched_straggler", "job": "llm"}, now + 2 * 10**12) == []
    assert not Matcher.parse("a!~x.*").matches({"a": "xyz"})
    with pytest.raises(SilenceError):
        store.add(["host=a"], now, now - 1, "a", "c")
    with pytest.raises(SilenceError):
        Matcher.parse("a=~(")


def test_docs_quick_start_runs_and_every_builtin_rule_has_a_runbook(tmp_path):
    import re

    from obshub.rules.fields import EVENT_VARS, HEALTH_VARS
    from obshub.rules.loader import load_ruleset

    doc = (REPO / "docs" / "RULES.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", doc, re.S)
    team = tmp_path / "team"
    (team / "tests").mkdir(parents=True)
    (team / "slow_sync.yaml").write_text(blocks[0])
    (team / "tests" / "slow_sync_test.yaml").write_text(blocks[1])
    res = subprocess.run(
        [*OBSHUB, "rules", "test", "team/tests/slow_sync_test.yaml"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert res.returncode == 0 and "1 passed, 0 failed" in res.stdout, res.stdout + res.stderr
    (team / "bad.yaml").write_text(blocks[0].replace("condition: duration_ns", "condition: duration"))
    res = subprocess.run(
        [*OBSHUB, "rules", "check", "team/bad.yaml"], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    shown = re.search(r"# (team/slow_sync\.yaml:\d+:\d+: .*)", doc).group(1)
    assert res.stderr.splitlines()[0] == shown.replace("slow_sync.yaml", "bad.yaml")
    for rid, rule in load_ruleset([REPO / "obshub" / "rules" / "builtin"]).rules.items():
        assert f"\n### {rid}\n" in doc, f"docs/RULES.md has no runbook section for {rid}"
        assert rule.runbook == f"docs/RULES.md#{rid}"
    for name in list(EVENT_VARS) + list(HEALTH_VARS):
        assert f"`{name}`" in doc, f"docs/RULES.md does not document field {name}"


def test_the_ten_minutes_commands_of_rules_md_run_outside_the_repository(tmp_path):
    """Steps 2 and 4 of docs/RULES.md's "ten minutes" named the pack `obshub/rules/builtin`, a path that
    exists only in a checkout: a user of the installed package, in their own directory, got "cannot read:
    No such file or directory" (walk25). Step 2's command, run as written there, and step 4's rule paths
    (given to `rules check`: `serve` needs a broker) pass in a directory that holds only team/."""
    import re
    import shlex

    doc = (REPO / "docs" / "RULES.md").read_text()
    section = doc[doc.index("## Write, test and ship a rule in ten minutes") :]
    section = section[: section.index("\n## ", 10)]
    team = tmp_path / "team"
    team.mkdir()
    (team / "slow_sync.yaml").write_text(re.findall(r"```yaml\n(.*?)```", section, re.S)[0])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    commands = [
        shlex.split(line, comments=True)
        for block in re.findall(r"```sh\n(.*?)```", section, re.S)
        for line in block.splitlines()
        if line.startswith("obshub rules ")
    ]
    check = next(c for c in commands if c[2] == "check")
    serve = next(c for c in commands if c[2] == "serve")
    paths = [serve[i + 1] for i, a in enumerate(serve) if a in ("-r", "--rules")]
    assert paths, serve
    for args in (check[2:], ["check", *paths]):
        res = subprocess.run(
            [sys.executable, "-m", "obshub", "rules", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert res.returncode == 0 and res.stdout.startswith("OK: "), (args, res.stdout + res.stderr)


def test_the_name_builtin_is_the_installed_pack_from_any_directory(tmp_path):
    """A user outside the repository (pip install) names the builtin pack `builtin`: on the command line,
    beside their own rules, and in a test file's rule_files; a real folder of that name wins."""
    (tmp_path / "mine.yaml").write_text(RULE)
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def obshub_rules(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "obshub", "rules", *args]
        return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)

    res = obshub_rules("check", "builtin", "mine.yaml")
    n_builtin = len(list((REPO / "obshub" / "rules" / "builtin").glob("*.yaml")))
    assert res.returncode == 0 and f"in {n_builtin + 1} file(s)" in res.stdout, res.stdout + res.stderr
    (tmp_path / "t_test.yaml").write_text(
        "version: 1\nrule_files: [builtin]\ntests:\n  - name: nothing\n    input: []\n    expect: [{at: 1s, alerts: []}]\n"
    )
    res = obshub_rules("test", "t_test.yaml")
    assert res.returncode == 0 and "1 passed, 0 failed" in res.stdout, res.stdout + res.stderr
    # `rules test builtin` runs the pack's own tests, as `rules check builtin` checks its rules (it was
    # "builtin: cannot read: No such file or directory", exit 1, newuser15)
    res = obshub_rules("test", "builtin")
    n_tests = sum(
        len(f.read_text().split("\n  - name: ")) - 1 for f in (REPO / "obshub/rules/builtin/tests").glob("*.yaml")
    )
    assert res.returncode == 0 and f"{n_tests} passed, 0 failed" in res.stdout, res.stdout + res.stderr
    (tmp_path / "builtin").mkdir()  # a folder of that name is the user's, not the pack
    res = obshub_rules("check", "builtin", "mine.yaml")
    assert res.returncode == 0 and "OK: 1 rule(s) in 1 file(s)" in res.stdout, res.stdout + res.stderr


@pytest.mark.parametrize(
    "content, named",
    [
        ('[{"id": "a"}]', "not a silences file (a JSON object with a 'silences' list)"),
        ('{"silences": {"a": 1}}', "not a silences file"),
        ('{"silences": [5]}', "silence 0: "),
        ('{"silences": [{"id": "a"}]}', "silence 0: "),
        (
            '{"silences": [{"id": "a", "matchers": ["host=x"], "starts_at_ns": "soon", "ends_at_ns": 1,'
            ' "author": "a", "comment": "c"}]}',
            "silence 0: 'starts_at_ns' is not an integer (ns)",
        ),
    ],
)
def test_a_hand_edited_silences_file_of_another_shape_is_one_error_naming_what(tmp_path, content, named):
    """The silences file is JSON a person may edit: a list at the top, a silence that is no object or has
    a field of another type gave an AttributeError or TypeError traceback in `obshub silence list`."""
    home = tmp_path / "home"
    (home / "state" / "rules").mkdir(parents=True)
    (home / "state" / "rules" / "silences.json").write_text(content)
    r = subprocess.run(
        OBSHUB + ["silence", "list"], capture_output=True, text=True, env={**os.environ, "OBSHUB_HOME": str(home)}
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "cannot read silences from" in r.stderr and named in " ".join(r.stderr.split()), r.stderr


def test_rules_a_folder_holds_but_does_not_read_are_named(tmp_path):
    """A rule folder contributes only its own *.yaml / *.yml files: `rules check team/` said "OK: 1 rule(s)"
    and `rules serve -r team/` ran without a word while team/net/slow.yaml and team/Gpu.YAML were never read,
    so their alerts never fired (newuser19). Each is now a note naming it and what to do; a folder with
    nothing else says why it found no rule file; rule tests in a subfolder (the builtin pack's tests/) are
    not rules and stay quiet."""
    from obshub.rules.loader import load_ruleset

    team = tmp_path / "team"
    (team / "net").mkdir(parents=True)
    (team / "tests").mkdir()
    (team / "rules.yaml").write_text(RULE)
    (team / "net" / "slow.yaml").write_text(RULE.replace("lost_batches\n", "net_slow\n", 1))
    (team / "Gpu.YAML").write_text(RULE.replace("lost_batches\n", "gpu_slow\n", 1))
    (team / "tests" / "rules_test.yaml").write_text(TEST_OK)
    res = run("rules", "check", str(team))
    assert res.returncode == 0 and "OK: 1 rule(s) in 1 file(s)" in res.stdout, res.stdout + res.stderr
    notes = [line for line in res.stderr.splitlines() if line.startswith("note: ")]
    assert len(notes) == 2, res.stderr
    assert notes[0].startswith(f"note: {team / 'Gpu.YAML'}: not read") and "lower case" in notes[0], notes
    assert notes[1].startswith(f"note: {team / 'net'}: not read: a subfolder (1 YAML file(s))") and (
        f"give {team / 'net'} as a rule path too" in notes[1]
    ), notes
    assert "tests" not in " ".join(notes)
    # named as well, both are read, and nothing is noted
    both = run("rules", "check", str(team), str(team / "net"))
    assert both.returncode == 0 and "OK: 2 rule(s) in 2 file(s)" in both.stdout, both.stdout + both.stderr
    assert load_ruleset([team]).unread == [n.removeprefix("note: ") for n in notes]
    assert load_ruleset([REPO / "obshub" / "rules" / "builtin"]).unread == []
    # a folder with only a subfolder of rules: the error says where they are
    (team / "rules.yaml").unlink()
    (team / "Gpu.YAML").unlink()
    res = run("rules", "check", str(team))
    assert res.returncode == 1 and "no rule files found" in res.stderr and f"{team / 'net'}: not read" in res.stderr
