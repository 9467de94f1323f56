"""``obshub agent``: the node agent's main loop, gluing an event source (BPF probes, or the synthetic
stream) to the transport (batcher -> Kafka publisher -> spool).

Steps: start the source and print its probe table (attached / skipped + reason) -> apply thresholds ->
register as component ``agent-<host>`` -> serve Prometheus metrics -> loop { poll the source (blocking at
most until the open batch is due) -> batcher -> transport; seal the batches that hold a step end
(step-aligned: one batch per training step) or are ``max_age_ms`` old;
serve delivery reports and spool replay; every ``loss_interval_s`` turn the source's in-kernel loss
counters into AGENT_LOSS events; every 0.25 s the state of each registered process
(:class:`producer.rankstate.RankWatch`: frozen, stopped, exited) -> a RANK_STATE event when it changed } -> on SIGTERM/SIGINT or ``--duration``: drain the source once more,
stop it, flush the last batches, deliver what is left for up to ``flush_timeout_s`` (a second signal, or
Kafka taking nothing for ``SHUTDOWN_STALL_S``, cuts this short: the rest stays in the spool) -> exit code 0 when
everything was delivered, :data:`EXIT_UNDELIVERED` (3) when batches stay in the spool (the message says
how many and where; the next start with the same ``--host`` replays them).

Jobs: one agent serves every job on its node. Each REGISTER event names its process's job (resolved
inside the training process from its environment, obshub/core/workload.py); the agent keeps ``pid ->
job`` and files every event under the job of its ``pid`` (one batcher per job, so a batch never mixes
jobs). Events of processes that never registered go to the agent's ``--job`` (the fallback); the host's
own events (PCIe, NIC, agent loss: :data:`HOST_KINDS`) go to every job with a live registered process.
A job whose processes are gone (two checks ``loss_interval_s`` apart) has its last batch sealed and is
forgotten.
"""

from __future__ import annotations

import gc
import logging
import math
import operator
import os
import signal
import sys
import threading
import time
from array import array
from collections import Counter
from itertools import accumulate
from typing import Callable

import msgpack

from obshub.core import registry
from obshub.core.schema import KIND_INFO, Event, Kind, Layer
from obshub.core.settings import AgentConfig, Settings
from obshub.producer.batcher import JobBatchers
from obshub.producer.clock import ClockTracker
from obshub.producer.errors import ProducerError
from obshub.producer.rankstate import RankWatch
from obshub.producer.reader import PackedRun
from obshub.producer.source import EventSource
from obshub.producer.spool import Spool
from obshub.producer.transport import DIRECT, DRAINING, SPOOLING, Transport

EXIT_OK = 0
EXIT_UNDELIVERED = 3

log = logging.getLogger("producer.agent")
_kind_of = operator.itemgetter(0)
_REGISTER = int(Kind.REGISTER)
_PID = 5  # index of ``pid`` in an event (schema.EVENT_FIELDS)
_STEP_END = int(Kind.STEP_END)
#: the longest the loop blocks in the source's poll, ms: how often it serves delivery reports, loss
#: reports and a stop request when nothing arrives
POLL_MAX_MS = 200.0
#: while no step end can seal the open batch (it is younger than the step minimum), the source's poll
#: waits up to this long past the moment one can, for the step end that then wakes it (in the kernel):
#: with steps shorter than this, one turn of the loop per sealed batch instead of a timer's turn and then
#: the step end's; the loop then turns at least every max(POLL_MAX_MS, step minimum + this) ms. The same
#: wait follows a step seal while no batch is open (the step minimum counts from that seal): the records
#: of the next steps stay in the ring until the step end that seals their batch
QUIET_GRACE_MS = 50.0

#: kinds that belong to the host, not to one process (sysfs counters, PCIe errors, the agent's own loss
#: reports): with no registered process as their ``pid`` they go to every job on the host
HOST_KINDS = frozenset(int(k) for k, info in KIND_INFO.items() if info.layer in (Layer.PCIE, Layer.NIC, Layer.AGENT))


class Agent:
    """One agent instance: ``config`` (identity, Kafka, batch and spool bounds), ``source`` (an
    EventSource, not yet started), ``settings`` (for the component registry; None: do not register),
    ``thresholds`` applied after start, ``say``: where human-readable lines go (default stderr).

    Counters read by the metrics: ``kind_counts`` (events per kind), ``lost_totals`` (per probe).
    Raises :class:`producer.errors.SpoolError` when the spool is held by another agent of the same host,
    :class:`producer.errors.TransportError` for an unusable Kafka configuration.
    """

    def __init__(
        self,
        config: AgentConfig,
        source: EventSource,
        *,
        settings: Settings | None = None,
        thresholds: dict[str, int] | None = None,
        say: Callable[[str], None] | None = None,
    ):
        self.config, self.source, self.settings = config, source, settings
        self.thresholds = dict(thresholds or {})
        self.say = say or (lambda msg: print(f"obshub agent: {msg}", file=sys.stderr, flush=True))
        self.clock = ClockTracker(refresh_s=config.clock_refresh_s)
        self.batcher = JobBatchers(
            config.job,
            config.host,
            config.host_id,
            clock=self.clock.current,
            max_bytes=config.batch.max_bytes,
            max_age_ms=config.batch.max_age_ms,
            step_min_age_ms=config.batch.step_min_age_ms,
        )
        spool = Spool(config.spool.dir, config.spool.max_bytes, config.spool.segment_bytes)
        try:
            self.transport = Transport(config.kafka, spool)
        except BaseException:  # the spool's files must not stay open behind a failed start; re-raised
            spool.close()
            raise
        self.kind_counts: Counter[int] = Counter()
        self.job_of_pid: dict[int, str] = {}  # registered processes -> their job
        self._ended: set[str] = set()  # jobs a STEP_END arrived for in this poll turn
        self._jobs: list[str] = []  # the jobs of live registered processes
        self._dead: set[int] = set()  # registered pids found gone once
        self._only = frozenset(config.only_jobs)  # --only-job: the jobs served (empty: all)
        self._ignored: set[int] = set()  # processes registered for a job not served: their events dropped
        self.rank_watch = RankWatch()  # frozen, stopped or exited registered processes -> RANK_STATE
        self.lost_totals: dict[str, int] = {}
        self.caught: Counter[str] = Counter()  # failures caught and gone on from, by where (caught_totals)
        self.probe_status: list = []
        self.metrics_port: int | None = None
        self._stop = threading.Event()
        self._signals = 0
        #: SIGTERM/SIGINT come from a StopWatch thread (obshub/core/stopping.py, set by ``obshub agent``),
        #: not from Python signal handlers of the main thread: run() installs none
        self.signals_watched = False
        self.component = f"agent-{config.host}"  # its record (`obshub status`)
        self._metrics_server = None
        # the deep dive (obshub/producer/control.py): a request from any thread, served by the loop
        self._dd_request: tuple[int, float, float] | None = None  # (steps, max_s, monotonic time asked)
        self._dd: dict | None = None  # the open window: steps, until, ends_at_start, asked, on_at
        self.deep_dives: list[dict] = []  # the windows so far (see deep_dive)
        self._control = None
        if spool.pending_batches:
            self.say(
                f"{spool.pending_batches} batches ({spool.pending_bytes} B) from a previous run wait in "
                f"the spool {config.spool.dir}; they are replayed first"
            )

    @property
    def agent_id(self) -> str:
        """This instance's id (UUID4), the ``agent_id`` of its batches."""
        return self.batcher.agent_id

    def stop(self) -> None:
        """Ask the loop to finish (thread- and signal-safe)."""
        self._stop.set()

    def _on_signal(self, signum, _frame=None) -> None:
        """SIGTERM/SIGINT: the first stops the loop; the second also stops waiting for Kafka (what is left
        goes to the spool). A handler of the main thread, or a StopWatch's (``signals_watched``)."""
        self._signals += 1
        if self._signals == 2:
            self.say(f"second {signal.Signals(signum).name}: stop waiting for Kafka, keep the rest in the spool")
        self._stop.set()

    # -- run -----------------------------------------------------------------------------------------
    def run(self) -> int:
        """Run until :meth:`stop`, SIGTERM/SIGINT (when called from the main thread) or ``duration_s``.
        Returns the exit code: 0 when everything was delivered, 3 when batches are left in the spool."""
        if threading.current_thread() is threading.main_thread() and not self.signals_watched:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._on_signal)
        name = self.component
        started = False
        try:
            self.probe_status = list(self.source.start())
            started = True
            # how a rank ended, recorded by the kernel at its exit (the BPF source's scheduler probe): wins
            # over the zombie's /proc stat, which the parent's reap can take first
            self.rank_watch.kernel_status = getattr(self.source, "exit_status", None)
            print(probe_table(self.probe_status), flush=True)
            for pname, value in self.thresholds.items():
                self.source.set_threshold(pname, value)
            if self.settings is not None:
                registry.register_component(
                    self.settings,
                    name,
                    os.getpid(),
                    host=self.config.host,
                    job=self.config.job,
                    agent_id=self.agent_id,
                    metrics_port=self.config.metrics_port,
                )
            self._start_metrics()
            self._start_control()
            # what start-up made (bcc, the libraries, the catalogue) lives as long as the agent: out of the
            # collector's sight, so its full collections walk only what the loop makes
            gc.freeze()
            self._loop()
        finally:
            undelivered = self._shutdown(drain=started)
            if self.settings is not None:
                registry.unregister_component(self.settings, name)
        batches, nbytes = undelivered
        spool = self.transport.spool
        if spool.dropped_batches:
            self.say(
                f"the spool {self.config.spool.dir} was full: {spool.dropped_batches} batches "
                f"({spool.dropped_bytes} B) were dropped, oldest first (raise --spool-max-bytes)"
            )
        if batches:
            gave_up = self.transport.gave_up_after_s
            why = "" if gave_up is None else f": it took none for {gave_up:.1f} s, so the agent stopped waiting"
            self.say(
                f"{batches} batches ({nbytes} B) were not delivered to Kafka "
                f"({self.config.kafka.bootstrap}){why}; they are kept in the spool {self.config.spool.dir} and "
                f"are replayed when an agent with --host {self.config.host} starts again"
            )
            return EXIT_UNDELIVERED
        self.say(f"stopped: {self.batcher.sealed} batches, {self.batcher.events} events, all delivered")
        return EXIT_OK

    # -- deep dive -----------------------------------------------------------------------------------
    def _start_control(self) -> None:
        """Listen on the control topic for deep-dive requests when the source has deep-dive probes."""
        probes = getattr(self.source, "deep_dive_probes", None)
        if probes is None or not probes():
            return
        from obshub.producer.control import ControlListener

        self._control = ControlListener(self.config.kafka, self.config.host, lambda r: self.deep_dive(r.steps, r.max_s))

    def caught_totals(self) -> dict[str, int]:
        """Failures the agent caught and went on from, by where (``obshub_agent_caught_errors``): ``drain``
        (the source's last poll at shutdown), ``deep_dive`` (a deep-dive request whose handling raised),
        and the event source's own (``BpfEventSource.caught``: ``attach``, ``compile``, bcc's bare
        Exception)."""
        out = Counter(self.caught)
        out.update(getattr(self.source, "caught", None) or {})
        if self._control is not None and self._control.failed:
            out["deep_dive"] += self._control.failed
        return dict(out)

    def deep_dive(self, steps: int, max_s: float = 120.0) -> None:
        """Ask for a deep dive (thread-safe): the loop attaches the source's deep-dive probes
        (``BpfEventSource.deep_dive_on``) and detaches them when every watched process has ended
        ``steps`` more steps (STEP_END events counted, the step open at the attach included) or after
        ``max_s`` seconds. The kernel keeps the step budget too (``deep_dive_on(steps)``): each process
        ships launch data for ``steps`` steps only, however late this loop sees the step ends. A request
        during a window extends it. Each window is appended to
        :attr:`deep_dives`: ``steps``, ``asked`` / ``on_at`` / ``off_at`` (time.monotonic s),
        ``attach_s`` (the attach's own time), ``step_ends`` seen in it."""
        if steps < 1 or not max_s > 0:
            raise ValueError(f"deep dive: steps={steps!r} must be >= 1 and max_s={max_s!r} > 0")
        if not hasattr(self.source, "deep_dive_on"):
            raise ValueError(f"deep dive: the event source {type(self.source).__name__} has no deep-dive probes")
        self._dd_request = (int(steps), float(max_s), time.monotonic())

    def _serve_deep_dive(self) -> None:
        req, dd, now = self._dd_request, self._dd, time.monotonic()
        if req is not None:
            self._dd_request = None
            steps, max_s, asked = req
            if dd is None:
                # count only the steps that end from now on: the STEP_ENDs already waiting in the ring
                # (read late on a busy host) are taken first, so they cannot close the window early
                poll = getattr(self.source, "poll_packed", None) or self.source.poll
                waiting = poll(0)
                if waiting:
                    self._take(waiting)
                attach_s = self.source.deep_dive_on(steps)
                # and those that ended while the uprobes attached (~0.1 s each, far more on a loaded host):
                # counted, they closed the window before one step of launch data (CI, attach 0.59 s)
                waiting = poll(0)
                if waiting:
                    self._take(waiting)
                dd = {"steps": steps, "asked": asked, "on_at": time.monotonic(), "attach_s": attach_s}
                self._dd = dd
                self.say(f"deep dive on for {steps} steps (at most {max_s:.0f} s): attached in {attach_s * 1e3:.1f} ms")
            else:
                self.source.deep_dive_on(steps)  # attached: a new budget of `steps` for every process
            dd["steps"] = steps
            dd["until"] = now + max_s
            dd["ends_at_start"] = self.kind_counts[_STEP_END]
        if dd is None:
            return
        ends = self.kind_counts[_STEP_END] - dd["ends_at_start"]
        if ends >= dd["steps"] * max(1, len(self.job_of_pid)) or now >= dd["until"]:
            self.source.deep_dive_off()
            dd.update(off_at=time.monotonic(), step_ends=ends)
            self.deep_dives.append(dd)
            self._dd = None
            self.say(f"deep dive off after {ends} step ends, {dd['off_at'] - dd['on_at']:.1f} s")

    def _start_metrics(self) -> None:
        if self.config.metrics_port is None:
            return
        from obshub.producer.agent_metrics import make_registry, serve_metrics

        try:
            server = serve_metrics(self.config.metrics_addr, self.config.metrics_port, make_registry(self))
        except OSError as exc:  # a port in use, an address that is not this host's (socket.gaierror too)
            raise ProducerError(
                f"Failed to serve metrics on {self.config.metrics_addr}:{self.config.metrics_port}: {exc}",
                "choose a free port with --metrics-port (0: any free port) or another --metrics-addr",
            ) from None
        self._metrics_server = server
        self.metrics_port = server.server_port
        self.say(f"metrics on http://{self.config.metrics_addr}:{self.metrics_port}/metrics")

    def _loop(self) -> None:
        cfg = self.config
        batcher, transport, source = self.batcher, self.transport, self.source
        deadline = time.monotonic() + cfg.duration_s if cfg.duration_s else None
        next_loss = time.monotonic() + cfg.loss_interval_s
        state = transport.state
        poll = getattr(source, "poll_packed", None) or source.poll
        # a source that can sleep through its wakeups is told how long no step end can seal a batch
        # (the open batch follows a step-aligned one and is younger than the step minimum): the end of
        # every fast step then no longer turns the loop
        quiet_poll = bool(getattr(source, "QUIET_POLL", False))
        # the longest wait for the source: the batch age bound, at most POLL_MAX_MS (a full ring or a
        # step end wakes the poll earlier); each turn costs CPU, so an idle agent turns a few times a
        # second only
        idle_ms = max(50.0, min(POLL_MAX_MS, float(cfg.batch.max_age_ms)))
        while not self._stop.is_set():
            until_due = batcher.ms_until_due()
            timeout = idle_ms if until_due is None else min(idle_ms, until_due)
            if quiet_poll:
                seal_ms = batcher.ms_until_step_seal()
                if 0 < seal_ms < math.inf:
                    # a step end cannot seal the open batch (or, right after a step seal, the next one)
                    # for seal_ms; the first one after that wakes the poll: wait a little past it for that
                    # step end, which then opens and seals the next batch in one turn
                    timeout = max(timeout, seal_ms + QUIET_GRACE_MS)
                    if until_due is not None:
                        timeout = min(until_due, timeout)
                events = poll(int(timeout), int(math.ceil(min(timeout, seal_ms))))
            else:
                events = poll(int(timeout))
            if events:
                self._take(events)
            if self._dd_request is not None or self._dd is not None:
                self._serve_deep_dive()
            if self.job_of_pid:
                states = self.rank_watch.poll(self.job_of_pid)
                if states:
                    self._take_events(states)
                    for job in {self.job_of_pid.get(ev[_PID], batcher.fallback_job) for ev in states}:
                        batcher.of(job).seal_next()  # a state change leaves now, not at the age bound
            for sealed in batcher.due():
                transport.send(sealed)
            transport.service(0)
            if transport.state != state:
                self._say_state(state, transport.state)
                state = transport.state
            now = time.monotonic()
            if now >= next_loss:
                self._report_loss()
                if self.job_of_pid or self._ignored:
                    self._prune_jobs()
                next_loss = now + cfg.loss_interval_s
            if deadline is not None and now >= deadline:
                break

    def _take(self, items: list) -> None:
        """Count, batch and send what the source returned: Events (10-tuples) and, from a source with
        ``poll_packed``, :class:`producer.reader.PackedRun` s (added whole, counted by their kinds).
        The batchers of the jobs a STEP_END arrived for are then told the step ended (after every item of
        the turn is in: the kernel sends the step's aggregates right behind its STEP_END), so the loop's
        ``due`` seals their batches at the step boundary."""
        ended = self._ended
        if not hasattr(self.source, "poll_packed"):  # Events only: no per-item type check
            self._take_events(items)
        else:
            self._take_mixed(items)
        if ended:
            for job in ended:
                self.batcher.of(job).step_end()
            ended.clear()

    def _take_mixed(self, items: list) -> None:
        counts = self.kind_counts
        plain: list = []
        for item in items:
            if type(item) is PackedRun:
                if plain:
                    self._take_events(plain)
                    plain = []
                counts.update(item.kinds)
                self._add_packed(item, _STEP_END in item.kinds)
            else:
                plain.append(item)
        if plain:
            self._take_events(plain)

    def _take_events(self, events: list) -> None:
        """Count Events, learn the jobs of the REGISTER events among them, batch them by job, send."""
        counts = self.kind_counts
        before, ends_before = counts[_REGISTER], counts[_STEP_END]
        counts.update(map(_kind_of, events))
        if counts[_REGISTER] != before:
            self._learn_jobs(events)
        if self._ignored:
            ignored = self._ignored
            events = [ev for ev in events if ev[_PID] not in ignored]
        has_end = counts[_STEP_END] != ends_before
        send = self.transport.send
        if not self.job_of_pid:  # nothing registered: everything is the fallback job's
            for sealed in self.batcher.fallback.add_many(events):
                send(sealed)
            if has_end:
                self._ended.add(self.batcher.fallback_job)
            return
        by_job: dict[str, list] = {}
        jobs, fallback, everyone = self.job_of_pid, self.batcher.fallback_job, self._jobs
        for ev in events:
            job = jobs.get(ev[_PID])
            if job is not None:
                by_job.setdefault(job, []).append(ev)
            elif ev[0] in HOST_KINDS:
                for j in everyone:
                    by_job.setdefault(j, []).append(ev)
            else:
                by_job.setdefault(fallback, []).append(ev)
        for job, evs in by_job.items():
            for sealed in self.batcher.of(job).add_many(evs):
                send(sealed)
            if has_end and any(ev[0] == _STEP_END for ev in evs):
                self._ended.add(job)

    def _add_packed(self, run: PackedRun, has_end: bool = False) -> None:
        """Batch one packed run: whole into one batcher when only one job can own its events (nothing
        registered: the fallback job; one job registered and only registered processes watched: that
        job), else split by job (the pids read from the msgpack arrays; each job's events gathered into
        one run of their own, order kept; ~0.5-1 µs per event). ``has_end``: the run holds a STEP_END (the
        jobs it belongs to are noted for :meth:`_take`)."""
        send = self.transport.send
        jobs = self.job_of_pid
        fallback = self.batcher.fallback_job
        only = self._jobs[0] if len(self._jobs) == 1 else None
        ignored = self._ignored
        if not ignored and (not jobs or only == fallback or (only is not None and self._registered_only())):
            for sealed in self.batcher.of(only or fallback).add_packed(run.data, run.ends):
                send(sealed)
            if has_end:
                self._ended.add(only or fallback)
            return
        ends = run.ends
        unpacker = msgpack.Unpacker(use_list=False, raw=False, strict_map_key=False)
        unpacker.feed(run.data)
        of_job: dict[str, list[int]] = {}  # job -> indexes of its events in the run
        cur, idx = None, []
        for i, ev in enumerate(unpacker):
            if ignored and ev[_PID] in ignored:
                continue
            job = jobs.get(ev[_PID], fallback)
            if job != cur:
                cur, idx = job, of_job.setdefault(job, [])
            idx.append(i)
            if has_end and ev[0] == _STEP_END:
                self._ended.add(job)
        view = memoryview(run.data)
        starts = None
        for job, idx in of_job.items():
            lo, hi = idx[0], idx[-1] + 1
            if hi - lo == len(idx):  # consecutive: one slice of the run
                base = ends[lo - 1] if lo else 0
                data: bytes | memoryview = view[base : ends[hi - 1]]
                part = array("I", [e - base for e in ends[lo:hi]])
            else:  # interleaved with other jobs' events: gather them
                if starts is None:
                    starts = array("I", [0]) + ends[:-1]
                data = b"".join([view[starts[i] : ends[i]] for i in idx])
                part = array("I", accumulate([ends[i] - starts[i] for i in idx]))
            for sealed in self.batcher.of(job).add_packed(data, part):
                send(sealed)

    def _registered_only(self) -> bool:
        """Does the source watch registered processes only (no ``--pid``/``--cgroup``)? Then every event
        of a packed run comes from a registered process."""
        t = getattr(self.source, "target", None)
        return bool(t is not None and t.registered and t.cgroup is None and not t.pids)

    def _learn_jobs(self, events: list) -> None:
        """Keep ``pid -> job`` of every REGISTER event (the job its payload names; the fallback job when
        it names none)."""
        for ev in events:
            if ev[0] != _REGISTER:
                continue
            payload = ev[9] if isinstance(ev[9], dict) else {}
            job = str(payload.get("job") or "") or self.batcher.fallback_job
            pid = ev[_PID]
            if self._only and job not in self._only:
                if pid not in self._ignored:
                    self._ignored.add(pid)
                    self.say(f"process {pid} registered for job {job} (rank {ev[8]}): not served (--only-job)")
                continue
            self._ignored.discard(pid)  # a pid number reused by a process of a served job
            if self.job_of_pid.get(pid) != job:
                self.job_of_pid[pid] = job
                self._dead.discard(pid)
                self.say(f"process {pid} registered for job {job} (rank {ev[8]})")
        self._jobs = sorted(set(self.job_of_pid.values()))

    def _prune_jobs(self) -> None:
        """Forget registered processes found gone on two checks in a row (their last events may still
        be in the ring buffer at the first); seal and forget a job left without processes."""
        self._ignored = {pid for pid in self._ignored if os.path.exists(f"/proc/{pid}")}
        gone = {pid for pid in self.job_of_pid if not os.path.exists(f"/proc/{pid}")}
        forget = gone & self._dead
        self._dead = gone - forget
        if not forget:
            return
        for pid in forget:
            del self.job_of_pid[pid]
        live = set(self.job_of_pid.values())
        for job in set(self._jobs) - live:
            last = self.batcher.forget(job)
            if last is not None:
                self.transport.send(last)
            self.say(f"job {job}: no registered process left on this host")
        self._jobs = sorted(live)

    def _say_state(self, old: str, new: str) -> None:
        t = self.transport
        if new == DRAINING or (new == SPOOLING and old == DIRECT):
            why = t.publisher.last_error or "delivery failed"
            self.say(
                f"Kafka ({self.config.kafka.bootstrap}) does not take batches ({why}); "
                f"spooling to {self.config.spool.dir}"
            )
        elif new == DIRECT:
            self.say(f"Kafka is back: the spool is replayed ({t.replayed} batches so far)")

    def _report_loss(self) -> None:
        """Turn increases of the source's cumulative per-probe loss counters into AGENT_LOSS events."""
        events = []
        for probe, total in self.source.lost().items():
            delta = total - self.lost_totals.get(probe, 0)
            if delta > 0:
                events.append(
                    Event(Kind.AGENT_LOSS, time.monotonic_ns(), 0, 0, -1, os.getpid(), 0, -1, delta, {"probe": probe})
                )
                self.lost_totals[probe] = total
        if events:
            self._take_events(events)

    def _shutdown(self, drain: bool = True) -> tuple[int, int]:
        """Drain the source (when it started), flush, deliver and release the spool, then detach the
        probes. Returns (undelivered batches, bytes)."""
        try:
            poll = getattr(self.source, "poll_packed", None) or self.source.poll
            events = poll(0) if drain else []
            if events:
                self._take(events)
        except Exception as exc:  # noqa: BLE001 - a broken source must not keep the batches we have from Kafka
            self.caught["drain"] += 1
            self.say(f"Failed to drain the event source at shutdown: {exc}")
        finally:
            if self._control is not None:
                self._control.close()
            if self._dd is not None:
                self._dd.update(
                    off_at=time.monotonic(), step_ends=self.kind_counts[_STEP_END] - self._dd["ends_at_start"]
                )
                self.deep_dives.append(self._dd)
                self._dd = None
            # the spool's lock says this agent stops: an agent started now waits for it (Spool)
            self.transport.spool.mark_stopping()
        try:
            self._report_loss()
            for last in self.batcher.flush():
                self.transport.send(last)
            # deliver (and release the spool) before the BPF teardown, which takes seconds (bcc detaches
            # every probe and frees the module: 4-11 s at load 5 on 2 cores): a restarted agent starts
            # meanwhile instead of finding the spool locked
            left = self.transport.close(self.config.flush_timeout_s, abort=lambda: self._signals >= 2)
        finally:
            self.source.close()
            self.rank_watch.close()
        if self._metrics_server is not None:
            from obshub.producer.agent_metrics import stop_metrics

            stop_metrics(self._metrics_server)
        return left

    def stats(self) -> dict:
        """A snapshot of the counters (for tests and ``--json`` output)."""
        t, pub, spool = self.transport, self.transport.publisher, self.transport.spool
        return {
            "agent_id": self.agent_id,
            "batches": self.batcher.sealed,
            "events": self.batcher.events,
            "events_by_kind": {Kind(k).name: n for k, n in self.kind_counts.items()},
            "lost": dict(self.lost_totals),
            "delivered": pub.delivered,
            "delivery_errors": pub.delivery_errors,
            "backpressure_waits": pub.backpressure_waits,
            "spooled": t.spooled,
            "replayed": t.replayed,
            "spool_batches": spool.pending_batches,
            "spool_bytes": spool.pending_bytes,
            "spool_dropped_batches": spool.dropped_batches,
            "spool_dropped_bytes": spool.dropped_bytes,
            "state": t.state,
        }


def probe_table(statuses: list) -> str:
    """The probe table printed at start: one row per probe (name, layer, attached / skipped, reason)."""
    rows = [("probe", "layer", "status", "reason")]
    for st in statuses:
        layer = getattr(st.layer, "value", st.layer)
        rows.append((st.name, str(layer), "attached" if st.attached else "skipped", st.reason or ""))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}".rstrip() for r in rows)
