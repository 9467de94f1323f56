"""The systemd units and the Slurm prolog in deploy/ agree with the Helm chart and with the layout
deploy/README.md installs (a checkout at /opt/obshub with its .venv, `pip install /opt/obshub`): what the
agent may do, and that every path a unit names exists there. Read from the files, no systemd needed."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def unit_settings(name: str) -> dict[str, str]:
    """``key -> value`` of the [Service] lines of ``deploy/systemd/NAME``."""
    out = {}
    for line in (DEPLOY / "systemd" / name).read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def test_the_agent_unit_has_the_charts_capabilities_and_no_other():
    """Slurm jobs run as their users: without CAP_SYS_PTRACE the agent cannot read their /proc/<pid>/maps
    (docs/AGENT.md, "Running the agent: privileges"), so it never finds their instrumentation."""
    chart = yaml.safe_load((DEPLOY / "helm" / "obshub" / "values.yaml").read_text())
    want = {f"CAP_{c}" for c in chart["agent"]["capabilities"]}
    unit = unit_settings("obshub-agent.service")
    assert set(unit["CapabilityBoundingSet"].split()) == want
    assert set(unit["AmbientCapabilities"].split()) == want
    assert "CAP_SYS_PTRACE" in want


def test_the_rule_units_rule_paths_exist_where_obshub_is_installed(tmp_path):
    """The rule engine's unit loads the builtin pack wherever obshub is installed: in a checkout at
    /opt/obshub (what the Slurm prolog's /opt/obshub/obshub/instrument/bootstrap needs) there is no
    /opt/obshub/rules/builtin, which only the image has."""
    argv = shlex.split(unit_settings("obshub-rules.service")["ExecStart"])
    paths = [argv[i + 1] for i, a in enumerate(argv) if a in ("-r", "--rules")]
    rules_d = tmp_path / "rules.d"
    rules_d.mkdir()
    here = [str(rules_d) if p == "/etc/obshub/rules.d" else p.replace("/opt/obshub", str(REPO)) for p in paths]
    r = subprocess.run(
        [sys.executable, "-m", "obshub.cli", "rules", "check", *here], capture_output=True, text=True, cwd=tmp_path
    )
    assert r.returncode == 0, r.stdout + r.stderr
    prolog = (DEPLOY / "slurm" / "task_prolog.sh").read_text()
    assert "${OBSHUB}/obshub/instrument/bootstrap" in prolog and (REPO / "obshub/instrument/bootstrap").is_dir()


def test_every_stream_worker_instance_gets_its_own_valid_metrics_port():
    """`obshub-streams@N` for N up to the events topic's partitions (64 in deploy/README.md's example):
    `946%i` gave worker 5 the agent's 9465 and workers 10 and up 94610..., no port at all. The unit's
    command line is run through the shell as systemd hands it over, with the program replaced by echo."""
    exec_start = unit_settings("obshub-streams@.service")["ExecStart"]
    agent_port = shlex.split(unit_settings("obshub-agent.service")["ExecStart"])[-1]
    ports = {}
    for n in range(1, 65):
        argv = shlex.split(exec_start.replace("$$", "$").replace("%i", str(n)))
        argv = [a.replace("/opt/obshub/.venv/bin/obshub", "echo") for a in argv]
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
        assert out[:4] == ["streams", "worker", "--index", str(n)], out
        ports[n] = int(out[out.index("--metrics-port") + 1])
    assert len(set(ports.values())) == 64 and all(1024 <= p <= 65535 for p in ports.values()), ports
    assert int(agent_port) not in ports.values() and ports[1] == 9471


@pytest.mark.slow  # the agent waits ~15 s for the unreachable broker before it exits
def test_the_agent_unit_starts_with_an_env_file_that_sets_only_the_bootstrap(tmp_path):
    """agent.env needs only OBSHUB_BOOTSTRAP (deploy/README.md: OBSHUB_JOB is optional, `defaultJob`).
    `--job ${OBSHUB_JOB}` made systemd pass an empty --job, which the agent refuses. The unit's command line
    as systemd would expand it with that file (every ${VAR} one word, empty when unset), run with the
    synthetic source for a moment instead of the probes: it must get past its settings."""
    argv = shlex.split(unit_settings("obshub-agent.service")["ExecStart"])
    env = {"OBSHUB_BOOTSTRAP": "127.0.0.1:9"}
    argv = [env.get(a[2:-1], "") if a.startswith("${") and a.endswith("}") else a for a in argv]
    assert argv[:2] == ["/opt/obshub/.venv/bin/obshub", "agent"]
    args = [a for a in argv[2:] if a != "--registered"]  # --registered is for the BPF source
    args[args.index("--metrics-port") + 1] = "0"  # any free port: another agent may hold 9465 here
    fast = ["--source", "synthetic", "--duration", "0.5", "--delivery-timeout-ms", "1000"]
    r = subprocess.run(
        [sys.executable, "-m", "obshub.cli", "agent", *args, *fast],
        capture_output=True,
        text=True,
        env={**os.environ, **env, "OBSHUB_HOME": str(tmp_path)},
        timeout=60,
    )
    assert "invalid agent settings" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "127.0.0.1:9" in r.stderr, r.stderr  # the bootstrap it was given, from the environment
