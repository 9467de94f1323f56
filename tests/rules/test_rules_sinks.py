"""Every sink against a local HTTP server that checks the real service's documented payload field by
field (Slack Block Kit webhook, PagerDuty Events API v2, Alertmanager API v2, Alertmanager-format
webhook) and answers 429 with Retry-After, 500, slow responses and 4xx on demand. Also: escaping,
dedup keys, secrets never in logs, and one sink's outage not blocking another."""

from __future__ import annotations

import io
import json
import logging
import re
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from pydantic import SecretStr

from obshub.rules.dispatch import Dispatcher
from obshub.rules.lifecycle import fingerprint, rfc3339
from obshub.rules.model import InhibitRule
from obshub.rules.silences import SilenceStore
from obshub.rules.sinks.alertmanager import AlertmanagerSink
from obshub.rules.sinks.base import DeliveryPolicy, Notification
from obshub.rules.sinks.config import AlertingConfig, Route, SinkSpec, build_sinks
from obshub.rules.sinks.console import ConsoleSink
from obshub.rules.sinks.pagerduty import PagerDutySink, dedup_key
from obshub.rules.sinks.slack import SECTION_MAX, SlackSink, escape_truncated
from obshub.rules.sinks.webhook import WebhookSink

FAST = DeliveryPolicy(max_attempts=4, max_elapsed_s=20, timeout_s=2, backoff_initial_s=0.01, backoff_max_s=0.05)


class HttpRecorder:
    """A local HTTP server: records every POST (path, headers, JSON body) and answers from a plan of
    ``(status, headers, delay_s)`` entries, then with ``default``."""

    def __init__(self, default=(200, {}, 0.0), body: str = "ok"):
        self.requests: list[dict] = []
        self.plan: list[tuple[int, dict, float]] = []
        self.default, self.body = default, body
        self.validator = None  # callable(path, json) raising AssertionError on a malformed payload
        self.errors: list[str] = []
        rec = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = json.loads(raw)
                rec.requests.append(
                    {"path": self.path, "headers": dict(self.headers), "json": body, "t": time.monotonic()}
                )
                if rec.validator:
                    try:
                        rec.validator(self.path, body)
                    except AssertionError as exc:
                        rec.errors.append(str(exc))
                        self._answer(400, {}, f"invalid payload: {exc}")
                        return
                status, headers, delay = rec.plan.pop(0) if rec.plan else rec.default
                time.sleep(delay)
                self._answer(status, headers, rec.body if status < 400 else f"error at {self.path}")

            def _answer(self, status, headers, text):
                data = text.encode()
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorder():
    servers = []

    def make(**kw) -> HttpRecorder:
        s = HttpRecorder(**kw)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


def alert(status="firing", rule="rdma_slow_completion_on_straggler", severity="critical", **ann) -> dict:
    labels = {"alertname": rule, "severity": severity, "job": "llm", "host": "node2", "layer": "nic"}
    now = 1_767_225_600_000_000_000
    return {
        "v": 1,
        "fingerprint": fingerprint(labels),
        "rule": rule,
        "status": status,
        "severity": severity,
        "labels": labels,
        "annotations": {"summary": "node2 held back step 7", "step": "7", **ann},
        "starts_at": rfc3339(now),
        "ends_at": rfc3339(now + 60 * 10**9) if status == "resolved" else "",
        "starts_at_ns": now,
        "ends_at_ns": now + 60 * 10**9 if status == "resolved" else 0,
        "updated_at_ns": now,
        "value": 1.0,
        "routes": [],
        "generator_url": "http://localhost:9099/rules#x",
    }


def notif(*alerts) -> Notification:
    return Notification("g1", {"alertname": alerts[0]["rule"], "job": "llm"}, list(alerts))


def is_rfc3339(s: str) -> bool:
    return (
        bool(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)", s))
        and datetime.fromisoformat(s.replace("Z", "+00:00")) is not None
    )


# ---------------------------------------------------------------------------------------------- Slack
def check_slack(path: str, body: dict) -> None:
    """Slack incoming webhook + Block Kit: text fallback, blocks <= 50, header plain_text <= 150,
    section mrkdwn <= 3000, context elements; no unescaped control characters from events."""
    assert set(body) == {"text", "blocks"}, body.keys()
    assert isinstance(body["text"], str) and body["text"]
    blocks = body["blocks"]
    assert 1 <= len(blocks) <= 50
    assert blocks[0]["type"] == "header" and blocks[0]["text"]["type"] == "plain_text"
    assert len(blocks[0]["text"]["text"]) <= 150
    for b in blocks[1:]:
        assert b["type"] in ("section", "context", "divider")
        if b["type"] == "section":
            assert b["text"]["type"] == "mrkdwn" and 0 < len(b["text"]["text"]) <= 3000
        if b["type"] == "context":
            assert 1 <= len(b["elements"]) <= 10 and all(e["type"] == "mrkdwn" for e in b["elements"])
    texts = [body["text"]] + [b["text"]["text"] for b in blocks if b["type"] == "section"]
    for t in texts:
        assert "<" not in t and ">" not in t, t
        assert not re.search(r"&(?!amp;|lt;|gt;)", t), f"bare or cut entity in {t!r}"


def test_slack_payload_and_escaping(recorder):
    srv = recorder()
    srv.validator = check_slack
    sink = SlackSink("slack", SecretStr(srv.url + "/services/T000/B000/XXXX"))
    evil = alert(evidence="process <!channel> & <@U123> <http://evil|click> " + "&" * 5000)
    res = sink.send(httpx.Client(), notif(evil, alert("resolved", severity="critical")), FAST)
    assert res.ok and res.attempts == 1, (res, srv.errors)
    body = srv.requests[0]["json"]
    assert srv.requests[0]["path"] == "/services/T000/B000/XXXX"
    section = body["blocks"][1]["text"]["text"]
    assert "&lt;!channel&gt; &amp; &lt;@U123&gt; &lt;http://evil|click&gt;" in section
    assert body["blocks"][0]["text"]["text"].startswith("FIRING: rdma_slow_completion_on_straggler")
    assert "resolved at" in body["blocks"][2]["text"]["text"]


def test_escape_truncated_never_cuts_an_entity():
    out = escape_truncated("<" * 100, 22)
    assert out == "&lt;" * 5 + "…" and len(out) <= 22
    assert escape_truncated("a&b", 10) == "a&amp;b"
    long = escape_truncated("x&" * 4000, SECTION_MAX)
    assert len(long) <= SECTION_MAX and long.endswith("…") and not re.search(r"&(?!amp;)", long[:-1])


# ------------------------------------------------------------------------------------------ PagerDuty
def check_pagerduty(path: str, body: dict) -> None:
    """Events API v2: routing_key, event_action, dedup_key <= 255; trigger needs payload.summary
    (<= 1024), source, severity in the four levels; resolve carries no payload."""
    assert path == "/v2/enqueue"
    assert body["routing_key"] == "R0UT1NGKEY000000000000000000000X"
    assert body["event_action"] in ("trigger", "resolve")
    assert 0 < len(body["dedup_key"]) <= 255
    if body["event_action"] == "resolve":
        assert set(body) == {"routing_key", "event_action", "dedup_key"}
        return
    p = body["payload"]
    assert 0 < len(p["summary"]) <= 1024 and p["source"] and p["severity"] in ("critical", "error", "warning", "info")
    assert is_rfc3339(p["timestamp"])
    assert set(p) <= {"summary", "source", "severity", "timestamp", "component", "group", "class", "custom_details"}
    assert set(body) <= {
        "routing_key",
        "event_action",
        "dedup_key",
        "payload",
        "client",
        "client_url",
        "links",
        "images",
    }


def test_pagerduty_trigger_resolve_same_key(recorder):
    srv = recorder(
        default=(202, {"Content-Type": "application/json"}, 0.0),
        body='{"status":"success","message":"Event processed","dedup_key":"x"}',
    )
    srv.validator = check_pagerduty
    sink = PagerDutySink("pd", SecretStr("R0UT1NGKEY000000000000000000000X"), url=srv.url + "/v2/enqueue")
    a = alert(summary="s" * 3000, runbook="https://runbooks.example/rdma")
    assert sink.send(httpx.Client(), notif(a), FAST).ok, srv.errors
    assert sink.send(httpx.Client(), notif(alert("resolved")), FAST).ok, srv.errors
    trig, res = srv.requests[0]["json"], srv.requests[1]["json"]
    assert trig["event_action"] == "trigger" and res["event_action"] == "resolve"
    assert trig["dedup_key"] == res["dedup_key"] == f"obshub/{a['rule']}/{a['fingerprint']}"
    assert trig["payload"]["severity"] == "critical" and trig["payload"]["source"] == "node2"
    assert trig["payload"]["component"] == "nic" and trig["payload"]["group"] == "llm"
    assert len(trig["payload"]["summary"]) == 1024 and trig["links"][0]["href"] == "https://runbooks.example/rdma"
    for sev in ("error", "warning", "info"):
        assert sink.event(alert(severity=sev))["payload"]["severity"] == sev


def test_dedup_keys_stable_and_bounded():
    a = alert()
    assert dedup_key(a) == dedup_key(dict(a)) == dedup_key(alert())
    long = dedup_key({**a, "rule": "r" * 400})
    assert len(long) <= 255 and long == dedup_key({**a, "rule": "r" * 400})
    assert dedup_key({**a, "rule": "r" * 400}, prefix="p" * 300) != long and len(dedup_key(a, "p" * 300)) <= 255
    # the fingerprint depends on labels only, not their order nor the annotations
    assert fingerprint({"a": "1", "b": "2"}) == fingerprint({"b": "2", "a": "1"})


# ------------------------------------------------------------------------------------- Alertmanager
def check_alertmanager(path: str, body) -> None:
    """POST /api/v2/alerts: an array of postableAlert {labels (alertname required), annotations,
    startsAt, endsAt, generatorURL}, timestamps RFC 3339."""
    assert path == "/api/v2/alerts"
    assert isinstance(body, list) and body
    for a in body:
        assert set(a) <= {"labels", "annotations", "startsAt", "endsAt", "generatorURL"}
        assert a["labels"]["alertname"] and all(isinstance(v, str) for v in a["labels"].values())
        assert all(isinstance(v, str) for v in a["annotations"].values())
        assert is_rfc3339(a["startsAt"]) and is_rfc3339(a["endsAt"])
        assert a["generatorURL"].startswith("http")


def test_alertmanager_resends_while_firing_and_ends_on_resolve(recorder):
    srv = recorder()
    srv.validator = check_alertmanager
    sink = AlertmanagerSink("am", srv.url, resend_every_s=0.2)
    acked: list = []
    d = Dispatcher(
        [sink], Route(group_wait="0s", group_interval="0s", repeat_interval="1h"), [], None, FAST, acked.extend
    )
    try:
        d.submit(alert(), "t1")
        deadline = time.monotonic() + 10
        while len(srv.requests) < 3 and time.monotonic() < deadline:
            d.tick()
            time.sleep(0.05)
        assert len(srv.requests) >= 3, "firing alerts are re-sent to Alertmanager"
        assert acked == ["t1"]
        first = srv.requests[0]["json"][0]
        assert first["labels"]["host"] == "node2" and first["startsAt"] == alert()["starts_at"]
        assert datetime.fromisoformat(first["endsAt"].replace("Z", "+00:00")).timestamp() > time.time()
        d.submit(alert("resolved"), "t2")
        n = len(srv.requests)
        deadline = time.monotonic() + 10
        while "t2" not in acked and time.monotonic() < deadline:
            d.tick()
            time.sleep(0.05)
        last = [r for r in srv.requests[n:] if r["json"][0]["endsAt"] == alert("resolved")["ends_at"]]
        assert last, "resolved alert carries its endsAt"
        assert srv.errors == []
    finally:
        d.close()


# ---------------------------------------------------------------------------------------- webhook
def check_webhook(path: str, body: dict) -> None:
    """Alertmanager webhook format version 4."""
    assert body["version"] == "4" and body["status"] in ("firing", "resolved")
    for k in ("groupKey", "receiver", "groupLabels", "commonLabels", "commonAnnotations", "externalURL", "alerts"):
        assert k in body, k
    for a in body["alerts"]:
        assert set(a) == {"status", "labels", "annotations", "startsAt", "endsAt", "generatorURL", "fingerprint"}
        assert is_rfc3339(a["startsAt"]) and re.fullmatch(r"[0-9a-f]{16}", a["fingerprint"])


def test_webhook_payload(recorder):
    srv = recorder()
    srv.validator = check_webhook
    sink = WebhookSink("hook", SecretStr(srv.url + "/hook?token=s3cr3t-token"), external_url="http://obshub")
    assert sink.send(httpx.Client(), notif(alert(), alert("resolved", rule="other")), FAST).ok, srv.errors
    body = srv.requests[0]["json"]
    assert (
        body["status"] == "firing" and body["commonLabels"]["job"] == "llm" and "alertname" not in body["commonLabels"]
    )
    assert body["alerts"][1]["endsAt"] == alert("resolved")["ends_at"]


# -------------------------------------------------------------------------------- retries and errors
def test_429_honours_retry_after_then_delivers(recorder):
    srv = recorder()
    srv.plan = [(429, {"Retry-After": "1"}, 0.0)]
    sink = WebhookSink("hook", SecretStr(srv.url + "/h"))
    res = sink.send(httpx.Client(), notif(alert()), FAST)
    assert res.ok and res.attempts == 2
    assert srv.requests[1]["t"] - srv.requests[0]["t"] >= 0.9  # waited Retry-After, not the 10 ms backoff


def test_500_retried_with_backoff_then_delivers(recorder):
    srv = recorder()
    srv.plan = [(500, {}, 0.0), (503, {}, 0.0)]
    res = WebhookSink("hook", SecretStr(srv.url + "/h")).send(httpx.Client(), notif(alert()), FAST)
    assert res.ok and res.attempts == 3 and len(srv.requests) == 3


def test_4xx_not_retried_and_reported(recorder, caplog):
    srv = recorder()
    srv.plan = [(400, {}, 0.0)]
    with caplog.at_level(logging.WARNING):
        res = WebhookSink("hook", SecretStr(srv.url + "/h")).send(httpx.Client(), notif(alert()), FAST)
    assert not res.ok and res.attempts == 1 and len(srv.requests) == 1
    assert "HTTP 400 (not retried)" in res.error and "gave up" in caplog.text


def test_timeouts_retried_then_given_up(recorder):
    srv = recorder(default=(200, {}, 1.5))
    policy = DeliveryPolicy(max_attempts=2, max_elapsed_s=20, timeout_s=0.3, backoff_initial_s=0.01, backoff_max_s=0.02)
    res = WebhookSink("hook", SecretStr(srv.url + "/h")).send(httpx.Client(), notif(alert()), policy)
    assert not res.ok and res.attempts == 2 and "timeout" in res.error


def test_secrets_never_logged(recorder, caplog, capsys, monkeypatch):
    secret_url_tail = "T0SECRET/B0SECRET/zzSECRETzz"
    srv = recorder()
    srv.plan = [(404, {}, 0.0)]  # the server echoes the path (with the secret) in its error body
    monkeypatch.setenv("TEST_SLACK_URL", f"{srv.url}/services/{secret_url_tail}")
    monkeypatch.setenv("TEST_PD_KEY", "PDKEYSECRET0123456789")
    cfg = AlertingConfig.model_validate(
        {
            "sinks": [
                {"name": "slack", "type": "slack", "url_env": "TEST_SLACK_URL"},
                {
                    "name": "pd",
                    "type": "pagerduty",
                    "routing_key_env": "TEST_PD_KEY",
                    "url": "http://127.0.0.1:9/v2/enqueue",
                },
            ]
        }
    )
    sinks = build_sinks(cfg)
    with caplog.at_level(logging.DEBUG):
        results = [s.send(httpx.Client(), notif(alert()), FAST) for s in sinks]
        logging.getLogger("test").info("sinks %r config %r", sinks, cfg)
    assert not any(r.ok for r in results)
    text = caplog.text + capsys.readouterr().err + " ".join(r.error for r in results) + repr(cfg) + str(sinks)
    assert "SECRET" not in text, text
    assert "<redacted>" in results[0].error and "HTTP 404" in results[0].error


def test_missing_secret_is_a_clear_error(monkeypatch, tmp_path):
    from obshub.rules.errors import SinkConfigError

    monkeypatch.delenv("NOPE_URL", raising=False)
    with pytest.raises(SinkConfigError, match="NOPE_URL"):
        build_sinks(AlertingConfig.model_validate({"sinks": [{"name": "s", "type": "slack", "url_env": "NOPE_URL"}]}))
    f = tmp_path / "key"
    f.write_text("FILESECRET\n")
    pd = build_sinks(
        AlertingConfig.model_validate({"sinks": [{"name": "p", "type": "pagerduty", "routing_key_file": str(f)}]})
    )[0]
    assert pd.event(alert())["routing_key"] == "FILESECRET"
    for kind in ("slack", "webhook"):  # a secret URL written into the config is refused, and says why
        cfg = AlertingConfig.model_validate({"sinks": [{"name": "s", "type": kind, "url": "https://hooks.example/x"}]})
        with pytest.raises(SinkConfigError, match=f"a {kind} sink's URL is a secret and is not read from `url:`"):
            build_sinks(cfg)


def test_alerting_config_problems_are_listed_at_file_line_col(tmp_path):
    """Every problem of an alerting config is named at its line:column with the field path: an unknown
    field at its key, a wrong value at the value; broken YAML and a byte that is not UTF-8 at their
    mark; a missing file by its path."""
    from obshub.rules.errors import SinkConfigError
    from obshub.rules.sinks.config import load_config

    f = tmp_path / "alerting.yaml"
    f.write_text(
        "version: 1\n"
        "sinks:\n"
        "  - name: s\n"
        "    type: slack\n"
        "    webhook: https://hooks.example/x\n"
        "    min_severity: loud\n"
        "route:\n"
        "  group_wait: soon\n"
    )
    with pytest.raises(SinkConfigError) as exc:
        load_config(f)
    text = str(exc.value)
    assert f"{f}:5:5: sinks/0/webhook: unknown field (fields: name, type, min_severity, url, url_env," in text, text
    assert f"{f}:6:19: sinks/0/min_severity:" in text, text
    assert f"{f}:8:15: route/group_wait:" in text, text
    f.write_text("version: 1\nsinks: [\n")
    with pytest.raises(SinkConfigError, match=f"{f}:3:1: YAML: expected the node content"):
        load_config(f)
    f.write_bytes(b"version: 1\nexternal_url: '\xff'\n")
    with pytest.raises(SinkConfigError, match=f"{f}:2:16: not UTF-8: byte 0xff"):
        load_config(f)
    with pytest.raises(SinkConfigError, match=f"cannot read alerting config {tmp_path / 'nope.yaml'}: No such file"):
        load_config(tmp_path / "nope.yaml")
    f.write_text(
        "version: 1\n"
        "route: {repeat_interval: 0s}\n"
        "delivery: {timeout: 10 s}\n"
        "sinks:\n"
        "  - {name: am, type: alertmanager, url: 'http://am:9093', resend_every: soon}\n"
    )
    with pytest.raises(SinkConfigError) as exc:  # durations are checked when the file is read
        load_config(f)
    assert str(exc.value).splitlines()[1:] == [
        f"{f}:2:26: route/repeat_interval: 0s must be longer than 0",
        f"{f}:3:21: delivery/timeout: '10 s' is not a duration (examples: 500ms, 30s, 5m, 1h30m)",
        f"{f}:5:73: sinks/0/resend_every: 'soon' is not a duration (examples: 500ms, 30s, 5m, 1h30m)",
    ], str(exc.value)
    f.write_text("version: 1\nsinks:\n  - {name: c, type: console}\n  - {name: c, type: console}\n")
    with pytest.raises(SinkConfigError, match=f"{f}:3:3: sinks: sink name\\(s\\) used twice: c"):
        load_config(f)
    f.write_text("version: 1\nroute: {group_wait: 0s, group_interval: 0s}\nsinks:\n  - {name: c, type: console}\n")
    assert [s.name for s in load_config(f).sinks] == ["c"]


def config_problems(f, text: str) -> tuple[list[str], str]:
    """Write alerting config ``text`` to ``f``; the problem lines load_config raises for it, and its message."""
    from obshub.rules.errors import SinkConfigError
    from obshub.rules.sinks.config import load_config

    f.write_text(text)
    with pytest.raises(SinkConfigError) as exc:
        load_config(f)
    return str(exc.value).splitlines()[1:], str(exc.value)


def test_external_url_and_runbook_base_url_are_checked_as_urls_not_by_their_prefix(tmp_path):
    """Only the ``http://`` prefix of ``external_url`` was checked: ``http://`` alone, a port out of range or
    a stray space passed, and every alert's generatorURL led nowhere. Now each is refused at its line:column
    as a sink URL is, with an example; ``external_url`` also without ``?query``/``#fragment``."""
    from obshub.rules.sinks.config import load_config

    f = tmp_path / "alerting.yaml"
    example = "e.g. http://obshub-rules.monitoring:9108"
    for value, why in (
        ("http://", "names no host (write http://HOST:PORT)"),
        ("http://rules:99999", "has a port that is not a number from 1 to 65535"),
        ("http://rules :9108", "holds white space"),
        ("https://rules:9108/?x=1", "has a ?query or #fragment (/rules#<rule id> is appended to it)"),
        ("rules:9108", "is not an http:// or https:// URL (scheme rules://)"),
    ):
        got, text = config_problems(f, f"version: 1\nexternal_url: '{value}'\n")
        assert len(got) == 1 and got[0].startswith(f"{f}:2:15: external_url: '{value}' {why}"), text
        assert example in got[0], text
    got, text = config_problems(f, "version: 1\nrunbook_base_url: 'https://git.example:0/'\n")
    assert got == [
        f"{f}:2:19: runbook_base_url: 'https://git.example:0/' has port 0 (a port is 1 to 65535); "
        "e.g. https://git.example.com/obshub/blob/main/"
    ], text
    f.write_text(
        "version: 1\nexternal_url: 'https://rules.example:9108/obshub/'\n"
        "runbook_base_url: 'https://git.example/obshub/blob/main/'\n"
    )
    cfg = load_config(f)
    assert cfg.external_url == "https://rules.example:9108/obshub/"
    assert cfg.runbook_base_url == "https://git.example/obshub/blob/main/"


def test_a_sink_url_that_is_wrong_is_refused_at_its_value_and_a_secret_one_by_its_source(monkeypatch, tmp_path):
    """An endpoint URL that no HTTP client can post to (no scheme, another scheme, no host, a port out of
    range, white space) is refused when the config is read, at the value's line:column, not at the first
    alert; a secret webhook URL (from the environment or a file) by the variable or file, never quoting it."""
    from obshub.rules.errors import SinkConfigError
    from obshub.rules.sinks.config import load_config

    f = tmp_path / "alerting.yaml"
    got, text = config_problems(
        f,
        "version: 1\n"
        "sinks:\n"
        "  - {name: a, type: alertmanager, url: 'alertmanager:9093'}\n"
        "  - {name: b, type: alertmanager, url: 'ftp://am:9093'}\n"
        "  - {name: c, type: alertmanager, url: 'http://:9093'}\n"
        "  - {name: d, type: alertmanager, url: 'http://u:PASSWORD@am:99999'}\n"
        "  - {name: e, type: alertmanager, url: 'http://am :9093'}\n"
        "  - {name: p, type: pagerduty, routing_key_env: K, url: 'events.pagerduty.com/v2/enqueue'}\n",
    )
    assert got == [
        f"{f}:3:40: sinks/0/url: the URL is not an http:// or https:// URL (scheme alertmanager://); "
        "e.g. http://alertmanager:9093",
        f"{f}:4:40: sinks/1/url: the URL is not an http:// or https:// URL (scheme ftp://); "
        "e.g. http://alertmanager:9093",
        f"{f}:5:40: sinks/2/url: the URL names no host (write http://HOST:PORT); e.g. http://alertmanager:9093",
        f"{f}:6:40: sinks/3/url: the URL has a port that is not a number from 1 to 65535; "
        "e.g. http://alertmanager:9093",
        f"{f}:7:40: sinks/4/url: the URL holds white space (a URL has none: percent-encode it, or remove a stray "
        "space or newline); e.g. http://alertmanager:9093",
        f"{f}:8:57: sinks/5/url: the URL is not an http:// or https:// URL (scheme missing); "
        "e.g. https://events.pagerduty.com/v2/enqueue",
    ], text
    assert "PASSWORD" not in text  # a URL may carry credentials: the reason never quotes it
    f.write_text("version: 1\nsinks:\n  - {name: a, type: alertmanager, url: 'https://am.example:9093/'}\n")
    assert load_config(f).sinks[0].url == "https://am.example:9093/"
    monkeypatch.setenv("HOOK_URL", "hooks.slack.com/services/T0SECRET")
    monkeypatch.setenv("HOOK_URL6", "https://[SECRET]/services/T0")  # urlsplit's ValueError was a traceback
    secret_file = tmp_path / "url"
    secret_file.write_text("https://hooks.example/ SECRET\n")
    bracket_file = tmp_path / "url6"
    bracket_file.write_text("https://[::SECRET/hook\n")
    for source, want in (
        ({"url_env": "HOOK_URL"}, "the webhook URL in environment variable HOOK_URL is not an http:// or https:// URL"),
        ({"url_file": str(secret_file)}, f"the webhook URL in file {secret_file} holds white space"),
        ({"url_env": "HOOK_URL6"}, "the webhook URL in environment variable HOOK_URL6 has a malformed \\[bracketed"),
        ({"url_file": str(bracket_file)}, f"the webhook URL in file {bracket_file} has a malformed \\[bracketed"),
    ):
        for kind in ("slack", "webhook"):
            cfg = AlertingConfig.model_validate({"sinks": [{"name": "s", "type": kind, **source}]})
            with pytest.raises(SinkConfigError, match=want) as exc:
                build_sinks(cfg)
            assert "SECRET" not in str(exc.value) + str(exc.value.hint)


def test_a_sink_url_with_a_malformed_bracketed_host_is_a_problem_not_a_traceback(tmp_path):
    """`http://[::1/` or `http://[SECRET]:80/` made urlsplit raise ValueError: in the config file the problem
    read "Invalid IPv6 URL", and from `url_env` / `url_file` `rules serve` died with a traceback whose last
    line quoted the bracketed host (a part of a secret URL; the test above has those). Both are the URL's
    problem, never quoting it."""
    f = tmp_path / "alerting.yaml"
    got, text = config_problems(
        f,
        "version: 1\n"
        "sinks:\n"
        "  - {name: a, type: alertmanager, url: 'http://[::1/'}\n"
        "  - {name: b, type: alertmanager, url: 'http://[SECRET]:9093/'}\n",
    )
    why = "the URL has a malformed [bracketed] host"
    assert [g.split(": ", 2)[:2] for g in got] == [[f"{f}:3:40", "sinks/0/url"], [f"{f}:4:40", "sinks/1/url"]], text
    assert all(why in g for g in got) and "SECRET" not in text, text


def test_a_sink_name_that_is_no_name_is_said_in_words_not_as_a_regular_expression(tmp_path):
    """`name: Bad Name` read "String should match pattern '^[a-z][a-z0-9_-]*$'" (newuser18): the rule is said
    in words at the value, with an example; a good name still loads."""
    f = tmp_path / "alerting.yaml"
    got, text = config_problems(f, "version: 1\nsinks:\n  - {name: Bad Name, type: console}\n")
    assert got == [
        f"{f}:3:12: sinks/0/name: 'Bad Name' is no sink name: lower-case letters, digits, '-' and '_', starting "
        "with a letter (e.g. oncall-slack); rule files' `routes:` name sinks so"
    ], text
    assert "pattern" not in text
    assert SinkSpec(name="oncall-slack_2", type="console").name == "oncall-slack_2"


def test_a_field_its_sink_type_does_not_read_is_refused_at_the_sink(tmp_path):
    """`resend_every` on a slack sink or `url` on a console sink was accepted and ignored: the user believes
    a setting that does nothing. Each is named at the sink's line, with the fields the type does read."""

    got, text = config_problems(
        tmp_path / "alerting.yaml",
        "version: 1\n"
        "sinks:\n"
        "  - {name: c, type: console, url: 'http://x:1'}\n"
        "  - name: s\n"
        "    type: slack\n"
        "    url_env: X\n"
        "    routing_key_env: Y\n"
        "    resend_every: 1m\n"
        "  - {name: a, type: alertmanager, url: 'http://am:9093', resend_every: 1m, min_severity: error}\n",
    )
    f = tmp_path / "alerting.yaml"
    assert got == [
        f"{f}:3:5: sinks/0: url does not apply to a console sink, which would ignore it (its fields: "
        "min_severity, name, type)",
        f"{f}:4:5: sinks/1: resend_every, routing_key_env do not apply to a slack sink, which would ignore them "
        "(its fields: min_severity, name, type, url, url_env, url_file)",
    ], text


# ---------------------------------------------------------------------- dispatcher: isolation, muting
def test_one_sink_outage_does_not_block_another_and_is_not_acked(recorder):
    down = recorder(default=(503, {}, 0.0))
    up = recorder()
    slow_policy = DeliveryPolicy(
        max_attempts=100, max_elapsed_s=60, timeout_s=1, backoff_initial_s=0.1, backoff_max_s=0.2
    )
    acked: list = []
    d = Dispatcher(
        [WebhookSink("down", SecretStr(down.url + "/d")), WebhookSink("up", SecretStr(up.url + "/u"))],
        Route(group_wait="0s", group_interval="0s"),
        [],
        None,
        slow_policy,
        acked.extend,
    )
    try:
        d.submit(alert(), "tok")
        d.tick()
        deadline = time.monotonic() + 10
        while not up.requests and time.monotonic() < deadline:
            time.sleep(0.05)
        assert up.requests, "the healthy sink got its notification while the other is down"
        assert len(down.requests) >= 1 and acked == []  # not acked: the down sink has not delivered
        down.default = (200, {}, 0.0)  # the outage ends
        deadline = time.monotonic() + 10
        while not acked and time.monotonic() < deadline:
            time.sleep(0.05)
        assert acked == ["tok"]
    finally:
        d.close()


def test_grouping_min_severity_silence_and_inhibition(tmp_path):
    out = io.StringIO()
    console = ConsoleSink("console", stream=out)
    pager = ConsoleSink("pager", min_severity="critical", stream=io.StringIO())
    store = SilenceStore(tmp_path / "silences.json")
    inhibit = [InhibitRule({"alertname": "host_stopped_reporting"}, {"category": "straggler"}, ["job", "host"])]
    acked: list = []
    d = Dispatcher(
        [console, pager],
        Route(group_by=["alertname"], group_wait="10s", group_interval="1m", repeat_interval="1h"),
        inhibit,
        store,
        FAST,
        acked.extend,
    )
    t0 = 1_000 * 10**9
    try:
        warn = {**alert(severity="warning", rule="sched_contention_on_straggler")}
        warn["labels"] = {**warn["labels"], "category": "straggler", "severity": "warning"}
        warn["fingerprint"] = fingerprint(warn["labels"])
        d.submit(warn, "a", now_ns=t0)
        other = {**warn, "labels": {**warn["labels"], "host": "node7"}}
        other["fingerprint"] = fingerprint(other["labels"])
        d.submit(other, "b", now_ns=t0 + 10**9)
        d.submit({**alert(), "status": "pending"}, "p", now_ns=t0)
        assert acked == ["p"]  # pending needs no delivery
        d.tick(t0 + 5 * 10**9)
        assert out.getvalue() == ""  # group_wait 10 s
        d.tick(t0 + 11 * 10**9)
        _wait_for(lambda: set(acked) == {"p", "a", "b"})
        lines = out.getvalue().splitlines()
        assert len(lines) == 2 and all("sched_contention_on_straggler" in ln for ln in lines)  # one group
        assert pager.stream.getvalue() == ""  # below the pager's min severity
        # a host-down alert inhibits that host's straggler alerts
        down = alert(rule="host_stopped_reporting")
        d.submit(down, "c", now_ns=t0 + 20 * 10**9)
        d.submit({**warn}, "d", now_ns=t0 + 20 * 10**9)  # node2 straggler again
        d.tick(t0 + 80 * 10**9)
        _wait_for(lambda: {"c", "d"} <= set(acked))
        new = out.getvalue().splitlines()[2:]
        assert any("host_stopped_reporting" in ln for ln in new)
        assert not any("sched_contention" in ln and "host=node2" in ln for ln in new), new
        # a silence mutes node7
        store.add(["host=node7"], t0, t0 + 10**15, "alice", "maintenance")
        d.submit({**other}, "e", now_ns=t0 + 200 * 10**9)
        d.tick(t0 + 300 * 10**9)
        _wait_for(lambda: "e" in acked)
        assert not any("node7" in ln for ln in out.getvalue().splitlines()[len(lines) + len(new) :])
    finally:
        d.close()


def _wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert cond()


def test_group_interval_repeat_interval_and_dedup():
    out = io.StringIO()
    acked: list = []
    d = Dispatcher(
        [ConsoleSink("console", stream=out)],
        Route(group_by=["job"], group_wait="0s", group_interval="5s", repeat_interval="10s"),
        [],
        None,
        FAST,
        acked.extend,
    )
    s = 10**9
    t0 = 5_000 * s
    try:
        a1 = alert()
        d.submit(a1, 1, now_ns=t0)
        d.submit(dict(a1), 2, now_ns=t0)  # the same change re-delivered: one notification line
        d.tick(t0)
        _wait_for(lambda: acked == [1, 2])
        assert len(out.getvalue().splitlines()) == 1
        a2 = alert(rule="sched_contention_on_straggler")
        d.submit(a2, 3, now_ns=t0 + 1 * s)
        d.tick(t0 + 2 * s)  # within group_interval: batched, not sent yet
        assert len(out.getvalue().splitlines()) == 1 and 3 not in acked
        d.tick(t0 + 5 * s)
        _wait_for(lambda: 3 in acked)
        lines = out.getvalue().splitlines()
        assert len(lines) == 3 and "sched_contention_on_straggler" in lines[2]  # group re-sent with both
        d.tick(t0 + 14 * s)
        assert len(out.getvalue().splitlines()) == 3
        d.tick(t0 + 15 * s)  # repeat_interval after the last flush
        _wait_for(lambda: len(out.getvalue().splitlines()) == 5)
        d.submit(alert("resolved"), 4, now_ns=t0 + 16 * s)
        d.tick(t0 + 20 * s)
        _wait_for(lambda: 4 in acked)
        assert (
            "[RESOLVED] rdma_slow_completion_on_straggler"
            in out.getvalue().splitlines()[-2] + out.getvalue().splitlines()[-1]
        )
        d.tick(t0 + 40 * s)  # the resolved alert left the group: only a2 repeats
        _wait_for(lambda: out.getvalue().splitlines()[-1].startswith("[FIRING] sched_contention"))
    finally:
        d.close()


def test_a_change_read_again_after_its_delivery_is_not_sent_again(recorder):
    """The notify loop commits an alert change's offset after its delivery; when that commit failed and the
    consumer then lost its group (a broker kill took the group coordinator away for longer than the session
    timeout: tests/core/test_kafka_cluster.py's hook got node2's one alert twice), it resumed from the older
    committed offset and the same records came again. The dispatcher knows what it handed to its sinks:
    a copy is acked without a second request, once the first delivery is done (never before: a crash meanwhile
    must re-deliver it), and an older record read again after a newer one (a firing after its resolve) does
    not turn the alert back. A new transition of the same alert is sent as before."""
    slow = recorder(default=(200, {}, 0.6))  # each request answered after 0.6 s: a delivery in flight
    acked: list = []
    d = Dispatcher(
        [WebhookSink("hook", SecretStr(slow.url + "/h"))],
        Route(group_wait="0s", group_interval="0s", repeat_interval="1h"),
        [],
        None,
        FAST,
        acked.extend,
    )
    copy = lambda rec: json.loads(json.dumps(rec))  # noqa: E731 - decoded again from the same bytes
    try:
        firing = alert()
        d.submit(firing, ("alerts", 0, 5))
        d.tick()
        d.submit(copy(firing), ("alerts", 0, 5, "again"))  # read again while its delivery is in flight
        d.tick()
        assert acked == []  # not before the delivery is done
        _wait_for(lambda: len(acked) == 2)
        assert acked == [("alerts", 0, 5), ("alerts", 0, 5, "again")]
        d.submit(copy(firing), "later")  # read again after the delivery: acked at once
        d.tick()
        assert acked[-1] == "later"
        resolved = alert("resolved")
        d.submit(resolved, "resolved")
        d.tick()
        _wait_for(lambda: "resolved" in acked)
        for tok, rec in (("firing again", firing), ("resolved again", resolved)):  # both re-read, in order
            d.submit(copy(rec), tok)
            d.tick()
        assert acked[-2:] == ["firing again", "resolved again"]
        time.sleep(0.8)
        d.tick()
        assert [r["json"]["status"] for r in slow.requests] == ["firing", "resolved"]
        refired = {**alert(), "starts_at_ns": firing["starts_at_ns"] + 10**10}  # a new episode: sent
        refired["updated_at_ns"] = refired["starts_at_ns"]
        d.submit(refired, "refired")
        d.tick()
        _wait_for(lambda: "refired" in acked)
        assert [r["json"]["status"] for r in slow.requests] == ["firing", "resolved", "firing"]
    finally:
        d.close()


def test_firing_alerts_survive_a_dispatcher_restart(recorder):
    srv = recorder()
    sink = AlertmanagerSink("am", srv.url, resend_every_s=0.2)
    route = Route(group_wait="0s", group_interval="0s", repeat_interval="1h")
    inhibit = [InhibitRule({"alertname": "host_stopped_reporting"}, {"category": "straggler"}, ["job", "host"])]
    d = Dispatcher([sink], route, inhibit, None, FAST, lambda t: None)
    d.submit(alert(rule="host_stopped_reporting"), 1)
    d.tick()
    snap = json.loads(json.dumps(d.snapshot()))
    d.close()
    d2 = Dispatcher([sink], route, inhibit, None, FAST, lambda t: None)
    try:
        d2.restore(snap)
        straggler = alert(rule="sched_contention_on_straggler")
        straggler["labels"] = {**straggler["labels"], "category": "straggler"}
        assert d2._inhibited(straggler["labels"])  # inhibition holds after the restart
        n = len(srv.requests)
        _wait_for(lambda: (d2.tick(), len(srv.requests) > n)[1])  # Alertmanager re-sends continue
        assert srv.requests[-1]["json"][0]["labels"]["alertname"] == "host_stopped_reporting"
    finally:
        d2.close()


def test_a_count_written_as_a_string_float_or_boolean_is_refused_at_its_value(tmp_path):
    """`max_attempts: "6"`, `steps: 2.0` and `max_per_hour: true` were read as 6, 2 and 1 (pydantic's lax
    mode); a rule file refuses `at_least: "5"`, and so does the alerting config now."""
    f = tmp_path / "alerting.yaml"
    got, text = config_problems(
        f,
        "version: 1\n"
        "delivery: {max_attempts: '6'}\n"
        "sinks:\n"
        "  - {name: d, type: deep_dive, steps: 2.0, max_per_hour: true}\n",
    )
    assert got == [
        f"{f}:2:26: delivery/max_attempts: Input should be a valid integer",
        f"{f}:4:39: sinks/0/steps: Input should be a valid integer",
        f"{f}:4:58: sinks/0/max_per_hour: Input should be a valid integer",
    ], text


def test_a_misspelt_config_field_is_one_problem_with_the_nearest_name(tmp_path):
    """`typ:` for a sink's required `type:` was two problems ("sinks/0/type: Field required" at the sink and
    "sinks/0/typ: Extra inputs are not permitted" at the key) and no misspelt key named the field meant
    (newuser15): one problem now, at the key, with the nearest field of its mapping."""
    from obshub.rules.sinks import config

    f = tmp_path / "alerting.yaml"
    lines = ["version: 1", "route:", "  group_wiat: 10s", "sinks:", "  - {name: c, typ: console}"]
    f.write_text("\n".join([*lines, "  - {name: h, type: webhook, url_evn: X}", ""]))
    with pytest.raises(config.SinkConfigError) as exc:
        config.load_config(f)
    assert str(exc.value).splitlines()[1:4] == [
        f"{f}:3:3: route/group_wiat: unknown field: did you mean 'group_wait'?",
        f"{f}:5:15: sinks/0/typ: unknown field: did you mean 'type'? (a required field)",
        f"{f}:6:30: sinks/1/url_evn: unknown field: did you mean 'url_env'?",
    ], str(exc.value)
