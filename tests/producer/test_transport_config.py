"""Agent settings: security settings pass through to librdkafka, secrets never print, wrong options are
reported by name."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from obshub.core.errors import ConfigError
from obshub.core.settings import KafkaConfig, agent_config
from obshub.producer.publisher import Publisher
from tests.conftest import REPO

SECRET = "s3cr3t-Pa55"


def test_sasl_ssl_settings_reach_librdkafka_and_secrets_stay_hidden(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    k = KafkaConfig(
        bootstrap="kafka1:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="agent",
        sasl_password=SECRET,
        ssl_ca_location=ca,
        ssl_key_password=SECRET,
        extra={"client.id": "node3"},
    )
    assert SECRET not in repr(k) and SECRET not in str(k.model_dump())
    conf = k.librdkafka_config()
    assert conf["security.protocol"] == "SASL_SSL" and conf["sasl.mechanism"] == "SCRAM-SHA-512"
    assert conf["sasl.username"] == "agent" and conf["sasl.password"] == SECRET
    assert conf["ssl.ca.location"] == str(ca) and conf["ssl.key.password"] == SECRET
    assert conf["enable.idempotence"] is True and conf["acks"] == "all" and conf["client.id"] == "node3"
    # librdkafka itself accepts the combination (SASL and SSL support built in)
    Publisher(
        KafkaConfig(
            bootstrap="127.0.0.1:1",
            security_protocol="SASL_SSL",
            sasl_mechanism="PLAIN",
            sasl_username="agent",
            sasl_password=SECRET,
        )
    ).close()


def test_incomplete_security_settings_are_reported_by_option(tmp_path):
    with pytest.raises(ConfigError) as ei:
        agent_config(
            job="j",
            host="h1",
            host_id=1,
            spool={"dir": tmp_path},
            kafka={"bootstrap": "k:9093", "security_protocol": "SASL_SSL", "sasl_password": SECRET},
        )
    msg = str(ei.value)
    assert "--sasl-mechanism" in msg and "--sasl-username" in msg and SECRET not in msg
    with pytest.raises(ConfigError, match="host name"):
        agent_config(job="j", host="bad/host", host_id=1, spool={"dir": tmp_path}, kafka={"bootstrap": "k:1"})
    with pytest.raises(ConfigError, match="quarter of the spool size"):
        agent_config(
            job="j",
            host="h",
            host_id=1,
            kafka={"bootstrap": "k:1"},
            spool={"dir": tmp_path, "max_bytes": 1 << 20, "segment_bytes": 1 << 19},
        )


def test_cli_reports_a_wrong_option_without_traceback_or_secret(tmp_path):
    env = {**os.environ, "OBSHUB_HOME": str(tmp_path), "OBSHUB_SASL_PASSWORD": SECRET, "PYTHONPATH": str(REPO)}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "obshub.cli",
            "agent",
            "--source",
            "synthetic",
            "--host",
            "h1",
            "--bootstrap",
            "127.0.0.1:1",
            "--security-protocol",
            "SASL_SSL",
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert "error:" in r.stderr and "--sasl-mechanism" in r.stderr and "hint:" in r.stderr
    assert "Traceback" not in r.stderr and SECRET not in r.stderr + r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "obshub.cli", "agent", "--host", "h1", "--bootstrap", "127.0.0.1:1"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "--registered" in r.stderr and "Traceback" not in r.stderr
