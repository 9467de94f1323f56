"""Bad input at the command line gets a clear error and a non-zero exit code, never a traceback
(cases found by a new user trying to break obshub)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # each test runs the obshub command line in a subprocess

OBSHUB = [sys.executable, "-m", "obshub.cli"]


def run(args, tmp_path, **env):
    e = {**os.environ, "OBSHUB_HOME": str(tmp_path / "home"), **env}
    return subprocess.run(OBSHUB + args, capture_output=True, text=True, env=e, timeout=120)


def test_user_text_is_not_read_as_markup(tmp_path):
    odd = tmp_path / "x[/y]"  # rich would read "[/y]" as a closing tag
    odd.mkdir(parents=True)
    r = run(["replay", str(odd), "--dry-run"], tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "x[/y]" in r.stderr.replace("\n", "")


@pytest.mark.parametrize("port", ["abc", "99999"])
def test_invalid_port_setting(tmp_path, port):
    r = run(["status"], tmp_path, OBSHUB_KAFKA_PORT=port)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "invalid setting" in r.stderr and "OBSHUB_KAFKA_PORT" in r.stderr


def test_silence_duration_is_bounded_before_saving(tmp_path):
    r = run(["silence", "add", "-m", "host=x", "-d", "99999999999h", "-a", "a", "-c", "c"], tmp_path)
    assert r.returncode == 2 and "at most 10 years" in r.stderr and "Traceback" not in r.stderr
    listed = run(["silence", "list"], tmp_path)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr
    # the option that is out of range is the one named
    r = run(["silence", "add", "-m", "host=x", "--start-in", "99999999999d", "-a", "a", "-c", "c"], tmp_path)
    assert r.returncode == 2 and "'--start-in'" in r.stderr and "start at most 10 years" in r.stderr, r.stderr
    r = run(["silence", "add", "-m", "host=x", "--start-in", "nope", "-a", "a", "-c", "c"], tmp_path)
    assert r.returncode == 2 and "'--start-in'" in r.stderr, r.stderr
    r = run(["silence", "add", "-m", "host=x", "--start-in", "3650d", "-d", "3650d", "-a", "a", "-c", "c"], tmp_path)
    assert r.returncode == 2 and "'-d' / '--duration'" in r.stderr and "--start-in plus --duration" in r.stderr


def test_rule_file_not_utf8_and_too_deep(tmp_path):
    bad = tmp_path / "b.yaml"
    bad.write_bytes(b'version: 1\nrules:\n  - id: t\n    description: "\xff\xfe"\n')
    r = run(["rules", "check", str(bad)], tmp_path)
    assert r.returncode == 1 and f"{bad}:4:19: not UTF-8" in r.stdout + r.stderr
    deep = tmp_path / "d.yaml"
    deep.write_text("version: 1\nlists:\n  a: " + "[" * 5000 + "]" * 5000 + "\n")
    r = run(["rules", "check", str(deep)], tmp_path)
    assert r.returncode == 1 and "nested too deeply" in r.stdout + r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("rate", ["0", "-5", "nan"])
def test_agent_rate_validated(tmp_path, rate):
    r = run(["agent", "--source", "synthetic", "--rate", rate, "--duration", "1"], tmp_path)
    assert r.returncode == 2 and "--rate" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("cmd", [["alerts"], ["trace", "export", "-o", "out.json"]])
def test_reading_commands_refuse_a_timeout_that_is_not_positive(tmp_path, cmd):
    r = run([*cmd, "--timeout-s", "-1"], tmp_path)
    assert r.returncode == 2 and "--timeout-s" in r.stderr and "x>0" in r.stderr and "Traceback" not in r.stderr


def test_every_command_and_group_has_examples_in_its_help():
    """`--help` teaches: every command and group of the obshub command line ends with examples."""
    import click
    from click.testing import CliRunner

    from obshub.cli import cli

    def walk(cmd, path):
        yield path
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd)
            for name in cmd.list_commands(ctx):
                yield from walk(cmd.get_command(ctx, name), [*path, name])

    paths = list(walk(cli, []))
    assert len(paths) >= 20
    missing = [" ".join(p) for p in paths if "Examples:" not in CliRunner().invoke(cli, [*p, "--help"]).output]
    assert not missing, missing
