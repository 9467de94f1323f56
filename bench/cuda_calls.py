"""Price of the CUDA/NCCL uprobes per call, on the torch wheel's real libraries (libcudart, libnccl under
site-packages/nvidia): ns per call of every probed symbol with no agent (A), with the default agent (B:
the per-launch probes are in the deep-dive tier, not attached) and during a deep dive (C: every probe
attached), interleaved A B C / A C B rounds; then µs per step and the projection for a 1 s step of an
8-GPU node at 2,000 / 10,000 / 50,000 launches and 100 / 500 collectives per step.

Without a GPU each call fails fast (the runtime finds no driver), but the uprobes fire the same: the
difference B - A and C - A is the probe's price (two traps, the BPF programs, the map updates). Needs
root (bcc); the caller is a small C loop (bench/cuda_calls.c, built with gcc), so the Python call is not
in the figure.

    flock /tmp/obshub-heavy.lock python -m bench.cuda_calls                 # 5 rounds, 200,000 calls
    flock /tmp/obshub-heavy.lock python -m bench.cuda_calls --rounds 3 --calls 50000

Raw results: bench/results/cuda_calls.json.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench import common
from obshub.producer import probes as cat
from obshub.producer.probes import ProbeOptions, Target

HERE = Path(__file__).resolve().parent
LAUNCHES = (2_000, 10_000, 50_000)  # kernel launches per 1 s step of one rank
COLLECTIVES = (100, 500)  # NCCL collectives per 1 s step of one rank
TARGET_LAUNCH_NS = 50.0  # the default agent's added price per cudaLaunchKernel (issue #34)


class Caller:
    """The C caller (bench/cuda_calls.c) as a child process: ``ns(lib, symbol, n)`` -> ns per call."""

    def __init__(self, workdir: Path):
        exe = workdir / "cuda_calls"
        subprocess.run(["gcc", "-O2", "-o", str(exe), str(HERE / "cuda_calls.c"), "-ldl"], check=True)
        self.proc = subprocess.Popen(
            [str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        assert self.proc.stdout.readline().strip() == "ready"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def ns(self, lib: Path, symbol: str, n: int) -> float:
        self.proc.stdin.write(f"{lib} {symbol} {n}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline().strip()
        if not line or line.startswith("error"):
            raise RuntimeError(f"the caller could not call {symbol} of {lib}: {line or 'it exited'}")
        return float(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)


def symbols(libs: dict[str, Path]) -> list[tuple[str, Path]]:
    """(symbol, library path) of every catalogue CUDA/NCCL symbol whose library is found here."""
    return [
        (s.symbol, libs[s.lib]) for s in cat.CUDA_SYMBOLS if s.lib in libs and cat.has_symbol(libs[s.lib], s.symbol)
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=common.positive_int, default=5)
    ap.add_argument("--calls", type=int, default=200_000, help="calls per sample of a probed symbol")
    args = ap.parse_args(argv)

    from obshub.core.settings import load_settings
    from obshub.producer.loader import BpfEventSource

    libs = cat.find_libraries(ProbeOptions(), set())
    syms = symbols(libs)
    if not any(s == "cudaLaunchKernel" for s, _ in syms):
        raise SystemExit("the torch wheel's libcudart (site-packages/nvidia/*/lib) is not installed here")
    work = Path(tempfile.mkdtemp(prefix="obshub-cuda-calls-"))
    caller = Caller(work)
    settings = load_settings()
    samples: dict[str, dict[str, list[float]]] = {c: {s: [] for s, _ in syms} for c in ("A", "B", "C")}
    attach_ms: list[float] = []

    def measure(config: str) -> None:
        for sym, lib in syms:
            samples[config][sym].append(caller.ns(lib, sym, args.calls))

    try:
        for r in range(args.rounds):
            common.console.print(f"[dim]round {r + 1}/{args.rounds}[/dim]")
            measure("A")
            src = BpfEventSource(
                settings, Target(pids={caller.pid}), ProbeOptions(probes=("cuda", "nccl"), sysfs=False)
            )
            try:
                src.start()
                order = ("B", "C") if r % 2 == 0 else ("C", "B")
                for config in order:
                    if config == "C":
                        attach_ms.append(src.deep_dive_on() * 1e3)
                    else:
                        src.deep_dive_off()
                    measure(config)
                    src.poll(0)  # keep the ring drained
            finally:
                src.close()
    finally:
        caller.close()

    med = {c: {s: statistics.median(v) for s, v in per.items()} for c, per in samples.items()}

    def ci(config: str, sym: str) -> tuple[float, float]:
        """min..max of the per-round differences config - A (n = rounds; a range, not a t-interval)."""
        d = [x - a for x, a in zip(samples[config][sym], samples["A"][sym])]
        return min(d), max(d)

    from rich.table import Table

    t = Table(
        title="ns per call, torch wheel's libraries (no GPU: each call fails fast)", caption=common.describe_machine()
    )
    for col in ("symbol", "A no agent", "B default agent", "B - A [min..max]", "C deep dive", "C - A [min..max]"):
        t.add_column(col)
    for sym, _lib in syms:
        b_lo, b_hi = ci("B", sym)
        c_lo, c_hi = ci("C", sym)
        t.add_row(
            sym,
            f"{med['A'][sym]:.1f}",
            f"{med['B'][sym]:.1f}",
            f"{med['B'][sym] - med['A'][sym]:+.1f} [{b_lo:+.0f}..{b_hi:+.0f}]",
            f"{med['C'][sym]:.1f}",
            f"{med['C'][sym] - med['A'][sym]:+.1f} [{c_lo:+.0f}..{c_hi:+.0f}]",
        )
    common.console.print(t)

    launch = {c: med[c]["cudaLaunchKernel"] - med["A"]["cudaLaunchKernel"] for c in ("B", "C")}
    coll_sym = "ncclAllReduce" if "ncclAllReduce" in med["A"] else None
    coll = {c: (med[c][coll_sym] - med["A"][coll_sym]) if coll_sym else 0.0 for c in ("B", "C")}
    p = Table(title="projection: µs per 1 s step of one rank (% of the step); an 8-GPU node pays it on each of 8 ranks")
    for col in ("launches / step", "collectives / step", "B default agent", "C deep dive", "node CPU, B (8 ranks)"):
        p.add_column(col)
    proj = []
    for n_l in LAUNCHES:
        for n_c in COLLECTIVES:
            b = (n_l * launch["B"] + n_c * coll["B"]) / 1e3
            c = (n_l * launch["C"] + n_c * coll["C"]) / 1e3
            proj.append({"launches": n_l, "collectives": n_c, "B_us": b, "C_us": c})
            p.add_row(
                f"{n_l:,}",
                str(n_c),
                f"{b:.1f} µs ({b / 1e4:.3f} %)",
                f"{c:.1f} µs ({c / 1e4:.3f} %)",
                f"{8 * b:.0f} µs",
            )
    common.console.print(p)
    common.console.print(
        f"deep-dive attach (bcc resolves the symbols and attaches the launch uprobe pairs): median "
        f"{statistics.median(attach_ms):.1f} ms, max {max(attach_ms):.1f} ms over {len(attach_ms)} attaches"
    )
    common.verdict(
        "default agent per cudaLaunchKernel <= 50 ns",
        launch["B"] <= TARGET_LAUNCH_NS,
        f"B - A = {launch['B']:+.1f} ns (deep dive: {launch['C']:+.1f} ns)",
    )
    path = common.save(
        "cuda_calls",
        {
            "rev": common.git_rev(),
            "calls": args.calls,
            "rounds": args.rounds,
            "samples": samples,
            "median": med,
            "projection": proj,
            "attach_ms": attach_ms,
            "at": time.time(),
        },
    )
    common.console.print(f"[dim]raw results: {path}[/dim]")
    return common.exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
