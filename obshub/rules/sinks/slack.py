"""Slack incoming webhook with Block Kit (https://api.slack.com/messaging/webhooks,
https://api.slack.com/reference/block-kit/blocks).

Payload: ``{"text": <fallback>, "blocks": [header, section per alert (max 10), context]}``. Limits
respected: header plain_text 150 chars, section text 3000 chars, 50 blocks per message.

Everything that comes from events (labels, annotations, host and process names) is escaped for mrkdwn
(``&`` -> ``&amp;``, ``<`` -> ``&lt;``, ``>`` -> ``&gt;``), so ``<!channel>`` or ``<@U123>`` in a process
name cannot ping anyone and ``<http://x|y>`` cannot forge a link. Text is truncated *before* escaping
(``escape_truncated``), so an entity is never cut in half."""

from __future__ import annotations

from typing import Any

from pydantic import SecretStr

from obshub.rules.sinks.base import Notification, Sink, secret_value

HEADER_MAX = 150
SECTION_MAX = 3000
MAX_ALERTS_SHOWN = 10
_ESC = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_ICON = {"firing": ":rotating_light:", "resolved": ":white_check_mark:"}


def escape(text: str) -> str:
    """Escape Slack's three control characters (&, <, >)."""
    return "".join(_ESC.get(c, c) for c in text)


def escape_truncated(text: str, limit: int) -> str:
    """Escape ``text`` keeping the result within ``limit`` characters: characters are dropped from the
    end *before* escaping (and an ellipsis added), so no ``&amp;`` is ever cut."""
    out, used = [], 0
    for i, c in enumerate(text):
        e = _ESC.get(c, c)
        rest = len(text) - i - 1
        if used + len(e) > limit - (1 if rest else 0):
            out.append("…")
            return "".join(out)
        out.append(e)
        used += len(e)
    return "".join(out)


class SlackSink(Sink):
    """Posts one Block Kit message per notification to the incoming-webhook URL (a secret)."""

    kind = "slack"

    def __init__(self, name: str, url: SecretStr, min_severity: str = "info"):
        super().__init__(name, min_severity)
        self._url = url
        self._register()

    @property
    def secrets(self) -> list[str]:
        return [secret_value(self._url)]

    def payload(self, n: Notification) -> dict[str, Any]:
        """The Block Kit JSON body for ``n``."""
        firing = [a for a in n.alerts if a["status"] == "firing"]
        resolved = [a for a in n.alerts if a["status"] == "resolved"]
        rule = n.alerts[0]["rule"] if n.alerts else "obshub"
        head = f"{n.status.upper()}: {rule}" + (
            f" ({len(firing)} firing, {len(resolved)} resolved)" if len(n.alerts) > 1 else ""
        )
        blocks: list[dict] = [{"type": "header", "text": {"type": "plain_text", "text": head[:HEADER_MAX]}}]
        for a in n.alerts[:MAX_ALERTS_SHOWN]:
            blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": self._alert_text(a)}})
        more = len(n.alerts) - MAX_ALERTS_SHOWN
        ctx = f"obshub rules · group {escape_truncated(_labels(n.group_labels), 1000)}"
        if more > 0:
            ctx += f" · {more} more alert(s) not shown"
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": ctx}]})
        first = n.alerts[0] if n.alerts else {"annotations": {}}
        fallback = f"{n.status.upper()} {rule}: " + first["annotations"].get("summary", "")
        return {"text": escape_truncated(fallback, SECTION_MAX), "blocks": blocks}

    @staticmethod
    def _alert_text(a: dict) -> str:
        ann = a.get("annotations", {})
        icon = _ICON.get(a["status"], "")
        parts = [
            f"{icon} *{escape_truncated(ann.get('summary', a['rule']), 500)}*",
            f"*severity* {a['severity']} · *labels* {escape_truncated(_labels(a['labels']), 600)}",
        ]
        if ann.get("evidence"):
            parts.append(f"*evidence* {escape_truncated(ann['evidence'], 1200)}")
        if ann.get("runbook"):
            parts.append(f"*runbook* {escape_truncated(ann['runbook'], 300)}")
        if a["status"] == "resolved" and a.get("ends_at"):
            parts.append(f"resolved at {a['ends_at']}")
        return "\n".join(parts)[:SECTION_MAX]

    def requests(self, n: Notification) -> list[tuple[str, Any]]:
        return [(secret_value(self._url), self.payload(n))]


def _labels(labels: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))
