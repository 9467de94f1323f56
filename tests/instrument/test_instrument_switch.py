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
