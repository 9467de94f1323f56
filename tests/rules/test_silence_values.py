"""``obshub silence add`` refuses equality matchers that can mute nothing (walk24): a value starting with
``=`` or ``~`` (``host==node2``), ``alertname=`` no rule id, ``severity=`` no severity, a value past
1,024 characters; and an empty author or comment is a usage error (exit 2) like the others."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from obshub.cli import cli


def add(tmp_path, *args: str):
    return CliRunner().invoke(
        cli, ["silence", "add", *args], env={"OBSHUB_HOME": str(tmp_path / "home")}, catch_exceptions=False
    )


@pytest.mark.parametrize(
    "matcher, said",
    [
        ("host==node2", "did you mean host=node2?"),
        ("host!==node2", "did you mean host!=node2?"),
        ("host!=~node.*", "did you mean host!~node.*?"),
        ("alertname=step_stal", "did you mean alertname=step_stall"),
        ("alertname=no_such_rule_anywhere", "no rule has the id 'no_such_rule_anywhere'"),
        ("severity=urgent", "critical, error, warning, info"),
        ("host=" + "x" * 100_000, "100000 characters, at most 1024"),
    ],
)
def test_a_matcher_that_mutes_nothing_is_refused_naming_it_and_the_fix(tmp_path, matcher, said):
    res = add(tmp_path, "-m", matcher, "-m", "job=llm", "-a", "alice", "-c", "maintenance")
    assert res.exit_code == 2, res.output
    assert said in res.output and "'-m' / '--matcher'" in res.output
    assert "x" * 1000 not in res.output  # the long value is not echoed whole
    listed = CliRunner().invoke(cli, ["silence", "list"], env={"OBSHUB_HOME": str(tmp_path / "home")})
    assert "no silences" in listed.output


def test_matchers_that_can_mute_are_kept(tmp_path):
    for m in ("host=node2", "alertname=step_stall", "severity=critical", "host=~=?node.*", "alertname!=step_stall"):
        res = add(tmp_path, "-m", m, "-m", "job=llm", "-a", "alice", "-c", "maintenance")
        assert res.exit_code == 0, (m, res.output)


def test_a_rule_id_of_a_given_rule_file_counts_and_any_label_keeps_an_unknown_one(tmp_path):
    rules = tmp_path / "team.yaml"
    rules.write_text(
        "version: 1\nrules:\n  - id: team_loss\n    description: d\n    severity: error\n    signal: steps\n"
        "    condition: quality.lost_batches > 0\n    group_by: {job: job}\n"
    )
    assert add(tmp_path, "-m", "alertname=team_loss", "-a", "a", "-c", "c").exit_code == 2
    assert add(tmp_path, "-m", "alertname=team_loss", "-r", str(rules), "-a", "a", "-c", "c").exit_code == 0
    assert add(tmp_path, "-m", "alertname=rule_to_come", "--any-label", "-a", "a", "-c", "c").exit_code == 0
    assert add(tmp_path, "-m", "severity=urgent", "--any-label", "-a", "a", "-c", "c").exit_code == 2


@pytest.mark.parametrize("who", [["-a", "", "-c", "why"], ["-a", "alice", "-c", "  "]])
def test_an_empty_author_or_comment_is_a_usage_error(tmp_path, who):
    res = add(tmp_path, "-m", "host=node2", *who)
    assert res.exit_code == 2, res.output
    assert "needs an author and a comment" in res.output


def test_silence_list_cuts_a_long_stored_value(tmp_path):
    import os
    import time

    from obshub.core.settings import load_settings
    from obshub.rules.service import state_dir
    from obshub.rules.silences import SilenceStore

    os.environ["OBSHUB_HOME"] = str(tmp_path / "home")
    try:
        store = SilenceStore(state_dir(load_settings()) / "silences.json")
        now = time.time_ns()
        store.add(["host=" + "y" * 5000], now, now + 3600 * 10**9, "alice", "old silence")
        out = CliRunner().invoke(cli, ["silence", "list"], env={"OBSHUB_HOME": str(tmp_path / "home")}).output
    finally:
        del os.environ["OBSHUB_HOME"]
    assert "(5005 characters)" in out and "y" * 200 not in out
