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


@pytest.mark.parametrize(
    "args, code, wanted",
    [
        (["--synthetic-events", "-5"], 2, "'--synthetic-events': -5 is not in the range x>=1"),
        (["--threshold", "bogus=5"], 2, "unknown threshold 'bogus' (known: runq_ns,"),
        (["--probes", "sched"], 2, "--probes applies to --source bpf only"),
        (["--pid", "1"], 2, "--pid applies to --source bpf only"),
        (["--batch-max-bytes", "0"], 2, "--batch-max-bytes: 0 is less than the least allowed, 1024"),
        (["--spool-segment-bytes", "1"], 2, "--spool-segment-bytes: 1 is less than the least allowed, 16384"),
        (["--duration", "-1"], 2, "--duration: -1.0 must be more than 0"),
        (["--host", "a/b"], 2, "Invalid value for '--host': 'a/b' is not a host name"),
        (["--job", ""], 2, "Invalid value for '--job': '' is empty: give a job name"),
        (["--job", " "], 2, "Invalid value for '--job': ' ' is empty: give a job name"),
        (["--threshold", "rdma_latency_ns=-5"], 2, "'rdma_latency_ns=-5': a threshold is 0 or more"),
        (["--spool-segment-bytes", str(2**40)], 2, "--spool-segment-bytes / --spool-max-bytes: spool segment size"),
    ],
)
def test_agent_options_out_of_range_or_of_the_other_source_are_named(tmp_path, args, code, wanted):
    """An agent option out of its range names the option (not the setting's field), and an option the
    chosen --source does not use is refused instead of ignored; nothing is spooled or sent. Every bad
    option value is a usage error (exit 2) in plain words, as `obshub run`'s: the values the agent's
    settings check (`--job ''`, `--batch-max-bytes 0`) exited 1 with pydantic's "Input should be ...",
    and `--job ' '` ran an agent publishing under a blank job."""
    r = run(["agent", "--source", "synthetic", "--bootstrap", "127.0.0.1:1", "--duration", "1", *args], tmp_path)
    err = " ".join(r.stderr.split())
    assert r.returncode == code and wanted in err and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "home" / "spool").exists() or not any((tmp_path / "home" / "spool").rglob("*.seg"))


@pytest.mark.parametrize(
    "cmd, option, wanted",
    [
        (["agent", "--registered", "--only-job", ""], "--only-job", "'' is empty: give a job name"),
        (["deep-dive", "--host", ""], "--host", "'' is empty: give a host name"),
        (["deep-dive", "--host", "a b"], "--host", "'a b' is not a host name"),
        (["tail", "steps", "--job", ""], "--job", "'' is empty: give a job name"),
    ],
)
def test_an_empty_job_or_host_is_a_usage_error_in_every_command(tmp_path, cmd, option, wanted):
    """`agent --only-job ''` served no job at all without a word (every registered process dropped),
    `deep-dive --host ''` exited 1 after building a request, `deep-dive --host 'a b'` waited for the broker
    to ask for a host no agent can have, and `tail steps --job ''` followed every job: each is a usage
    error (exit 2) naming the option, as `obshub run --job ''`."""
    r = run([*cmd, "--bootstrap", "127.0.0.1:1"] if cmd[0] != "tail" else cmd, tmp_path)
    err = " ".join(r.stderr.split())
    assert r.returncode == 2 and f"Invalid value for '{option}': {wanted}" in err and "Traceback" not in err, err


def test_agent_refuses_the_synthetic_rate_for_the_bpf_source(tmp_path):
    r = run(["agent", "--registered", "--rate", "5", "--bootstrap", "127.0.0.1:1"], tmp_path)
    assert r.returncode == 2 and "--rate applies to --source synthetic only" in r.stderr, r.stderr


@pytest.mark.parametrize("cmd", [["alerts"], ["trace", "export", "-o", "out.json"]])
def test_reading_commands_refuse_a_timeout_that_is_not_positive(tmp_path, cmd):
    r = run([*cmd, "--timeout-s", "-1"], tmp_path)
    assert r.returncode == 2 and "--timeout-s" in r.stderr and "x>0" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("cmd", [["alerts"], ["trace", "export", "-o", "out.json", "--job", "j", "--steps", "1"]])
@pytest.mark.parametrize(
    "option, value, largest",
    [
        ("--since", "99999999999h", "the largest duration accepted is 3650d"),
        ("--until", "3651d", "the largest duration accepted is 3650d"),
        ("--since", "9999-12-31T23:59:59Z", "2262-04-11T23:47:16Z (the largest"),
        ("--since", "1969-07-20T20:17:00Z", "from 1970-01-01T00:00:00Z"),
    ],
)
def test_a_time_range_out_of_bounds_is_a_usage_error_naming_the_option_and_the_largest_value(
    tmp_path, cmd, option, value, largest
):
    """`99999999999h` ago was a time 11 million years before 1970 that the reader silently took as "from
    the oldest message"; a time past int64 ns overflowed the summaries' clock. Both are refused (exit 2)
    before a broker is asked, naming the option and the bound."""
    r = run([*cmd, option, value], tmp_path)
    assert r.returncode == 2 and f"Invalid value for '{option}'" in r.stderr, r.stderr
    assert largest in r.stderr and "Traceback" not in r.stderr, r.stderr


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


@pytest.mark.parametrize(
    "job, named", [("x" * 70, "the job would be named 'xxx"), ("a\tb", "the job would be named 'ab'")]
)
def test_run_refuses_a_job_name_the_probe_would_change(tmp_path, job, named):
    """`obshub run --job <70 characters> -- cmd` ran cmd, and the register probe carried the name cut to 63
    bytes: the job was published under a name the user never gave (`obshub tail steps --job` found
    nothing). Now refused before the command starts (it would have printed 'started'), as a usage error
    (exit 2, as every command's bad option values; it was exit 1)."""
    r = run(["run", "--job", job, "--", sys.executable, "-c", "print('started')"], tmp_path)
    err = " ".join(r.stderr.split())
    assert r.returncode == 2 and "Invalid value for '--job'" in err, err
    assert named in err and "at most 63 bytes" in err and "started" not in r.stdout, err


@pytest.mark.parametrize("job", ["", "  "])
def test_run_refuses_an_empty_job_as_a_usage_error(tmp_path, job):
    """`obshub run --job ''` exited 1 (an ObshubError) where `alerts --job ''` and every other bad option value
    exit 2 (click's usage error naming the option)."""
    r = run(["run", "--job", job, "--", sys.executable, "-c", "print('started')"], tmp_path)
    err = " ".join(r.stderr.split())
    assert r.returncode == 2 and f"Invalid value for '--job': '{job}' is empty; give the job a name" in r.stderr, err
    assert "started" not in r.stdout and "Traceback" not in err, err


@pytest.mark.parametrize("cmd", [["status"], ["topics", "check"], ["tail", "steps"], ["rules", "serve"]])
def test_a_malformed_bootstrap_variable_is_refused_at_once_naming_it(tmp_path, cmd):
    """`OBSHUB_BOOTSTRAP=127.0.0.1:99999 obshub status` (a port out of range) waited 10 s, then said
    "connection refused": now one error naming the variable and the form, before any client connects."""
    r = run(cmd, tmp_path, OBSHUB_BOOTSTRAP="127.0.0.1:99999")
    err = " ".join(r.stderr.split())
    assert r.returncode == 1 and "Traceback" not in err, err
    assert "OBSHUB_BOOTSTRAP: '127.0.0.1:99999': port 99999 is out of range (1-65535)" in err, err
    assert "give host:port" in err and "refused" not in err and "answered" not in r.stdout + err, err


@pytest.mark.parametrize(
    "cmd",
    [
        ["alerts"],
        ["trace", "export", "--job", "j", "--steps", "1", "-o", "-"],
        ["agent", "--job", "j", "--host", "h"],
        ["deep-dive", "--host", "h"],
    ],
)
def test_a_malformed_bootstrap_option_is_a_usage_error_naming_it(tmp_path, cmd):
    r = run([*cmd, "--bootstrap", "k1:9092,,k2:9092"], tmp_path)
    err = " ".join(r.stderr.split())
    assert r.returncode == 2 and "Invalid value for '--bootstrap'" in err, err
    assert "has an empty address between commas" in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    "cmd",
    [["alerts"], ["topics", "check"], ["trace", "export", "--job", "j", "--steps", "1", "-o", "-"], ["rules", "serve"]],
)
def test_incomplete_kafka_security_settings_are_one_error_naming_the_variables(tmp_path, cmd):
    """SASL_SSL without a mechanism and user, or a CA file that does not exist: every Kafka client command
    stops with one error naming the variables to set (not a pydantic traceback), never the password; the
    rule engine fails before it registers itself (no stale record for `obshub status`) or starts a thread."""
    r = run(cmd, tmp_path, OBSHUB_KAFKA_SECURITY_PROTOCOL="SASL_SSL", OBSHUB_KAFKA_SASL_PASSWORD="hunter2SECRET")
    assert r.returncode == 1 and "Traceback" not in r.stderr and "Exception in thread" not in r.stderr, r.stderr
    assert (
        "error: Kafka connection: security protocol SASL_SSL needs OBSHUB_KAFKA_SASL_MECHANISM (or "
        "--sasl-mechanism), OBSHUB_KAFKA_SASL_USERNAME (or --sasl-username)" in " ".join(r.stderr.split())
    ), r.stderr
    assert "hunter2SECRET" not in r.stdout + r.stderr
    assert not (tmp_path / "home" / "run" / "rules.json").exists()
    r = run(cmd, tmp_path, OBSHUB_KAFKA_SECURITY_PROTOCOL="SSL", OBSHUB_KAFKA_SSL_CA_LOCATION=str(tmp_path / "ca.pem"))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "error: Kafka connection: OBSHUB_KAFKA_SSL_CA_LOCATION (--ssl-ca-location)" in r.stderr, r.stderr
    assert "does not exist" in r.stderr, r.stderr
    sasl = {"OBSHUB_KAFKA_SASL_USERNAME": "u", "OBSHUB_KAFKA_SASL_PASSWORD": "hunter2SECRET"}
    r = run(cmd, tmp_path, OBSHUB_KAFKA_SECURITY_PROTOCOL="SASL_SSL", OBSHUB_KAFKA_SASL_MECHANISM="scram", **sasl)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "hunter2SECRET" not in r.stderr, r.stderr
    assert "error: Kafka connection: OBSHUB_KAFKA_SASL_MECHANISM: Input should be 'PLAIN'" in r.stderr, r.stderr


@pytest.mark.parametrize(
    "args, option",
    [
        (["replay", "{trace}", "--topic", "bad topic"], "'--topic'"),
        (["replay", "{trace}", "--topic", ""], "'--topic'"),
        (["trace", "export", "--job", "j", "--steps", "1", "-o", "-", "--events-topic", "a/b"], "'--events-topic'"),
        (["trace", "export", "--job", "j", "--steps", "1", "-o", "-", "--steps-topic", ""], "'--steps-topic'"),
    ],
)
def test_a_topic_name_kafka_would_refuse_is_a_usage_error_before_the_broker_is_asked(tmp_path, args, option):
    """`replay --topic` and `trace export --events-topic/--steps-topic` took any text: a name Kafka refuses
    (a space, '/', empty) waited for the broker, then failed there. Now a usage error naming the option,
    with the broker unreachable (nothing is asked)."""
    trace = tmp_path / "rank0.json"
    trace.write_text('{"traceEvents": [{"ph": "X", "name": "ProfilerStep#1", "ts": 1, "dur": 5, "pid": 1, "tid": 1}]}')
    r = run([a.replace("{trace}", str(trace)) for a in args], tmp_path, OBSHUB_BOOTSTRAP="127.0.0.1:9")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"Invalid value for {option}" in r.stderr and "a Kafka topic name takes letters" in r.stderr, r.stderr


@pytest.mark.parametrize(
    "cmd",
    [
        ["rules", "serve", "--metrics-port", "{port}"],
        ["agent", "--source", "synthetic", "--delivery-timeout-ms", "1000", "--metrics-port", "{port}"],
    ],
)
def test_a_metrics_port_in_use_is_one_error_naming_the_option(tmp_path, cmd):
    """The rule engine and the agent gave an OSError / socket.gaierror traceback for a metrics port another
    process holds (the stream worker already said "Failed to serve metrics"); now one error that names
    the address, the fix, and no component record left behind."""
    import socket

    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = str(held.getsockname()[1])
        r = run([a.replace("{port}", port) for a in cmd], tmp_path, OBSHUB_BOOTSTRAP="127.0.0.1:9")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"error: Failed to serve metrics on 0.0.0.0:{port}: [Errno 98] Address already in use" in r.stderr
    assert "--metrics-port" in r.stderr
    assert not list((tmp_path / "home" / "run").glob("*.json"))


def test_a_metrics_address_that_is_not_this_hosts_is_one_error_naming_it(tmp_path):
    r = run(["rules", "serve", "--metrics-port", "0", "--metrics-addr", "no-such-host.invalid"], tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "error: Failed to serve metrics on no-such-host.invalid:0" in r.stderr, r.stderr


def test_help_lists_a_command_this_install_cannot_run_instead_of_failing(tmp_path):
    """Without the USDT extension (an install where `make setup` did not build it), `obshub --help` failed as
    a whole (exit 1, the extension's error) because listing `run` imports it; now it lists every command, says
    that `run` is not usable here, and `obshub run` itself still gives the error and its hint."""
    code = "import sys; sys.modules['obshub.instrument._usdt'] = None; from obshub.cli import main; main(sys.argv[1:])"
    e = {**os.environ, "OBSHUB_HOME": str(tmp_path / "home")}
    r = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True, env=e, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "run        (not usable in this install: `obshub run` says why)" in r.stdout, r.stdout
    assert "rules      Validate, test and run alerting rules" in r.stdout, r.stdout
    r = subprocess.run(
        [sys.executable, "-c", code, "run", "--", "true"], capture_output=True, text=True, env=e, timeout=120
    )
    assert r.returncode == 1 and "the USDT extension obshub.instrument._usdt is not built" in r.stderr, r.stderr


@pytest.mark.parametrize(
    "matchers",
    [["host=~.*"], ["host!=node2"], ["rank="], ["hostname!=x", "job=~.*"]],
)
def test_a_silence_that_would_mute_every_alert_is_refused(tmp_path, matchers):
    """An absent label reads as '', so a silence whose every matcher matches '' muted every alert of
    another kind too (`-m host=~.*` meant for "every host" also muted the job-wide alerts; a misspelt
    label name with != muted everything). It was saved and applied (newuser19); Alertmanager refuses it."""
    from obshub.rules.silences import SilenceError, SilenceStore

    args = [a for m in matchers for a in ("-m", m)]
    r = run(["silence", "add", *args, "-a", "a", "-c", "c"], tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert "without th" in r.stderr and "mute every alert of another kind" in r.stderr, r.stderr
    assert "-m host=node2" in r.stderr  # the fix
    assert run(["silence", "list", "--all"], tmp_path).stdout.strip() == "no silences"  # nothing was saved
    with pytest.raises(SilenceError, match="absent label"):  # the store refuses it too
        SilenceStore(tmp_path / "s.json").add(matchers, 1, 2, "a", "c")
    # a matcher that needs a value keeps every other one allowed
    ok = run(["silence", "add", *args, "-m", "host=~.+", "-a", "a", "-c", "c"], tmp_path)
    assert ok.returncode == 0 and ok.stdout.startswith("silence "), ok.stdout + ok.stderr


def test_a_silence_on_a_label_no_alert_carries_is_refused_naming_the_labels(tmp_path):
    """`silence add -m hostname=node2` (the label is `host`) was saved and muted nothing, without a word:
    now a usage error naming the labels the alerts carry; a label of the user's own rules (-r) counts, and
    --any-label keeps it on purpose."""
    r = run(["silence", "add", "-m", "hostname=node2", "-a", "a", "-c", "c"], tmp_path)
    err = " ".join(r.stderr.split())
    assert r.returncode == 2 and "no alert carries the label 'hostname': the silence would mute nothing" in err, err
    assert "alerts carry alertname, category," in err and " host, job, layer," in err and "rank" in err, err
    assert run(["silence", "list", "--all"], tmp_path).stdout.strip() == "no silences"  # nothing was saved
    own = tmp_path / "team.yaml"
    own.write_text(
        "version: 1\nrules:\n  - id: team_rule\n    description: d\n    severity: warning\n    signal: steps\n"
        '    condition: "true"\n    group_by: {job: job}\n    labels: {team: ml}\n'
    )
    assert run(["silence", "add", "-m", "team=ml", "-a", "a", "-c", "c"], tmp_path).returncode == 2
    ok = run(["silence", "add", "-m", "team=ml", "-m", "host=n1", "-r", str(own), "-a", "a", "-c", "c"], tmp_path)
    assert ok.returncode == 0 and ok.stdout.startswith("silence "), ok.stdout + ok.stderr
    forced = run(["silence", "add", "-m", "hostname=node2", "--any-label", "-a", "a", "-c", "c"], tmp_path)
    assert forced.returncode == 0 and forced.stdout.startswith("silence "), forced.stdout + forced.stderr
