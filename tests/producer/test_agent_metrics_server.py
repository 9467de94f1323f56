"""The agent's metrics server (obshub/producer/agent_metrics.py): serves a registry in the exposition format, its
idle thread sleeps (no periodic wakeup) and still stops at once when asked, and the port is free after."""

from __future__ import annotations

import socket
import threading
import time

import httpx
from prometheus_client import CollectorRegistry, Counter

from obshub.producer.agent_metrics import IDLE_POLL_S, serve_metrics, stop_metrics


def test_serves_then_stops_at_once_although_its_thread_sleeps():
    reg = CollectorRegistry()
    Counter("obshub_test_things", "things", registry=reg).inc(3)
    server = serve_metrics("127.0.0.1", 0, reg)
    port = server.server_port
    body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    assert "obshub_test_things_total 3.0" in body
    thread = next(t for t in threading.enumerate() if t.name == "obshub-metrics")
    assert IDLE_POLL_S >= 60  # the idle thread does not wake twice a second
    t0 = time.monotonic()
    stop_metrics(server)
    assert time.monotonic() - t0 < 2.0
    thread.join(2.0)
    assert not thread.is_alive()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # nothing listens any more
