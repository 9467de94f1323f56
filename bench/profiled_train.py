"""obshub's training workload (``obshub.workloads.ddp_train``) run under ``torch.profiler`` with its usual
CPU settings: ``torch.profiler.profile(activities=[ProfilerActivity.CPU])``, no schedule (every op of
every step recorded), no shapes, no stacks, no memory profiling. The trace is summarised after training
(``key_averages``), outside the timed steps, as a user would do. Same command line and same
``step N rank R time_ms T`` output as the workload itself, so bench/training_overhead.py reads both alike.

    python -m bench.profiled_train --steps 20        # one rank; under torchrun/env: each rank profiled
"""

from __future__ import annotations

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from obshub.workloads import ddp_train


def main(argv: list[str] | None = None) -> int:
    """Run ``ddp_train.main(argv)`` inside a CPU profiler; returns its exit code."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        rc = ddp_train.main(argv)
    events = prof.key_averages()
    print(f"profiled_train: {len(events)} distinct ops recorded", file=sys.stderr)
    return rc


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main(sys.argv[1:]))
