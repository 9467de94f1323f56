"""The ``deep_dive`` sink: not a notification but an action. For every firing alert that names a host
(the ``host`` label: every straggler, stall and layer rule carries it, from the straggler analysis or the
step's culprit), ask that host's agent for a deep dive through the control topic
(:class:`obshub.core.control.DeepDiveTrigger`): the agent attaches the per-launch CUDA uprobes of the
deep-dive tier for ``steps`` steps of each rank (at most ``max_time``), then detaches them, so the launch
counts, call times and slow launches of the suspect host's next steps arrive on the events topic.

Rate limits (the trigger's): one request per host every ``host_every`` (default 10 m), at most
``max_per_hour`` (default 12) across all hosts. Alerts without the label, resolved alerts and alerts
below ``min_severity`` (default ``warning``) ask nothing. Config::

    sinks:
      - {name: dive, type: deep_dive, min_severity: warning, steps: 20, max_time: 2m, host_every: 10m}

Time from the alert to the first deep-dive data: the route's ``group_wait`` (the dispatcher's, shared by
every sink) + the agent's control poll (0.2 s) + the attach (12-17 ms measured) + the rest of the step
in flight + the agent's batch age; the end-to-end test bounds request -> data (docs/AGENT.md).
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

from obshub.rules.sinks.base import DeliveryPolicy, DeliveryResult, Notification, Sink

log = logging.getLogger("obshub.rules.sinks")


class DeepDiveSink(Sink):
    """Asks the agent of the host an alert names for a deep dive (see the module docstring).
    ``trigger``: a :class:`obshub.core.control.DeepDiveTrigger` (or anything with its ``request(host,
    by)``); ``host_label``: the alert label that names the host."""

    kind = "deep_dive"

    def __init__(self, name: str, trigger: Any, min_severity: str = "warning", host_label: str = "host"):
        super().__init__(name, min_severity)
        self.trigger, self.host_label = trigger, host_label

    def hosts(self, n: Notification) -> dict[str, str]:
        """host -> the rule that named it, for the firing alerts of ``n`` that carry the host label."""
        out: dict[str, str] = {}
        for a in n.alerts:
            host = (a.get("labels") or {}).get(self.host_label)
            if a.get("status") == "firing" and isinstance(host, str) and host:
                out.setdefault(host, str(a.get("rule", "")))
        return out

    def send(self, client: httpx.Client, n: Notification, policy: DeliveryPolicy) -> DeliveryResult:
        """Request a deep dive per named host (rate-limited). Never raises; a broker that did not take a
        request is reported as a failed delivery naming the host."""
        errors = []
        asked = 0
        for host, rule in self.hosts(n).items():
            try:
                if self.trigger.request(host, by=f"rule {rule}" if rule else "rules") is not None:
                    asked += 1
            except (ValueError, RuntimeError) as exc:
                errors.append(f"{host}: {exc}")
            except Exception as exc:  # noqa: BLE001 - the broker client's own errors (KafkaException, BufferError,
                # the admin's): reported as a failed delivery (obshub_rules_deliveries{outcome="gave_up"})
                errors.append(f"{host}: {type(exc).__name__}: {exc}")
        err = "; ".join(errors)
        if err:
            log.warning("sink %s (deep_dive) could not ask: %s", self.name, err)
        return DeliveryResult(self.name, not errors, max(asked, 1), err)
