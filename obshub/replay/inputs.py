"""Find the trace files of a replay and group them per rank.

Arguments may be files or directories (searched recursively for ``*.json`` and ``*.json.gz``). Each file
is classified by content, not name: a Kineto trace has ``traceEvents``, an execution trace has ``nodes``.
Execution traces are paired with Kineto traces by recording process id (both files carry it), else by
the rank number in the file name (``..._3.json``, ``rank3``, ``worker3``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from obshub.replay.errors import NotAKinetoTraceError, ReplayError
from obshub.replay.et import EtFile, read_et
from obshub.replay.kineto import rank_from_filename, sniff
from obshub.replay.mapping import RankTrace, load_rank

SUFFIXES = (".json", ".json.gz")


@dataclass
class ReplayInputs:
    """The ranks of one replay (sorted by rank), the world size the traces claim, and notes (pairing,
    missing ranks) for the operator."""

    ranks: list[RankTrace]
    world_size: int | None
    notes: list[str] = field(default_factory=list)

    @property
    def missing_ranks(self) -> list[int]:
        """Ranks ``0..world_size-1`` without a trace (empty when the world size is unknown)."""
        have = {r.rank for r in self.ranks}
        return [r for r in range(self.world_size or 0) if r not in have]

    def coverage(self) -> str:
        """``"8 of 8 ranks present"`` / ``"2 of 128 ranks present (missing 2-127)"``."""
        n = len(self.ranks)
        if not self.world_size:
            return f"{n} rank(s) present, world size unknown"
        miss = self.missing_ranks
        s = f"{n} of {self.world_size} ranks present"
        return s + (f" (missing {compress_ranges(miss)})" if miss else "")


def compress_ranges(nums: list[int]) -> str:
    """``[2,3,4,7]`` -> ``"2-4,7"``."""
    out, i = [], 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ",".join(out)


def expand(paths: list[Path]) -> dict[Path, bool]:
    """Files named by ``paths`` -> whether each was found in a directory (searched recursively for
    ``*.json(.gz)``) rather than named. Raises ReplayError for a path that does not exist or a directory
    without such files."""
    files: dict[Path, bool] = {}
    for p in paths:
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(SUFFIXES))
            if not found:
                raise ReplayError(
                    f"no *.json or *.json.gz files under {p}",
                    hint="point at the folder torch.profiler's trace handler wrote",
                )
            for f in found:
                files.setdefault(f, True)
        elif p.is_file():
            files[p] = False
        else:
            raise ReplayError(f"trace path {p} does not exist", hint="check the path")
    return files


def discover(paths: list[Path], et_paths: list[Path] | None = None) -> ReplayInputs:
    """Load the skeleton of every Kineto trace under ``paths`` (execution traces found there are used
    as such), pair execution traces, and check ranks. Other JSON files found in a directory are skipped
    (noted); named ones are errors. Raises ReplayError for two files of one rank or no Kineto trace at
    all; TraceFormatError for a named file that is neither format, or any truncated or invalid one."""
    ranks: list[RankTrace] = []
    ets: list[EtFile] = [read_et(p) for p in expand(et_paths)] if et_paths else []
    skipped: list[str] = []
    for f, in_dir in expand(paths).items():
        if sniff(f) == "et":
            ets.append(read_et(f))
            continue
        try:
            ranks.append(load_rank(f))
        except NotAKinetoTraceError as exc:
            if exc.is_execution_trace:
                ets.append(read_et(f))
            elif in_dir:  # some other JSON file next to the traces (a config, a summary): not ours
                skipped.append(f.name)
            else:
                raise
    if not ranks:
        raise ReplayError(
            "no Kineto trace among the given files", hint="pass the *.pt.trace.json(.gz) files of torch.profiler"
        )
    ranks.sort(key=lambda r: r.rank)
    for a, b in zip(ranks, ranks[1:]):
        if a.rank == b.rank:
            raise ReplayError(
                f"two traces claim rank {a.rank}: {a.path} and {b.path}",
                hint="replay one profiling window at a time (one file per rank)",
            )
    worlds = {r.world_size for r in ranks if r.world_size}
    inputs = ReplayInputs(ranks, max(worlds) if worlds else None)
    if skipped:
        inputs.notes.append(f"skipped {len(skipped)} JSON file(s) that hold no trace events: {', '.join(skipped[:5])}")
    if len(worlds) > 1:
        inputs.notes.append(f"ranks disagree on the world size: {sorted(worlds)}")
    _pair_et(inputs, ets)
    return inputs


def _pair_et(inputs: ReplayInputs, ets: list[EtFile]) -> None:
    by_pid = {r.pid: r for r in inputs.ranks if r.pid}
    by_rank = {r.rank: r for r in inputs.ranks}
    for et in ets:
        target = by_pid.get(et.pid) if et.pid is not None else None
        how = "process id"
        if target is None:
            rk = rank_from_filename(et.path)
            target, how = by_rank.get(rk) if rk is not None else None, "file name"
        if target is None or target.et is not None:
            inputs.notes.append(f"execution trace {et.path.name} matches no Kineto trace (pid {et.pid}); ignored")
            continue
        target.et = et
        target.stats.notes.append(f"execution trace {et.path.name} paired by {how}")
