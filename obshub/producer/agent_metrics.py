"""Prometheus metrics of one agent (prometheus-client), read from the agent's live counters at scrape time
(a custom collector: no double bookkeeping in the hot path, one registry per agent so several agents can
live in one process, as the tests do).

Every metric carries the labels ``training_job`` and ``host`` (not ``job``: that is the label Prometheus
gives every scraped series itself, so an exported ``job`` would be renamed ``exported_job``). Names and
meaning (also in docs/METRICS.md):

======================================================  =======  ==================================================
obshub_agent_events_total{kind}                         counter  events read from the source, per Kind name
obshub_agent_lost_events_total{probe}                   counter  events the probes lost (ring buffer full), in-kernel
obshub_agent_rejected_events_total                      counter  events msgpack could not encode (skipped)
obshub_agent_batches_total                              counter  batches sealed
obshub_agent_batches_delivered_total                    counter  batches acknowledged by Kafka (direct + replayed)
obshub_agent_delivered_bytes_total                      counter  bytes of those batches
obshub_agent_delivery_errors_total                      counter  delivery reports with an error (purges excluded)
obshub_agent_backpressure_waits_total                   counter  times the producer queue was full and the agent waited
obshub_agent_spooled_batches_total                      counter  batches written to the spool
obshub_agent_replayed_batches_total                     counter  spooled batches delivered
obshub_agent_spool_bytes                                gauge    bytes waiting in the spool
obshub_agent_spool_batches                              gauge    batches waiting in the spool
obshub_agent_spool_dropped_batches_total                counter  spooled batches dropped because the spool was full
obshub_agent_spool_dropped_bytes_total                  counter  bytes of those
obshub_agent_clock_offset_seconds                       gauge    CLOCK_REALTIME - CLOCK_MONOTONIC, s
obshub_agent_clock_uncertainty_seconds                  gauge    ± bound of that offset, s
obshub_agent_transport_state{state}                     gauge    1 for the current state (direct/draining/spooling)
obshub_agent_job_processes                              gauge    live registered processes of the job ``training_job``
obshub_agent_caught_errors_total{where}                 counter  failures caught and gone on from, by where
obshub_agent_coll_ring_records_total                    counter  records read from the ranks' collective rings
obshub_agent_coll_ring_drops_total                      counter  collectives a rank's ring had no room for (by trap)
======================================================  =======  ==================================================

``training_job`` is the agent's ``--job`` on every series but ``obshub_agent_job_processes``, which has
one series per job the agent serves (the job each registered process named).
"""

from __future__ import annotations

import socket
import threading
from collections import Counter
from socketserver import ThreadingMixIn
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from obshub.core.schema import Kind
from obshub.producer.transport import DIRECT, DRAINING, SPOOLING


class MetricsSource(Protocol):
    """What the collector reads from a running agent (``producer.agent.Agent`` provides it): identity in
    ``config``, the ``batcher``, the ``transport`` (publisher, spool, state), ``clock``, ``kind_counts``,
    ``lost_totals`` and ``job_of_pid`` (registered pid -> job)."""

    config: Any
    batcher: Any
    transport: Any
    clock: Any
    kind_counts: Counter[int]
    lost_totals: dict[str, int]
    job_of_pid: dict[int, str]


def _kind_name(k: int) -> str:
    try:
        return Kind(k).name
    except ValueError:
        return str(k)


class AgentCollector(Collector):
    """Yields the metric families above from ``agent``'s counters on every scrape."""

    def __init__(self, agent: MetricsSource):
        self.agent = agent

    def collect(self):
        a = self.agent
        labels = ["training_job", "host"]
        base = [a.config.job, a.config.host]
        t, pub, spool = a.transport, a.transport.publisher, a.transport.spool

        ev = CounterMetricFamily(
            "obshub_agent_events", "events read from the source, per kind", labels=labels + ["kind"]
        )
        for k, n in list(a.kind_counts.items()):
            ev.add_metric(base + [_kind_name(k)], n)
        yield ev
        lost = CounterMetricFamily(
            "obshub_agent_lost_events", "events lost by the probes (ring buffer full)", labels=labels + ["probe"]
        )
        for probe, n in list(a.lost_totals.items()):
            lost.add_metric(base + [probe], n)
        yield lost

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            m = CounterMetricFamily(name, doc, labels=labels)
            m.add_metric(base, value)
            return m

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            m = GaugeMetricFamily(name, doc, labels=labels)
            m.add_metric(base, value)
            return m

        yield counter("obshub_agent_rejected_events", "events msgpack could not encode", a.batcher.rejected)
        yield counter("obshub_agent_batches", "batches sealed", a.batcher.sealed)
        yield counter("obshub_agent_batches_delivered", "batches acknowledged by Kafka", pub.delivered)
        yield counter("obshub_agent_delivered_bytes", "bytes of delivered batches", pub.delivered_bytes)
        yield counter("obshub_agent_delivery_errors", "delivery reports with an error", pub.delivery_errors)
        yield counter("obshub_agent_backpressure_waits", "waits on a full producer queue", pub.backpressure_waits)
        yield counter("obshub_agent_spooled_batches", "batches written to the spool", t.spooled)
        yield counter("obshub_agent_replayed_batches", "spooled batches delivered", t.replayed)
        yield gauge("obshub_agent_spool_bytes", "bytes waiting in the spool", spool.pending_bytes)
        yield gauge("obshub_agent_spool_batches", "batches waiting in the spool", spool.pending_batches)
        yield counter(
            "obshub_agent_spool_dropped_batches", "spooled batches dropped (spool full)", spool.dropped_batches
        )
        yield counter("obshub_agent_spool_dropped_bytes", "spooled bytes dropped (spool full)", spool.dropped_bytes)
        clock = a.clock.current()
        yield gauge("obshub_agent_clock_offset_seconds", "CLOCK_REALTIME - CLOCK_MONOTONIC, s", clock.offset_ns / 1e9)
        yield gauge(
            "obshub_agent_clock_uncertainty_seconds", "uncertainty of the clock offset, s", clock.uncertainty_ns / 1e9
        )
        st = GaugeMetricFamily(
            "obshub_agent_transport_state", "1 for the transport's current state", labels=labels + ["state"]
        )
        for s in (DIRECT, DRAINING, SPOOLING):
            st.add_metric(base + [s], 1 if t.state == s else 0)
        yield st
        jp = GaugeMetricFamily(
            "obshub_agent_job_processes", "live registered processes of a job on this node", labels=labels
        )
        for job, n in sorted(Counter(a.job_of_pid.values()).items()):
            jp.add_metric([job, a.config.host], n)
        yield jp
        caught = CounterMetricFamily(
            "obshub_agent_caught_errors",
            "failures the agent caught and went on from, by where (attach, compile, drain, deep_dive)",
            labels=labels + ["where"],
        )
        totals = a.caught_totals() if hasattr(a, "caught_totals") else {}
        for where in sorted({"attach", "compile", "drain", "deep_dive", *totals}):
            caught.add_metric(base + [where], totals.get(where, 0))
        yield caught
        rings = getattr(getattr(a, "source", None), "coll_ring_totals", None)
        records, drops = rings() if rings is not None else (0, 0)
        yield counter("obshub_agent_coll_ring_records", "records read from the ranks' collective rings", records)
        yield counter(
            "obshub_agent_coll_ring_drops", "collectives a rank's collective ring had no room for (sent by trap)", drops
        )


def make_registry(agent: MetricsSource) -> CollectorRegistry:
    """A fresh registry holding only ``agent``'s collector."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(AgentCollector(agent))
    return reg


#: how long the idle metrics server's thread sleeps between checks for a shutdown request, s. The
#: library's own server (``prometheus_client.start_http_server``) checks every 0.5 s: two wakeups a second
#: of an otherwise idle thread, 0.19 ms of the agent's CPU per second on this project's VM (about 4 µs
#: per training step of docs/BENCHMARKS.md section 1). :func:`stop_metrics` wakes it instead.
IDLE_POLL_S = 3600.0


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


def serve_metrics(addr: str, port: int, registry: CollectorRegistry) -> WSGIServer:
    """Serve ``registry`` at ``http://addr:port/metrics`` (any path answers, as with
    ``prometheus_client.start_http_server``: the library's WSGI app, a thread per request) from a daemon
    thread that sleeps until a request or :func:`stop_metrics`. ``port`` 0 picks a free port
    (``server.server_port``). Raises OSError when the address cannot be bound."""
    family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0][0]
    server_cls = type("MetricsServer", (_Server,), {"address_family": family})
    server = make_server(addr, port, make_wsgi_app(registry), server_cls, handler_class=_Quiet)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": IDLE_POLL_S}, name="obshub-metrics", daemon=True
    ).start()
    return server


def stop_metrics(server: WSGIServer, timeout_s: float = 5.0) -> None:
    """Stop a :func:`serve_metrics` server: request the shutdown, wake its thread with a connection (it
    sleeps up to :data:`IDLE_POLL_S` otherwise; the connection is never served), wait up to ``timeout_s``
    for the thread, close the socket."""
    stopper = threading.Thread(target=server.shutdown, daemon=True)
    stopper.start()
    host, port = server.server_address[:2]
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    while stopper.is_alive():
        try:
            socket.create_connection((host, port), timeout=1).close()
        except OSError:
            pass
        stopper.join(min(0.05, timeout_s))
        timeout_s -= 0.05
        if timeout_s <= 0:
            break
    server.server_close()
