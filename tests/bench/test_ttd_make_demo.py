"""``python -m bench.ttd --make-demo``: the clean run's command line is one the demo accepts. The demo runs
are not started here (they need root and minutes): the commands the bench builds go through the demo's
own option check (``obshub demo``'s click command), the runs' report is a stub."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from click.testing import CliRunner

from bench import ttd
from obshub.demo import cli as demo_cli


def test_make_demo_runs_the_clean_run_without_a_fault_host(monkeypatch):
    """demo20: ``--make-demo`` passed ``--fault-host 1`` to the clean run too, which the demo refuses since
    newuser20 (``--fault-host with --fault none``), so the campaign died after its net-loss run. The
    net-loss run names node-01 (index 1), the clean run no host."""
    cmds: list[list[str]] = []

    def run(cmd, stdout=None, stderr=None, timeout=None):
        cmds.append(cmd)
        rep = {"verdict": {"ok": True, "ttd_s": None}, "alerts": []}
        Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps(rep))

    monkeypatch.setattr(ttd.os, "geteuid", lambda: 0)
    monkeypatch.setattr(ttd, "private_stack", lambda _print: contextlib.nullcontext())
    monkeypatch.setattr(ttd, "wait_for_demo_lock", lambda: None)
    monkeypatch.setattr(ttd.subprocess, "run", run)
    out = ttd.run_make_demo()
    assert sorted(out) == ["net-loss", "none"]
    loss, clean = cmds
    assert loss[loss.index("--fault") + 1] == "net-loss" and loss[loss.index("--fault-host") + 1] == "1"
    assert clean[clean.index("--fault") + 1] == "none" and "--fault-host" not in clean
    # what the demo says to the command line the bench built before: refused as bad options (exit 2)
    refused = CliRunner().invoke(demo_cli.demo_command, ["--hosts", "4", "--fault", "none", "--fault-host", "1"])
    assert refused.exit_code == 2 and "--fault-host with --fault none" in refused.output
