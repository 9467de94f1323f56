"""The Grafana dashboard against a real Prometheus scraping a running pipeline.

A synthetic agent (``obshub agent --source synthetic``), a stream worker and the rule engine run against
the session's broker, each serving /metrics; a real Prometheus (built from its Go module by the set-up)
scrapes them every second. A synthetic job with a known straggler (node2, layer sched, at known steps)
and a host that stops reporting goes through the pipeline. Then every query of every panel of
deploy/grafana/obshub-dashboard.json, sent to Prometheus's HTTP API with the dashboard's variables
filled in, must return data, and the panels that answer "which host, which layer, which step" must
answer with the known ground truth."""

from __future__ import annotations

import json
import sys
import time
import uuid

import httpx
import pytest

from obshub.core import schema
from obshub.streams import synthetic
from tests.support import testkit
from tests.support.gotools import REPO, Proc, free_port, tool, wait_http, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

DASHBOARD = REPO / "deploy" / "grafana" / "obshub-dashboard.json"


def panel_queries(dashboard: dict) -> list[tuple[str, str]]:
    """``(panel title, PromQL expr)`` of every target of every panel (rows included)."""
    out = []
    for p in dashboard["panels"]:
        for inner in [p, *p.get("panels", [])]:
            for t in inner.get("targets", []):
                out.append((inner["title"], t["expr"]))
    return out


def fill(expr: str, job_regex: str) -> str:
    """The query Grafana would send: dashboard variables and interval macros replaced."""
    return expr.replace("$training_job", job_regex).replace("$__rate_interval", "30s").replace("$__range", "10m")


def query(base: str, expr: str) -> list[dict]:
    r = httpx.get(f"{base}/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", f"{expr}: {r.status_code} {body}"
    return body["data"]["result"]


def test_every_dashboard_panel_returns_data_from_a_running_pipeline(kafka, tmp_path):
    prometheus = tool("prometheus")
    u = uuid.uuid4().hex[:8]
    job = f"prom-{u}"
    env = {
        "OBSHUB_HOME": str(tmp_path / "home"),
        "OBSHUB_BOOTSTRAP": kafka.bootstrap_servers,
        "OBSHUB_METRICS_ADDR": "127.0.0.1",
    }
    ports = {"agent": free_port(), "streams": free_port(), "rules": free_port(), "prom": free_port()}
    obshub = [sys.executable, "-m", "obshub.cli"]
    procs: list[Proc] = []
    try:
        worker = Proc(
            obshub
            + [
                "streams",
                "worker",
                "--app-id",
                f"prom-app-{u}",
                "--window-s",
                "4",
                "--partitions",
                "2",
                "--index",
                "71",
                "--metrics-port",
                str(ports["streams"]),
                "--log-level",
                "info",
            ],
            tmp_path / "worker.log",
            env,
        )
        procs.append(worker)
        rules = Proc(
            obshub + ["rules", "serve", "--group-prefix", f"prom-rules-{u}", "--metrics-port", str(ports["rules"])],
            tmp_path / "rules.log",
            env,
        )
        procs.append(rules)
        agent = Proc(
            obshub
            + [
                "agent",
                "--source",
                "synthetic",
                "--rate",
                "300",
                "--job",
                f"{job}-agent",
                "--host",
                f"agent-{u}",
                "--metrics-port",
                str(ports["agent"]),
                "--duration",
                "300",
            ],
            tmp_path / "agent.log",
            env,
        )
        procs.append(agent)
        config = tmp_path / "prometheus.yml"
        config.write_text(
            json.dumps(
                {  # YAML is a superset of JSON
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "scrape_configs": [
                        {"job_name": f"obshub-{name}", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
                        for name, port in ports.items()
                        if name != "prom"
                    ],
                }
            )
        )
        prom = Proc(
            [
                str(prometheus),
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{ports['prom']}",
                "--log.level=warn",
            ],
            tmp_path / "prometheus.log",
            cwd=tmp_path,
        )
        procs.append(prom)
        base = f"http://127.0.0.1:{ports['prom']}"
        wait_http(f"{base}/-/ready", prom)
        for name in ("streams", "rules", "agent"):
            wait_http(
                f"http://127.0.0.1:{ports[name]}/metrics",
                procs[["streams", "rules", "agent"].index(name)],
                timeout_s=90,
            )
        wait_until(lambda: "Worker ready" in worker.tail(100_000), 90, "the stream worker", worker)
        wait_until(
            lambda: (
                all(r["value"][1] == "1" for r in query(base, 'up{job=~"obshub-.*"}'))
                and len(query(base, 'up{job=~"obshub-.*"}')) == 3
            ),
            30,
            "three healthy scrape targets",
            prom,
        )

        scn = synthetic.Scenario(
            job=job,
            hosts=4,
            steps=30,
            straggler=2,
            guilty_steps=(4, 12, 21, 26),
            guilty_layer="sched",
            stop_host=3,
            stop_after=24,
        )
        batches = synthetic.generate(scn)
        first = scn.hosts * 11  # registrations + steps 0..9
        testkit.publish(kafka, schema.TOPIC_EVENTS, batches[:first])
        sel = f'training_job="{job}"'
        # the counters must have a scraped value before the rest arrives, so increase() over the range sees it
        wait_until(
            lambda: query(base, f"obshub_straggler_steps_total{{{sel}}}"),
            90,
            "the first straggler step in Prometheus",
            worker,
            prom,
        )
        time.sleep(2)
        testkit.publish(kafka, schema.TOPIC_EVENTS, batches[first:])
        wait_until(
            lambda: [r for r in query(base, f"obshub_last_step{{{sel}}}") if r["value"][1] == "29"],
            90,
            "step 29 summarised",
            worker,
            prom,
        )
        wait_until(
            lambda: query(base, f"obshub_missing_host_steps_total{{{sel}}}"),
            60,
            "the missing host's steps",
            worker,
            prom,
        )
        wait_until(lambda: query(base, "obshub_rules_records_total"), 60, "the rule engine's records", rules, prom)
        time.sleep(3)  # a few more scrapes, so rate() has two samples after the last change

        dashboard = json.loads(DASHBOARD.read_text())
        queries = panel_queries(dashboard)
        assert len(queries) >= 15
        empty = [
            (title, fill(expr, job)) for title, expr in queries if not query(base, fill(expr, f"{job}|{job}-agent"))
        ]
        assert not empty, f"panels without data: {empty}"

        def answer(title: str) -> list[dict]:
            expr = next(e for t, e in queries if t == title)
            return query(base, fill(expr, job))

        top = max(answer("Straggler steps by host"), key=lambda r: float(r["value"][1]))
        assert top["metric"]["host"] == "node2" and float(top["value"][1]) > 0
        blame = max(answer("Blame: excess time by host and layer"), key=lambda r: float(r["value"][1]))
        assert (blame["metric"]["host"], blame["metric"]["layer"]) == ("node2", "sched")
        last = {r["metric"]["host"]: float(r["value"][1]) for r in answer("Latest straggler step per host")}
        assert last["node2"] == 26
        missing = {r["metric"]["host"] for r in answer("Hosts missing from steps")}
        assert missing == {"node3"}

        # every obshub series Prometheus scraped from the three components is documented
        names = httpx.get(f"{base}/api/v1/label/__name__/values", timeout=10).json()["data"]
        doc = (REPO / "docs" / "METRICS.md").read_text()
        ours = {
            n.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
            for n in names
            if n.startswith("obshub_") and not n.endswith("_created")
        }
        assert len(ours) > 40 and not [n for n in sorted(ours) if f"`{n}`" not in doc]
    finally:
        for p in reversed(procs):
            p.stop()
