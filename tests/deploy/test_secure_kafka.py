"""Every component through a secured Kafka: a real broker with a SASL/SCRAM-over-TLS listener and a
mutual-TLS listener (its own certificates, tests/support/secure_kafka.py), configured for obshub only
through the OBSHUB_KAFKA_* environment (what the Helm chart sets).

Through SASL_SSL: topics created by obshub, the agent publishes, a stream worker joins and summarises
(its Faust/aiokafka clients), the rule engine fires an alert, and the operators' commands read back:
`obshub tail steps`, `obshub alerts`, `obshub trace export`, `obshub status`. Through mutual TLS: the
agent delivers with its client certificate. A wrong password and an untrusted CA give one error naming
the setting, and the password appears in no log and no `status` output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
from confluent_kafka import Producer

from obshub import stack
from obshub.core import kafka, schema
from obshub.core.settings import load_settings
from obshub.streams import synthetic
from tests.support import secure_kafka
from tests.support.gotools import REPO, Proc, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]
OBSHUB = [sys.executable, "-m", "obshub.cli"]


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = secure_kafka.start(tmp_path_factory.mktemp("secure-kafka"))
    yield b
    b.stop()


def sasl_env(b, home) -> dict[str, str]:
    return {
        "OBSHUB_HOME": str(home),
        "OBSHUB_BOOTSTRAP": b.sasl_ssl,
        "OBSHUB_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "OBSHUB_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "OBSHUB_KAFKA_SASL_USERNAME": secure_kafka.USER,
        "OBSHUB_KAFKA_SASL_PASSWORD": b.password,
        "OBSHUB_KAFKA_SSL_CA_LOCATION": str(b.certs.ca),
        "OBSHUB_METRICS_ADDR": "127.0.0.1",
    }


def run(env, *args, timeout=120) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OBSHUB_")}
    return subprocess.run(
        OBSHUB + list(args), capture_output=True, text=True, cwd=REPO, timeout=timeout, env={**clean, **env}
    )


def test_every_component_through_sasl_ssl_and_mtls(broker, tmp_path, monkeypatch):
    env = sasl_env(broker, tmp_path / "home")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("OBSHUB_KAFKA_PORT", raising=False)
    monkeypatch.setenv("OBSHUB_KAFKA_PARTITIONS", "obshub.dlq.v1=3")  # a partition count as a setting
    settings = load_settings()
    stack.ensure_topics(settings)  # obshub's own admin client, through SASL_SSL
    u = uuid.uuid4().hex[:8]
    job = f"sec-{u}"
    (tmp_path / "rules.yaml").write_text(f"""\
version: 1
rules:
  - id: test_secure_straggler
    description: a straggler was named (test rule, only for job {job})
    severity: warning
    signal: steps
    condition: job == '{job}' && size(blame) > 0
    group_by: {{job: job}}
    window: 5m
""")
    procs = []
    try:
        worker = Proc(
            OBSHUB
            + [
                "streams",
                "worker",
                "--app-id",
                f"sec-app-{u}",
                "--window-s",
                "4",
                "--partitions",
                "2",
                "--index",
                "81",
                "--log-level",
                "info",
            ],
            tmp_path / "worker.log",
            env,
        )
        procs.append(worker)
        rules = Proc(
            OBSHUB
            + ["rules", "serve", "-r", str(tmp_path / "rules.yaml"), "--group-prefix", f"sec-{u}", "--from-beginning"],
            tmp_path / "rules.log",
            env,
        )
        procs.append(rules)
        agent = run(
            env,
            "agent",
            "--source",
            "synthetic",
            "--rate",
            "2000",
            "--synthetic-events",
            "2000",
            "--job",
            f"{job}-agent",
            "--host",
            f"a-{u}",
            "--duration",
            "20",
        )
        assert agent.returncode == 0, agent.stderr[-2000:]
        assert "all delivered" in agent.stderr
        wait_until(lambda: "Worker ready" in worker.tail(200_000), 120, "the stream worker", worker)
        scn = synthetic.Scenario(job=job, hosts=3, steps=8, straggler=1, guilty_steps=(3, 5), guilty_layer="sched")
        p = Producer(kafka.producer_config(kafka.connection(settings)))
        for key, b in synthetic.generate(scn):
            p.produce(schema.TOPIC_EVENTS, key=key, value=schema.encode_batch(b))
        assert p.flush(30) == 0
        tail = run(
            env,
            "tail",
            "steps",
            "--job",
            job,
            "--from-beginning",
            "--count",
            "8",
            "--json",
            "--timeout-s",
            "90",
            timeout=150,
        )
        assert tail.returncode == 0, tail.stderr[-2000:]
        steps = [json.loads(line) for line in tail.stdout.splitlines() if line.startswith("{")]
        assert {s["step"] for s in steps} == set(range(8))
        assert {s["step"]: s["straggler"]["host"] for s in steps if s["straggler"]} == {3: "node1", 5: "node1"}

        def fired():
            r = run(env, "alerts", "--job", job, "--json", "--since", "1h")
            return r.returncode == 0 and [a for a in json.loads(r.stdout) if a["status"] == "firing"]

        wait_until(fired, 60, "the alert through SASL_SSL", rules)
        out = tmp_path / "t.json"
        exp = run(env, "trace", "export", "--job", job, "--steps", "2-4", "-o", str(out), "--since", "1h")
        assert exp.returncode == 0 and "3 hosts" in exp.stderr, exp.stderr[-2000:]
        st = run(env, "status", "--json")
        assert st.returncode == 0, st.stdout[-2000:] + st.stderr[-2000:]
        status = json.loads(st.stdout)
        assert status["security"]["protocol"] == "SASL_SSL" and status["security"]["sasl_username"] == "obshub"
        assert any(t["name"] == schema.TOPIC_STEPS and t["messages"] > 0 for t in status["topics"])
        assert [t["partitions"] for t in status["topics"] if t["name"] == schema.TOPIC_DLQ] == [3]
        st_text = run(env, "status")
        assert st_text.returncode == 0 and "Kafka security: SASL_SSL, SASL SCRAM-SHA-512 as obshub" in st_text.stdout

        # mutual TLS: the agent with a client certificate on the SSL listener
        mtls = {
            "OBSHUB_HOME": str(tmp_path / "home2"),
            "OBSHUB_BOOTSTRAP": broker.mtls,
            "OBSHUB_KAFKA_SECURITY_PROTOCOL": "SSL",
            "OBSHUB_KAFKA_SSL_CA_LOCATION": str(broker.certs.ca),
            "OBSHUB_KAFKA_SSL_CERTIFICATE_LOCATION": str(broker.certs.client_cert),
            "OBSHUB_KAFKA_SSL_KEY_LOCATION": str(broker.certs.client_key),
        }
        agent2 = run(
            mtls,
            "agent",
            "--source",
            "synthetic",
            "--rate",
            "2000",
            "--synthetic-events",
            "1000",
            "--job",
            f"{job}-mtls",
            "--host",
            f"m-{u}",
            "--duration",
            "20",
        )
        assert agent2.returncode == 0 and "all delivered" in agent2.stderr, agent2.stderr[-2000:]
    finally:
        for pr in reversed(procs):
            pr.stop()
    texts = [pr.log.read_text(errors="replace") for pr in procs]
    texts += [agent.stdout, agent.stderr, tail.stderr, exp.stderr, st.stdout, st.stderr, st_text.stdout, agent2.stderr]
    assert not [t for t in texts if broker.password in t], "the SASL password leaked into a log or output"


def test_wrong_password_and_untrusted_ca_name_the_setting(broker, tmp_path):
    env = sasl_env(broker, tmp_path / "home")
    bad_pw = {**env, "OBSHUB_KAFKA_SASL_PASSWORD": "not-the-password"}
    r = run(bad_pw, "alerts", "--since", "1h")
    assert r.returncode == 1
    assert "rejected the SASL credentials of user 'obshub'" in r.stderr and "OBSHUB_KAFKA_SASL_PASSWORD" in r.stderr
    assert "not-the-password" not in r.stderr + r.stdout
    st = run(bad_pw, "status", "--json")
    assert st.returncode == 1 and "OBSHUB_KAFKA_SASL_PASSWORD" in json.loads(st.stdout)["broker"]["error"]
    assert "not-the-password" not in st.stdout
    w = run(bad_pw, "streams", "worker", "--app-id", "sec-bad", "--index", "82", timeout=90)
    assert w.returncode == 1 and "rejected the SASL credentials" in w.stderr, w.stderr[-2000:]
    untrusted = {**env, "OBSHUB_KAFKA_SSL_CA_LOCATION": str(broker.certs.other_ca)}
    r = run(untrusted, "trace", "export", "--job", "x", "--steps", "1", "-o", str(tmp_path / "x.json"))
    assert r.returncode == 1
    assert "is not trusted" in r.stderr and "OBSHUB_KAFKA_SSL_CA_LOCATION" in r.stderr, r.stderr[-2000:]
    no_cert = {
        "OBSHUB_HOME": str(tmp_path / "h3"),
        "OBSHUB_BOOTSTRAP": broker.mtls,
        "OBSHUB_KAFKA_SECURITY_PROTOCOL": "SSL",
        "OBSHUB_KAFKA_SSL_CA_LOCATION": str(broker.certs.ca),
    }
    r = run(no_cert, "alerts", "--since", "1h")
    assert r.returncode == 1 and "OBSHUB_KAFKA_SSL_CERTIFICATE_LOCATION" in r.stderr, r.stderr[-2000:]
