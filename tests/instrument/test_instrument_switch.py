"""OBSHUB_INSTRUMENT as a person writes it (newuser23): on f174a23 only ``0`` turned `obshub run`'s
bootstrap off, so ``OBSHUB_INSTRUMENT=false`` (or ``off``, ``no``) left every process instrumented, and a
typo said nothing. A real `obshub run` of a real interpreter: its sitecustomize installs the torch import
watcher exactly when the instrumentation is on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROBE = "import sys; print(any(type(f).__name__ == '_TorchImportWatcher' for f in sys.meta_path))"


def _run(value: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "OBSHUB_INSTRUMENT"}
    env["PYTHONPATH"] = str(REPO)
    if value is not None:
        env["OBSHUB_INSTRUMENT"] = value
    return subprocess.run(
        [sys.executable, "-m", "obshub", "run", "--", sys.executable, "-c", PROBE],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("value", ["0", "false", "FALSE", " off ", "no"])
def test_every_usual_off_value_turns_the_bootstrap_off(value):
    res = _run(value)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False", (value, res.stdout, res.stderr)
    assert "OBSHUB_INSTRUMENT" not in res.stderr


@pytest.mark.parametrize("value", [None, "1", "true", "On", ""])
def test_on_values_keep_it_on_silently(value):
    res = _run(value)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "True", (value, res.stdout, res.stderr)
    assert "OBSHUB_INSTRUMENT" not in res.stderr


def test_an_unknown_value_keeps_it_on_and_says_so():
    res = _run("maybe")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "True"
    assert "OBSHUB_INSTRUMENT='maybe'" in res.stderr and "stays on" in res.stderr


TREE = """
import os, subprocess, sys
probe = {probe!r}
for i in range(4):  # started by this process, as torchrun's launcher starts its ranks
    subprocess.run([sys.executable, "-c", probe], env={{**os.environ, "LOCAL_RANK": str(i), "RANK": str(i)}}, check=True)
clean = {{k: v for k, v in os.environ.items() if k != "OBSHUB_INSTRUMENT_WARNED"}}
for i in range(4):  # started each on its own (a script per rank): only local rank 0 says it
    subprocess.run([sys.executable, "-c", probe], env={{**clean, "LOCAL_RANK": str(i)}}, check=True)
for i in range(2):  # RANK alone (no LOCAL_RANK): only rank 0
    subprocess.run([sys.executable, "-c", probe], env={{**clean, "RANK": str(i + 1)}}, check=True)
"""


def test_an_unknown_value_is_said_once_per_process_tree_not_by_every_rank():
    """mends24: on cfd471b every Python process said it: ``obshub run -- torchrun --nproc-per-node 8`` wrote
    the line 9 times (launcher and ranks). Here a real process tree of 10 interpreters under `obshub run`:
    the first says it; its children (the launcher's ranks) inherit that it was said; ranks started apart say it
    only at local rank 0. Every one stays instrumented (the watcher is installed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBSHUB_INSTRUMENT")}
    env.update(PYTHONPATH=str(REPO), OBSHUB_INSTRUMENT="maybe")
    res = subprocess.run(
        [sys.executable, "-m", "obshub", "run", "--", sys.executable, "-c", PROBE + "\n" + TREE.format(probe=PROBE)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["True"] * 11, res.stdout
    assert res.stderr.count("OBSHUB_INSTRUMENT='maybe'") == 2, res.stderr  # the tree's first, local rank 0


@pytest.mark.torch
def test_an_unknown_value_is_said_once_under_torchrun(tmp_path):
    """The same under a real ``torchrun`` of 4 ranks (launcher and 4 workers, 5 interpreters: 5 lines on
    cfd471b): one line, and every rank instrumented."""
    script = tmp_path / "rank.py"
    script.write_text(PROBE + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBSHUB_INSTRUMENT")}
    env.update(PYTHONPATH=str(REPO), OBSHUB_INSTRUMENT="maybe")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", str(script)]
    res = subprocess.run(
        [sys.executable, "-m", "obshub", "run", "--", *cmd],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("True") == 4 and "False" not in res.stdout, res.stdout  # the ranks' lines interleave
    assert res.stderr.count("OBSHUB_INSTRUMENT='maybe'") == 1, res.stderr[-3000:]


@pytest.mark.parametrize(
    ("var", "value", "said"),
    [
        ("OBSHUB_HOST_ID", "abc", "OBSHUB_HOST_ID='abc' (the default of --host-id) is not an integer in 0..65535"),
        ("OBSHUB_HOST_ID", "70000", "OBSHUB_HOST_ID='70000' (the default of --host-id) is not an integer"),
        ("OBSHUB_OPTIMIZERS_PER_STEP", "0", "OBSHUB_OPTIMIZERS_PER_STEP='0' (the default of --optimizers-per-step)"),
    ],
)
def test_a_bad_default_in_the_environment_is_refused_as_its_option_is(var, value, said):
    """mends24: on cfd471b `obshub run` started the command, and every process that imported torch ran
    uninstrumented with its own `obshub: instrumentation not enabled` line (9 under torchrun of 8 ranks),
    while `--host-id abc` was refused at once. Now the same usage error (exit 2), naming the variable; the
    option given wins over the variable, and an empty one is unset."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBSHUB_")}
    env.update(PYTHONPATH=str(REPO), **{var: value})
    cmd = [sys.executable, "-m", "obshub", "run", "--", sys.executable, "-c", "print('ran')"]
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 2 and said in res.stderr and "ran" not in res.stdout, (res.stdout, res.stderr)
    option = "--host-id" if var == "OBSHUB_HOST_ID" else "--optimizers-per-step"
    res = subprocess.run(
        [*cmd[:4], option, "2", *cmd[4:]], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0 and res.stdout.strip() == "ran", res.stderr
    res = subprocess.run(cmd, cwd=REPO, env={**env, var: ""}, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ran", res.stderr
