"""A local HTTP receiver standing in for Slack, PagerDuty, Alertmanager and a generic webhook, so the
demo's alerts can be inspected in a file. Each request is checked against the service's documented
payload format and appended as one JSON line to ``path``::

    {"received_ns": int, "path": str, "service": "slack"|"pagerduty"|"alertmanager"|"webhook",
     "valid": bool, "problem": str, "body": <the JSON body>}

Endpoints (``http://127.0.0.1:<port>``) and the formats checked:

- ``/slack`` — Slack incoming webhook: an object with a non-empty ``text`` string or a ``blocks`` list
  (api.slack.com/messaging/webhooks);
- ``/pagerduty`` (also ``/v2/enqueue``) — PagerDuty Events API v2: ``routing_key``, ``event_action`` in
  trigger/acknowledge/resolve, ``dedup_key`` for acknowledge/resolve, and for trigger a ``payload`` with
  ``summary``, ``source`` and ``severity`` in critical/error/warning/info
  (developer.pagerduty.com/docs/events-api-v2/trigger-events);
- ``/alertmanager`` (also ``/api/v2/alerts``) — Alertmanager API v2: a list of alerts, each with a
  ``labels`` object (prometheus.io/docs/alerting/latest/clients);
- anything else — a generic webhook: any JSON value.

Slack and PagerDuty answer 200/202 like the real services; a body that is not JSON gets 400.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

PD_SEVERITIES = {"critical", "error", "warning", "info"}


def check_slack(body) -> str:
    """Empty string when ``body`` is a valid Slack incoming-webhook message, else what is wrong."""
    if not isinstance(body, dict):
        return "Slack payload must be a JSON object"
    if isinstance(body.get("text"), str) and body["text"].strip():
        return ""
    if isinstance(body.get("blocks"), list) and body["blocks"]:
        return ""
    return "Slack payload needs a non-empty 'text' or 'blocks'"


def check_pagerduty(body) -> str:
    """Empty string when ``body`` is a valid PagerDuty Events API v2 event, else what is wrong."""
    if not isinstance(body, dict):
        return "PagerDuty event must be a JSON object"
    if not isinstance(body.get("routing_key"), str) or not body["routing_key"]:
        return "PagerDuty event needs 'routing_key'"
    action = body.get("event_action")
    if action not in ("trigger", "acknowledge", "resolve"):
        return f"PagerDuty 'event_action' must be trigger, acknowledge or resolve, not {action!r}"
    if action != "trigger":
        return "" if body.get("dedup_key") else f"PagerDuty {action} needs 'dedup_key'"
    p = body.get("payload")
    if not isinstance(p, dict):
        return "PagerDuty trigger needs a 'payload' object"
    for key in ("summary", "source", "severity"):
        if not p.get(key):
            return f"PagerDuty payload needs '{key}'"
    if p["severity"] not in PD_SEVERITIES:
        return f"PagerDuty severity {p['severity']!r} is not one of {sorted(PD_SEVERITIES)}"
    return ""


def check_alertmanager(body) -> str:
    """Empty string when ``body`` is a valid Alertmanager API v2 ``POST /api/v2/alerts`` list."""
    if not isinstance(body, list) or not body:
        return "Alertmanager expects a non-empty JSON list of alerts"
    for i, a in enumerate(body):
        if not isinstance(a, dict) or not isinstance(a.get("labels"), dict) or not a["labels"]:
            return f"alert {i} needs a non-empty 'labels' object"
    return ""


ROUTES = {
    "/slack": ("slack", check_slack),
    "/pagerduty": ("pagerduty", check_pagerduty),
    "/v2/enqueue": ("pagerduty", check_pagerduty),
    "/alertmanager": ("alertmanager", check_alertmanager),
    "/api/v2/alerts": ("alertmanager", check_alertmanager),
}


class WebhookReceiver:
    """The receiver: ``start()`` serves on 127.0.0.1 (``port`` 0 = any free port) in a thread,
    ``url(service)`` gives an endpoint, ``records()`` reads back what arrived, ``stop()`` ends it."""

    def __init__(self, path: Path, port: int = 0):
        self.path = Path(path)
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's naming)
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n)
                try:
                    body = json.loads(raw or b"null")
                except ValueError:
                    self.send_response(400)
                    self.end_headers()
                    receiver._append(self.path, "?", False, "body is not JSON", raw.decode(errors="replace"))
                    return
                service, check = ROUTES.get(self.path.split("?")[0], ("webhook", lambda b: ""))
                problem = check(body)
                receiver._append(self.path, service, not problem, problem, body)
                self.send_response(202 if service == "pagerduty" else 200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"status":"success"}' if service == "pagerduty" else b"ok")

            def log_message(self, *_args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="webhook", daemon=True)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def url(self, service: str = "webhook") -> str:
        """The endpoint URL for ``service`` (slack, pagerduty, alertmanager, webhook)."""
        return f"http://127.0.0.1:{self.port}/{service}"

    def start(self) -> "WebhookReceiver":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _append(self, path: str, service: str, valid: bool, problem: str, body) -> None:
        line = json.dumps(
            {
                "received_ns": time.time_ns(),
                "path": path,
                "service": service,
                "valid": valid,
                "problem": problem,
                "body": body,
            }
        )
        with self._lock, open(self.path, "a") as f:
            f.write(line + "\n")

    def records(self) -> list[dict]:
        """Every request received so far, in order."""
        if not self.path.exists():
            return []
        return [json.loads(x) for x in self.path.read_text().splitlines() if x.strip()]
