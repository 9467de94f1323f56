"""librdkafka's error texts (as the secured test broker produces them, see tests/deploy/test_secure_kafka.py)
turn into one error naming the setting to fix, without the password."""

from __future__ import annotations

from obshub.core.kafkacheck import explain

CONF = {
    "bootstrap.servers": "k1:9093",
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "obshub",
    "sasl.password": "s3cret-pw",
    "ssl.ca.location": "/etc/ca.pem",
}


def test_rejected_password_names_the_credential_settings():
    e = explain(
        [
            ("_ALL_BROKERS_DOWN", "1/1 brokers are down"),
            (
                "_AUTHENTICATION",
                "sasl_ssl://k1:9093/bootstrap: SASL authentication error: Authentication failed "
                "during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512",
            ),
        ],
        CONF,
    )
    assert "rejected the SASL credentials of user 'obshub'" in str(e)
    assert "OBSHUB_KAFKA_SASL_PASSWORD" in e.hint and "s3cret-pw" not in str(e) + e.hint


def test_untrusted_broker_certificate_names_the_ca_setting():
    e = explain(
        [
            (
                "_SSL",
                "sasl_ssl://k1:9093/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate "
                "verify failed: broker certificate could not be verified, verify that ssl.ca.location is correctly "
                "configured",
            )
        ],
        CONF,
    )
    assert "not signed by the CA in /etc/ca.pem" in str(e) and "OBSHUB_KAFKA_SSL_CA_LOCATION" in e.hint


def test_refused_client_certificate_names_the_certificate_settings():
    conf = {"bootstrap.servers": "k1:9094", "security.protocol": "SSL", "ssl.ca.location": "/etc/ca.pem"}
    e = explain(
        [
            (
                "_TRANSPORT",
                "ssl://k1:9094/bootstrap: Receive failed: error:0A000412:SSL routines::ssl/tls alert "
                "bad certificate: SSL alert number 42",
            )
        ],
        conf,
    )
    assert "refused this client's TLS certificate (none was given)" in str(e)
    assert "OBSHUB_KAFKA_SSL_CERTIFICATE_LOCATION" in e.hint


def test_nothing_to_explain():
    assert explain([("_ALL_BROKERS_DOWN", "1/1 brokers are down")], CONF) is None


def test_replication_factor_and_partitions_are_settings(monkeypatch):
    import pytest

    from obshub.core import topics
    from obshub.core.errors import ConfigError

    events = next(t for t in topics.TOPICS if t.name == "obshub.events.v1")
    assert topics.replication_factor() == 1 and topics.partitions(events) == events.partitions
    monkeypatch.setenv("OBSHUB_KAFKA_REPLICATION_FACTOR", "3")
    monkeypatch.setenv("OBSHUB_KAFKA_PARTITIONS", "obshub.events.v1=64, obshub.steps.v1=16")
    assert topics.replication_factor() == 3 and topics.partitions(events) == 64
    monkeypatch.setenv("OBSHUB_KAFKA_PARTITIONS", "obshub.events.v1:64")
    with pytest.raises(ConfigError, match="OBSHUB_KAFKA_PARTITIONS"):
        topics.partitions(events)
    monkeypatch.setenv("OBSHUB_KAFKA_REPLICATION_FACTOR", "zero")
    with pytest.raises(ConfigError, match="OBSHUB_KAFKA_REPLICATION_FACTOR"):
        topics.replication_factor()


def test_security_settings_come_from_the_environment(monkeypatch, tmp_path):
    from obshub.core import kafka

    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    for k, v in {
        "OBSHUB_KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
        "OBSHUB_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "OBSHUB_KAFKA_SASL_USERNAME": "obshub",
        "OBSHUB_KAFKA_SASL_PASSWORD": "pw-12345",
        "OBSHUB_KAFKA_SSL_CA_LOCATION": str(ca),
    }.items():
        monkeypatch.setenv(k, v)
    conn = kafka.KafkaConnection(bootstrap="k1:9093")
    conf = kafka.consumer_config(conn, "g")
    assert (conf["security.protocol"], conf["sasl.mechanism"], conf["sasl.password"], conf["ssl.ca.location"]) == (
        "SASL_SSL",
        "SCRAM-SHA-512",
        "pw-12345",
        str(ca),
    )
    assert "pw-12345" not in repr(conn) and "pw-12345" not in str(conn)
    assert (
        kafka.KafkaConnection(bootstrap="k1:9093", security_protocol="PLAINTEXT").security_protocol.value == "PLAINTEXT"
    )
