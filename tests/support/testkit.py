"""Helpers to drive real stream workers against a real broker: isolated topics, publishing batches,
starting ``obshub streams worker`` subprocesses, collecting summaries. Used by the tests, the demo and
the benchmarks (nothing here is a mock: every call talks to Kafka or runs the real worker).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from obshub.core import schema
from obshub.core.settings import Settings

REPO = Path(__file__).resolve().parent.parent.parent


@dataclass
class Topics:
    """One isolated set of topics for one app: agent batches in, summaries and DLQ out."""

    events: str
    steps: str
    dlq: str


def make_topics(settings: Settings, prefix: str, partitions: int = 4, max_message_bytes: int = 16 << 20) -> Topics:
    """Create ``<prefix>-events`` (``partitions``), ``<prefix>-steps`` (2) and ``<prefix>-dlq`` (1), all
    accepting messages up to ``max_message_bytes``. Raises RuntimeError when creation fails."""
    from confluent_kafka.admin import AdminClient, NewTopic

    t = Topics(f"{prefix}-events", f"{prefix}-steps", f"{prefix}-dlq")
    cfg = {"max.message.bytes": str(max_message_bytes)}
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    futs = admin.create_topics(
        [
            NewTopic(t.events, partitions, 1, config=cfg),
            NewTopic(t.steps, 2, 1, config=cfg),
            NewTopic(t.dlq, 1, 1, config=cfg),
        ],
        operation_timeout=20,
    )
    for name, f in futs.items():
        try:
            f.result()
        except Exception as exc:
            if "already exists" not in str(exc).lower():
                raise RuntimeError(f"Failed to create topic {name}: {exc}") from exc
    return t


def producer(settings: Settings):
    """A confluent-kafka producer that accepts messages up to 16 MiB."""
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": settings.bootstrap_servers, "message.max.bytes": 16 << 20, "linger.ms": 5})


def publish(settings: Settings, topic: str, items: Iterable[tuple[bytes, bytes | schema.Batch]]) -> int:
    """Publish ``(key, value)`` pairs (a Batch is encoded with ``schema.encode_batch``) and flush.
    Returns the count. Raises RuntimeError when not everything was delivered within 30 s."""
    p = producer(settings)
    n = 0
    for key, value in items:
        if isinstance(value, schema.Batch):
            value = schema.encode_batch(value)
        p.produce(topic, key=key, value=value)
        p.poll(0)
        n += 1
    if p.flush(30) != 0:
        raise RuntimeError(f"Failed to deliver all {n} messages to {topic}")
    return n


class Worker:
    """One ``obshub streams worker`` subprocess (its own session, so it can be killed as a group)."""

    def __init__(
        self,
        topics: Topics,
        app_id: str,
        index: int,
        log_path: Path,
        *,
        window_s: float = 2.0,
        partitions: int = 4,
        metrics_port: int = 0,
        env: dict | None = None,
        args: list[str] | None = None,
    ):
        cmd = [
            sys.executable,
            "-m",
            "obshub.cli",
            "streams",
            "worker",
            "--app-id",
            app_id,
            "--input-topic",
            topics.events,
            "--output-topic",
            topics.steps,
            "--dlq-topic",
            topics.dlq,
            "--partitions",
            str(partitions),
            "--window-s",
            str(window_s),
            "--index",
            str(index),
            "--metrics-port",
            str(metrics_port),
            "--log-level",
            "info",
            *(args or []),
        ]
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
            cwd=REPO,
        )

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Wait until Faust logs "Worker ready". Raises RuntimeError (with the log tail) otherwise."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.log_path.read_text(errors="replace")
            if "Worker ready" in text:
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode}:\n{text[-3000:]}")
            time.sleep(0.2)
        raise RuntimeError(f"worker not ready in {timeout_s} s:\n{self.log_path.read_text(errors='replace')[-3000:]}")

    def settled(self) -> bool:
        """True when the worker logged "Worker ready" after its latest partition assignment (Faust can skip
        input messages fetched while a worker is still finishing a rebalance, docs/STREAMS.md)."""
        text = self.log_path.read_text(errors="replace")
        return text.rfind("Worker ready") > text.rfind("Setting newly assigned partitions") >= 0

    def kill(self) -> None:
        """SIGKILL the worker (no clean shutdown, no final commit)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._log.close()

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM, wait, then SIGKILL if it is still there."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()


def stop_together(workers: Iterable[Worker], timeout_s: float = 20.0) -> None:
    """Stop ``workers`` as :meth:`Worker.stop` does, all at once: SIGTERM to every one, then one deadline of
    ``timeout_s`` for all, then SIGKILL whatever is left (one after the other, each of a group would wait out
    the rebalance that the previous one's leave started)."""
    ws = list(workers)
    for w in ws:
        if w.proc.poll() is None:
            os.killpg(w.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for w in ws:  # no second SIGTERM: the worker reads one as "stop at once" (test_streams_stop.py)
        try:
            w.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(w.proc.pid, signal.SIGKILL)
            w.proc.wait(10)
        w._log.close()


def collect(settings: Settings, topic: str, *, until, timeout_s: float = 60.0) -> list:
    """Read ``topic`` from the beginning until ``until(messages)`` is true or ``timeout_s`` passed; returns
    the confluent-kafka messages read so far."""
    import uuid

    from confluent_kafka import Consumer

    c = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": f"kit-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "fetch.message.max.bytes": 16 << 20,
        }
    )
    c.subscribe([topic])
    out: list = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.3)
            if m is not None and not m.error():
                out.append(m)
            elif until(out):
                break
    finally:
        c.close()
    return out


def summaries(messages: list) -> list[dict]:
    """Decoded JSON summaries of ``messages`` (order kept)."""
    return [json.loads(m.value()) for m in messages]
