"""The worker's Faust app without a broker: Faust's per-message statistics hooks are no-ops, and a failed
produce call still reaches the worker's own sensor (logged and counted)."""

from __future__ import annotations

from obshub.streams.app import WorkerConfig, _faust_app
from obshub.streams.faustkit import STATISTICS_HOOKS as _STATISTICS_HOOKS
from obshub.streams.metrics import WorkerMetrics


def test_statistics_hooks_are_no_ops_and_send_errors_are_still_counted():
    m = WorkerMetrics()
    app = _faust_app(WorkerConfig(app_id="sensors-test"), m)
    for name in _STATISTICS_HOOKS:
        assert getattr(app.sensors, name)(None, None, None, None) is None
    state = app.sensors.on_send_initiated(None, "t", None, 1, 1)
    app.sensors.on_send_error(None, RuntimeError("broker gone"), state)
    assert m.send_errors._value.get() == 1


def test_tune_gc_keeps_collecting_cycles_with_larger_thresholds():
    import gc
    import weakref

    from obshub.streams.app import GC_THRESHOLD, tune_gc

    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == GC_THRESHOLD and gc.isenabled()

        class Node:
            pass

        node = Node()
        node.me = node  # a reference cycle: only the collector frees it
        ref = weakref.ref(node)
        del node
        gc.collect()
        assert ref() is None
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_housekeeping_failures_are_exported_per_task_from_the_start():
    """The worker's best-effort tasks (retention, progress report, dead-lettering, consumer positions) count
    their failures in ``obshub_streams_housekeeping_errors_total{task}``; every task's series exists at 0
    before any failure, so an alert on its rate needs no absent() guard."""
    from prometheus_client import generate_latest

    m = WorkerMetrics()
    text = generate_latest(m.registry).decode()
    for task in ("retention", "progress", "dead_letter", "lag"):
        assert f'obshub_streams_housekeeping_errors_total{{task="{task}"}} 0.0' in text, text
    m.housekeeping_errors.labels("lag").inc()
    assert 'obshub_streams_housekeeping_errors_total{task="lag"} 1.0' in generate_latest(m.registry).decode()
