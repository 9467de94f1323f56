"""``obshub run``: the command line of the in-process instrumentation (:mod:`obshub.instrument.run`)."""

from __future__ import annotations

import os

import click

from obshub.core.errors import ConfigError
from obshub.instrument.run import check_env_defaults, check_job, exec_instrumented

EPILOG = """\b
Examples:
  obshub run -- python train.py                                   # one process, instrumented
  obshub run --job llama-7b -- torchrun --nproc-per-node 2 train.py   # every torchrun worker instrumented
  obshub run --host-id 3 -- torchrun --nproc-per-node 8 -m obshub.workloads.ddp_train  # node 3 of a job
  obshub run --optimizers-per-step 2 -- python gan.py              # a GAN: 2 optimizer steps per iteration
  OBSHUB_INSTRUMENT=0 obshub run -- python train.py               # same environment, instrumentation off
"""


def _job(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """``--job`` checked as the command line reads it (``run.check_job``): a bad value is a usage error
    (exit 2) naming the option, as every command's bad option values are (it was exit 1)."""
    if value is not None:
        try:
            check_job(value)
        except ConfigError as exc:
            why = str(exc).removeprefix("--job ")  # click names the option: "Invalid value for '--job': ..."
            raise click.BadParameter(f"{why}; {exc.hint}" if exc.hint else why) from None
    return value


@click.command(
    "run",
    epilog=EPILOG,
    context_settings={
        "ignore_unknown_options": True,
        "allow_interspersed_args": False,
        "help_option_names": ["-h", "--help"],
    },
)
@click.option(
    "--job",
    default=None,
    callback=_job,
    help="job name carried by the register probe (default: $OBSHUB_JOB, the Slurm job, the torchrun run, a pod label, else 'default')",
)
@click.option(
    "--host-id",
    type=click.IntRange(0, 0xFFFF),
    default=None,
    help="this node's host id in TraceKeys, 0..65535 (default $OBSHUB_HOST_ID, else the rank)",
)
@click.option(
    "--optimizers-per-step",
    type=click.IntRange(1, None),
    default=None,
    help="optimizer.step() calls in one training iteration, e.g. 2 for a GAN (default "
    "$OBSHUB_OPTIMIZERS_PER_STEP, else learned: the first iteration then counts one step per optimizer)",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run_command(
    job: str | None, host_id: int | None, optimizers_per_step: int | None, command: tuple[str, ...]
) -> None:
    """Run COMMAND with in-process PyTorch instrumentation (USDT), no code change needed.

    COMMAND replaces this process: its exit code and signals are its own (127 when it is not found, 126
    when it cannot be run, as a shell). Put `--` before it."""
    if command[0].startswith("-"):
        # options of `obshub run` come before COMMAND; a program name does not start with '-': this is an
        # option `obshub run` does not have (or one meant for the program, before its name)
        raise click.UsageError(
            f"No such option: {command[0]} (the options are --job, --host-id and --optimizers-per-step; put `--` before COMMAND)"
        )
    try:
        check_env_defaults(dict(os.environ), host_id, optimizers_per_step)
    except ConfigError as exc:
        raise click.UsageError(f"{exc}; {exc.hint}" if exc.hint else str(exc)) from None
    exec_instrumented(command, job, host_id, optimizers_per_step)
