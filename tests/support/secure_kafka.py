"""A real Apache Kafka broker with secured listeners, for the tests of secure Kafka: the jars of the
local stack (``obshub up`` installs them), KRaft, and

- ``SASL_SSL``: SASL/SCRAM-SHA-512 over TLS (the user ``obshub`` created at storage format time),
- ``SSL``: mutual TLS (``ssl.client.auth=required``: a client certificate signed by the test CA),
- ``PLAINTEXT`` on 127.0.0.1 only for the broker's own inter-broker traffic and the test set-up.

Certificates are made with the ``cryptography`` package: a test CA, the broker's certificate (SAN
127.0.0.1 and localhost), a client certificate for mutual TLS, and a second, unrelated CA whose
certificate a client must reject. Kafka reads them as PEM files (``ssl.keystore.type=PEM``).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from obshub import stack
from obshub.core.settings import load_settings

USER = "obshub"


def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject_key, cn: str, issuer_key, issuer_cn: str, *, ca: bool, sans=()) -> x509.Certificate:
    now = dt.datetime.now(dt.timezone.utc)
    b = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(issuer_cn))
        .public_key(subject_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def _pem_key(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _pem_cert(cert) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@dataclass
class Certs:
    """PEM files: ``ca`` (trusted), ``other_ca`` (unrelated), ``client_cert``/``client_key`` (mutual TLS),
    ``server_chain``/``server_key`` (the broker's)."""

    ca: Path
    other_ca: Path
    client_cert: Path
    client_key: Path
    server_chain: Path
    server_key: Path


def make_certs(folder: Path) -> Certs:
    """A fresh CA, broker and client certificate, and an unrelated CA, written to ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, other_key, srv_key, cli_key = _key(), _key(), _key(), _key()
    ca = _cert(ca_key, "obshub test CA", ca_key, "obshub test CA", ca=True)
    other = _cert(other_key, "unrelated CA", other_key, "unrelated CA", ca=True)
    srv = _cert(
        srv_key,
        "127.0.0.1",
        ca_key,
        "obshub test CA",
        ca=False,
        sans=[x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")],
    )
    cli = _cert(cli_key, "obshub-client", ca_key, "obshub test CA", ca=False)
    files = {
        "ca": _pem_cert(ca),
        "other_ca": _pem_cert(other),
        "client_cert": _pem_cert(cli),
        "client_key": _pem_key(cli_key),
        "server_chain": _pem_cert(srv) + _pem_cert(ca),
        "server_key": _pem_key(srv_key),
    }
    out = {}
    for name, data in files.items():
        p = folder / f"{name}.pem"
        p.write_bytes(data)
        os.chmod(p, 0o600)
        out[name] = p
    return Certs(**out)


@dataclass
class SecureBroker:
    """A running secured broker: ``sasl_ssl`` and ``mtls`` bootstrap addresses, ``plaintext`` (set-up
    only), the SCRAM ``password`` of ``USER``, the certificates, and the process."""

    sasl_ssl: str
    mtls: str
    plaintext: str
    password: str
    certs: Certs
    proc: subprocess.Popen
    home: Path

    def stop(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL) and wait for it."""
        stack.stop_pid(self.proc.pid)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass


def _free_ports(n: int) -> list[int]:
    import socket

    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def start(home: Path, timeout_s: float = 120.0) -> SecureBroker:
    """Start a broker with the listeners above in ``home`` (fresh storage, fresh certificates). Raises
    RuntimeError with the broker's log tail when it does not come up."""
    settings = load_settings()
    libs = stack.install_kafka(settings)
    java = stack.java_binary()
    certs = make_certs(home / "certs")
    password = secrets.token_urlsafe(18)
    plain, ctrl, sasl, mtls = _free_ports(4)
    data = home / "data"
    log = home / "kafka.log"
    props = home / "server.properties"
    # PEM keystore and truststore given inline, per listener
    lines = [
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@127.0.0.1:{ctrl}",
        f"listeners=PLAINTEXT://127.0.0.1:{plain},CONTROLLER://127.0.0.1:{ctrl},SASL_SSL://127.0.0.1:{sasl},"
        f"SSL://127.0.0.1:{mtls}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{plain},SASL_SSL://127.0.0.1:{sasl},SSL://127.0.0.1:{mtls}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL",
        "sasl.enabled.mechanisms=SCRAM-SHA-512",
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config="
        "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "ssl.client.auth=none",
        "listener.name.ssl.ssl.client.auth=required",
        f"log.dirs={data}",
        "num.partitions=1",
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=4",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        "auto.create.topics.enable=true",
    ]
    for lst in ("sasl_ssl", "ssl"):
        lines += [
            f"listener.name.{lst}.ssl.keystore.type=PEM",
            f"listener.name.{lst}.ssl.keystore.certificate.chain={_inline(certs.server_chain)}",
            f"listener.name.{lst}.ssl.keystore.key={_inline(certs.server_key)}",
            f"listener.name.{lst}.ssl.truststore.type=PEM",
            f"listener.name.{lst}.ssl.truststore.certificates={_inline(certs.ca)}",
        ]
    home.mkdir(parents=True, exist_ok=True)
    props.write_text("\n".join(lines) + "\n")
    log4j = home / "log4j2.properties"
    log4j.write_text(stack._LOG4J2.format(log=log))
    data.mkdir(parents=True, exist_ok=True)
    fmt = subprocess.run(
        [
            java,
            "-cp",
            stack._classpath(libs),
            f"-Dlog4j2.configurationFile={log4j}",
            "kafka.tools.StorageTool",
            "format",
            "-t",
            stack._cluster_id(),
            "-c",
            str(props),
            "--add-scram",
            f"SCRAM-SHA-512=[name={USER},password={password}]",
        ],
        capture_output=True,
        text=True,
    )
    if fmt.returncode != 0:
        raise RuntimeError(f"kafka storage format failed: {(fmt.stdout + fmt.stderr)[-1500:]}")
    out = open(home / "kafka.stdout.log", "ab")
    proc = subprocess.Popen(
        [
            java,
            "-Xms128m",
            "-Xmx384m",
            "-XX:+UseG1GC",
            "-XX:TieredStopAtLevel=1",
            f"-Dlog4j2.configurationFile={log4j}",
            "-cp",
            stack._classpath(libs),
            "kafka.Kafka",
            str(props),
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    broker = SecureBroker(f"127.0.0.1:{sasl}", f"127.0.0.1:{mtls}", f"127.0.0.1:{plain}", password, certs, proc, home)
    deadline = time.monotonic() + timeout_s
    plain_settings = load_settings(bootstrap=broker.plaintext)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if stack.port_in_use(sasl) and stack._metadata_ok(plain_settings):
            return broker
        time.sleep(0.5)
    broker.stop()
    tail = (home / "kafka.stdout.log").read_text(errors="replace")[-2000:] + (
        log.read_text(errors="replace")[-2000:] if log.exists() else ""
    )
    raise RuntimeError(f"the secured broker did not come up within {timeout_s:.0f} s:\n{tail}")


def _inline(path: Path) -> str:
    """A PEM file as one properties value (newlines escaped as Kafka's PEM-in-config form expects)."""
    return path.read_text().strip().replace("\n", "\\n")
