"""Prometheus metrics of a stream worker (prometheus-client), served on ``--metrics-port`` at ``/metrics``.

Names and units (Prometheus conventions: counters end in ``_total``, units in the name):

- ``obshub_streams_events_total``             events ingested (valid batches only)
- ``obshub_streams_events_per_second``        events ingested per second over the last timer interval
- ``obshub_streams_batches_total``            valid batches ingested
- ``obshub_streams_lag_seconds``              now - the newest batch's ``sent_ns`` (end-to-end delay)
- ``obshub_streams_consumer_lag_messages``    input messages not yet read, summed over owned partitions
- ``obshub_streams_open_steps``               steps held open in this worker's partitions
- ``obshub_streams_late_events_total``        events that arrived after their step closed
- ``obshub_streams_lost_batches_total``       batch sequence gaps (batches never seen)
- ``obshub_streams_duplicate_batches_total``  batches seen twice (dropped)
- ``obshub_streams_late_batches_total``       batches that filled an earlier gap (folded, after being counted lost)
- ``obshub_streams_replayed_batches_total``   batches read again after a restart (not counted as duplicates)
- ``obshub_streams_dlq_total{field}``         messages sent to the DLQ, by offending field
- ``obshub_streams_summaries_total{closed_by}`` step summaries emitted
- ``obshub_streams_consumer_skips_total``     offsets Faust's consumer skipped, read again (streams.reread)
- ``obshub_streams_send_errors_total``        produce calls that failed (summaries, internal, changelog)
- ``obshub_streams_processing_errors_total{stage}`` messages the worker failed on (a bug: ``ingest``, ``fold``,
  ``summary``), each logged with its position, sent to the DLQ and skipped
- ``obshub_streams_housekeeping_errors_total{task}`` best-effort tasks that failed and were skipped, logged
  (``retention``: dropping expired agent records, ``progress``: the input-read report, ``dead_letter``: a
  DLQ send, ``lag``: reading consumer positions)
- ``obshub_streams_table_keys{table}``        keys of each table this worker holds (flat under retention)
- ``obshub_streams_jobs_tracked``             jobs with in-memory state in this worker (flat under retention)
- ``obshub_streams_ready``                    0 while the worker recovers its tables at start, 1 once it reads
  its inputs (``obshub status`` says "recovering" meanwhile)
- ``obshub_streams_start_to_ready_seconds``   seconds from start to reading inputs (mostly the recovery)

Results of the analysis (``StepResultMetrics``, one observation per step summary this worker emits; the
label ``training_job`` names the training job, because ``job`` is Prometheus's own target label):

- ``obshub_step_duration_seconds{training_job,host}``        histogram of each host's step time; in a job
  of more than ``host_series_max`` hosts (64) only the notable hosts keep their own series (below), the
  others are observed under ``host="_other"``
- ``obshub_step_max_duration_seconds{training_job}``         the slowest host's time at the latest step
- ``obshub_last_step{training_job}``                         number of the latest (highest) step summarised
- ``obshub_steps_total{training_job,closed_by}``             step summaries (complete / window)
- ``obshub_stalled_steps_total{training_job}``               steps slower than the job's p99 baseline
- ``obshub_straggler_steps_total{training_job,host}``        steps that named ``host`` the straggler
- ``obshub_straggler_excess_seconds_total{training_job,host}`` time the peers lost waiting for ``host``
- ``obshub_straggler_last_step{training_job,host}``          the latest step that named ``host``
- ``obshub_blamed_steps_total{training_job,host,layer}``     steps whose blame names ``layer`` on ``host``
- ``obshub_blame_excess_seconds_total{training_job,host,layer}`` that layer's excess over the peer median
- ``obshub_blame_last_step{training_job,host,layer}``        the latest step with that blame
- ``obshub_collective_skew_seconds{training_job}``           histogram of arrival skew per collective
- ``obshub_missing_host_steps_total{training_job,host}``     steps closed without data from ``host``
- ``obshub_step_lost_batches_total{training_job}``           agent batches lost (sequence gaps)
- ``obshub_step_duplicate_batches_total{training_job}``      duplicate batches dropped
- ``obshub_step_late_events_total{training_job}``            events that arrived after their step closed
- ``obshub_step_ringbuf_lost_events_total{training_job}``    events the probes lost in the kernel

A training job whose summaries stop for ``idle_s`` (the worker's ``--job-retention-s``, default 1 h) has its series removed, so finished
jobs do not stay in every scrape.

Per-host series are bounded: the step-time histogram has 14 series per (job, host label), so every host
of a 2,048-host job would make some 29,000 series per worker. In a job whose summary lists at most
``host_series_max`` hosts every host has its own series; in a wider job a host gets its own series when
a summary names it the straggler or blames it, or when it is among the ``HOST_SLOWEST`` slowest of a step
while the job has fewer than ``host_series_max`` hosts with their own series; every other observation
goes to ``host="_other"``. Every step time is observed exactly once, so the job's quantiles (summed over
``host``) are exact; a host's own series starts at the step that made it notable.
"""

from __future__ import annotations

import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

STEP_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
SKEW_BUCKETS_S = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
HOST_SERIES_MAX = 64  # hosts per job with their own step-time series (the slowest of a step fill it)
HOST_SLOWEST = 8  # the slowest hosts of a step that may get their own series
OTHER_HOSTS = "_other"  # the host label of every other step time of a wide job


class StepResultMetrics:
    """The analysis results as Prometheus series (names in the module docstring), fed one step summary
    (``schema.STEP_SUMMARY_FIELDS``, times in ns) at a time by ``observe``. Thread-safe. Series of a
    training job are removed once no summary of it arrived for ``idle_s`` seconds."""

    def __init__(
        self, registry: CollectorRegistry, idle_s: float = 3600.0, host_series_max: int = HOST_SERIES_MAX
    ) -> None:
        r, J, H, L = registry, "training_job", "host", "layer"
        self.host_series_max = host_series_max
        self._detail: dict[str, set[str]] = {}  # job -> hosts with their own step-time series
        self.step_time = Histogram(
            "obshub_step_duration_seconds", "step time of each host", [J, H], buckets=STEP_BUCKETS_S, registry=r
        )
        self.step_max = Gauge(
            "obshub_step_max_duration_seconds", "slowest host's step time, latest step", [J], registry=r
        )
        self.last_step = Gauge("obshub_last_step", "number of the latest step summarised", [J], registry=r)
        self.steps = Counter("obshub_steps", "step summaries by how the step closed", [J, "closed_by"], registry=r)
        self.stalled = Counter("obshub_stalled_steps", "steps slower than the job's p99 baseline", [J], registry=r)
        self.strag = Counter("obshub_straggler_steps", "steps that named this host the straggler", [J, H], registry=r)
        self.strag_s = Counter(
            "obshub_straggler_excess_seconds", "time the peers lost waiting for this host", [J, H], registry=r
        )
        self.strag_last = Gauge(
            "obshub_straggler_last_step", "latest step that named this host the straggler", [J, H], registry=r
        )
        self.blamed = Counter(
            "obshub_blamed_steps", "steps whose blame names this layer on this host", [J, H, L], registry=r
        )
        self.blame_s = Counter(
            "obshub_blame_excess_seconds", "excess of the layer over the peer median", [J, H, L], registry=r
        )
        self.blame_last = Gauge("obshub_blame_last_step", "latest step with this blame", [J, H, L], registry=r)
        self.skew = Histogram(
            "obshub_collective_skew_seconds", "arrival skew of each collective", [J], buckets=SKEW_BUCKETS_S, registry=r
        )
        self.missing = Counter(
            "obshub_missing_host_steps", "steps closed without data from this host", [J, H], registry=r
        )
        self.lost = Counter("obshub_step_lost_batches", "agent batches lost (sequence gaps)", [J], registry=r)
        self.dups = Counter("obshub_step_duplicate_batches", "duplicate agent batches dropped", [J], registry=r)
        self.late = Counter("obshub_step_late_events", "events that arrived after their step closed", [J], registry=r)
        self.ringbuf = Counter(
            "obshub_step_ringbuf_lost_events", "events the probes lost in the kernel", [J], registry=r
        )
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._seen: dict[str, float] = {}  # training job -> monotonic time of last summary
        self._labels: dict[str, set[tuple[object, tuple[str, ...]]]] = {}  # job -> (metric, labels) to remove
        self._steps: dict[tuple, int] = {}  # (gauge, job, labels...) -> highest step set

    def _touch(self, job: str, metric, *labels: str):
        self._labels.setdefault(job, set()).add((metric, (job, *labels)))
        return metric.labels(job, *labels)

    def _latest(self, job: str, metric, step: int, *labels: str) -> None:
        # steps close out of order (by window, on several partitions): a "latest step" gauge only grows
        key = (id(metric), job, *labels)
        if step >= self._steps.get(key, -1):
            self._steps[key] = step
            self._touch(job, metric, *labels).set(step)

    def _step_times(self, job: str, s: dict) -> None:
        """Observe every host's step time once: under its own ``host`` label, or ``OTHER_HOSTS``."""
        times = s.get("step_time_ns") or {}
        if len(times) <= self.host_series_max:
            for host, ns in times.items():
                self._touch(job, self.step_time, host).observe(ns / 1e9)
            return
        detail = self._detail.setdefault(job, set())
        strag = s.get("straggler") or {}
        named = {strag.get("host")} | {b.get("host") for b in s.get("blame") or []}
        notable = set(named)
        if len(detail) < self.host_series_max:
            notable.update(sorted(times, key=lambda h: times[h], reverse=True)[:HOST_SLOWEST])
        for h in notable:
            if h in times and h not in detail and (len(detail) < self.host_series_max or h in named):
                detail.add(h)
        other = None
        for host, ns in times.items():
            if host in detail:
                self._touch(job, self.step_time, host).observe(ns / 1e9)
            else:
                if other is None:
                    other = self._touch(job, self.step_time, OTHER_HOSTS)
                other.observe(ns / 1e9)

    def observe(self, s: dict) -> None:
        """Add one step summary. Malformed fields are skipped (the summary came from this worker)."""
        job = str(s.get("job", ""))
        with self._lock:
            now = time.monotonic()
            self._seen[job] = now
            t = self._touch
            self._step_times(job, s)
            t(job, self.step_max).set(s.get("step_time_max_ns", 0) / 1e9)
            step = s.get("step", 0)
            self._latest(job, self.last_step, step)
            t(job, self.steps, s.get("closed_by", "")).inc()
            t(job, self.stalled).inc(1 if s.get("stall") else 0)
            strag = s.get("straggler")
            if strag:
                h = strag["host"]
                t(job, self.strag, h).inc()
                t(job, self.strag_s, h).inc(strag.get("excess_ns", 0) / 1e9)
                self._latest(job, self.strag_last, step, h)
            for b in s.get("blame") or []:
                t(job, self.blamed, b["host"], b["layer"]).inc()
                t(job, self.blame_s, b["host"], b["layer"]).inc(max(0, b.get("excess_ns", 0)) / 1e9)
                self._latest(job, self.blame_last, step, b["host"], b["layer"])
            for c in s.get("collectives") or []:
                t(job, self.skew).observe(max(0, c.get("skew_ns", 0)) / 1e9)
            for h in s.get("missing_hosts") or []:
                t(job, self.missing, h).inc()
            q = s.get("quality") or {}
            t(job, self.lost).inc(q.get("lost_batches", 0))
            t(job, self.dups).inc(q.get("duplicate_batches", 0))
            t(job, self.late).inc(q.get("late_events", 0))
            t(job, self.ringbuf).inc(q.get("ringbuf_lost", 0))
            for old in [j for j, seen in self._seen.items() if now - seen > self.idle_s]:
                for metric, labels in self._labels.pop(old, ()):
                    try:
                        metric.remove(*labels)
                    except KeyError:
                        pass
                del self._seen[old]
                self._detail.pop(old, None)
                self._steps = {k: v for k, v in self._steps.items() if k[1] != old}


class WorkerMetrics:
    """The metric objects of one worker, in their own registry (so tests can build several)."""

    def __init__(self, job_idle_s: float = 3600.0) -> None:
        r = self.registry = CollectorRegistry()
        self.events = Counter("obshub_streams_events", "events ingested", registry=r)
        self.events_rate = Gauge("obshub_streams_events_per_second", "events ingested per second", registry=r)
        self.batches = Counter("obshub_streams_batches", "valid batches ingested", registry=r)
        self.lag_s = Gauge("obshub_streams_lag_seconds", "now minus the newest batch sent_ns", registry=r)
        self.consumer_lag = Gauge("obshub_streams_consumer_lag_messages", "input messages not yet read", registry=r)
        self.open_steps = Gauge("obshub_streams_open_steps", "steps open in owned partitions", registry=r)
        self.late = Counter("obshub_streams_late_events", "events after their step closed", registry=r)
        self.lost = Counter("obshub_streams_lost_batches", "batch sequence gaps", registry=r)
        self.dups = Counter("obshub_streams_duplicate_batches", "duplicate batches dropped", registry=r)
        self.replayed = Counter("obshub_streams_replayed_batches", "batches re-read after a restart", registry=r)
        self.late_batches = Counter(
            "obshub_streams_late_batches", "batches that arrived after a newer one and filled its gap", registry=r
        )
        self.dlq = Counter("obshub_streams_dlq", "messages sent to the DLQ", ["field"], registry=r)
        self.consumer_skips = Counter("obshub_streams_consumer_skips", "input offsets the consumer skipped", registry=r)
        self.changelog_skips = Counter(
            "obshub_streams_changelog_skipped",
            "table changelog records that did not decode, skipped during recovery",
            ["table"],
            registry=r,
        )
        self.send_errors = Counter("obshub_streams_send_errors", "failed produce calls", registry=r)
        self.processing_errors = Counter(
            "obshub_streams_processing_errors",
            "messages the worker failed on (a bug), dead-lettered and skipped",
            ["stage"],
            registry=r,
        )
        self.housekeeping_errors = Counter(
            "obshub_streams_housekeeping_errors",
            "best-effort tasks that failed and were skipped (retention, progress, dead_letter, lag, offset_check)",
            ["task"],
            registry=r,
        )
        for task in ("retention", "progress", "dead_letter", "lag", "offset_check"):
            self.housekeeping_errors.labels(task)  # every series exported from the start, at 0
        self.summaries = Counter("obshub_streams_summaries", "step summaries emitted", ["closed_by"], registry=r)
        self.table_keys = Gauge(
            "obshub_streams_table_keys", "keys of each table held by this worker (retention)", ["table"], registry=r
        )
        self.jobs_tracked = Gauge(
            "obshub_streams_jobs_tracked", "jobs with in-memory state in this worker (retention)", registry=r
        )
        self.ready = Gauge(
            "obshub_streams_ready", "1 once the tables are recovered and inputs are read, else 0", registry=r
        )
        self.start_to_ready = Gauge(
            "obshub_streams_start_to_ready_seconds", "seconds from start to reading inputs (recovery)", registry=r
        )
        self.results = StepResultMetrics(r, idle_s=job_idle_s)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serve ``/metrics`` on ``addr``:``port`` in a daemon thread (no-op for port 0). Raises OSError
        when the address cannot be bound."""
        if port:
            start_http_server(port, addr=addr, registry=self.registry)
