"""A bounded stop of ``obshub rules serve``: SIGTERM/SIGINT are seen whatever the main thread is doing.

A Python signal handler runs only in the main thread, between two bytecodes: a main thread blocked inside a
C call never runs it. On 2026-12-06 a ``rules serve`` whose three brokers were gone (a test's cluster torn
down after a broker kill and a controller loss, the machine at load 9-10) ignored SIGTERM and then SIGINT for
12 minutes, its 39 threads all waiting on futexes (librdkafka's consumer close and transactional calls can
block while the cluster is gone; which one held it was not pinned). This module takes both
signals away from the main thread:

- :func:`block_stop_signals` blocks SIGTERM and SIGINT in the calling (main) thread before any other thread
  exists, so every thread started after it (librdkafka's, the notify loop's, the HTTP server's) inherits the
  mask and the kernel keeps the signals pending for :class:`StopWatch`;
- :class:`StopWatch` is a daemon thread in ``signal.sigwait``: the first signal sets the service's ``stop``
  event (the loops commit what they hold and return, as before); if the process has not ended
  ``grace_s`` seconds later, or a second signal arrives, it logs why, writes every thread's Python stack
  to stderr (``faulthandler``), runs ``cleanup`` (the component's record) and ends the process with
  :data:`EXIT_STOP_FORCED`. What was not committed is evaluated again by the next start (at least once).

Linux/POSIX only (``pthread_sigmask``, ``sigtimedwait``).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

log = logging.getLogger("obshub.rules.service")

#: exit code of a stop that did not finish within the grace period, or was cut short by a second signal
EXIT_STOP_FORCED = 1
#: default seconds from SIGTERM/SIGINT to a forced exit: a normal stop takes a few seconds (a final commit
#: per partition waits at most 2 s, the notify loop's join 30 s at worst); Kubernetes' default grace is 30 s
#: and systemd's TimeoutStopSec 90 s, so a supervisor may still cut it shorter
STOP_GRACE_S = 60.0
_STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def block_stop_signals() -> None:
    """Block SIGTERM and SIGINT in the calling thread (call it in the main thread before any other thread
    starts: threads inherit the mask). Until a :class:`StopWatch` runs, the signals stay pending."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)


class StopWatch:
    """Waits for SIGTERM/SIGINT in a daemon thread (see the module docstring).

    ``on_stop()`` is called once, at the first signal (it must only set flags: it runs in this thread);
    ``cleanup()`` runs before a forced exit (errors are logged, never raised); ``grace_s`` (> 0) is the
    seconds from the first signal to the forced exit. The signals must be blocked in every thread
    (:func:`block_stop_signals`), else one may be delivered to a thread that is not waiting for it."""

    def __init__(self, on_stop: Callable[[], None], cleanup: Callable[[], None], grace_s: float = STOP_GRACE_S):
        if not grace_s > 0:
            raise ValueError(f"grace_s must be > 0, got {grace_s!r}")
        self.on_stop, self.cleanup, self.grace_s = on_stop, cleanup, grace_s
        self.thread = threading.Thread(target=self._run, name="stop-watch", daemon=True)

    def start(self) -> StopWatch:
        """Start the thread; returns ``self``."""
        self.thread.start()
        return self

    def _run(self) -> None:
        first = signal.sigwait(_STOP_SIGNALS)
        deadline = time.monotonic() + self.grace_s
        log.info(
            "%s: stopping (at most %.0f s; a second signal ends it at once)", signal.Signals(first).name, self.grace_s
        )
        self.on_stop()
        while True:
            left = deadline - time.monotonic()
            info = signal.sigtimedwait(_STOP_SIGNALS, max(left, 0.0)) if left > 0 else None
            if info is not None:
                self._force(f"a second signal ({signal.Signals(info.si_signo).name}) arrived while stopping")
            elif time.monotonic() >= deadline:
                self._force(f"the stop did not finish within {self.grace_s:g} s of {signal.Signals(first).name}")

    def _force(self, why: str) -> None:
        log.error(
            "%s: exiting now (exit %d); what was not committed is evaluated again by the next start. "
            "Each thread's stack follows on stderr.",
            why,
            EXIT_STOP_FORCED,
        )
        try:
            sys.stderr.flush()
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        except (OSError, ValueError, RuntimeError) as exc:  # stderr closed or not a file
            log.debug("no thread stacks: %s", exc)
        try:
            self.cleanup()
        except Exception as exc:  # noqa: BLE001 - the process ends next whatever went wrong here
            log.warning("cleanup before the forced exit failed: %s", exc)
        for h in logging.getLogger().handlers:
            try:
                h.flush()
            except Exception:  # noqa: BLE001, S112 - a handler that cannot flush loses its last lines only
                continue
        os._exit(EXIT_STOP_FORCED)
