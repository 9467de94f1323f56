"""``obshub run [--job NAME] [--host-id N] -- <command ...>``: run a training command with obshub's
in-process PyTorch instrumentation (USDT probes), without changing a line of it (the click command is
:func:`obshub.instrument.cli.run_command`).

How: the bootstrap folder ``obshub/instrument/bootstrap`` (a ``sitecustomize``) is prepended to
``PYTHONPATH`` and ``OBSHUB_JOB`` / ``OBSHUB_HOST_ID`` are set; every Python process the command starts
(``python train.py``, ``torchrun`` and each of its workers) then enables :mod:`obshub.instrument` as
soon as it imports torch. Programs that never import torch are untouched.

The command *replaces* this process (``execvpe``): its pid is the one obshub was started with, so exit
codes, SIGINT and SIGTERM reach it exactly as they would without obshub (a signal sent to ``obshub run``'s
pid is a signal to the command). If the command cannot be started, obshub exits 1 with an error.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from obshub.core import workload
from obshub.core.errors import ConfigError, ObshubError

BOOTSTRAP_DIR = Path(__file__).resolve().parent / "bootstrap"


def bootstrap_dir() -> Path:
    """The folder holding the bootstrap ``sitecustomize.py``; raises ObshubError when it is missing."""
    if (BOOTSTRAP_DIR / "sitecustomize.py").is_file():
        return BOOTSTRAP_DIR
    raise ObshubError(
        f"the obshub bootstrap folder {BOOTSTRAP_DIR} is missing",
        hint="reinstall obshub (`make setup`) from a complete checkout",
    )


def child_env(
    base: dict[str, str], job: str | None, host_id: int | None, optimizers_per_step: int | None = None
) -> dict[str, str]:
    """The environment of the command: ``base`` with the bootstrap folder first on PYTHONPATH and
    ``OBSHUB_JOB`` / ``OBSHUB_HOST_ID`` / ``OBSHUB_OPTIMIZERS_PER_STEP`` set when given (kept from ``base``
    otherwise)."""
    env = dict(base)
    boot = str(bootstrap_dir())
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != boot]
    env["PYTHONPATH"] = os.pathsep.join([boot, *parts])
    if job is not None:
        env["OBSHUB_JOB"] = job
    if host_id is not None:
        env["OBSHUB_HOST_ID"] = str(host_id)
    if optimizers_per_step is not None:
        env["OBSHUB_OPTIMIZERS_PER_STEP"] = str(optimizers_per_step)
    return env


def check_job(job: str) -> None:
    """Refuse a ``--job`` the register probe would not carry as given: empty (or blanks), or changed by
    ``workload.clean_job`` (more than ``JOB_MAX_BYTES`` bytes of UTF-8, control characters): the job would
    be published under another name than the one given, and ``obshub tail steps --job`` would find nothing.
    A given name must also be an identifier as a host's is (``workload.JOB_RE``: ``--job 'a b'`` was
    accepted; the job is the key of every step, alert label and ``--job`` filter, and the schema takes any
    printable text, so the command line that names it is where a name that needs quoting is refused).
    Raises ConfigError (its hint says what to give); ``obshub run`` reports it as a usage error (exit 2)."""
    if not job.strip():
        raise ConfigError(f"--job {job!r} is empty", hint="give the job a name, e.g. --job llama-7b")
    if workload.clean_job(job) != job.strip():
        raise ConfigError(
            f"--job {job!r}: the job would be named {workload.clean_job(job)!r} "
            f"(a job name is at most {workload.JOB_MAX_BYTES} bytes of UTF-8, without control characters)",
            hint=f"give a name of at most {workload.JOB_MAX_BYTES} bytes of printable text, e.g. --job llama-7b",
        )
    if not workload.JOB_RE.match(job):
        raise ConfigError(
            f"--job {job!r} is not a job name: letters, digits, '.', '_' or '-', starting with a letter or digit"
            " (as a host name)",
            hint="e.g. --job llama-7b",
        )


def check_env_defaults(env: dict[str, str], host_id: int | None, optimizers_per_step: int | None) -> None:
    """Refuse an ``OBSHUB_HOST_ID`` (0..65535) or ``OBSHUB_OPTIMIZERS_PER_STEP`` (1 or more) in ``env`` that
    every instrumented process would refuse, where the option it is the default of was not given (empty:
    unset, as the processes read it). Each process then ran uninstrumented with its own ``obshub:`` line,
    9 lines under ``torchrun --nproc-per-node 8``, while ``--host-id abc`` was refused at once. Raises
    ConfigError naming the variable and the option; ``obshub run`` reports it as a usage error (exit 2)."""
    checks = (
        ("OBSHUB_HOST_ID", "--host-id", host_id, 0, 0xFFFF, "an integer in 0..65535", "this node's number"),
        (
            "OBSHUB_OPTIMIZERS_PER_STEP",
            "--optimizers-per-step",
            optimizers_per_step,
            1,
            None,
            "an integer >= 1",
            "the optimizer.step() calls of one training iteration",
        ),
    )
    for var, option, given, lo, hi, what, meaning in checks:
        raw = env.get(var, "")
        if given is not None or raw == "":
            continue
        try:
            value = int(raw)
        except ValueError:
            value = lo - 1
        if value < lo or (hi is not None and value > hi):
            raise ConfigError(
                f"{var}={raw!r} (the default of {option}) is not {what}",
                hint=f"set {var} to {meaning}, unset it, or give {option}",
            )


def exec_instrumented(
    command: tuple[str, ...] | list[str], job: str | None, host_id: int | None, optimizers_per_step: int | None = None
) -> None:
    """Replace this process with ``command`` under the instrumentation (never returns on success).
    Raises ConfigError for an empty ``job`` and ObshubError when the command cannot be started (exit code
    127 when it is not found, 126 when it cannot be run, as a shell)."""
    if job is not None:
        check_job(job)
    env = child_env(dict(os.environ), job, host_id, optimizers_per_step)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], list(command), env)
    except OSError as exc:
        # the shell's exit statuses: 127 command not found, 126 found but not runnable
        raise ObshubError(
            f"could not start {command[0]!r}: {exc.strerror}",
            hint="check the command name and that it is on PATH and executable",
            exit_code=127 if isinstance(exc, FileNotFoundError) else 126,
        ) from exc
