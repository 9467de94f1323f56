"""Prometheus Alertmanager API v2 (``POST <url>/api/v2/alerts``, https://prometheus.io/docs/alerting/latest/clients/).

Body: a JSON array of ``{"labels", "annotations", "startsAt", "endsAt", "generatorURL"}``, timestamps
RFC 3339. Alertmanager expects clients to re-send firing alerts (every 30 s to 3 min): the dispatcher
re-sends to this sink every ``resend_every`` while an alert fires, and, as Prometheus does, a firing
alert carries ``endsAt = now + 4 * resend_every`` so Alertmanager resolves it by itself if obshub dies.
A resolved alert carries its real ``endsAt``. Requests carry at most ``MAX_BATCH`` alerts (as Prometheus
sends them). ``annotations.runbook_url`` is the rule's runbook link when the engine could make one."""

from __future__ import annotations

import time
from typing import Any

from obshub.rules.lifecycle import rfc3339
from obshub.rules.sinks.base import Notification, Sink

MAX_BATCH = 64


class AlertmanagerSink(Sink):
    """Pushes alerts to an Alertmanager (``url`` = its base URL, e.g. http://alertmanager:9093)."""

    kind = "alertmanager"

    def __init__(self, name: str, url: str, min_severity: str = "info", resend_every_s: float = 60.0):
        super().__init__(name, min_severity, resend_every_s)
        self.url = url.rstrip("/") + "/api/v2/alerts"

    def alert(self, a: dict, now_ns: int | None = None) -> dict[str, Any]:
        """One postableAlert."""
        now_ns = now_ns if now_ns is not None else time.time_ns()
        if a["status"] == "resolved":
            ends = a.get("ends_at") or rfc3339(now_ns)
        else:
            ends = rfc3339(now_ns + int(4 * self.resend_every_s * 1e9))
        out = {
            "labels": {k: str(v) for k, v in a["labels"].items()},
            "annotations": {k: str(v) for k, v in a.get("annotations", {}).items()},
            "startsAt": a.get("starts_at") or rfc3339(now_ns),
            "endsAt": ends,
        }
        if a.get("generator_url"):
            out["generatorURL"] = a["generator_url"]
        return out

    def requests(self, n: Notification) -> list[tuple[str, Any]]:
        alerts = [self.alert(a) for a in n.alerts]
        return [(self.url, alerts[i : i + MAX_BATCH]) for i in range(0, len(alerts), MAX_BATCH)]
