"""The worker's Faust app without a broker: Faust's per-message statistics hooks are no-ops, and a failed
produce call still reaches the worker's own sensor (logged and counted)."""

from __future__ import annotations

from streams.app import _STATISTICS_HOOKS, WorkerConfig, _faust_app
from streams.metrics import WorkerMetrics


def test_statistics_hooks_are_no_ops_and_send_errors_are_still_counted():
    m = WorkerMetrics()
    app = _faust_app(WorkerConfig(app_id="sensors-test"), m)
    for name in _STATISTICS_HOOKS:
        assert getattr(app.sensors, name)(None, None, None, None) is None
    state = app.sensors.on_send_initiated(None, "t", None, 1, 1)
    app.sensors.on_send_error(None, RuntimeError("broker gone"), state)
    assert m.send_errors._value.get() == 1
