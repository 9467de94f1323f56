"""What a new user hit trying obshub from the README (trial report of main e9531ce): each case runs in
the test process (``obshub.cli.main`` with its real exit code), no broker, no subprocess."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from obshub import stack
from obshub.cli import main
from obshub.core.errors import StackError
from obshub.core.registry import register_component
from obshub.core.settings import load_settings


def obshub(args, capsys) -> tuple[int, str, str]:
    """Run ``obshub ARGS`` in this process; return (exit code, stdout, stderr)."""
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def test_up_on_another_port_while_the_stack_runs_names_the_running_port(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    monkeypatch.setenv("OBSHUB_HOME", str(home))
    monkeypatch.setenv("OBSHUB_KAFKA_PORT", "19092")
    s = load_settings()
    register_component(s, "kafka", os.getpid(), port=19092, log=str(home / "logs" / "kafka.log"))
    t0 = time.monotonic()
    with pytest.raises(StackError) as exc:
        stack.up(load_settings(kafka_port=29095))
    assert "127.0.0.1:19092" in str(exc.value) and "29095" in str(exc.value)
    assert "OBSHUB_HOME=" in exc.value.hint
    code, _out, err = obshub(["up", "--port", "29095"], capsys)
    assert code == 1 and "already runs a Kafka broker on 127.0.0.1:19092" in err and "Traceback" not in err
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize(
    "args, named",
    [
        (["silence", "add", "-m", "host=x", "-d", "0s", "-a", "a", "-c", "c"], "'-d' / '--duration'"),
        (["demo", "--fault-host", "9"], "--fault-host 9 is outside 0..3"),
        (["replay", ".", "--speed", "slow"], "'--speed'"),
        (["replay", ".", "--dry-run", "--job", ""], "Invalid value for '--job': '' is empty"),  # used the folder's name
        (["replay", ".", "--dry-run", "--job", "  "], "Invalid value for '--job': '  ' is empty"),
        # an empty value was read as the option left out (every job's alerts, the default broker), and an
        # output that is no file name failed only after the topics were read (newuser12)
        (["alerts", "--job", ""], "Invalid value for '--job': '' is empty: give a job name, or leave the option out"),
        (["alerts", "--host", " "], "Invalid value for '--host': ' ' is empty: give a host name"),
        (["alerts", "--rule", ""], "Invalid value for '--rule': '' is empty: give a rule id"),
        (["alerts", "--bootstrap", ""], "Invalid value for '--bootstrap': '' is empty"),
        (["trace", "export", "--job", "", "--steps", "1", "-o", "t.json"], "'--job': '' is empty: give a job name\n"),
        (
            ["trace", "export", "--job", "j", "--steps", "1", "-o", "t.json", "--bootstrap", ""],
            "'--bootstrap': '' is empty",
        ),
        (["trace", "export", "--job", "j", "--steps", "1", "-o", ""], "'-o' / '--output': '' is not a file name"),
        (["trace", "export", "--job", "j", "--steps", "1", "-o", "."], "'-o' / '--output': '.' is not a file name"),
        (["replay", ".", "--dry-run", "--bootstrap", ""], "'--bootstrap': '' is empty"),
        (
            ["trace", "export", "--job", "j", "--steps", "1-99999999999999999999", "-o", "t.json"],
            "is beyond the largest",
        ),
    ],
)
def test_usage_errors_exit_2_naming_the_option(tmp_path, monkeypatch, capsys, args, named):
    monkeypatch.setenv("OBSHUB_HOME", str(tmp_path / "home"))
    code, _out, err = obshub(args, capsys)
    assert code == 2 and named in err and "Traceback" not in err, (code, err)


def test_the_readme_lists_every_fault_of_the_demo():
    from pathlib import Path

    from obshub.demo.faults import KINDS

    line = next(ln for ln in (Path(__file__).parents[2] / "README.md").read_text().splitlines() if "(also: " in ln)
    listed = {k.strip() for k in line.split("(also: ", 1)[1].split(")")[0].split(",")} | {"cpu"}
    assert listed == set(KINDS), sorted(set(KINDS) ^ listed)


def test_doctor_and_status_say_what_is_true():
    from obshub.cli import component_state
    from obshub.doctor import roles_need

    assert roles_need(["agent"]) == "the agent role needs"
    assert roles_need(["agent", "kafka", "agent"]) == "the agent and kafka roles need"
    kafka = {"name": "kafka", "pid": 1, "running": True}
    assert component_state(kafka, True) == "yes"
    assert "process yes, but it does not answer" in component_state(kafka, False)  # once "running yes"
    assert "another process answers" in component_state({**kafka, "running": False}, True)
    assert component_state({"name": "rules", "running": True}, False) == "yes"  # the broker's state is not theirs


def test_up_while_the_registered_broker_does_not_listen_is_a_clear_error(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    monkeypatch.setenv("OBSHUB_HOME", str(home))
    port = stack.free_port_pair()
    monkeypatch.setenv("OBSHUB_KAFKA_PORT", str(port))
    register_component(load_settings(), "kafka", os.getpid(), port=port)  # a live pid, nothing on the port
    code, _out, err = obshub(["up"], capsys)
    assert code == 1 and f"runs but nothing listens on 127.0.0.1:{port}" in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    "args, named",
    [
        (
            ["--fault", "cpu", "--param", "rate_mbit=50"],
            "--param rate_mbit: read by net-slow only, not by this run's cpu",
        ),
        (["--fault", "cpu", "--param", "layer=net"], "--param layer: read by stall only"),
        (["--fault", "hang", "--param", "percent=5"], "--param percent: read by net-loss only"),
        (["--sequence", "stall:net@1", "--param", "procs=4"], "read by cpu or stall (layer=cpu) only"),
        (["--fault", "stall", "--param", "shape=quota"], "--param shape: read by stall (layer=cpu) only"),
        (["--fault", "stall", "--param", "layer=cpu", "--param", "loss_pct=40"], "--param loss_pct: read by stall"),
        (["--fault", "stall", "--param", "loss_pct=150"], "--param loss_pct=150: a percent, 1-100"),
        (["--fault", "stall", "--param", "layer=cpu", "--param", "quota_us=200000"], "--param quota_us=200000"),
        (["--fault", "stall", "--param", "stall_ms=20000", "--param", "period_s=1"], "not shorter than period_s=1"),
        (["--fault", "stall", "--param", "layer=mem", "--param", "full=2"], "--param full=2: the only value is 1"),
        (["--param", "percent=nan"], "--param percent=nan: expected a positive number"),
        (["--param", "percent=0.5"], "--param percent=0.5: expected a whole number"),
        (["--sequence", "stall:net@9"], "--sequence: host 9 of stall:net is outside 0..3"),
        (["--sequence", ","], "',' holds no KIND@HOST"),
        (["--matrix", "--sequence", "cpu@1"], "--matrix and --sequence are two kinds of run"),
        (["--fault", "hang", "--sequence", "cpu@1"], "--fault with --sequence"),
        (["--fault-host", "2", "--sequence", "cpu@1"], "--fault-host with --sequence"),
        (["--matrix", "--fault", "cpu"], "--fault with --matrix"),
        (["--fault-at", "-5"], "'--fault-at': -5.0 is not in the range x>=0"),
        (["--duration", "nan"], "'--duration': 'nan' is not a finite number"),
        (["--settle", "inf"], "'--settle': 'inf' is not a finite number"),
        (["--steps", "0"], "'--steps': 0 is not in the range x>=1"),
        (["--steps", "3", "--fault", "cpu"], "--steps 3 with cpu: the fault could never be named"),
        (["--steps", "10", "--sequence", "cpu@1"], "holds 10 steps (Thresholds.baseline_min_n"),
        (["--steps", "10", "--fault", "stall"], "give --steps 11 or more"),
        (["--sequence", "cpu@1", "--fault-for", "0"], "'--fault-for': 0.0 is not in the range x>0"),
        (["--sequence", "cpu@1,mem@2", "--gap", "-5"], "'--gap': -5.0 is not in the range x>=0"),
        (["--lock-wait", "-1"], "'--lock-wait'"),
        (["--step-sleep-ms", "-1"], "'--step-sleep-ms'"),
        (["--hidden", "0"], "'--hidden': 0 is not in the range x>=1"),
        (["--fault", "none", "--json", "/nonexistent-nu10/dir/r.json"], "its folder /nonexistent-nu10/dir does not"),
        # newuser20: the last value won silently (a cpu stall ran); a clean run's fault host was ignored
        (["--fault", "stall", "--param", "layer=net", "--param", "layer=cpu"], "layer is given twice"),
        (["--fault", "none", "--fault-host", "2"], "--fault-host with --fault none: a clean run injects no fault"),
    ],
)
def test_demo_refuses_bad_options_before_setting_anything_up(tmp_path, monkeypatch, capsys, args, named):
    """Each of these was accepted (the cluster, Kafka and the agents were set up, then the run failed, ran
    a fault the user did not ask for, ignored the option, or lost its report at the end); now a usage
    error (exit 2) naming the option, and nothing is started."""
    import obshub.demo.cli as demo_cli

    def never(*_a, **_k):
        raise AssertionError("the demo started setting up")

    monkeypatch.setattr(demo_cli, "run_demo", never)
    monkeypatch.setattr(demo_cli, "run_matrix", never)
    monkeypatch.setenv("OBSHUB_HOME", str(tmp_path / "home"))
    code, _out, err = obshub(["demo", *args], capsys)
    err = " ".join(err.split())
    assert code == 2 and named in err and "Traceback" not in err, (code, err)
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize(
    "args, named",
    [
        (["--hosts", "8"], "--hosts with --cleanup"),
        (["--fault", "cpu", "--keep-stack"], "--fault, --keep-stack with --cleanup"),
        (["--matrix"], "--matrix with --cleanup"),
    ],
)
def test_demo_cleanup_refuses_options_it_would_ignore(tmp_path, monkeypatch, capsys, args, named):
    """`demo --cleanup --hosts 8` removed the leftovers and ignored --hosts (a user who meant a run got a
    cleanup); now a usage error (exit 2) naming them, and nothing is swept. --lock-wait still applies."""
    import obshub.demo.cli as demo_cli

    swept = []
    monkeypatch.setattr(demo_cli.cluster_mod, "sweep", lambda **_k: swept.append(1) or [])
    monkeypatch.setattr(demo_cli.cluster_mod.Cluster, "lock", lambda self: None)
    monkeypatch.setattr(demo_cli.cluster_mod.Cluster, "unlock", lambda self: None)
    monkeypatch.setenv("OBSHUB_HOME", str(tmp_path / "home"))
    code, _out, err = obshub(["demo", "--cleanup", *args], capsys)
    err = " ".join(err.split())
    assert code == 2 and named in err and "Traceback" not in err, (code, err)
    assert not swept
    code, _out, err = obshub(["demo", "--cleanup", "--lock-wait", "5"], capsys)
    assert code == 0 and swept == [1], (code, err)
    assert "nothing to clean up" in err


def test_demo_matrix_gives_each_fault_the_params_it_reads():
    """``--matrix --param percent=5 --param procs=3``: percent to net-loss alone, procs to cpu alone (each
    scenario's own check refuses a key its kind does not read)."""
    from obshub.demo.runner import DemoOptions, matrix_scenarios

    got = {o.fault: o.fault_params for o in matrix_scenarios(DemoOptions(fault_params={"percent": 5, "procs": 3}))}
    assert got["net-loss"] == {"percent": 5} and got["cpu"] == {"procs": 3} and got["hang"] == {}
    for o in matrix_scenarios(DemoOptions(fault_params={"percent": 5, "procs": 3, "stall_ms": 500})):
        o.check()


RULE = """version: 1
rules:
  - id: long
    description: a stall ratio over 5
    severity: warning
    signal: steps
    condition: stall_ratio > 5
"""


@pytest.mark.parametrize(
    "extra, where",
    [
        (
            "    window: 99999999999999999999d\n",
            ':8:13: rule "long": window: 99999999999999999999d is longer than 3650d',
        ),
        ("    for: 99999999999999d\n", ':8:10: rule "long": for: 99999999999999d is longer than 3650d'),
        ("    renotify: {limit: 2, after: 999999999999d}\n", ':8:33: rule "long": renotify/after: 999999999999d'),
    ],
)
def test_rules_check_refuses_a_duration_the_engine_cannot_hold(tmp_path, capsys, extra, where):
    """`window: 99999999999999999999d` passed `obshub rules check`, then the engine's state snapshot (msgpack,
    int64) failed to encode: OverflowError in `rules serve`. Now a problem at file:line:col; 3650d is fine
    and its snapshot encodes."""
    import time

    import msgpack

    from obshub.rules.engine import Engine
    from obshub.rules.loader import load_ruleset

    bad = tmp_path / "long.yaml"
    bad.write_text(RULE + extra)
    code, _out, err = obshub(["rules", "check", str(bad)], capsys)
    assert code == 1 and f"{bad}{where}" in err and "Traceback" not in err, err
    ok = tmp_path / "ok.yaml"
    ok.write_text(RULE + "    window: 3650d\n    keep_firing_for: 3650d\n")
    engine = Engine(load_ruleset([ok]), lambda *_a, **_k: None)
    now = time.time_ns()
    for i in range(3):
        engine.process(
            "steps", {"job": "j", "step": i, "stall_ratio": 9.0, "time_ns": now + i, "closed_at_ns": now + i}
        )
    assert msgpack.packb(engine.snapshot(), use_bin_type=True)


def test_a_control_character_in_a_rule_file_is_named_at_its_line_and_column(tmp_path, capsys):
    """A NUL or other control character (a binary file, a paste gone wrong) was reported without a
    position and with the YAML library's internals ('in "<unicode string>", position 0')."""
    bad = tmp_path / "bell.yaml"
    bad.write_text("version: 1\nrules:\n  - id: a\x07b\n")
    code, _out, err = obshub(["rules", "check", str(bad)], capsys)
    assert code == 1 and f"{bad}:3:10: YAML: character U+0007 is not allowed" in err, err
    assert "<unicode string>" not in err
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\x00\x01binary")
    code, _out, err = obshub(["rules", "check", str(binary)], capsys)
    assert code == 1 and f"{binary}:1:1: YAML: character U+0000" in err, err


def test_an_alerting_config_duration_over_ten_years_is_refused_at_its_place(tmp_path):
    """`delivery: {timeout: 99999999d}` was accepted by `rules serve -c` and failed at the first delivery
    (socket timeout: OverflowError); `route: {group_wait: 99999999999999999999d}` as well. Now refused at
    file:line:col before the engine starts; 3650d is accepted."""
    import socket

    from obshub.core.errors import ObshubError
    from obshub.rules.sinks.config import load_config

    cfg = tmp_path / "alerting.yaml"
    cfg.write_text(
        "version: 1\nroute:\n  group_wait: 99999999999999999999d\ndelivery:\n  timeout: 99999999d\n"
        "sinks:\n  - {name: c, type: console}\n"
    )
    with pytest.raises(ObshubError) as exc:
        load_config(cfg)
    assert f"{cfg.name}:3:15: route/group_wait: 99999999999999999999d is longer than 3650d" in str(exc.value)
    assert f"{cfg.name}:5:12: delivery/timeout: 99999999d is longer than 3650d" in str(exc.value)
    cfg.write_text("version: 1\ndelivery:\n  timeout: 3650d\nsinks:\n  - {name: c, type: console}\n")
    timeout_s = load_config(cfg).delivery.policy().timeout_s
    with socket.socket() as s:
        s.settimeout(timeout_s)  # the longest accepted fits a socket timeout


@pytest.mark.parametrize(
    "args, option",
    [
        (["alerts", "--timeout-s", "nan"], "'--timeout-s': 'nan' is not a finite number"),
        (["trace", "export", "--job", "j", "--steps", "1", "-o", "-", "--timeout-s", "nan"], "'--timeout-s': 'nan'"),
        (["deep-dive", "--host", "node-01", "--max-s", "nan"], "'--max-s': 'nan' is not a finite number"),
        (["demo", "--lock-wait", "inf"], "'--lock-wait': 'inf' is not a finite number"),
        # the stream worker ran with a nan window; tail steps waited forever
        (["streams", "worker", "--window-s", "nan"], "'--window-s': 'nan' is not a finite number"),
        (["streams", "worker", "--job-retention-s", "inf"], "'--job-retention-s': 'inf' is not a finite number"),
        (["streams", "worker", "--read-idle-every-s", "nan"], "'--read-idle-every-s': 'nan' is not a finite number"),
        (["streams", "worker", "--read-idle-every-s", "0.1"], "'--read-idle-every-s': 0.1 is not in the range"),
        (["tail", "steps", "--timeout-s", "nan"], "'--timeout-s': 'nan' is not a finite number"),
        (["tail", "steps", "--hold-s", "nan"], "'--hold-s': 'nan' is not a finite number"),
        (["streams", "worker", "--app-id", "a b"], "'--app-id': 'a b' holds ' '"),
    ],
)
@pytest.mark.timeout(60)
def test_nan_and_inf_are_refused_where_a_number_of_seconds_is_asked(tmp_path, monkeypatch, capsys, args, option):
    """click's FloatRange lets nan through every bound: `alerts --timeout-s nan` and `trace export
    --timeout-s nan` never gave up on an unreachable broker (a nan deadline never passes: still waiting
    after 30 s), `deep-dive --max-s nan` was refused only by the request's own check (exit 1). Now a
    usage error naming the option, exit 2."""
    monkeypatch.setenv("OBSHUB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OBSHUB_KAFKA_PORT", "1")  # nothing is reached: the option is refused first
    code, _out, err = obshub(args, capsys)
    assert code == 2 and option in " ".join(err.split()) and "Traceback" not in err, (code, err)


@pytest.mark.parametrize("rounds, why", [("0", "0 is not 1 or more"), ("-1", "-1 is not 1 or more"), ("x", "'x'")])
def test_bench_refuses_rounds_below_one(capsys, rounds, why):
    """`python -m bench --rounds 0` ran every benchmark with its default rounds (``rounds or ROUNDS``),
    `--rounds -1` with none (nan medians in the tables); now a usage error before any benchmark starts."""
    from bench.__main__ import main as bench_main

    with pytest.raises(SystemExit) as exc:
        bench_main(["--rounds", rounds, "summary_size"])
    assert exc.value.code == 2 and why in capsys.readouterr().err


def test_every_benchmark_reads_rounds_as_one_or_more():
    """Each benchmark's own `--rounds` took 0 (its default, `rounds or ROUNDS`) and negatives (no sample:
    nan medians) like `python -m bench` did; every one reads it with ``common.positive_int`` now."""
    import re
    from pathlib import Path

    bench_dir = Path(__file__).resolve().parents[2] / "bench"
    options = {
        f.name: re.findall(r'add_argument\(\s*"--rounds",\s*type=([\w.]+)', f.read_text())
        for f in bench_dir.glob("*.py")
    }
    with_rounds = {name: types for name, types in options.items() if types}
    assert len(with_rounds) >= 15, with_rounds  # the benchmarks with a --rounds option
    assert all(types == ["common.positive_int"] for types in with_rounds.values()), with_rounds


@pytest.mark.parametrize("var, below", [("OBSHUB_HOME", ""), ("OBSHUB_CACHE", "sub")])
def test_a_state_folder_that_is_a_file_is_a_settings_error(tmp_path, monkeypatch, capsys, var, below):
    """`OBSHUB_HOME=/etc/passwd obshub up` ended in a NotADirectoryError traceback from the first mkdir
    (and `obshub status` reported "state /etc/passwd"); now an invalid setting naming the variable."""
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    monkeypatch.setenv("OBSHUB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(var, str(a_file / below) if below else str(a_file))
    monkeypatch.setenv("OBSHUB_KAFKA_PORT", str(stack.free_port_pair()))
    code, _out, err = obshub(["up"], capsys)
    err = " ".join(err.split())
    assert code == 1 and "invalid setting" in err and f"{a_file} is a file" in err and var in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("var", ["OBSHUB_HOME", "OBSHUB_CACHE"])
def test_an_empty_state_folder_variable_is_the_default_and_a_relative_one_is_refused(
    tmp_path, monkeypatch, capsys, var
):
    """`OBSHUB_HOME=$UNSET obshub up` put the state into the working directory (`silence add` wrote
    ./state/rules/silences.json), and a relative OBSHUB_HOME meant another folder from every other
    directory: `obshub down` elsewhere said "nothing was running" beside a running broker (newuser19)."""
    import platformdirs

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OBSHUB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(var, "")
    s = load_settings()
    default = platformdirs.user_data_dir("obshub") if var == "OBSHUB_HOME" else platformdirs.user_cache_dir("obshub")
    assert (s.home if var == "OBSHUB_HOME" else s.cache) == Path(default).resolve()
    monkeypatch.setenv(var, "rel/state")
    code, _out, err = obshub(["silence", "list"], capsys)
    err = " ".join(err.split())
    assert code == 1 and "invalid setting" in err and var in err and "'rel/state' is a relative path" in err, err
    assert f"e.g. {tmp_path / 'rel' / 'state'}" in err and "Value error" not in err and "Traceback" not in err
    assert not (tmp_path / "rel").exists() and not (tmp_path / "state").exists()  # nothing written here


def test_a_state_folder_that_cannot_be_made_is_one_error_naming_it(tmp_path, monkeypatch, capsys):
    """A folder this user cannot create (`OBSHUB_HOME=/var/lib/obshub` as a user; here under /proc, where
    nobody can) ended `obshub silence add` and `obshub up` in a FileNotFoundError / PermissionError
    traceback from the first mkdir (newuser19)."""
    home = Path("/proc/obshub-newuser19/home")
    monkeypatch.setenv("OBSHUB_HOME", str(home))
    monkeypatch.setenv("OBSHUB_KAFKA_PORT", str(stack.free_port_pair()))
    for args in (["silence", "add", "-m", "host=a", "-a", "a", "-c", "c"], ["up"]):
        code, _out, err = obshub(args, capsys)
        err = " ".join(err.split())
        assert code == 1 and "error: /proc/obshub-newuser19" in err and "Traceback" not in err, err
        assert f"OBSHUB_HOME is {home}: make it a folder this user can write" in err, err


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "args",
    [
        ["topics", "check", "--rules-group-prefix", "team a"],
        ["topics", "create", "--rules-group-prefix", "team/a"],
        ["topics", "check", "--app-id", "my app"],
        ["rules", "serve", "--group-prefix", "team a"],
        ["rules", "serve", "--group-prefix", ""],
    ],
)
def test_a_rule_engine_prefix_kafka_cannot_name_a_topic_with_is_refused(tmp_path, monkeypatch, capsys, args):
    """The rule engines' state topic is PREFIX-state: a prefix with a space or a slash (or none) names no
    Kafka topic, yet `rules serve` started (and waited for the broker) with it. Now a usage error."""
    monkeypatch.setenv("OBSHUB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OBSHUB_KAFKA_PORT", "1")
    code, _out, err = obshub(args, capsys)
    assert code == 2 and "a Kafka topic name takes letters, digits" in " ".join(err.split()), (code, err)


@pytest.mark.parametrize("cmd", [["probes"], ["agent", "--source", "synthetic"]])
@pytest.mark.parametrize("value", [",", " , ", ""])
def test_a_probe_list_that_names_no_probe_is_refused(tmp_path, monkeypatch, capsys, cmd, value):
    """`--probes ,` (or "") selected every probe, as if the option were left out; now a usage error."""
    monkeypatch.setenv("OBSHUB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OBSHUB_KAFKA_PORT", "1")  # nothing is reached: the option is refused first
    code, _out, err = obshub([*cmd, "--probes", value], capsys)
    assert code == 2 and "names no probe" in " ".join(err.split()) and "Traceback" not in err, (code, err)


def test_status_says_a_component_whose_process_is_gone_exited_and_when_it_started():
    """`obshub status` marked such a record "no (stale)": it says the process exited and when it started."""
    from obshub.cli import component_state

    started = time.mktime((2026, 12, 6, 21, 24, 22, 0, 0, -1))
    for name in ("agent-node-01", "kafka"):
        cell = component_state({"name": name, "pid": 7, "running": False, "started": started}, False)
        assert "no: exited (started 2026-12-06 21:24:22)" in cell and "`obshub down` clears it" in cell, cell
    assert "no: exited, its record" in component_state({"name": "rules", "pid": 7, "running": False}, False)


@pytest.mark.parametrize(
    "env, why",
    [
        ({"OBSHUB_KAFKA_PORT": "65535"}, "OBSHUB_KAFKA_PORT=65535 leaves no port for the Kafka controller listener"),
        ({"OBSHUB_KAFKA_PORT": "PORT", "OBSHUB_KAFKA_CONTROLLER_PORT": "PORT"}, "need two ports"),
    ],
)
def test_a_broker_port_that_leaves_the_controller_none_is_a_settings_error(tmp_path, monkeypatch, capsys, env, why):
    """`OBSHUB_KAFKA_PORT=65535 obshub up` ended in an OverflowError traceback (the controller listener is
    the broker's port + 1: 65536); one port for both listeners ran the broker's storage format, which failed
    with the last 600 characters of a Java stack trace and the hint to remove the data folder (newuser20).
    Now an invalid setting naming the variables, before anything is written."""
    home = tmp_path / "home"
    monkeypatch.setenv("OBSHUB_HOME", str(home))
    port = str(stack.free_port_pair())
    for var, value in env.items():
        monkeypatch.setenv(var, port if value == "PORT" else value)
    for args in (["up"], ["status"]):
        code, _out, err = obshub(args, capsys)
        err = " ".join(err.split())
        assert code == 1 and "invalid setting" in err and why in err, err
        assert "Traceback" not in err and "OBSHUB_KAFKA_CONTROLLER_PORT" in err, err
    assert not (home / "kafka").exists()
    monkeypatch.setenv("OBSHUB_KAFKA_CONTROLLER_PORT", "19093")  # a controller port of its own: fine
    monkeypatch.setenv("OBSHUB_KAFKA_PORT", "65535")
    assert load_settings().controller_port == 19093


def test_a_failed_storage_format_names_the_java_exception_not_the_tail_of_its_stack(tmp_path):
    """The broker's storage format failing (here: a configuration the real StorageTool refuses) was reported
    as the last 600 characters of its output: stack frames cut mid-line (`ala:1115)`). The reason is the
    exception's own line (newuser20)."""
    import subprocess

    settings = load_settings(home=tmp_path / "home")
    libs = stack.install_kafka(settings)
    props = tmp_path / "server.properties"
    props.write_text(
        "process.roles=broker,controller\nnode.id=1\ncontroller.quorum.voters=1@127.0.0.1:19500\n"
        "listeners=PLAINTEXT://127.0.0.1:19500,CONTROLLER://127.0.0.1:19500\ncontroller.listener.names=CONTROLLER\n"
        f"log.dirs={tmp_path / 'data'}\n"
    )
    proc = subprocess.run(
        [stack.java_binary(), "-cp", stack._classpath(libs), "kafka.tools.StorageTool", "format"]
        + ["-t", stack._cluster_id(), "-c", str(props)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    why = stack.java_failure(proc.stdout + proc.stderr)
    assert why.startswith('Exception in thread "main"') and "two listeners on the same port" in why, why
    assert "\tat " not in why and " at scala." not in why, why


@pytest.mark.parametrize("version", ["../../evil", "4.1", "4.1.1; rm", "latest"])
def test_a_kafka_version_that_is_no_release_number_is_refused_before_anything_is_written(
    tmp_path, monkeypatch, capsys, version
):
    """OBSHUB_KAFKA_VERSION names the jars' cache folder and goes into a Maven POM: `../../evil` made
    `obshub up` write evil/pom.xml two folders above the cache (newuser20). An empty one is the default."""
    monkeypatch.setenv("OBSHUB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OBSHUB_CACHE", str(tmp_path / "a" / "b" / "cache"))
    monkeypatch.setenv("OBSHUB_KAFKA_PORT", str(stack.free_port_pair()))
    monkeypatch.setenv("OBSHUB_KAFKA_VERSION", version)
    code, _out, err = obshub(["up"], capsys)
    err = " ".join(err.split())
    assert code == 1 and f"kafka_version: {version!r} is not a Kafka release number" in err, err
    assert "OBSHUB_KAFKA_VERSION" in err and not (tmp_path / "a" / "evil").exists()
    assert not (tmp_path / "a" / "b" / "cache").exists() and not (tmp_path / "home").exists()
    monkeypatch.setenv("OBSHUB_KAFKA_VERSION", "")
    assert load_settings().kafka_version == "4.1.1"


def test_a_full_disk_under_the_state_folder_is_one_error_naming_the_silences_file(tmp_path, monkeypatch, capsys):
    """`obshub silence add` on a full disk ended in an OSError traceback (ENOSPC from the write names no file,
    so it was taken for a bug). Here the temporary file is /dev/full: every write fails with ENOSPC, as on a
    full disk. Now one error naming the file; the silences already there are kept (newuser20)."""
    home = tmp_path / "home"
    monkeypatch.setenv("OBSHUB_HOME", str(home))
    code, out, _err = obshub(["silence", "add", "-m", "host=a", "-a", "me", "-c", "first"], capsys)
    assert code == 0, out
    tmp = home / "state" / "rules" / "silences.tmp"
    tmp.symlink_to("/dev/full")
    code, _out, err = obshub(["silence", "add", "-m", "host=b", "-a", "me", "-c", "second"], capsys)
    err = " ".join(err.split())
    assert code == 1 and "Traceback" not in err, err
    assert (
        f"error: cannot write silences to {home / 'state' / 'rules' / 'silences.json'}: No space left on device" in err
    )
    tmp.unlink()
    code, out, _err = obshub(["silence", "list"], capsys)
    assert code == 0 and "host=a" in out and "host=b" not in out, out


def test_output_to_a_full_disk_is_one_error_not_a_traceback(tmp_path):
    """`obshub probes --json > file` on a full disk ended in an OSError traceback: the write's ENOSPC names no
    file, so the CLI took it for a bug. Here stdout is /dev/full (every write: ENOSPC) (newuser20)."""
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        res = subprocess.run(
            [sys.executable, "-m", "obshub.cli", "probes", "--json"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env={**os.environ, "OBSHUB_HOME": str(tmp_path / "home")},
        )
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "error: No space left on device" in res.stderr and "where its output is redirected" in res.stderr
