"""The Helm chart deploy/helm/obshub rendered by a real helm (built from its Go module by the set-up) for
the default values and for a secured Kafka (SASL/SCRAM over TLS with mutual TLS), every rendered object
validated against the Kubernetes API schemas (kubernetes-validate, schemas shipped with the package, no
network), and the properties an SRE relies on checked: minimal capabilities of the agent, resources and
probes on every container, scrape annotations that name a real port, secrets only by reference, the
rendered alerting config accepted by the rule engine, the dashboard the same as deploy/grafana's."""

from __future__ import annotations

import json
import subprocess

import kubernetes_validate
import pytest
import yaml

from obshub.rules.sinks.config import AlertingConfig
from tests.support.gotools import REPO, tool

CHART = REPO / "deploy" / "helm" / "obshub"
K8S = "1.33.0"
SECURED = {
    "kafka.bootstrap": "kafka-0.kafka:9093,kafka-1.kafka:9093",
    "kafka.securityProtocol": "SASL_SSL",
    "kafka.sasl.mechanism": "SCRAM-SHA-512",
    "kafka.sasl.username": "obshub",
    "kafka.sasl.passwordSecret.name": "obshub-kafka-password",
    "kafka.tls.caSecret.name": "kafka-cluster-ca",
    "kafka.tls.clientCertSecret.name": "obshub-kafka-client",
    "rules.sinkSecretName": "obshub-sinks",
    "rules.externalURL": "https://obshub-rules.example.com",
    "rules.alerting.runbook_base_url": "https://git.example.com/obshub/blob/main/",
}


def render(tmp_path, values: dict | None = None) -> subprocess.CompletedProcess:
    """``helm template`` with ``values`` (dotted keys) written to a values file, as a user's -f file."""
    nested: dict = {}
    for k, v in (values or {}).items():
        *path, leaf = k.split(".")
        d = nested
        for p in path:
            d = d.setdefault(p, {})
        d[leaf] = v
    vf = tmp_path / "values.yaml"
    vf.write_text(yaml.safe_dump(nested))
    args = [
        str(tool("helm")),
        "template",
        "obshub",
        str(CHART),
        "--namespace",
        "monitoring",
        "--kube-version",
        K8S,
        "-f",
        str(vf),
    ]
    return subprocess.run(
        args, capture_output=True, text=True, timeout=120, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    )


def objects(tmp_path, values=None) -> list[dict]:
    r = render(tmp_path, values)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def pod_specs(objs):
    for o in objs:
        if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet"):
            yield o, o["spec"]["template"]


@pytest.mark.parametrize("name,values", [("default", None), ("secured", SECURED)])
def test_chart_renders_valid_kubernetes_objects(tmp_path, name, values):
    objs = objects(tmp_path, values)
    kinds = sorted(o["kind"] for o in objs)
    assert kinds == [
        "ConfigMap",
        "ConfigMap",
        "DaemonSet",
        "Deployment",
        "Deployment",
        "Job",
        "PersistentVolumeClaim",
        "Service",
        "Service",
        "ServiceAccount",
    ]
    for o in objs:
        kubernetes_validate.validate(o, K8S, strict=True)  # raises ValidationError naming the field

    for o, tmpl in pod_specs(objs):
        spec = tmpl["spec"]
        ann = tmpl["metadata"].get("annotations", {})
        for c in spec["containers"]:
            where = f"{o['metadata']['name']}/{c['name']}"
            assert c["command"][0] == "/opt/obshub/.venv/bin/obshub", where
            assert {"cpu", "memory"} <= set(c["resources"]["requests"]) and "memory" in c["resources"]["limits"], where
            assert c["livenessProbe"]["httpGet"] and c["readinessProbe"]["httpGet"], where
            ports = {p["containerPort"] for p in c["ports"]}
            assert int(ann["prometheus.io/port"]) in ports, where
            env = {e["name"]: e for e in c["env"]}
            assert env["OBSHUB_METRICS_ADDR"]["value"] == "0.0.0.0"
            assert env["OBSHUB_KAFKA_REPLICATION_FACTOR"]["value"] == "3"
            assert "obshub.events.v1=64" in env["OBSHUB_KAFKA_PARTITIONS"]["value"]
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    agent = next(o for o in objs if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    assert agent["hostPID"] is True
    sc = agent["containers"][0]["securityContext"]
    assert sc["privileged"] is False
    assert sorted(sc["capabilities"]["add"]) == ["BPF", "DAC_READ_SEARCH", "PERFMON", "SYS_ADMIN", "SYS_PTRACE"]
    for o, tmpl in pod_specs(objs):
        if o["kind"] == "Deployment":
            assert tmpl["spec"]["securityContext"]["runAsNonRoot"] is True

    cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-rules"))
    cfg = AlertingConfig.model_validate(yaml.safe_load(cm["data"]["alerting.yaml"]))
    assert cfg.mode == "alertmanager" and cfg.external_url.startswith("http")
    dash = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard"))
    assert json.loads(dash["data"]["obshub-dashboard.json"]) == json.loads(
        (REPO / "deploy" / "grafana" / "obshub-dashboard.json").read_text()
    )


def test_secured_values_reference_secrets_and_mount_certificates(tmp_path):
    objs = objects(tmp_path, SECURED)
    text = yaml.safe_dump_all(objs)
    for _o, tmpl in pod_specs(objs):
        c = tmpl["spec"]["containers"][0]
        env = {e["name"]: e for e in c["env"]}
        assert env["OBSHUB_KAFKA_SECURITY_PROTOCOL"]["value"] == "SASL_SSL"
        assert env["OBSHUB_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": "obshub-kafka-password",
            "key": "password",
        }
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in tmpl["spec"]["volumes"]}
        ca = env["OBSHUB_KAFKA_SSL_CA_LOCATION"]["value"]
        assert volumes[mounts[ca.rsplit("/", 1)[0]]]["secret"]["secretName"] == "kafka-cluster-ca"
        cert = env["OBSHUB_KAFKA_SSL_CERTIFICATE_LOCATION"]["value"]
        assert volumes[mounts[cert.rsplit("/", 1)[0]]]["secret"]["secretName"] == "obshub-kafka-client"
    assert "password:" not in text.lower().replace("sasl_password", "")
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-rules"))
    assert yaml.safe_load(cm["data"]["alerting.yaml"])["external_url"] == "https://obshub-rules.example.com"


def test_validation_catches_a_wrong_object_and_helm_names_a_missing_setting(tmp_path):
    objs = objects(tmp_path)
    ds = next(o for o in objs if o["kind"] == "DaemonSet")
    ds["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = {"cores": 1}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, K8S, strict=True)
    r = render(tmp_path, {"kafka.securityProtocol": "SASL_SSL"})
    assert r.returncode != 0 and "kafka.sasl.username is required" in r.stderr


@pytest.mark.parametrize(
    "values, named",
    [
        ({"kafka.securityProtocol": "TLS"}, 'kafka.securityProtocol "TLS" is not one of PLAINTEXT, SSL,'),
        ({**SECURED, "kafka.sasl.mechanism": "scram-sha-512"}, 'kafka.sasl.mechanism "scram-sha-512" is not one of'),
        ({"logFormat": "yaml"}, 'logFormat "yaml" is not json or text'),
        # workers beyond a topic's partitions idle for that stage (rendered before: a 12-replica Deployment)
        ({"streams.replicas": 12}, "streams.replicas 12 is more than the 8 partitions of the workers' fold"),
        (
            {"streams.replicas": 6, "streams.partitions": 16, "kafka.partitions.events": 4},
            "streams.replicas 6 is more than the 4 partitions of obshub.events.v1 (kafka.partitions.events)",
        ),
    ],
)
def test_a_value_every_pod_would_refuse_fails_the_install_naming_the_key(tmp_path, values, named):
    """Rendered as given, each of these starts every pod only for it to stop at once (a crash loop the SRE
    meets in `kubectl logs`); the chart refuses it at `helm install` instead."""
    r = render(tmp_path, values)
    assert r.returncode != 0 and named in r.stderr, r.stderr


def test_pod_monitors_when_the_prometheus_operator_is_used(tmp_path):
    objs = objects(tmp_path, {"metrics.serviceMonitor.enabled": True, "metrics.serviceMonitor.labels.release": "kps"})
    mons = [o for o in objs if o["kind"] == "PodMonitor"]
    assert sorted(m["metadata"]["name"] for m in mons) == ["obshub-agent", "obshub-rules", "obshub-streams"]
    pods = {o["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]: o for o, _t in pod_specs(objs)}
    for m in mons:
        comp = m["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
        ports = {p["name"] for p in pods[comp]["spec"]["template"]["spec"]["containers"][0]["ports"]}
        assert m["spec"]["podMetricsEndpoints"][0]["port"] in ports
        assert m["metadata"]["labels"]["release"] == "kps"


@pytest.mark.parametrize("values", [None, SECURED])
def test_topics_job_runs_obshub_topics_create_before_install_and_upgrade(tmp_path, values):
    objs = objects(tmp_path, values)
    job = next(o for o in objs if o["kind"] == "Job")
    assert set(job["metadata"]["annotations"]["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    spec = job["spec"]["template"]["spec"]
    assert spec["restartPolicy"] == "Never" and "serviceAccountName" not in spec  # runs before the chart's SA
    c = spec["containers"][0]
    assert c["command"][:3] == ["/opt/obshub/.venv/bin/obshub", "topics", "create"]
    assert c["command"][c["command"].index("--streams-partitions") + 1] == "8"  # the workers' --partitions
    workers = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-streams"))
    wc = workers["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e for e in c["env"]} == {e["name"]: e for e in wc["env"]}  # the same Kafka connection
    assert c["securityContext"]["allowPrivilegeEscalation"] is False and "memory" in c["resources"]["limits"]
    mounts = {m["name"] for m in c["volumeMounts"]}
    assert mounts == {m["name"] for m in wc["volumeMounts"]}
    assert not [o for o in objects(tmp_path, {"topics.create": False}) if o["kind"] == "Job"]
