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
- ``obshub_streams_replayed_batches_total``   batches read again after a restart (not counted as duplicates)
- ``obshub_streams_dlq_total{field}``         messages sent to the DLQ, by offending field
- ``obshub_streams_summaries_total{closed_by}`` step summaries emitted
- ``obshub_streams_consumer_skips_total``     input offsets Faust's consumer skipped (see app.SkipDetector)
- ``obshub_streams_send_errors_total``        produce calls that failed (summaries, internal, changelog)
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


class WorkerMetrics:
    """The metric objects of one worker, in their own registry (so tests can build several)."""

    def __init__(self) -> None:
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
        self.dlq = Counter("obshub_streams_dlq", "messages sent to the DLQ", ["field"], registry=r)
        self.consumer_skips = Counter("obshub_streams_consumer_skips", "input offsets the consumer skipped",
                                      registry=r)
        self.send_errors = Counter("obshub_streams_send_errors", "failed produce calls", registry=r)
        self.summaries = Counter("obshub_streams_summaries", "step summaries emitted", ["closed_by"], registry=r)

    def serve(self, port: int) -> None:
        """Serve ``/metrics`` on 0.0.0.0:``port`` in a daemon thread (no-op for port 0)."""
        if port:
            start_http_server(port, registry=self.registry)
