"""Durations as written in rule files: ``500ms``, ``30s``, ``5m``, ``2h``, ``1d``, or combinations such as
``1m30s`` (the Prometheus duration syntax). Values are returned in nanoseconds."""

from __future__ import annotations

import re

_UNIT_NS = {"ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000, "d": 86_400_000_000_000}
_RE = re.compile(r"^(?:(\d+)(ms|s|m|h|d))+$")
_PART = re.compile(r"(\d+)(ms|s|m|h|d)")
DURATION_PATTERN = r"^([0-9]+(ms|s|m|h|d))+$"
#: the longest duration a rule file or an alerting config may give: 10 years. Past 292 years a time plus
#: it overflows int64 ns (the rule engine's state snapshot fails to encode), past 270 years a socket
#: timeout (OverflowError at the first delivery); nothing meaningful is that long.
MAX_DURATION_NS = 3650 * 86_400 * 1_000_000_000


def parse_duration_ns(text: str) -> int:
    """``"1m30s"`` -> 90_000_000_000 (ns). Raises ValueError naming the text when it is not a duration."""
    if not isinstance(text, str) or not _RE.match(text):
        raise ValueError(f"{text!r} is not a duration (examples: 500ms, 30s, 5m, 1h30m)")
    return sum(int(n) * _UNIT_NS[u] for n, u in _PART.findall(text))
