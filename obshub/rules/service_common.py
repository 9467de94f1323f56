"""What the engine and notify loops of ``obshub rules serve`` share: the state folder and its atomic files, the Kafka
client settings (with the service's ``BrokerWatch``: one warning per broker outage, no raw client log
lines), offset commits, flushes that wait out an outage, and the service's Prometheus metrics."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
from confluent_kafka import Consumer, IsolationLevel, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from prometheus_client import Counter, Gauge

from obshub.core import kafka
from obshub.core.reach import BrokerWatch
from obshub.core.settings import Settings

log = logging.getLogger("obshub.rules.service")
KAFKA_LOG = logging.getLogger("obshub.rules.kafka")  # librdkafka's lines go through logging (JSON logs too)
STOP_FLUSH_S = 5.0  # on SIGTERM/SIGINT during a broker outage, how long to wait for acknowledgements

RECORDS = Counter(
    "obshub_rules_records", "input records evaluated (events: also those skipped, of kinds no rule reads)", ["signal"]
)
SKIPPED = Counter("obshub_rules_events_skipped", "events of kinds no rule reads, skipped without decoding")
CHANGES = Counter("obshub_rules_alert_changes", "alert state changes published", ["rule", "status"])
DLQ = Counter("obshub_rules_dlq", "input messages sent to the DLQ (undecodable)", ["topic"])
ACTIVE = Gauge("obshub_rules_active_alerts", "alerts pending or firing now")
EVAL_ERRORS = Gauge("obshub_rules_eval_errors", "expression evaluations that failed (counted as no match)")
TEMPLATE_ERRORS = Gauge(
    "obshub_rules_template_errors", "alert annotations whose template failed to render (the alert shows the error)"
)
RELOADS = Counter("obshub_rules_reloads", "rule reloads by outcome", ["outcome"])
CONSUMER_ERRORS = Counter(
    "obshub_rules_consumer_errors", "errors a rule-engine consumer returned instead of a message", ["topic"]
)
COMMIT_RETRIES = Counter(
    "obshub_rules_commit_retries", "engine transaction commits that timed out (broker away) and were retried"
)
ABORTS = Counter(
    "obshub_rules_transactions_aborted", "engine transactions aborted (the partition's last committed state reloaded)"
)


def state_dir(settings: Settings) -> Path:
    """Where the rule engine keeps its state: ``$OBSHUB_HOME/state/rules``."""
    return settings.state_dir / "rules"


def atomic_write(path: Path, data: Any) -> None:
    """Write ``data`` to ``path`` atomically (a temporary file renamed over it): JSON, or msgpack when
    the name ends in ``.msgpack`` (the engine's state: a wide job's windows encode ~5x faster).
    Raises OSError naming the file (a full or read-only disk: the error of a ``write`` has no file name
    of its own); the partly written temporary file is removed, so a full disk does not fill further."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    try:
        if path.suffix == ".msgpack":
            tmp.write_bytes(msgpack.packb(data, use_bin_type=True))
        else:
            tmp.write_text(json.dumps(data, separators=(",", ":")))
        os.replace(tmp, path)
    except OSError as exc:
        if tmp.is_file():
            tmp.unlink(missing_ok=True)
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror, str(tmp)) from exc
        raise


def read_state(path: Path) -> Any | None:
    """The content of a state file written by ``atomic_write``; None when missing or unreadable
    (logged: the service then starts from empty state rather than not at all)."""
    try:
        raw = path.read_bytes()
        return msgpack.unpackb(raw, raw=False, strict_map_key=False) if path.suffix == ".msgpack" else json.loads(raw)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, msgpack.UnpackException) as exc:
        log.error("ignoring unreadable state file %s: %s", path, exc)
        return None


def pin_start(
    consumer: Consumer, partitions: list[TopicPartition], settings: Settings, earliest: bool
) -> list[TopicPartition]:
    """Fix where each newly assigned partition starts, at assignment time, and assign them.

    A partition with a committed offset starts there. One without (a new group, or a partition the group
    never committed) starts at its beginning when ``earliest``, else at its last stable offset *now*
    (``ListOffsets`` with ``read_committed``, the isolation level the loops read with). Left to
    ``auto.offset.reset``, librdkafka resolves "latest" lazily at the first fetch, so records produced
    between the assignment and that fetch (a summary written while the engine was starting) would be
    skipped. Call from an ``on_assign`` callback. Returns the partitions with their start offsets; on a
    broker error the partitions are assigned as given (the lazy reset applies) and the error is logged."""
    try:
        committed = consumer.committed(partitions, timeout=10)
        todo = [tp for tp in committed if tp.offset < 0]
        if todo:
            admin = AdminClient(kafka.admin_config(kafka.connection(settings), quiet=True))
            spec = OffsetSpec.earliest() if earliest else OffsetSpec.latest()
            futs = admin.list_offsets(
                {TopicPartition(tp.topic, tp.partition): spec for tp in todo},
                isolation_level=IsolationLevel.READ_COMMITTED,
                request_timeout=10,
            )
            starts = {(tp.topic, tp.partition): fut.result(10).offset for tp, fut in futs.items()}
            for tp in todo:
                tp.offset = starts[(tp.topic, tp.partition)]
        partitions = committed
    except KafkaException as exc:
        log.warning(
            "could not resolve start offsets at assignment (records produced meanwhile may be skipped): %s", exc
        )
    consumer.assign(partitions)
    return partitions


def log_assign(
    loop: str, watch: BrokerWatch | None = None, *, settings: Settings | None = None, earliest: bool = False
):
    """An ``on_assign`` callback that logs the partitions a loop was given (and tells ``watch`` the
    broker answers). With ``settings``, it also fixes each partition's start offset (``pin_start``)."""

    def on_assign(consumer, partitions) -> None:
        if watch is not None:
            watch.up()
        if settings is not None and partitions:
            pin_start(consumer, partitions, settings, earliest)
        log.info(
            "%s: assigned %d partition(s) of %s",
            loop,
            len(partitions),
            ", ".join(sorted({p.topic for p in partitions})) or "-",
        )

    return on_assign


def consumer_lag(cons: Consumer, into: dict[str, int] | None = None) -> dict[str, int]:
    """Messages not yet consumed by ``cons``, summed per topic over its assigned partitions: the high
    watermark its last fetch response carried (librdkafka's cached value) minus its position; a partition
    not fetched yet counts 0. No broker round trip: a watermark query (ListOffsets) waits behind the
    consumer's own long-poll fetch on the same connection, up to ``fetch.wait.max.ms`` (500 ms) per
    partition (5.7 s for 12 partitions on the loaded demo VM), which would stall the evaluation loop
    every ``health_every_s``. Adds into ``into`` when given. Raises what confluent-kafka raises
    (callers treat health as best effort)."""
    lag = into if into is not None else {}
    for tp in cons.position(cons.assignment()):
        lo, hi = cons.get_watermark_offsets(tp, cached=True)
        pos = tp.offset if tp.offset >= 0 else lo
        if hi >= 0 and pos >= 0:
            lag[tp.topic] = lag.get(tp.topic, 0) + max(0, hi - pos)
    return lag


def _client_log(watch: BrokerWatch | None) -> dict:
    return watch.client_conf() if watch is not None else {"logger": KAFKA_LOG}


def producer(settings: Settings, watch: BrokerWatch | None = None, extra: dict | None = None) -> Producer:
    """The idempotent producer of a loop (alert changes, dead letters); ``extra``: more librdkafka
    settings (the engine's transactional producers)."""
    return Producer(
        kafka.producer_config(
            kafka.connection(settings),
            {"enable.idempotence": True, "linger.ms": 5, **_client_log(watch), **(extra or {})},
        )
    )


def flush(prod: Producer, stop: threading.Event, watch: BrokerWatch | None = None) -> int:
    """Wait until the broker acknowledged everything ``prod`` produced, through outages (the loop pauses;
    it never commits past what is not on the broker). Once ``stop`` is set, waits at most
    ``STOP_FLUSH_S`` more. Returns how many messages are still not acknowledged (0 = all)."""
    stop_deadline = None
    while True:
        left = prod.flush(1.0)
        if left == 0:
            if watch is not None:
                watch.up()
            return 0
        if stop.is_set():
            stop_deadline = stop_deadline or time.monotonic() + STOP_FLUSH_S
            if time.monotonic() >= stop_deadline:
                return left


def wait_for_broker(bootstrap: str, stop: threading.Event, watch: BrokerWatch) -> bool:
    """Block until the broker answers (True) or ``stop`` is set (False); ``watch`` says once that it is
    away and once that it is back. For set-up steps that need the broker (topic metadata)."""
    from obshub.core.reach import BrokerUnreachable, require_broker, tcp_reason

    while not stop.is_set():
        try:
            if require_broker(bootstrap, 1.0, stop=stop):
                watch.up()
                return True
        except BrokerUnreachable:
            watch.down(tcp_reason(bootstrap, 1.0) or "no answer")
    return False


def consumer(
    settings: Settings, group: str, reset: str, watch: BrokerWatch | None = None, extra: dict | None = None
) -> Consumer:
    """A consumer of group ``group`` that commits only explicitly and reads committed records only;
    ``reset``: where a new group starts; ``extra``: more librdkafka settings."""
    return Consumer(
        kafka.consumer_config(
            kafka.connection(settings),
            group,
            {
                "enable.auto.commit": False,
                "auto.offset.reset": reset,
                "enable.partition.eof": False,
                "isolation.level": "read_committed",
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 1000,
                **_client_log(watch),
                **(extra or {}),
            },
        )
    )
