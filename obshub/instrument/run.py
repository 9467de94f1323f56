"""``obshub run [--job NAME] [--host-id N] -- <command ...>``: run a training command with obshub's
in-process PyTorch instrumentation (USDT probes), without changing a line of it.

How: the bootstrap folder ``producer/usdt/bootstrap`` (a ``sitecustomize``) is prepended to
``PYTHONPATH`` and ``OBSHUB_JOB`` / ``OBSHUB_HOST_ID`` are set; every Python process the command starts
(``python train.py``, ``torchrun`` and each of its workers) then enables :mod:`producer.instrument` as
soon as it imports torch. Programs that never import torch are untouched.

The command *replaces* this process (``execvpe``): its pid is the one obshub was started with, so exit
codes, SIGINT and SIGTERM reach it exactly as they would without obshub (a signal sent to ``obshub run``'s
pid is a signal to the command). If the command cannot be started, obshub exits 1 with an error.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from obshub.errors import ConfigError, ObshubError

BOOTSTRAP_DIR = Path(__file__).resolve().parent.parent / "producer" / "usdt" / "bootstrap"

EPILOG = """\b
Examples:
  obshub run -- python train.py                                   # one process, instrumented
  obshub run --job llama-7b -- torchrun --nproc-per-node 2 train.py   # every torchrun worker instrumented
  obshub run --host-id 3 -- torchrun --nproc-per-node 8 -m obshub.workloads.ddp_train  # node 3 of a job
  OBSHUB_INSTRUMENT=0 obshub run -- python train.py               # same environment, instrumentation off
"""


def bootstrap_dir() -> Path:
    """The folder holding the bootstrap ``sitecustomize.py``; raises ObshubError when it is missing."""
    for candidate in (BOOTSTRAP_DIR, Path(__import__("producer").__file__).parent / "usdt" / "bootstrap"):
        if (candidate / "sitecustomize.py").is_file():
            return candidate
    raise ObshubError(f"the obshub bootstrap folder {BOOTSTRAP_DIR} is missing",
                      hint="reinstall obshub (`make setup`) from a complete checkout")


def child_env(base: dict[str, str], job: str | None, host_id: int | None) -> dict[str, str]:
    """The environment of the command: ``base`` with the bootstrap folder first on PYTHONPATH and
    ``OBSHUB_JOB`` / ``OBSHUB_HOST_ID`` set when given (kept from ``base`` otherwise)."""
    env = dict(base)
    boot = str(bootstrap_dir())
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != boot]
    env["PYTHONPATH"] = os.pathsep.join([boot, *parts])
    if job is not None:
        env["OBSHUB_JOB"] = job
    if host_id is not None:
        env["OBSHUB_HOST_ID"] = str(host_id)
    return env


@click.command("run", epilog=EPILOG, context_settings={"ignore_unknown_options": True,
                                                         "allow_interspersed_args": False,
                                                         "help_option_names": ["-h", "--help"]})
@click.option("--job", default=None, help="job name carried by the register probe (default $OBSHUB_JOB, "
              "else 'default')")
@click.option("--host-id", type=click.IntRange(0, 0xFFFF), default=None,
              help="this node's host id in TraceKeys, 0..65535 (default $OBSHUB_HOST_ID, else the rank)")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run_command(job: str | None, host_id: int | None, command: tuple[str, ...]) -> None:
    """Run COMMAND with in-process PyTorch instrumentation (USDT), no code change needed.

    COMMAND replaces this process: its exit code and signals are its own. Put `--` before it."""
    if job is not None and not job.strip():
        raise ConfigError("--job is empty", hint="give the job a name, e.g. --job llama-7b")
    env = child_env(dict(os.environ), job, host_id)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], list(command), env)
    except OSError as exc:
        raise ObshubError(f"could not start {command[0]!r}: {exc.strerror}",
                          hint="check the command name and that it is on PATH and executable") from exc
