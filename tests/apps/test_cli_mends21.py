"""Small mends of the command line (width21): a usage error is exit 2 naming the option and what it takes,
a missing broker is said at once with an exit code of its own, and a start-up names everything that is
missing at once."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import click
import pytest

from tests.apps.test_no_broker import TRACES, closed_port

pytestmark = pytest.mark.slow  # the command line in subprocesses

OBSHUB = [sys.executable, "-m", "obshub.cli"]


def run(args, tmp_path, **env):
    e = {**os.environ, "OBSHUB_HOME": str(tmp_path / "home"), **env}
    e.pop("OBSHUB_BOOTSTRAP", None)
    return subprocess.run(OBSHUB + args, capture_output=True, text=True, env={**e, **env}, timeout=120)


@pytest.mark.parametrize("cmd", [["probes"], ["agent", "--job", "j", "--host", "h"]])
def test_an_unknown_probe_name_is_a_usage_error_naming_the_valid_names(tmp_path, cmd):
    """`obshub probes --probes nope` exited 1 (an ObshubError raised after the libraries were read), where
    every bad option value is a usage error: now exit 2 naming the option, the bad name and the valid ones."""
    r = run([*cmd, "--probes", "sched,nope"], tmp_path)
    err = " ".join(r.stderr.split())
    assert r.returncode == 2 and "Invalid value for '--probes'" in err and "'nope'" in err, err
    assert "layer names (cuda, memory, nccl, network, nic, pcie, pytorch, sched)" in err, err
    assert "net_retransmit" in err and "Traceback" not in err, err


@pytest.mark.parametrize("job", ["a b", "x/y", "-x", "é"])
def test_run_refuses_a_job_name_that_is_not_an_identifier(tmp_path, job):
    """`obshub run --job 'a b' -- cmd` ran cmd under a job name with a blank (the schema takes any printable
    text): a job name is now checked as a host name is, a usage error naming --job before cmd starts."""
    r = run(["run", "--job", job, "--", sys.executable, "-c", "print('started')"], tmp_path)
    err = " ".join(r.stderr.split())
    assert r.returncode == 2 and f"Invalid value for '--job': {job!r} is not a job name" in err, err
    assert "letters, digits, '.', '_' or '-'" in err and "started" not in r.stdout, err


def test_run_takes_a_job_name_of_letters_digits_dots_dashes_and_underscores(tmp_path):
    r = run(["run", "--job", "llama-7b.run_2", "--", sys.executable, "-c", "print('started')"], tmp_path)
    assert r.returncode == 0 and "started" in r.stdout, r.stderr


def test_replay_without_a_broker_fails_at_once_with_its_own_exit_code(tmp_path):
    """`obshub replay DIR` with no broker waited 10 s before the first trace was read, then exited 1 as any
    error: now the connection refused is said at once, exit 69 (sysexits' EX_UNAVAILABLE: nothing published)."""
    if not TRACES.is_dir():
        pytest.skip(f"shared traces missing: {TRACES}")
    port = closed_port()
    t0 = time.monotonic()
    r = run(["replay", str(TRACES), "--job", "w21"], tmp_path, OBSHUB_KAFKA_PORT=str(port))
    took = time.monotonic() - t0
    err = " ".join(r.stderr.split())
    assert r.returncode == 69, (r.returncode, err)
    assert f"cannot reach the Kafka broker at 127.0.0.1:{port} (127.0.0.1:{port}: connection refused)" in err, err
    assert "obshub up" in err and "Traceback" not in err, err
    assert took < 9, f"took {took:.1f} s"  # interpreter start-up on a loaded 2-core machine; it waited 10 s more


def test_the_replay_sink_says_a_missing_broker_within_2_s():
    from obshub.replay.errors import ReplayError
    from obshub.replay.publish import EXIT_NO_BROKER, KafkaSink

    for addr in (f"127.0.0.1:{closed_port()}", "192.0.2.1:9092"):  # refused; TEST-NET-1, nobody answers
        t0 = time.monotonic()
        with pytest.raises(ReplayError, match="cannot reach the Kafka broker") as ei:
            KafkaSink(addr)
        assert time.monotonic() - t0 <= 2.0 and ei.value.exit_code == EXIT_NO_BROKER == 69


def test_rules_serve_names_every_sink_whose_secret_is_missing(tmp_path):
    """`obshub rules serve -c` named the first sink's missing secret only: an operator fixed it, started
    again and met the next. Now every sink that cannot be built is named at once, before any client."""
    cfg = tmp_path / "alerting.yaml"
    cfg.write_text(
        "sinks:\n"
        "  - {name: chat, type: slack, url_env: W21_NO_SLACK_URL}\n"
        "  - {name: console, type: console}\n"
        "  - {name: pager, type: pagerduty, routing_key_env: W21_NO_PD_KEY}\n"
        f"  - {{name: hook, type: webhook, url_file: {tmp_path / 'missing'}}}\n"
    )
    r = run(["rules", "serve", "-c", str(cfg)], tmp_path, OBSHUB_KAFKA_PORT=str(closed_port()))
    err = " ".join(r.stderr.split())
    assert r.returncode == 1 and "3 of 4 sinks cannot be built" in err, err
    assert "sink 'chat': environment variable W21_NO_SLACK_URL" in err, err
    assert "sink 'pager': environment variable W21_NO_PD_KEY" in err, err
    assert f"sink 'hook': cannot read webhook URL from {tmp_path / 'missing'}" in err, err
    assert "cannot reach" not in err and "Traceback" not in err, err


def test_demo_refuses_a_duration_past_a_day(tmp_path):
    """`obshub demo --duration 1e9` (32 years) was taken; the bound is a day, a usage error naming it."""
    r = run(["demo", "--duration", "1e9"], tmp_path)
    err = " ".join(r.stderr.split())
    assert r.returncode == 2 and "Invalid value for '--duration'" in err and "0<x<=86400" in err, err
    assert "setting up" not in err.lower() and "Traceback" not in err, err


def test_demo_refuses_more_ranks_than_this_machine_runs(tmp_path):
    """`obshub demo --hosts 16 --ranks-per-host 8` (128 torch ranks) was taken on a 2-core machine; a demo
    runs at most 8 ranks per CPU (16 on 2 cores: 4 x 4 is the most run here)."""
    cpus = len(os.sched_getaffinity(0))
    r = run(["demo", "--hosts", "16", "--ranks-per-host", "8"], tmp_path)
    err = " ".join(r.stderr.split())
    if 128 <= 8 * cpus:
        pytest.skip(f"{cpus} CPUs run 128 ranks")
    assert r.returncode == 2 and "--hosts 16 x --ranks-per-host 8 = 128 ranks" in err, err
    assert f"at most {8 * cpus} (8 per CPU, {cpus} CPU(s))" in err and "Traceback" not in err, err


def test_the_demo_s_world_limit_is_8_ranks_per_cpu():
    from obshub.demo.cli import _check_world

    _check_world(4, 4, cpus=2)
    _check_world(16, 1, cpus=2)
    _check_world(16, 8, cpus=16)
    for hosts, ranks in ((16, 8), (16, 2), (5, 4), (1, 17)):
        with pytest.raises(click.UsageError, match=f"= {hosts * ranks} ranks: this machine runs at most 16"):
            _check_world(hosts, ranks, cpus=2)
