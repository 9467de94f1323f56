"""One clear error for a Kafka connection that cannot work: the credentials, the certificates or the
address, named by the setting that holds them.

librdkafka reports a rejected SASL password, an untrusted broker certificate or a refused client
certificate only as log lines and error callbacks, repeated on every retry, while the client itself just
waits ("all brokers down"). :func:`check` makes one metadata request with a short timeout, collects those
callbacks, and turns the first one that explains the failure into a :class:`KafkaConnectError` whose
message names the setting to fix (environment variable names, the same as the Helm chart's). The
password never appears in the message (librdkafka does not echo it; the user name does appear).
"""

from __future__ import annotations

from typing import Any

from obshub.core.errors import ObshubError
from obshub.core.log import NullLogger

# the setting that holds each part of the connection (environment variables of obshub.core.settings)
SETTING = {
    "bootstrap": "OBSHUB_BOOTSTRAP",
    "protocol": "OBSHUB_KAFKA_SECURITY_PROTOCOL",
    "mechanism": "OBSHUB_KAFKA_SASL_MECHANISM",
    "username": "OBSHUB_KAFKA_SASL_USERNAME",
    "password": "OBSHUB_KAFKA_SASL_PASSWORD",
    "ca": "OBSHUB_KAFKA_SSL_CA_LOCATION",
    "cert": "OBSHUB_KAFKA_SSL_CERTIFICATE_LOCATION",
    "key": "OBSHUB_KAFKA_SSL_KEY_LOCATION",
}


class KafkaConnectError(ObshubError):
    """Kafka cannot be used with this connection; the message names the setting to fix."""


def explain(errors: list[tuple[str, str]], conf: dict[str, Any]) -> KafkaConnectError | None:
    """The error for the first explaining entry of ``errors`` (``(librdkafka error name, text)`` pairs
    from an error callback) for a client configured with ``conf`` (librdkafka keys), or None when none of
    them explains a configuration problem."""
    bootstrap = conf.get("bootstrap.servers", "?")
    protocol = str(conf.get("security.protocol", "PLAINTEXT")).upper()
    for name, text in errors:
        low = text.lower()
        if name == "_AUTHENTICATION" or "sasl authentication error" in low:
            return KafkaConnectError(
                f"Kafka at {bootstrap} rejected the SASL credentials of user {conf.get('sasl.username')!r} "
                f"(mechanism {conf.get('sasl.mechanism')})",
                f"check {SETTING['username']} and {SETTING['password']} (and {SETTING['mechanism']}: the broker "
                "must have a SCRAM credential of that mechanism for the user)",
            )
        if "certificate verify failed" in low or "broker certificate could not be verified" in low:
            ca = conf.get("ssl.ca.location")
            return KafkaConnectError(
                f"the TLS certificate of Kafka at {bootstrap} is not trusted: it is not signed by "
                + (f"the CA in {ca}" if ca else "a CA of the system store"),
                f"set {SETTING['ca']} to the PEM file of the CA that signed the brokers' certificates",
            )
        if "bad certificate" in low or "certificate required" in low or "unknown ca" in low:
            return KafkaConnectError(
                f"Kafka at {bootstrap} refused this client's TLS certificate"
                + ("" if conf.get("ssl.certificate.location") else " (none was given)"),
                f"set {SETTING['cert']} and {SETTING['key']} to a client certificate and key signed by a CA "
                "the broker trusts (mutual TLS)",
            )
        if "ssl handshake failed" in low or ("disconnected" in low and protocol == "PLAINTEXT"):
            return KafkaConnectError(
                f"the TLS handshake with Kafka at {bootstrap} failed ({text.split(': ', 1)[-1][:200]})",
                f"check {SETTING['protocol']} ({protocol}) against the listener of {bootstrap}",
            )
    return None


def check(conf: dict[str, Any], timeout_s: float = 10.0) -> None:
    """Make one metadata request with the librdkafka configuration ``conf``. Returns when the cluster
    answers; raises KafkaConnectError naming the setting when the credentials, certificates or protocol
    are wrong, or when nothing answers at ``bootstrap.servers`` within ``timeout_s``."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    errors: list[tuple[str, str]] = []
    c = {k: v for k, v in conf.items() if k not in ("error_cb", "logger")}
    c["error_cb"] = lambda e: errors.append((e.name(), e.str()))
    c["logger"] = NullLogger()
    admin = AdminClient(c)
    try:
        admin.list_topics(timeout=timeout_s)
        return
    except KafkaException:
        pass
    admin.poll(0.5)  # deliver the error callbacks queued while list_topics waited
    found = explain(errors, conf)
    if found is not None:
        raise found
    protocol = str(conf.get("security.protocol", "PLAINTEXT")).upper()
    raise KafkaConnectError(
        f"no Kafka broker answered at {conf.get('bootstrap.servers')} within {timeout_s:.0f} s "
        f"(security protocol {protocol})",
        f"check {SETTING['bootstrap']} (host:port of a listener that speaks {protocol}) and that the broker runs",
    )
