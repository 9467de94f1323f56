"""Everything the stream worker does with Faust's internals, in one file (the adapter).

The worker uses Faust's public API (``faust.App``, agents, topics, tables, timers, codecs, ``Worker``)
in obshub/streams/app.py and cli.py. Four things need Faust's internals, and live only here, so that a
Faust upgrade or a replacement is one file to port:

- :func:`as_current`: which message a table write belongs to. A table write goes to the changelog
  partition of the *current event* (``faust.streams._current_event``, a ContextVar holding a weak
  reference); an agent that takes several messages per round sets it before each write.
- :func:`lean_sensors`: Faust calls its sensor hooks for every message consumed, every event streamed and
  every table read and write (``SensorDelegate.on_message_in`` ...); their only users are statistics
  (Faust's Monitor, which nothing here reads: no web server). Each costs µs of Python per call, so they
  become no-ops; the send hooks stay (``SendErrors`` reads them).
- :class:`RecoveringTable`: a table whose changelog recovery (``Table.apply_changelog_batch``) skips
  records that do not decode instead of retrying them forever.
- :func:`idempotent_producer`: the worker's one producer (summaries, internal topic, changelogs, DLQ)
  with ``enable_idempotence``. Faust passes it to aiokafka only inside a transaction
  (``Producer._settings_extra``); without it a produce request retried after a broker died before
  answering is written twice (a step summarised twice, issue #32).

``SUPPORTED`` names the faust-streaming versions these were checked against; tests/streams/test_faustkit.py
fails on another version, or when one of these internals changed shape, before any worker runs on it.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

import faust
import faust.streams
from faust.sensors.base import SensorDelegate

log = logging.getLogger("obshub.streams")

#: faust-streaming versions (inclusive lower, exclusive upper) whose internals this module was checked on
SUPPORTED = ((0, 15), (0, 16))

#: the per-message statistics hooks of ``SensorDelegate`` that :func:`lean_sensors` switches off
STATISTICS_HOOKS = (
    "on_message_in",
    "on_stream_event_in",
    "on_stream_event_out",
    "on_message_out",
    "on_table_get",
    "on_table_set",
    "on_table_del",
)


def faust_version() -> tuple[int, ...]:
    """The installed faust-streaming version as a tuple of ints (``(0, 15, 3)``)."""
    from importlib.metadata import version

    return tuple(int(x) for x in version("faust-streaming").split(".")[:3] if x.isdigit())


def as_current(event: Any) -> None:
    """Make ``event`` (a ``faust.Event``) Faust's current event: a table write goes to the changelog
    partition of the current event's message, so in a round of several messages each write names its own."""
    faust.streams._current_event.set(weakref.ref(event))


def _no_statistics(*args: Any, **kwargs: Any) -> None:
    return None


def lean_sensors(app: faust.App) -> None:
    """Turn Faust's per-message statistics hooks (:data:`STATISTICS_HOOKS`) into no-ops on
    ``app.sensors``; the others stay (send hooks, commits, rebalances and offsets reach every sensor)."""
    for name in STATISTICS_HOOKS:
        setattr(app.sensors, name, _no_statistics)


def idempotent_producer(app: faust.App) -> None:
    """Make every producer ``app`` creates from now on an idempotent one (aiokafka
    ``enable_idempotence=True`` with ``acks="all"``): the broker drops a retried batch it already
    appended (producer id and per-partition sequence numbers), so a broker lost between the write of a
    batch and its answer no longer duplicates the batch's records. Call before the worker starts (the
    producer is created at start). The brokers must allow the producer id request (Kafka >= 0.11; with
    ACLs on brokers before 2.8 the ``IdempotentWrite`` cluster permission)."""
    transport = app.transport
    base = transport.Producer

    class IdempotentProducer(base):  # type: ignore[misc, valid-type]
        def _settings_extra(self) -> Any:
            return {**super()._settings_extra(), "acks": "all", "enable_idempotence": True}

    transport.Producer = IdempotentProducer  # an instance attribute: this app's transport only


class SendErrors(faust.Sensor):
    """Faust reports a failed produce only to sensors: ``on_error(exc)`` is called for each, so that no
    loss is silent (the worker logs it and counts it)."""

    def __init__(self, on_error: Callable[[BaseException], None], **kw: Any) -> None:
        super().__init__(**kw)
        self._on_error = on_error

    def on_send_error(self, producer: Any, exc: BaseException, state: Any) -> None:
        self._on_error(exc)


class RecoveringTable(faust.Table):
    """A ``faust.Table`` whose changelog recovery skips records the ``is_bad(key_or_value)`` predicate
    marks (a damaged or foreign record that does not decode): each is passed to ``on_skip(table, message,
    which, bad)`` (``which``: ``"key"`` or ``"value"``), and recovery goes on with the others, so
    one damaged record cannot keep the worker from becoming ready. Set both as class attributes of a
    subclass."""

    is_bad: Callable[[Any], bool] = staticmethod(lambda _x: False)
    on_skip: Callable[[Any, Any, str, Any], None] = staticmethod(lambda *_a: None)

    def apply_changelog_batch(self, batch: Any) -> None:
        good = []
        for event in batch:
            bad = next((x for x in (event.key, event.value) if type(self).is_bad(x)), None)
            if bad is None:
                good.append(event)
                continue
            type(self).on_skip(self, event.message, "key" if bad is event.key else "value", bad)
        super().apply_changelog_batch(good)


def check_internals() -> list[str]:
    """What of the above no longer holds on the installed Faust (empty when all holds): the version range,
    the current-event ContextVar, the statistics hooks, ``Table.apply_changelog_batch``, the aiokafka
    driver's ``Transport.Producer._settings_extra`` and ``_new_producer``."""
    problems = []
    v = faust_version()
    if not SUPPORTED[0] <= v[:2] < SUPPORTED[1]:
        problems.append(f"faust-streaming {'.'.join(map(str, v))} is outside the checked range {SUPPORTED}")
    if not hasattr(getattr(faust.streams, "_current_event", None), "set"):
        problems.append("faust.streams._current_event is not a ContextVar")
    missing = [h for h in STATISTICS_HOOKS if not callable(getattr(SensorDelegate, h, None))]
    if missing:
        problems.append(f"SensorDelegate lacks {missing}")
    if not callable(getattr(faust.Table, "apply_changelog_batch", None)):
        problems.append("faust.Table.apply_changelog_batch is gone")
    from faust.transport.drivers import aiokafka as driver

    producer = getattr(driver.Transport, "Producer", None)
    if not (
        callable(getattr(producer, "_settings_extra", None)) and callable(getattr(producer, "_new_producer", None))
    ):
        problems.append("faust's aiokafka Transport.Producer lacks _settings_extra or _new_producer")
    return problems
