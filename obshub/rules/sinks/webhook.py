"""Generic JSON webhook, in Alertmanager's webhook format (version "4",
https://prometheus.io/docs/alerting/latest/configuration/#webhook_config) so existing receivers work:
``{"version", "groupKey", "status", "receiver", "groupLabels", "commonLabels", "commonAnnotations",
"externalURL", "alerts": [{"status", "labels", "annotations", "startsAt", "endsAt", "generatorURL",
"fingerprint"}]}``. The URL is a secret (it often embeds a token)."""

from __future__ import annotations

from typing import Any

from pydantic import SecretStr

from obshub.rules.sinks.base import Notification, Sink, secret_value


def _common(dicts: list[dict]) -> dict:
    if not dicts:
        return {}
    first = dicts[0]
    return {k: v for k, v in first.items() if all(d.get(k) == v for d in dicts[1:])}


class WebhookSink(Sink):
    """POSTs one JSON document per notification."""

    kind = "webhook"

    def __init__(self, name: str, url: SecretStr, min_severity: str = "info", external_url: str = ""):
        super().__init__(name, min_severity)
        self._url, self.external_url = url, external_url
        self._register()

    @property
    def secrets(self) -> list[str]:
        return [secret_value(self._url)]

    def payload(self, n: Notification) -> dict[str, Any]:
        """The webhook body for ``n``."""
        alerts = [
            {
                "status": a["status"],
                "labels": a["labels"],
                "annotations": a.get("annotations", {}),
                "startsAt": a.get("starts_at", ""),
                "endsAt": a.get("ends_at") or "0001-01-01T00:00:00Z",
                "generatorURL": a.get("generator_url", ""),
                "fingerprint": a["fingerprint"],
            }
            for a in n.alerts
        ]
        return {
            "version": "4",
            "groupKey": n.group_key,
            "truncatedAlerts": 0,
            "status": n.status,
            "receiver": self.name,
            "groupLabels": n.group_labels,
            "commonLabels": _common([a["labels"] for a in n.alerts]),
            "commonAnnotations": _common([a.get("annotations", {}) for a in n.alerts]),
            "externalURL": self.external_url,
            "alerts": alerts,
        }

    def requests(self, n: Notification) -> list[tuple[str, Any]]:
        return [(secret_value(self._url), self.payload(n))]
