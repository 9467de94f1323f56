"""Streaming reader for Kineto (PyTorch profiler) Chrome-trace JSON files, plain or gzip-compressed.

Format: the Chrome Trace Event Format ("JSON Object Format": ``{"traceEvents": [...], ...}``, or the bare
"JSON Array Format"), https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU,
as written by Kineto's ``ChromeTraceLogger`` (pytorch/kineto ``libkineto/src/output_json.cpp``):

* ``ts`` and ``dur`` are **microseconds** (numbers, possibly fractional).
* Newer Kineto writes ``"baseTimeNanoseconds"`` (usually at the *end* of the file) and then ``ts`` is
  relative to it: ``t_ns = baseTimeNanoseconds + ts * 1000``. Older files have absolute (Unix epoch) µs.
* ``distributedInfo`` = ``{"backend", "rank", "world_size", ...}`` names the rank.

Memory stays bounded whatever the file size: the file is fed in ``CHUNK_BYTES`` chunks to ijson's C
parser and each event is handed out and dropped (no ``json.load``). Because header keys may come after
the events, a full pass is needed before :attr:`KinetoFile.header` is complete; :mod:`mapping` therefore
reads a file twice (skeleton, then events).
"""

from __future__ import annotations

import gzip
import math
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ijson

from obshub.replay.errors import NotAKinetoTraceError, TraceFormatError

CHUNK_BYTES = 64 * 1024  # per open file; a replay holds one chunk (and its parsed events) per rank
_GZIP_MAGIC = b"\x1f\x8b"


def is_int(v: Any) -> bool:
    """True for a JSON integer (a Python int that is not a bool)."""
    return type(v) is int


def is_gzip(path: Path) -> bool:
    """True when ``path`` starts with the gzip magic bytes (the suffix is not trusted)."""
    with open(path, "rb") as f:
        return f.read(2) == _GZIP_MAGIC


def open_bytes(path: Path):
    """Open ``path`` for reading bytes, transparently gunzipping. Raises TraceFormatError when it
    cannot be opened."""
    try:
        return gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")
    except OSError as exc:
        raise TraceFormatError(
            f"Failed to open trace file {path}: {exc}", hint="check the path and its permissions"
        ) from None


@dataclass
class KinetoFile:
    """One Kineto trace file. Iterate :meth:`events` for the raw event dicts (as in the file); after a
    complete iteration :attr:`header` holds ``distributedInfo`` and ``baseTimeNanoseconds`` when present
    and :attr:`n_events` the number of events.

    Raises :class:`TraceFormatError` (during iteration) for a file that is not gzip/JSON, is truncated,
    or is an execution trace rather than a Chrome trace.
    """

    path: Path
    header: dict[str, Any] = field(default_factory=dict)
    n_events: int = 0
    _scanned: bool = False
    _array: bool = False

    def events(self) -> Iterator[Any]:
        """Yield every element of ``traceEvents`` (or of a top-level array) in file order. Elements are
        whatever JSON holds there (normally dicts); validation is the caller's job.

        The first complete pass also collects :attr:`header`. To keep that pass at one parse of the
        file: ``distributedInfo`` is parsed only until the first event appears (Kineto writes it before
        ``traceEvents``), and ``baseTimeNanoseconds`` (a number Kineto writes after the array) is read
        from the top-level text before ``"traceEvents"`` or after the array's closing bracket."""
        prefix = "item" if self._array else "traceEvents.item"
        out = ijson.sendable_list()
        coro = ijson.items_coro(out, prefix, use_float=True)
        first_pass = not self._scanned and not self._array
        info = ijson.sendable_list()
        info_coro = ijson.items_coro(info, "distributedInfo", use_float=True) if first_pass else None
        n, consumed, objs = 0, 0, 0  # objs: elements that are JSON objects (trace events are)
        head, tail = b"", [b"", b""]
        with open_bytes(self.path) as f:
            try:
                while True:
                    chunk = f.read(CHUNK_BYTES)
                    if not chunk:
                        break
                    if not head:
                        head = chunk
                    tail = [tail[1], chunk]
                    consumed += len(chunk)
                    if info_coro is not None:
                        if n or info:
                            info_coro = None  # found, or events began: stop parsing for the header
                        else:
                            info_coro.send(chunk)
                    coro.send(chunk)
                    if out:
                        n += len(out)
                        objs += sum(1 for e in out if isinstance(e, dict))
                        yield from out
                        del out[:]
                coro.close()
                if out:
                    n += len(out)
                    objs += sum(1 for e in out if isinstance(e, dict))
                    yield from out
                    del out[:]
            except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
                raise TraceFormatError(
                    f"Failed to read {self.path}: gzip stream broken after {consumed} uncompressed bytes "
                    f"and {n} events ({type(exc).__name__}: {exc})",
                    hint="the file is truncated or corrupt; copy it again from where the job wrote it",
                ) from None
            except ijson.JSONError as exc:
                text = " ".join(str(exc).split())
                if "premature EOF" in text or "Incomplete" in text:
                    raise TraceFormatError(
                        f"Failed to parse {self.path}: JSON ends early after {consumed} bytes and {n} events ({text})",
                        hint="the file is truncated (the profiler may not have finished writing it); "
                        "copy it again or re-export the trace",
                    ) from None
                gz_name = self.path.name.endswith(".gz") and not is_gzip(self.path)
                raise TraceFormatError(
                    f"Failed to parse {self.path}: "
                    + ("named .gz but not gzip-compressed (no gzip magic bytes), and " if gz_name else "")
                    + f"not valid JSON within the first {consumed} bytes, after {n} events ({text})",
                    hint="the file was renamed or damaged: a .json.gz must be gzip-compressed (`file` shows it); "
                    "pass Kineto/Chrome-trace JSON files (.json or .json.gz) as torch.profiler wrote them"
                    if gz_name
                    else "pass Kineto/Chrome-trace JSON files (.json or .json.gz) as torch.profiler wrote them",
                ) from None
        if first_pass:
            self.header = {}
            if info:
                self.header["distributedInfo"] = info[0]
            base = _top_level_number(head, b"".join(tail), b"baseTimeNanoseconds")
            if base is not None:
                self.header["baseTimeNanoseconds"] = base
        self.n_events = n
        if n == 0:
            if not self._array and self._first_byte() == b"[":
                self._array = True
                yield from self.events()
                return
            if self._is_execution_trace():
                raise NotAKinetoTraceError(
                    f"{self.path} is a PyTorch execution trace, not a Kineto trace",
                    hint="pass execution traces with --et, Kineto traces as arguments",
                    is_execution_trace=True,
                )
            raise NotAKinetoTraceError(
                f"{self.path} contains no trace events (no non-empty 'traceEvents' array)",
                hint="pass the files torch.profiler wrote (tensorboard_trace_handler or export_chrome_trace)",
            )
        if objs == 0:  # an array of numbers or strings (a JSON file, not a trace): nothing to replay
            raise NotAKinetoTraceError(
                f"{self.path} contains no trace events ({n} element(s), none of them a JSON object)",
                hint="pass the files torch.profiler wrote (tensorboard_trace_handler or export_chrome_trace)",
            )
        self._scanned = True

    def _first_byte(self) -> bytes:
        with open_bytes(self.path) as f:
            try:
                return f.read(4096).lstrip()[:1]
            except (OSError, EOFError, zlib.error):
                return b""

    def _is_execution_trace(self) -> bool:
        try:
            with open_bytes(self.path) as f:
                return any(True for _ in ijson.items(f, "nodes.item"))
        except (ijson.JSONError, OSError, EOFError, zlib.error):
            return False

    @property
    def base_ns(self) -> int:
        """``baseTimeNanoseconds`` or 0 (absolute µs timestamps). Valid after a complete pass."""
        b = self.header.get("baseTimeNanoseconds", 0)
        return int(b) if isinstance(b, (int, float)) and not isinstance(b, bool) else 0

    def rank_info(self) -> tuple[int | None, int | None]:
        """``(rank, world_size)`` from ``distributedInfo``; ``None`` for what is missing."""
        d = self.header.get("distributedInfo")
        if not isinstance(d, dict):
            return None, None
        r, w = d.get("rank"), d.get("world_size")
        return (r if is_int(r) and r >= 0 else None, w if is_int(w) and w > 0 else None)


def _top_level_number(head: bytes, tail: bytes, key: bytes) -> int | None:
    """An integer top-level ``key`` of a Chrome-trace object, found in the text before the
    ``"traceEvents"`` key (``head``) or after the array's last ``]`` (``tail``); None when absent."""
    pat = re.compile(rb'"' + re.escape(key) + rb'"\s*:\s*(-?\d+)\s*[,}]')
    cut = head.find(b'"traceEvents"')
    for text in (head[:cut] if cut >= 0 else b"", tail[tail.rfind(b"]") + 1 :]):
        m = pat.search(text)
        if m:
            return int(m.group(1))
    return None


def sniff(path: Path) -> str | None:
    """Guess a JSON trace's kind from its first 4 KiB: ``"kineto"`` (a ``schemaVersion`` /
    ``traceEvents`` key), ``"et"`` (execution trace: ``"schema"`` with ``"nodes"`` or ``"pid"``), or None
    when undecided (the caller then tries the Kineto reader, whose errors are precise)."""
    try:
        with open_bytes(path) as f:
            head = f.read(4096)
    except (OSError, EOFError, zlib.error, TraceFormatError):
        return None
    if b'"traceEvents"' in head or b'"schemaVersion"' in head:
        return "kineto"
    if b'"schema"' in head and (b'"nodes"' in head or b'"pid"' in head):
        return "et"
    return None


I64_MAX = 2**63 - 1


def ts_to_ns(ts_us: Any, base_ns: int) -> int:
    """Convert a Chrome-trace ``ts`` (µs, int or float) to ns: ``base_ns + round(ts_us * 1000)``.
    Raises ValueError for a non-number, NaN/infinity, or a result outside 0..2**63-1."""
    if isinstance(ts_us, bool) or not isinstance(ts_us, (int, float)):
        raise ValueError(f"ts {ts_us!r} is not a number")
    if isinstance(ts_us, float) and not math.isfinite(ts_us * 1000):
        raise ValueError(f"ts {ts_us!r} is not finite in ns")
    ns = base_ns + (ts_us * 1000 if isinstance(ts_us, int) else round(ts_us * 1000))
    if not 0 <= ns <= I64_MAX:
        raise ValueError(f"ts {ts_us!r} gives a time outside 0..2**63-1 ns")
    return int(ns)


def dur_to_ns(dur_us: Any) -> int:
    """Convert a ``dur`` (µs) to ns; a missing or negative duration counts as 0, a huge one is capped at
    2**63-1."""
    if isinstance(dur_us, bool) or not isinstance(dur_us, (int, float)) or not dur_us > 0:
        return 0
    if isinstance(dur_us, float) and not math.isfinite(dur_us * 1000):
        return I64_MAX
    return min(int(round(dur_us * 1000)), I64_MAX)


_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)


def rank_from_filename(path: Path) -> int | None:
    """Best-effort rank from a file name (``rank-3``, ``rank3``, ``worker3``, ``..._3.json``)."""
    m = _RANK_IN_NAME.search(path.name)
    if m:
        return int(m.group(1))
    m = re.search(r"_(\d+)\.json", path.name)
    return int(m.group(1)) if m else None
