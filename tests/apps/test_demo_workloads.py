"""``obshub demo --workload ddp|lightning|accum`` and ``python -m bench.ttd --workload``: the rank's command
line names the workload's module, the demo refuses an unknown one, and the bench passes the workload to every
demo run it starts (the runs themselves need root and minutes: their commands go through the demo's own
option parser, the reports are stubs). The workloads' step boundaries under ``obshub run``:
tests/instrument/test_instrument_workloads.py."""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from bench import ttd
from obshub.demo import cli as demo_cli
from obshub.demo import parts
from obshub.demo.cluster import Host
from obshub.demo.errors import DemoError
from obshub.demo.runner import DemoOptions, describe


@pytest.mark.parametrize(
    ("workload", "module"),
    [
        ("ddp", "obshub.workloads.ddp_train"),
        ("lightning", "obshub.workloads.lightning_train"),
        ("accum", "obshub.workloads.accum_train"),
    ],
)
def test_each_workload_runs_its_own_module_under_obshub_run(workload, module):
    argv = parts.training_argv("j", Host(1), 100, 512, 50.0, workload)
    tail = argv[argv.index("--") + 1 :]
    assert tail[1:] == ["-m", module, "--steps", "100", "--hidden", "512", "--step-sleep-ms", "50.0"]
    assert argv[argv.index("run") + 1 : argv.index("--")] == ["--job", "j", "--host-id", "1"]
    assert parts.missing(workload) == []  # the module and what it needs (lightning) import here


def test_an_unknown_workload_is_refused_naming_the_known_ones():
    with pytest.raises(DemoError) as exc:
        DemoOptions(workload="keras").check()
    assert "--workload 'keras'" in str(exc.value) and "ddp, lightning, accum" in exc.value.hint
    bad = CliRunner().invoke(demo_cli.demo_command, ["--workload", "keras"])
    assert bad.exit_code == 2 and "'keras' is not one of 'ddp', 'lightning', 'accum'" in bad.output
    shown = CliRunner().invoke(demo_cli.demo_command, ["--help"], terminal_width=200)
    assert "--workload [ddp|lightning|accum]" in shown.output and "--workload lightning" in shown.output


def test_the_scenario_line_names_a_workload_other_than_the_default():
    assert "workload" not in describe(DemoOptions())
    assert "workload lightning, fault net-loss on node-01" in describe(DemoOptions(workload="lightning"))


def _stub_runs(monkeypatch) -> list[list[str]]:
    cmds: list[list[str]] = []

    def run(cmd, stdout=None, stderr=None, timeout=None, env=None, **_kw):
        if "demo" not in cmd:  # the bench's git revision
            return subprocess.CompletedProcess(cmd, 0, "abc1234\n", "")
        cmds.append(cmd)
        rep = {"verdict": {"ok": True, "ttd_s": None}, "alerts": [], "episodes": [], "scenario": {"fault_at_s": 5.0}}
        Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps(rep))

    monkeypatch.setattr(ttd.os, "geteuid", lambda: 0)
    monkeypatch.setattr(ttd, "private_stack", lambda _print: contextlib.nullcontext())
    monkeypatch.setattr(ttd, "wait_for_demo_lock", lambda: None)
    monkeypatch.setattr(ttd.subprocess, "run", run)
    return cmds


def _demo_options(cmd: list[str]) -> dict:
    """The options ``obshub demo`` parses from the bench's command line (parsed by its click command, not run)."""
    args = cmd[cmd.index("demo") + 1 :]
    return demo_cli.demo_command.make_context("demo", args).params


def test_bench_make_demo_passes_the_workload_to_both_runs(monkeypatch):
    cmds = _stub_runs(monkeypatch)
    ttd.run_make_demo(workload="lightning")
    assert [_demo_options(c)["workload"] for c in cmds] == ["lightning", "lightning"]
    cmds.clear()
    ttd.run_make_demo()
    assert [_demo_options(c)["workload"] for c in cmds] == ["ddp", "ddp"] and all("--workload" not in c for c in cmds)


def test_bench_stall_campaign_passes_the_workload(monkeypatch, tmp_path):
    cmds = _stub_runs(monkeypatch)
    monkeypatch.setattr(ttd.common, "save", lambda _n, _r: tmp_path / "r.json")
    a = ttd.parse_args(["--stall", "cpu,process", "--fault-hosts", "2", "--ranks-per-host", "2", "--fault-rank", "1",
                        "--workload", "accum"])  # fmt: skip
    ttd.run_stall(a.fault_host_list, a.layers, 5.0, None, None, a.params, a.ranks_per_host, a.fault_rank, a.workload)
    (cmd,) = cmds
    opts = _demo_options(cmd)
    assert (opts["workload"], opts["ranks_per_host"], opts["fault_rank"]) == ("accum", 2, 1)
    with pytest.raises(SystemExit):
        ttd.parse_args(["--stall", "net", "--workload", "keras"])
