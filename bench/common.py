"""Shared helpers of the benchmarks: machine description, interleaved runs, robust statistics and the
side-by-side table every benchmark prints.

A benchmark compares configurations A, B, C... by running them *interleaved* (A B C A B C ...) so that
drift of the machine (other load, thermal, page cache) spreads over all configurations instead of biasing
one. It reports the median and the spread (min..max and the median absolute deviation) of each, and the
ratio of each median to the baseline's median.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.table import Table

console = Console(highlight=False, width=max(120, shutil.get_terminal_size((120, 40)).columns))


def machine() -> dict:
    """What the numbers were measured on: CPU model, cores, memory (GiB), kernel, Python, load average."""
    model = "?"
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                model = ln.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = 0.0
    try:
        for ln in Path("/proc/meminfo").read_text().splitlines():
            if ln.startswith("MemTotal:"):
                mem_gib = int(ln.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "mem_gib": round(mem_gib, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg": os.getloadavg(),
    }


def describe_machine() -> str:
    """One line for the table caption."""
    m = machine()
    la = ", ".join(f"{x:.2f}" for x in m["loadavg"])
    return f"{m['cpu']}, {m['cores']} cores, {m['mem_gib']} GiB, Linux {m['kernel']}, Python {m['python']}, load {la}"


@dataclass
class Series:
    """Samples of one configuration, in the benchmark's unit."""

    name: str
    samples: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")

    @property
    def mad(self) -> float:
        """Median absolute deviation from the median."""
        if not self.samples:
            return float("nan")
        m = self.median
        return statistics.median(abs(x - m) for x in self.samples)


def interleave(configs: dict[str, Callable[[], float]], rounds: int, progress: bool = True) -> dict[str, Series]:
    """Run each configuration ``rounds`` times, interleaved (A B C, A B C, ...). Each callable returns one
    sample (any unit). Returns name -> Series."""
    out = {name: Series(name) for name in configs}
    for r in range(rounds):
        for name, fn in configs.items():
            if progress:
                console.print(f"[dim]  round {r + 1}/{rounds}: {name}[/dim]")
            out[name].samples.append(fn())
    return out


def table(
    title: str,
    series: dict[str, Series],
    unit: str,
    baseline: str | None = None,
    lower_is_better: bool = True,
    fmt: str = "{:.3f}",
) -> Table:
    """A rich table: configuration, n, median, spread (min..max, ±MAD), ratio to the baseline median."""
    base = series[baseline].median if baseline else None
    t = Table(title=title, caption=describe_machine())
    for col in ("configuration", "n", f"median ({unit})", "min .. max", "± MAD", f"ratio to {baseline or '-'}"):
        t.add_column(col)
    for s in series.values():
        ratio = "" if base in (None, 0) else f"{s.median / base:.4f}"
        t.add_row(
            s.name,
            str(len(s.samples)),
            fmt.format(s.median),
            f"{fmt.format(min(s.samples))} .. {fmt.format(max(s.samples))}" if s.samples else "",
            fmt.format(s.mad),
            ratio,
        )
    return t


def rows_table(
    title: str, columns: tuple[str, ...] | list[str], rows: list[list[str]], caption: str | None = None
) -> Table:
    """A rich table of right-aligned ``columns`` and already formatted ``rows`` (one list of cells each)."""
    t = Table(title=title, caption=caption)
    for col in columns:
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(*r)
    return t


# the labels of the targets missed in this process (``verdict``), read by ``exit_code``
MISSED: list[str] = []

EXIT_TARGET_MISSED = 1
"""Exit code of a benchmark (``python -m bench``, ``python -m bench.NAME``) whose run missed a target; 0 when
every target printed was met, 2 for bad arguments (argparse)."""


def verdict(label: str, ok: bool, detail: str) -> None:
    """Print whether a stated target was met, and how far off; a miss is kept in ``MISSED`` (the exit code)."""
    mark = "[green]target met[/green]" if ok else "[red]target missed[/red]"
    if not ok:
        MISSED.append(label)
    console.print(f"{label}: {mark} — {detail}")


def exit_code(quick: bool = False) -> int:
    """A benchmark's exit code after its run: ``EXIT_TARGET_MISSED`` (1) when a verdict of this process
    missed its target, else 0. ``quick``: a smoke run (tiny sizes, one round), whose verdicts are printed
    but are no measurement of the target: 0."""
    return EXIT_TARGET_MISSED if MISSED and not quick else 0


def results_dir() -> Path:
    """Where raw results go: ``$OBSHUB_BENCH_RESULTS``, else bench/results/."""
    env = os.environ.get("OBSHUB_BENCH_RESULTS")
    return Path(env) if env else Path(__file__).resolve().parent / "results"


def save(name: str, data: dict) -> Path:
    """Write a benchmark's raw results to bench/results/<name>.json (with the machine and a timestamp);
    ``$OBSHUB_BENCH_RESULTS`` names another folder (the smoke test uses a temporary one)."""
    out = results_dir()
    out.mkdir(exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), "time": time.time(), **data}, indent=2, default=str))
    return path


def git_rev() -> str:
    """Short commit id of the tree being measured."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).resolve().parent
        ).stdout.strip()
    except OSError:
        return "?"


def positive_int(text: str) -> int:
    """argparse type of ``--rounds`` (every benchmark) and of counts such as ``bench.summary_size --hosts``: a
    whole number of 1 or more (0 was read as each benchmark's default, ``rounds or ROUNDS``;
    a negative number ran the set-up and took no sample: nan medians). Raises argparse.ArgumentTypeError."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not 1 or more")
    return n
