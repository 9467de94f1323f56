"""Cost of obshub's USDT probes, side by side: ns per call with no tracer attached (the probe site is a
NOP), against the same call without a probe, a plain Python call, and (``--attached``, root) the same
probe with a BPF program attached. ``--per-step`` adds the cost of the whole instrumentation layer per
training step (global hooks + probes) on a tiny CPU model, with ``enable()`` against without.

    python -m bench.usdt_overhead                  # ns/call, probes not attached
    python -m bench.usdt_overhead --attached       # also with a bcc program on coll_begin (root)
    python -m bench.usdt_overhead --per-step       # also µs per training step with/without enable()

Configurations run interleaved (bench.common.interleave); raw results go to bench/results/usdt_overhead.json.
"""

from __future__ import annotations

import argparse
import time

from bench import common
from obshub.instrument import _usdt, usdt

CALLS = 200_000  # calls per sample
ROUNDS = 7  # samples per configuration
STEPS = 200  # training steps per sample (--per-step)
KEY = (1 << 48) | (3 << 32) | 7


def _py_empty(pg, seq, op, nbytes, step, key):
    return None


def _per_call(fn, *args) -> float:
    """ns per call of ``fn(*args)`` over CALLS calls (loop overhead included, the same for every row)."""
    t0 = time.perf_counter_ns()
    for _ in range(CALLS):
        fn(*args)
    return (time.perf_counter_ns() - t0) / CALLS


def call_configs() -> dict:
    """name -> sampler for the per-call rows."""
    coll = ("0", 12, "all_reduce", 4096, 3, KEY)
    return {
        "python def, 6 args (no C, no probe)": lambda: _per_call(_py_empty, *coll),
        "C _baseline: parse 6 args, no probe": lambda: _per_call(_usdt._baseline, *coll),
        "C coll_begin: parse 6 args + probe (NOP)": lambda: _per_call(usdt.coll_begin, *coll),
        "C tracekey: parse 2 args + probe (NOP)": lambda: _per_call(usdt.tracekey, KEY, 3),
        "C phase_begin: parse 3 args + probe (NOP)": lambda: _per_call(usdt.phase_begin, "forward", 3, KEY),
    }


def attach_coll_begin():
    """A minimal bcc program on obshub:coll_begin (counts hits). Returns the BPF object (keep it alive)."""
    from bcc import BPF, USDT

    from obshub.core.settings import load_settings
    from obshub.producer import kheaders

    kheaders.apply_env(load_settings())
    u = USDT(path=usdt.library_path())
    u.enable_probe(probe="coll_begin", fn_name="on_coll")
    text = b"BPF_ARRAY(hits, u64, 1);\nint on_coll(struct pt_regs *ctx) { hits.atomic_increment(0); return 0; }\n"
    return BPF(text=text, usdt_contexts=[u])


def step_configs() -> dict:
    """name -> sampler (µs per training step) with and without obshub.instrument.enable()."""
    import torch

    from obshub import instrument

    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 32), torch.randint(0, 4, (8,))
    loss_fn = torch.nn.CrossEntropyLoss()

    def run(enabled: bool) -> float:
        (instrument.enable if enabled else instrument.disable)()
        t0 = time.perf_counter_ns()
        for _ in range(STEPS):
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        return (time.perf_counter_ns() - t0) / STEPS / 1000

    return {
        "training step, no instrumentation": lambda: run(False),
        "training step, enable() (probes NOP)": lambda: run(True),
    }


def main(argv=None) -> int:
    """Run the benchmark and print the tables."""
    p = argparse.ArgumentParser(
        prog="python -m bench.usdt_overhead", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--attached", action="store_true", help="also measure with a bcc program attached (root)")
    p.add_argument("--per-step", action="store_true", help="also measure µs per training step (imports torch)")
    args = p.parse_args(argv)

    configs = call_configs()
    calls = common.interleave(configs, ROUNDS, progress=False)
    result = {"calls": {k: v.samples for k, v in calls.items()}}
    if args.attached:
        bpf = attach_coll_begin()
        coll = ("0", 12, "all_reduce", 4096, 3, KEY)
        attached = common.interleave(
            {"C coll_begin: probe with bcc attached (uprobe trap)": lambda: _per_call(usdt.coll_begin, *coll)},
            ROUNDS,
            progress=False,
        )
        calls.update(attached)
        result["attached"] = {k: v.samples for k, v in attached.items()}
        bpf.cleanup()
    common.console.print(
        common.table(
            "USDT probe cost per call", calls, "ns/call", baseline="C _baseline: parse 6 args, no probe", fmt="{:.1f}"
        )
    )
    if args.per_step:
        steps = common.interleave(step_configs(), ROUNDS, progress=False)
        result["per_step"] = {k: v.samples for k, v in steps.items()}
        common.console.print(
            common.table(
                "instrumentation cost per training step",
                steps,
                "µs/step",
                baseline="training step, no instrumentation",
                fmt="{:.1f}",
            )
        )
    common.console.print(f"raw results: {common.save('usdt_overhead', result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
