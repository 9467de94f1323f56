"""A bounded stop of a long-running obshub process (``rules serve``, ``streams worker``, ``agent``):
SIGTERM/SIGINT are seen whatever the main thread is doing.

A Python signal handler runs only in the main thread, between two bytecodes: a main thread blocked inside a
C call never runs it. On 2026-12-06 a ``rules serve`` whose three brokers were gone (a test's cluster torn
down after a broker kill and a controller loss, the machine at load 9-10) ignored SIGTERM and then SIGINT for
12 minutes, its 39 threads all waiting on futexes (librdkafka's consumer close and transactional calls can
block while the cluster is gone; which one held it was not pinned). The stream worker (its output producer
and admin calls) and the agent (its producer's flush and purge) make the same kind of calls. This module
takes both signals away from the main thread:

- :func:`block_stop_signals` blocks SIGTERM and SIGINT in the calling (main) thread before any other thread
  exists, so every thread started after it (librdkafka's, the notify loop's, the HTTP server's, asyncio's
  executor) inherits the mask and the kernel keeps the signals pending for :class:`StopWatch`;
- :class:`StopWatch` is a daemon thread in ``signal.sigwait``: the first signal calls ``on_stop`` (the
  process's own way to stop: set a stop event, or hand the signal to an event loop); if the process has
  not ended ``grace_s`` seconds later, or a second signal arrives (a third where ``on_second`` takes the
  second; a signal within :data:`SAME_STOP_S` of the one before is the same request, as `timeout` sends
  it to the process and to its group), it logs why, writes every thread's Python stack to stderr (``faulthandler``), runs ``cleanup``
  (the component's record) and ends the process with :data:`EXIT_STOP_FORCED`.

A child process inherits the blocked mask (``execve`` keeps it; ``subprocess``' ``restore_signals`` resets
the dispositions of SIGPIPE and SIGXFSZ only, not the mask), so a child started with ``subprocess`` would
ignore ``kill <child>`` and a terminal's Ctrl-C. :func:`run_child` starts a command with an empty mask
(``posix_spawn``'s ``setsigmask``, set in the child before it runs: no window in which this process has the
signals unblocked, no ``preexec_fn`` in a threaded process); the agent's ``cp`` and ``mount`` use it.

Linux/POSIX only (``pthread_sigmask``, ``sigtimedwait``, ``posix_spawn``).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

log = logging.getLogger("obshub.stopping")

#: exit code of a stop that did not finish within the grace period, or was cut short by a second signal
EXIT_STOP_FORCED = 1
#: default seconds from SIGTERM/SIGINT to a forced exit: a normal stop takes a few seconds (the rule
#: engine's final commit per partition waits at most 2 s, its notify loop's join 30 s at worst; the agent's
#: flush 15 s, its BPF teardown 4-11 s); Kubernetes' default grace is 30 s and systemd's TimeoutStopSec 90 s,
#: so a supervisor may still cut it shorter
STOP_GRACE_S = 60.0
#: the longest grace accepted: a day. ``sigtimedwait`` raises OverflowError past time_t (``--stop-timeout
#: 1e12``): the stop-watch thread died at the first signal and left the process deaf to both
MAX_STOP_GRACE_S = 86_400.0
_STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
#: a signal within this many seconds of the one before is the same stop request, not a second one: `timeout`
#: sends its signal to the command and then to its whole process group (the command gets it twice, µs
#: apart), and so does a wrapper script that forwards the Ctrl-C its process group also got; either one
#: forced `timeout -s INT 1h obshub rules serve` out at once (exit 1, every thread's stack) instead of a stop.
#: A person's second Ctrl-C comes later than this.
SAME_STOP_S = 0.25


def block_stop_signals() -> None:
    """Block SIGTERM and SIGINT in the calling thread (call it in the main thread before any other thread
    starts: threads inherit the mask). Until a :class:`StopWatch` runs, the signals stay pending."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)


def run_child(argv: list[str], *, check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (looked up on PATH) to its end with no signal blocked and SIGPIPE/SIGXFSZ at their
    defaults, whatever this thread blocks (:func:`block_stop_signals`), so SIGTERM/SIGINT reach it; stdin
    is /dev/null. Returns its exit code (negative: the signal that ended it) and its stdout and stderr as
    text (undecodable bytes replaced). Raises FileNotFoundError when ``argv[0]`` is not found,
    CalledProcessError with ``check`` when the exit code is not 0."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.posix_spawnp(
            argv[0],
            argv,
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, out.fileno(), 1),
                (os.POSIX_SPAWN_DUP2, err.fileno(), 2),
            ],
            setsigmask=(),
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
        )
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read().decode(errors="replace"))
    done = subprocess.CompletedProcess(argv, code, texts[0], texts[1])
    if check:
        done.check_returncode()
    return done


class StopWatch:
    """Waits for SIGTERM/SIGINT in a daemon thread (see the module docstring).

    ``on_stop(signum)`` is called once, at the first signal (it runs in this thread: it must only set flags
    or hand the stop to another thread, e.g. ``loop.call_soon_threadsafe``); :attr:`signum` is that signal.
    ``on_second(signum)``, when given, takes the second signal (the agent's "stop waiting for Kafka") and
    a third forces the exit; without it the second forces it. ``cleanup()`` runs before a forced exit
    (errors are logged, never raised); ``grace_s`` (> 0) is the seconds from the first signal to the forced
    exit; ``name`` names the process in the log (``rules serve``), ``logger`` is the one to log to,
    ``unfinished`` says in the forced exit's message what becomes of unfinished work. The signals must be blocked in every
    thread (:func:`block_stop_signals`), else one may be delivered to a thread that is not waiting for it.
    Raises ValueError for a ``grace_s`` not in (0, :data:`MAX_STOP_GRACE_S`]."""

    def __init__(
        self,
        on_stop: Callable[[int], None],
        cleanup: Callable[[], None],
        grace_s: float = STOP_GRACE_S,
        *,
        on_second: Callable[[int], None] | None = None,
        name: str = "obshub",
        logger: logging.Logger | None = None,
        unfinished: str = "what was not committed is evaluated again by the next start",
    ):
        if not 0 < grace_s <= MAX_STOP_GRACE_S:
            raise ValueError(f"grace_s must be > 0 and at most {MAX_STOP_GRACE_S:g} s, got {grace_s!r}")
        self.on_stop, self.cleanup, self.grace_s = on_stop, cleanup, grace_s
        self.on_second, self.name, self.unfinished = on_second, name, unfinished
        self.log = logger or log
        self.signum: int | None = None  # the first signal, once it arrived
        self.thread = threading.Thread(target=self._run, name="stop-watch", daemon=True)

    def start(self) -> StopWatch:
        """Start the thread; returns ``self``."""
        self.thread.start()
        return self

    def _run(self) -> None:
        first = signal.sigwait(_STOP_SIGNALS)
        self.signum = first
        deadline = time.monotonic() + self.grace_s
        ends = "a third signal ends it at once" if self.on_second else "a second signal ends it at once"
        self.log.info(
            "%s: %s: stopping (at most %.0f s; %s)", self.name, signal.Signals(first).name, self.grace_s, ends
        )
        self.on_stop(first)
        seen, last = 1, time.monotonic()
        while True:
            left = deadline - time.monotonic()
            info = signal.sigtimedwait(_STOP_SIGNALS, max(left, 0.0)) if left > 0 else None
            if info is not None:
                now, previous = time.monotonic(), last
                last = now
                if now - previous < SAME_STOP_S:  # delivered twice (to the process and to its group)
                    self.log.info(
                        "%s: %s again %.0f ms later: the same stop request (sent to the process and its group)",
                        self.name,
                        signal.Signals(info.si_signo).name,
                        (now - previous) * 1e3,
                    )
                    continue
                seen += 1
                if seen == 2 and self.on_second is not None:
                    self.on_second(info.si_signo)
                    continue
                nth = "second" if seen == 2 else "third"
                self._force(f"a {nth} signal ({signal.Signals(info.si_signo).name}) arrived while stopping")
            elif time.monotonic() >= deadline:
                self._force(f"the stop did not finish within {self.grace_s:g} s of {signal.Signals(first).name}")

    def _force(self, why: str) -> None:
        self.log.error(
            "%s: %s: exiting now (exit %d); %s. Each thread's stack follows on stderr.",
            self.name,
            why,
            EXIT_STOP_FORCED,
            self.unfinished,
        )
        try:
            sys.stderr.flush()
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        except (OSError, ValueError, RuntimeError) as exc:  # stderr closed or not a file
            self.log.debug("no thread stacks: %s", exc)
        try:
            self.cleanup()
        except Exception as exc:  # noqa: BLE001 - the process ends next whatever went wrong here
            self.log.warning("cleanup before the forced exit failed: %s", exc)
        for h in logging.getLogger().handlers:
            try:
                h.flush()
            except Exception:  # noqa: BLE001, S112 - a handler that cannot flush loses its last lines only
                continue
        os._exit(EXIT_STOP_FORCED)


class SignalRelay:
    """A StopWatch's ``on_stop``/``on_second`` for a process whose stop target exists only later (a Faust
    worker, an agent, built after the signals had to be blocked): the signals seen so far are kept and
    handed to the target when it is attached (:meth:`attach`), later ones at once, each exactly once.
    :attr:`stop` is set at the first (for the start-up steps before the target exists)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.signals: list[int] = []
        self._lock = threading.Lock()
        self._to: Callable[[int], None] | None = None

    def __call__(self, signum: int) -> None:
        with self._lock:
            self.signals.append(signum)
            self.stop.set()
            if self._to is not None:
                self._to(signum)

    def attach(self, to: Callable[[int], None]) -> None:
        """Hand every signal seen so far, and each later one, to ``to(signum)`` (it must only set flags or
        hand the stop to another thread: it runs in the stop-watch thread, or here for those seen before)."""
        with self._lock:
            self._to = to
            for signum in self.signals:
                to(signum)
