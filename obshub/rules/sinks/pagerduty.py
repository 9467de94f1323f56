"""PagerDuty Events API v2 (https://developer.pagerduty.com/docs/events-api-v2/trigger-events/).

One event per alert, ``POST https://events.pagerduty.com/v2/enqueue``:

* firing   -> ``{"routing_key", "event_action": "trigger", "dedup_key", "payload": {"summary" (<= 1024 chars),
  "source", "severity", "timestamp", "component", "group", "class", "custom_details"}, "client",
  "client_url", "links"}``
* resolved -> ``{"routing_key", "event_action": "resolve", "dedup_key"}``

The dedup key (``dedup_key``) is ``obshub/<rule>/<fingerprint>``: stable across restarts (the
fingerprint comes from the labels) and at most 255 characters (PagerDuty's limit; longer prefixes are
hashed). Severity maps one to one (obshub uses PagerDuty's four levels). Success is HTTP 202."""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import SecretStr

from obshub.rules.sinks.base import Notification, Sink, secret_value

DEFAULT_URL = "https://events.pagerduty.com/v2/enqueue"
DEDUP_MAX = 255
SUMMARY_MAX = 1024
SEVERITY_MAP = {"critical": "critical", "error": "error", "warning": "warning", "info": "info"}


def dedup_key(alert: dict, prefix: str = "obshub") -> str:
    """Stable PagerDuty dedup key of an alert, <= 255 characters."""
    key = f"{prefix}/{alert['rule']}/{alert['fingerprint']}"
    if len(key) <= DEDUP_MAX:
        return key
    return f"{prefix[:100]}/{hashlib.sha256(key.encode()).hexdigest()}"[:DEDUP_MAX]


class PagerDutySink(Sink):
    """Triggers and resolves PagerDuty alerts with the integration's routing key (a secret)."""

    kind = "pagerduty"

    def __init__(
        self,
        name: str,
        routing_key: SecretStr,
        url: str = DEFAULT_URL,
        min_severity: str = "info",
        dedup_prefix: str = "obshub",
    ):
        super().__init__(name, min_severity)
        self._key, self.url, self.dedup_prefix = routing_key, url, dedup_prefix
        self._register()

    @property
    def secrets(self) -> list[str]:
        return [secret_value(self._key)]

    def event(self, a: dict) -> dict[str, Any]:
        """The Events API v2 body for one alert change."""
        key = secret_value(self._key)
        dk = dedup_key(a, self.dedup_prefix)
        if a["status"] == "resolved":
            return {"routing_key": key, "event_action": "resolve", "dedup_key": dk}
        ann, labels = a.get("annotations", {}), a.get("labels", {})
        summary = ann.get("summary") or f"{a['rule']} {labels}"
        body: dict[str, Any] = {
            "routing_key": key,
            "event_action": "trigger",
            "dedup_key": dk,
            "payload": {
                "summary": summary[:SUMMARY_MAX],
                "source": labels.get("host") or labels.get("job") or "obshub",
                "severity": SEVERITY_MAP[a["severity"]],
                "timestamp": a.get("starts_at") or None,
                "component": labels.get("layer", ""),
                "group": labels.get("job", ""),
                "class": a["rule"],
                "custom_details": {"labels": labels, "annotations": ann, "value": a.get("value")},
            },
            "client": "obshub",
            "client_url": a.get("generator_url") or None,
        }
        if str(ann.get("runbook", "")).startswith(("http://", "https://")):
            body["links"] = [{"href": ann["runbook"], "text": "runbook"}]
        body["payload"] = {k: v for k, v in body["payload"].items() if v not in (None, "")}
        return {k: v for k, v in body.items() if v is not None}

    def requests(self, n: Notification) -> list[tuple[str, Any]]:
        return [(self.url, self.event(a)) for a in n.alerts]
