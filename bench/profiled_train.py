"""obshub's training workload (``obshub.workloads.ddp_train``) under ``torch.profiler`` as users run it for
continuous profiling: ``profile(activities=[CPU], schedule=schedule(wait=1, warmup=1, active=3, repeat=0),
on_trace_ready=tensorboard_trace_handler(DIR))`` with ``prof.step()`` after every optimizer step (a global
optimizer step hook, so the workload's own loop is unchanged), so every 5 steps three are recorded (each a
``ProfilerStep#N`` range) and their trace is exported to DIR. No shapes, no stacks, no memory profiling.
Same command line and same ``step N rank R time_ms T`` output as the workload itself, so
bench/training_overhead.py reads both alike.

    python -m bench.profiled_train --steps 20 --trace-dir /tmp/traces   # one rank; under torchrun: each rank
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

from obshub.workloads import ddp_train

SCHEDULE = dict(wait=1, warmup=1, active=3, repeat=0)


def main(argv: list[str] | None = None) -> int:
    """Run ``ddp_train.main(argv)`` (``--trace-dir DIR`` taken out of ``argv``) inside the profiler;
    returns its exit code. Prints the number of traces exported to stderr."""
    argv = list(argv or [])
    trace_dir = None
    if "--trace-dir" in argv:
        i = argv.index("--trace-dir")
        trace_dir = argv[i + 1]
        del argv[i : i + 2]
    out = Path(trace_dir or tempfile.mkdtemp(prefix="obshub-profiler-"))
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(**SCHEDULE),
        on_trace_ready=tensorboard_trace_handler(str(out)),
    ) as prof:
        handle = register_optimizer_step_post_hook(lambda _opt, _args, _kwargs: prof.step())
        try:
            rc = ddp_train.main(argv)
        finally:
            handle.remove()
    traces = list(out.glob("*.json"))
    print(f"profiled_train: {len(traces)} traces exported to {out}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main(sys.argv[1:]))
