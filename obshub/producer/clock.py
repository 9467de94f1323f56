"""The agent's clock relation: CLOCK_MONOTONIC (what ``bpf_ktime_get_ns()`` returns) to CLOCK_REALTIME,
with an uncertainty, and TAI - UTC where the host knows it (docs/ARCHITECTURE.md "Clocks").

Method (the bracket method of e.g. chrony's ``PHC`` reading and Linux's ``PTP_SYS_OFFSET``): read
CLOCK_MONOTONIC, CLOCK_REALTIME, CLOCK_MONOTONIC; the realtime reading happened somewhere inside the
bracket ``[m1, m2]``, so ``offset = realtime - (m1 + m2) / 2`` is off by at most ``(m2 - m1) / 2``.
Of ``samples`` readings, the one with the tightest bracket wins (preemption only ever widens a bracket).

TAI: ``CLOCK_TAI - CLOCK_REALTIME`` read the same way and rounded to whole seconds (the kernel keeps the
TAI offset in whole seconds, set by NTP/PTP daemons through ``adjtimex``); 0 when the host never set it.
"""

from __future__ import annotations

import time
from typing import Callable

from obshub.core.schema import Clock

_NS_PER_S = 1_000_000_000


def measure(samples: int = 16) -> Clock:
    """Measure the clock relation now. Returns ``schema.Clock(offset_ns, uncertainty_ns, tai_offset_ns)``
    where ``realtime_ns = monotonic_ns + offset_ns`` within ``± uncertainty_ns`` (ns, integers).

    ``samples``: readings taken; the tightest bracket is kept. Raises ValueError when ``samples < 1``.
    """
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    get = time.clock_gettime_ns
    mono, real = time.CLOCK_MONOTONIC, time.CLOCK_REALTIME
    best_width, best_offset = None, 0
    for _ in range(samples):
        m1 = get(mono)
        r = get(real)
        m2 = get(mono)
        width = m2 - m1
        if best_width is None or width < best_width:
            best_width, best_offset = width, r - (m1 + m2) // 2
    uncertainty = (best_width + 1) // 2  # ceil(width / 2): never claim more precision than measured
    return Clock(offset_ns=best_offset, uncertainty_ns=uncertainty, tai_offset_ns=tai_offset_ns(samples))


def tai_offset_ns(samples: int = 4) -> int:
    """TAI - UTC in ns as the kernel knows it (a whole number of seconds, 37 s since 2017), or 0 when the
    host has no CLOCK_TAI or its TAI offset was never set."""
    tai = getattr(time, "CLOCK_TAI", None)
    if tai is None:
        return 0
    get, real = time.clock_gettime_ns, time.CLOCK_REALTIME
    best_width, best = None, 0
    for _ in range(max(1, samples)):
        r1 = get(real)
        t = get(tai)
        r2 = get(real)
        if best_width is None or r2 - r1 < best_width:
            best_width, best = r2 - r1, t - (r1 + r2) // 2
    seconds = round(best / _NS_PER_S)
    return seconds * _NS_PER_S


class ClockTracker:
    """Keeps a current :class:`schema.Clock`, measured at construction and again every ``refresh_s``
    seconds (on the next :meth:`current` call after that), so NTP slewing and steps show up in the
    batches within ``refresh_s``.

    ``now``: monotonic seconds source, for tests.
    """

    def __init__(self, refresh_s: float = 10.0, samples: int = 16, now: Callable[[], float] = time.monotonic):
        if refresh_s <= 0:
            raise ValueError(f"refresh_s must be positive, got {refresh_s}")
        self.refresh_s = refresh_s
        self.samples = samples
        self._now = now
        self.refreshes = 0
        self.refresh()

    def refresh(self) -> Clock:
        """Measure again now and return the new clock."""
        self._clock = measure(self.samples)
        self._at = self._now()
        self.refreshes += 1
        return self._clock

    def current(self) -> Clock:
        """The clock relation, re-measured when the last measurement is older than ``refresh_s``."""
        if self._now() - self._at >= self.refresh_s:
            return self.refresh()
        return self._clock
