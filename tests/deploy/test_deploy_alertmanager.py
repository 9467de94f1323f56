"""Alertmanager-first against a real Alertmanager (built from its Go module by the set-up).

``obshub rules serve`` runs with ``mode: alertmanager``: it sends every firing and resolved alert
straight to Alertmanager, which groups them by its own ``group_by``, applies a silence made through its
API, and notifies a local webhook receiver. Step summaries with lost batches fire a test rule for three
hosts of two training jobs; the checks: the alerts arrive with runbook_url and a generatorURL that the
rule engine serves; Alertmanager groups them by (alertname, job); a silence on one job mutes that job's
alerts; when the other job's condition ends, obshub resolves its alerts and Alertmanager ends them and
sends the resolved notification."""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone

import httpx
import pytest
from confluent_kafka import Producer

from obshub.core import schema
from tests.rules.test_rules_sinks import HttpRecorder
from tests.support.gotools import Proc, free_port, tool, wait_http, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]


def _rules(path, jobs: tuple[str, str]) -> None:
    path.write_text(f"""\
version: 1
rules:
  - id: test_am_lost_batches
    description: batches lost on a host (test rule, only for the jobs of this test)
    severity: warning
    signal: steps
    condition: (job == '{jobs[0]}' || job == '{jobs[1]}') && quality.lost_batches > 0
    group_by: {{job: job, host: "hosts[0]"}}
    window: 3s
    labels: {{layer: agent}}
    annotations: {{summary: "{{{{ quality.lost_batches }}}} batches lost in step {{{{ step }}}}"}}
    runbook: docs/RULES.md#obshub_lost_batches
""")


class Steps(threading.Thread):
    """Publishes one step summary with lost batches per (job, host) every 0.5 s while it is enabled."""

    def __init__(self, bootstrap: str, targets: dict[tuple[str, str], bool]):
        super().__init__(daemon=True)
        self.p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.targets, self.stop = targets, threading.Event()

    def run(self) -> None:
        try:
            self._run()
        finally:
            self.p.flush(5)
            del self.p

    def _run(self) -> None:
        step = 0
        while not self.stop.is_set():
            for (job, host), on in list(self.targets.items()):
                if on:
                    s = {
                        "v": 1,
                        "job": job,
                        "step": step,
                        "closed_by": "complete",
                        "closed_at_ns": time.time_ns(),
                        "hosts": [host],
                        "expected_hosts": [host],
                        "missing_hosts": [],
                        "quality": {"lost_batches": 2},
                    }
                    self.p.produce(schema.TOPIC_STEPS, key=job, value=json.dumps(s).encode())
            self.p.flush(10)
            step += 1
            self.stop.wait(0.5)


def test_alertmanager_first_groups_silences_and_resolves(kafka, tmp_path):
    am_bin = tool("alertmanager")
    u = uuid.uuid4().hex[:8]
    ja, jb = f"am-a-{u}", f"am-b-{u}"
    receiver = HttpRecorder()
    am_port, rules_port = free_port(), free_port()
    am_url = f"http://127.0.0.1:{am_port}"
    (tmp_path / "am.yml").write_text(
        json.dumps(
            {
                "route": {
                    "receiver": "hook",
                    "group_by": ["alertname", "job"],
                    "group_wait": "1s",
                    "group_interval": "1s",
                    "repeat_interval": "1h",
                },
                "receivers": [
                    {"name": "hook", "webhook_configs": [{"url": f"{receiver.url}/am", "send_resolved": True}]}
                ],
            }
        )
    )
    _rules(tmp_path / "rules.yaml", (ja, jb))
    (tmp_path / "alerting.yaml").write_text(f"""\
version: 1
mode: alertmanager
runbook_base_url: https://runbooks.example/obshub/
sinks:
  - {{name: am, type: alertmanager, url: "{am_url}", resend_every: 2s}}
""")
    targets = {(ja, "h1"): True, (ja, "h2"): True, (jb, "h3"): True}
    steps = Steps(kafka.bootstrap_servers, targets)
    procs: list[Proc] = []
    try:
        am = Proc(
            [
                str(am_bin),
                f"--config.file={tmp_path / 'am.yml'}",
                f"--storage.path={tmp_path / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{am_port}",
                "--cluster.listen-address=",
                "--log.level=warn",
            ],
            tmp_path / "am.log",
            cwd=tmp_path,
        )
        procs.append(am)
        wait_http(f"{am_url}/-/ready", am)
        rules = Proc(
            [
                sys.executable,
                "-m",
                "obshub.cli",
                "rules",
                "serve",
                "-r",
                str(tmp_path / "rules.yaml"),
                "-c",
                str(tmp_path / "alerting.yaml"),
                "--group-prefix",
                f"am-{u}",
                "--metrics-port",
                str(rules_port),
                "--metrics-addr",
                "127.0.0.1",
                "--log-format",
                "json",
            ],
            tmp_path / "rules.log",
            {"OBSHUB_HOME": str(tmp_path / "home"), "OBSHUB_BOOTSTRAP": kafka.bootstrap_servers},
        )
        procs.append(rules)
        wait_http(f"http://127.0.0.1:{rules_port}/-/ready", rules, timeout_s=90)
        time.sleep(2)  # the engine's consumer group starts at the latest offset: let it join first
        steps.start()

        def am_alerts(**params) -> list[dict]:
            r = httpx.get(f"{am_url}/api/v2/alerts", params=params, timeout=5)
            r.raise_for_status()
            return [a for a in r.json() if a["labels"].get("job") in (ja, jb)]

        alerts = wait_until(
            lambda: (lambda a: a if len(a) == 3 else None)(am_alerts()), 60, "three alerts in Alertmanager", rules, am
        )
        assert {(a["labels"]["job"], a["labels"]["host"]) for a in alerts} == set(targets)
        for a in alerts:
            assert a["labels"]["alertname"] == "test_am_lost_batches"
            assert (
                a["annotations"]["runbook_url"] == "https://runbooks.example/obshub/docs/RULES.md#obshub_lost_batches"
            )
            gen = a["generatorURL"]
            assert gen.endswith("/rules#test_am_lost_batches")
            page = httpx.get(gen.replace(gen.split("/rules")[0], f"http://127.0.0.1:{rules_port}"), timeout=5).text
            assert "id='test_am_lost_batches'" in page and a["labels"]["host"] in page

        # grouping is Alertmanager's: by (alertname, job), as its route says
        def groups():
            r = httpx.get(f"{am_url}/api/v2/alerts/groups", timeout=5).json()
            return {
                g["labels"]["job"]: sorted(a["labels"]["host"] for a in g["alerts"])
                for g in r
                if g["labels"].get("job") in (ja, jb)
            }

        assert wait_until(
            lambda: (lambda g: g if g == {ja: ["h1", "h2"], jb: ["h3"]} else None)(groups()), 20, "two groups", am
        )
        notified = wait_until(
            lambda: (
                {r["json"]["groupLabels"].get("job") for r in receiver.requests if r["json"]["status"] == "firing"}
                >= {ja, jb}
                and receiver.requests
            ),
            30,
            "firing notifications of both groups",
            am,
        )
        for r in notified:
            assert set(r["json"]["groupLabels"]) == {"alertname", "job"}

        # a silence made through Alertmanager's API mutes job A
        now = datetime.now(timezone.utc)
        sil = httpx.post(
            f"{am_url}/api/v2/silences",
            json={
                "matchers": [{"name": "job", "value": ja, "isRegex": False, "isEqual": True}],
                "startsAt": now.isoformat(),
                "endsAt": (now + timedelta(hours=1)).isoformat(),
                "createdBy": "test",
                "comment": "maintenance",
            },
            timeout=5,
        )
        assert sil.status_code == 200, sil.text

        def suppressed():
            a = [x for x in am_alerts() if x["labels"]["job"] == ja]
            return a if a and all(x["status"]["state"] == "suppressed" for x in a) else None

        muted = wait_until(suppressed, 20, "job A suppressed", am)
        assert all(sil.json()["silenceID"] in x["status"]["silencedBy"] for x in muted)
        assert [x["labels"]["job"] for x in am_alerts(silenced="false")] == [jb]

        # job B's condition ends: obshub resolves it, Alertmanager ends it and notifies "resolved"
        targets[(jb, "h3")] = False
        wait_until(lambda: not [x for x in am_alerts() if x["labels"]["job"] == jb], 45, "job B resolved", rules, am)
        wait_until(
            lambda: [
                r
                for r in receiver.requests
                if r["json"]["status"] == "resolved" and r["json"]["groupLabels"].get("job") == jb
            ],
            30,
            "the resolved notification",
            am,
        )
        assert [x["labels"]["job"] for x in am_alerts()] == [ja, ja]  # A still fires (silenced), B ended
        text = rules.tail(1_000_000)
        assert all(line.startswith("{") for line in text.splitlines() if line.strip()), text[-3000:]
        lines = [json.loads(line) for line in text.splitlines() if line.strip()]
        assert lines and all({"time", "level", "logger", "message"} <= set(x) for x in lines)
        assert any(
            x["logger"] == "obshub.rules.service" and "alert resolved test_am_lost_batches" in x["message"]
            for x in lines
        )
    finally:
        steps.stop.set()
        if steps.is_alive():
            steps.join(15)
        for p in reversed(procs):
            p.stop()
        receiver.close()
