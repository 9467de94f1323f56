"""The one Kafka connection configuration: every client kind gets the same bootstrap and security
settings, secrets stay out of repr, and an incomplete security setting is refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from obshub.core import kafka
from obshub.core.errors import ConfigError
from obshub.core.settings import KafkaConfig, load_settings


def _sasl() -> kafka.KafkaConnection:
    return kafka.KafkaConnection(
        bootstrap="k1:9093,k2:9093",
        client_id="obshub-test",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="agent",
        sasl_password="s3cret",
    )


def test_every_client_kind_carries_the_connection():
    conn = _sasl()
    common = {
        "bootstrap.servers": "k1:9093,k2:9093",
        "client.id": "obshub-test",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "agent",
        "sasl.password": "s3cret",
    }
    for conf in (kafka.producer_config(conn), kafka.consumer_config(conn, "g"), kafka.admin_config(conn)):
        assert common.items() <= conf.items()
    assert kafka.consumer_config(conn, "g", {"enable.auto.commit": False})["group.id"] == "g"
    assert kafka.consumer_config(conn, "g", {"enable.auto.commit": False})["enable.auto.commit"] is False
    assert "logger" in kafka.admin_config(conn, quiet=True)
    aio = kafka.aiokafka_kwargs(conn)
    assert aio["bootstrap_servers"] == "k1:9093,k2:9093" and aio["sasl_plain_password"] == "s3cret"
    fk = kafka.faust_kwargs(conn)
    assert fk["broker"] == ["kafka://k1:9093", "kafka://k2:9093"] and "broker_credentials" in fk


def test_secrets_stay_out_of_repr_and_plaintext_needs_no_credentials():
    assert "s3cret" not in repr(_sasl())
    plain = kafka.connection(load_settings(bootstrap="h:1"))
    assert kafka.faust_kwargs(plain) == {"broker": ["kafka://h:1"]}
    assert kafka.producer_config(plain) == {"bootstrap.servers": "h:1", "security.protocol": "PLAINTEXT"}


def test_incomplete_sasl_is_refused_naming_what_is_missing():
    with pytest.raises(ValidationError, match="--sasl-password"):
        kafka.KafkaConnection(bootstrap="k:1", security_protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_username="u")


def test_agent_producer_config_is_built_on_the_connection():
    conf = KafkaConfig(bootstrap="k:1", extra={"linger.ms": "7"}).librdkafka_config()
    assert conf["bootstrap.servers"] == "k:1" and conf["enable.idempotence"] is True
    assert conf["linger.ms"] == "7"  # extra entries override


@pytest.mark.parametrize(
    "good", ["k:9092", "k1:9093, k2:9093", "10.0.0.1:1,10.0.0.2:65535", "[::1]:9092", "PLAINTEXT://k:9092"]
)
def test_well_formed_bootstrap_servers_are_taken(good):
    assert kafka.bootstrap_problem(good) is None
    assert kafka.KafkaConnection(bootstrap=good).bootstrap == good.strip()


@pytest.mark.parametrize(
    "bad, why",
    [
        ("127.0.0.1:99999", "port 99999 is out of range (1-65535)"),
        ("k:0", "port 0 is out of range"),
        ("k:x", "port 'x' is not a number"),
        ("k", "'k' has no port"),
        (":9092", "':9092' has no host"),
        ("k:1,,k:2", "has an empty address between commas"),
        ("k:1,", "has an empty address between commas"),
        ("::1:9092", "an IPv6 host is written in brackets"),
        ("k :1", "holds a blank"),
    ],
)
def test_a_malformed_bootstrap_is_refused_saying_what_is_wrong(bad, why):
    """`OBSHUB_BOOTSTRAP=127.0.0.1:99999 obshub status` waited 10 s and said "connection refused"; a
    malformed address is refused before any client is made, by the settings and by every connection."""
    assert why in (kafka.bootstrap_problem(bad) or "")
    with pytest.raises(ValidationError, match="host:port"):
        kafka.KafkaConnection(bootstrap=bad)
    with pytest.raises(ConfigError, match="OBSHUB_BOOTSTRAP") as e:
        load_settings(bootstrap=bad)
    assert why in str(e.value)


def test_an_empty_bootstrap_setting_is_still_the_local_broker():
    assert load_settings(bootstrap=" ").bootstrap_servers == f"127.0.0.1:{load_settings().kafka_port}"
