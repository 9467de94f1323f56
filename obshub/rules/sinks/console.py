"""Console sink: one line per alert on stdout (or a given stream), for local runs and debugging."""

from __future__ import annotations

import sys
from typing import TextIO

import httpx

from obshub.rules.sinks.base import DeliveryPolicy, DeliveryResult, Notification, Sink


class ConsoleSink(Sink):
    """Prints ``[FIRING] rule {labels} summary`` lines; never fails."""

    kind = "console"

    def __init__(self, name: str = "console", min_severity: str = "info", stream: TextIO | None = None):
        super().__init__(name, min_severity)
        self.stream = stream

    def line(self, a: dict) -> str:
        """The text line for one alert."""
        labels = ",".join(f"{k}={v}" for k, v in sorted(a["labels"].items()))
        return f"[{a['status'].upper()}] {a['rule']} {{{labels}}} {a.get('annotations', {}).get('summary', '')}"

    def send(self, client: httpx.Client, n: Notification, policy: DeliveryPolicy) -> DeliveryResult:
        out = self.stream or sys.stdout
        for a in n.alerts:
            print(self.line(a), file=out, flush=True)
        return DeliveryResult(self.name, True, 1)
