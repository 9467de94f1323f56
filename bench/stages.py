"""Where a process's CPU goes, by stage: a sampling profiler (py-spy) attached to a running stream worker
or rule engine for a while, its stacks sorted into the stages of that process.

``/proc/<pid>/stat`` says how much CPU a process used; a stream worker runs ingest, the fold and the
close in one asyncio thread, and the rule engine decodes its inputs and evaluates the rules in one loop,
so the split between them needs the stacks. py-spy samples every thread's Python stack ``rate`` times
per second without stopping the process (``--nonblocking``; idle threads are left out), and each sample
is given to the first stage (from the root of the stack) whose rule matches one of its frames. The share
of samples of a stage times the process's CPU per step is that stage's CPU per step.

Stages of ``worker``: ``ingest`` (the ingest agent: decode, per-agent bookkeeping, per-host reduction,
repartition send), ``fold`` (the join's state: ``streams.fold`` with its table reads and writes, each
changelog record's encoding, and the decoding of the internal messages, i.e. table operations + codec),
``close`` (``summarize`` and the summary's emission: JSON, send, result metrics), ``fold transport`` (the
rest of the fold agent's task: Faust's stream over the internal topic, producing the round's internal
messages), ``timer`` (window expiry, gauges), ``kafka client + faust`` (everything else: fetching,
producing, the event loop, the metrics endpoint). Stages of ``engine``: ``decode`` (message -> records), ``rules`` (the
engine: conditions, windows, lifecycle), ``state`` (saving the engine's state), ``publish`` (alert
changes), ``notify`` (the delivery thread), ``kafka client + loop`` (the rest).

    prof = Profile(pid, "worker", seconds=20, out=Path("/tmp/w.txt"))   # starts sampling
    shares = prof.result()   # waits for the end; {"ingest": 0.41, "fold": 0.22, ...} or None
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def _fn(frame: str) -> str:
    """The function part of a py-spy frame ``function (file:line)``, lower case."""
    return frame.split(" (")[0].lower()


def _in(frame: str, *files: str) -> bool:
    """Whether the frame's file is one of ``files`` (path fragments such as ``streams/``)."""
    where = frame.rpartition(" (")[2]
    return any(f in where for f in files)


def _any(frames: list[str], pred) -> bool:
    return any(pred(f) for f in frames)


def _worker_fold(frames: list[str]) -> bool:
    """The join's state: ``streams.fold`` (its logic, table operations and the codec of what it reads and
    writes), or a table operation or codec frame inside the fold agent's task."""
    if _any(frames, lambda f: _in(f, "obshub/streams/fold")):
        return True
    return _any(frames, lambda f: _in(f, "streams/") and "fold_agent" in _fn(f)) and _any(
        frames, lambda f: _in(f, "faust/tables/", "faust/serializers/", "obshub/streams/wire")
    )


# (stage, predicate over one frame "function (file:line)", or over the whole stack when the stage is in
# _STACK_RULES); the first rule that matches wins, so the more specific stages come first (close runs
# inside the fold, decode inside the loop)
_RULES: dict[str, list[tuple[str, callable]]] = {
    "worker": [
        ("timer", lambda f: _in(f, "streams/") and "expire" in _fn(f)),
        (
            "close",
            lambda f: (
                _in(f, "obshub/streams/analysis", "obshub/streams/compact")
                or (_in(f, "streams/") and "send_closed" in _fn(f))
            ),
        ),
        # before fold: the ingest agent uses streams.fold's write-back view for its own table
        ("ingest", lambda f: (_in(f, "streams/") and "ingest" in _fn(f)) or _in(f, "obshub/streams/ingest")),
        ("fold", _worker_fold),
        ("fold transport", lambda f: _in(f, "streams/") and "fold" in _fn(f)),
    ],
    "engine": [
        (
            "notify",
            lambda f: (
                "run_notify" in _fn(f)
                or _in(f, "obshub/rules/dispatch", "obshub/rules/sinks", "obshub/rules/service_notify")
            ),
        ),
        ("decode", lambda f: _in(f, "obshub/rules/service", "obshub/rules/intake") and "decode" in _fn(f)),
        ("state", lambda f: _in(f, "rules/") and ("atomic_write" in _fn(f) or "snapshot" in _fn(f))),
        ("publish", lambda f: _in(f, "obshub/rules/service") and "publish" in _fn(f)),
        (
            "rules",
            lambda f: _in(
                f,
                "obshub/rules/engine",
                "obshub/rules/expr",
                "obshub/rules/lifecycle",
                "obshub/rules/model",
                "obshub/rules/window",
                "obshub/rules/fields",
            ),
        ),
    ],
}
OTHER = {"worker": "kafka client + faust", "engine": "kafka client + loop"}
_STACK_RULES = {_worker_fold}


def py_spy() -> str | None:
    """Path of the py-spy executable next to this interpreter or on PATH; None when not installed."""
    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.exists() else shutil.which("py-spy")


def classify(stack: str, kind: str) -> str:
    """Stage of one folded stack (frames root first, separated by ';') of a ``kind`` process."""
    frames = stack.split(";")
    for stage, match in _RULES[kind]:
        if match in _STACK_RULES:
            if match(frames):
                return stage
        elif any(match(f) for f in frames):
            return stage
    return OTHER[kind]


def parse(text: str, kind: str) -> dict[str, int]:
    """Samples per stage from py-spy's raw (folded) output: one ``stack count`` per line."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        stage = classify(stack, kind)
        out[stage] = out.get(stage, 0) + int(n)
    return out


class Profile:
    """py-spy sampling ``pid`` for ``seconds`` (started at once). ``kind``: "worker" or "engine"."""

    def __init__(self, pid: int, kind: str, *, seconds: float, out: Path, rate: int = 50):
        self.kind, self.out = kind, out
        exe = py_spy()
        self.proc = None
        if exe is None or seconds < 1:
            return
        self.proc = subprocess.Popen(
            [
                exe,
                "record",
                "-p",
                str(pid),
                "-d",
                str(max(1, int(seconds))),
                "-r",
                str(rate),
                "--nonblocking",
                "-f",
                "raw",
                "-o",
                str(out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def result(self, timeout_s: float = 30.0) -> dict | None:
        """``{"samples": {stage: n}, "shares": {stage: fraction}}`` once py-spy is done; None without
        py-spy, or when it could not attach or wrote nothing."""
        if self.proc is None:
            return None
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        try:
            samples = parse(self.out.read_text(errors="replace"), self.kind)
        except OSError:
            return None
        total = sum(samples.values())
        if not total:
            return None
        return {"samples": samples, "shares": {k: v / total for k, v in samples.items()}}
