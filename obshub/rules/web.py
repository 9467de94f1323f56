"""The rule engine's HTTP endpoint (one port, ``--metrics-port``): Prometheus metrics, health probes, and
the pages an alert's ``generatorURL`` leads to.

Routes:

- ``/metrics``       Prometheus text format (the default registry of this process)
- ``/-/healthy``     200 while the process runs (Kubernetes liveness probe)
- ``/-/ready``       200 once both loops run and the rules are loaded, else 503 (readiness probe)
- ``/rules``         HTML: every rule (anchor ``#<rule id>``) with its description, severity, runbook link
                     and the alerts of it pending or firing now. ``generatorURL`` of every alert is
                     ``<external_url>/rules#<rule id>``.
- ``/api/v1/alerts`` JSON: ``{"alerts": [{rule, state, labels, annotations, active_since, fired_at}]}``

Served by the standard library's WSGI server in a daemon thread (as prometheus-client does), so a
scrape never waits for rule evaluation. The page reads the engine without its lock: a scrape may show
a state one evaluation old.
"""

from __future__ import annotations

import html
import json
import threading
from typing import Callable
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import REGISTRY, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from obshub.rules.lifecycle import rfc3339


class _Quiet(WSGIRequestHandler):
    def log_message(self, *_args) -> None:  # scrapes every few seconds would flood the log
        pass


def runbook_url(runbook: str, base: str) -> str:
    """A link for a rule's ``runbook``: itself when it is a URL, else ``base`` + the repository path
    (``docs/RULES.md#x`` with base ``https://git.example/obshub/blob/main/``); empty without a base."""
    if runbook.startswith(("http://", "https://")):
        return runbook
    if runbook and base:
        return base.rstrip("/") + "/" + runbook.lstrip("/")
    return ""


class RulesWeb:
    """WSGI application over a running ``RuleService`` (``svc``: needs ``ruleset``, ``engine``,
    ``config``); ``ready()`` says whether the readiness probe passes."""

    def __init__(self, svc, ready: Callable[[], bool]):
        self.svc, self.ready = svc, ready
        self.metrics = make_wsgi_app(REGISTRY)

    def __call__(self, environ, start_response):
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return self.metrics(environ, start_response)
        if path == "/-/healthy":
            return self._send(start_response, "200 OK", "text/plain", "ok\n")
        if path == "/-/ready":
            ok = self.ready()
            return self._send(
                start_response,
                "200 OK" if ok else "503 Service Unavailable",
                "text/plain",
                "ready\n" if ok else "starting\n",
            )
        if path == "/api/v1/alerts":
            return self._send(start_response, "200 OK", "application/json", json.dumps({"alerts": self.alerts()}))
        if path in ("/", "/rules"):
            return self._send(start_response, "200 OK", "text/html; charset=utf-8", self.page())
        return self._send(
            start_response,
            "404 Not Found",
            "text/plain",
            "not found: /metrics, /rules, /api/v1/alerts, /-/healthy, /-/ready\n",
        )

    @staticmethod
    def _send(start_response, status: str, ctype: str, body: str):
        data = body.encode()
        start_response(status, [("Content-Type", ctype), ("Content-Length", str(len(data)))])
        return [data]

    def alerts(self) -> list[dict]:
        """Alerts pending or firing now, JSON-able."""
        out = []
        for i in list(self.svc.engine.active()):
            out.append(
                {
                    "rule": i.rule,
                    "state": i.state,
                    "labels": i.labels,
                    "annotations": i.annotations,
                    "active_since": rfc3339(i.active_since_ns) if i.active_since_ns else "",
                    "fired_at": rfc3339(i.fired_at_ns) if i.fired_at_ns else "",
                }
            )
        return out

    def page(self) -> str:
        """The /rules page."""
        e = html.escape
        active: dict[str, list[dict]] = {}
        for a in self.alerts():
            active.setdefault(a["rule"], []).append(a)
        base = getattr(self.svc.config, "runbook_base_url", "")
        parts = [
            "<!doctype html><html><head><meta charset='utf-8'><title>obshub rules</title>",
            "<style>body{font-family:sans-serif;max-width:70em;margin:auto}h2{margin-top:2em}"
            "td,th{padding:2px 8px;text-align:left;vertical-align:top}.firing{color:#b00}</style></head><body>",
            f"<h1>obshub rule engine: {len(self.svc.ruleset.rules)} rules, "
            f"{sum(len(v) for v in active.values())} active alerts</h1>",
        ]
        for rid, r in sorted(self.svc.ruleset.rules.items()):
            link = runbook_url(r.runbook, base)
            rb = (f"<a href='{e(link)}'>{e(r.runbook)}</a>" if link else e(r.runbook)) or "-"
            parts.append(
                f"<h2 id='{e(rid)}'>{e(rid)}</h2><p>{e(r.description)}</p>"
                f"<table><tr><th>severity</th><td>{e(r.severity)}</td></tr>"
                f"<tr><th>signal</th><td>{e(r.signal)}</td></tr>"
                f"<tr><th>runbook</th><td>{rb}</td></tr>"
                f"<tr><th>file</th><td>{e(str(r.file))}:{r.line}</td></tr></table>"
            )
            rows = active.get(rid, [])
            if rows:
                parts.append("<table><tr><th>state</th><th>labels</th><th>since</th><th>summary</th></tr>")
                for a in rows:
                    labels = ", ".join(f"{k}={v}" for k, v in sorted(a["labels"].items()))
                    parts.append(
                        f"<tr class='{e(a['state'])}'><td>{e(a['state'])}</td><td>{e(labels)}</td>"
                        f"<td>{e(a['fired_at'] or a['active_since'])}</td>"
                        f"<td>{e(str(a['annotations'].get('summary', '')))}</td></tr>"
                    )
                parts.append("</table>")
            else:
                parts.append("<p>no active alerts</p>")
        parts.append("</body></html>")
        return "".join(parts)


def serve(app: RulesWeb, port: int, addr: str = "0.0.0.0"):
    """Serve ``app`` on ``addr``:``port`` (0 = any free port) in a daemon thread; returns the server
    (``server_port`` holds the bound port). Raises OSError when the address cannot be bound."""
    server = make_server(addr, port, app, ThreadingWSGIServer, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="rules-http", daemon=True).start()
    return server
