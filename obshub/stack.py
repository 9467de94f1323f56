"""The local stack: a single-node Apache Kafka 4.x broker in KRaft mode with obshub's topics
(:data:`obshub.core.topics.TOPICS`); ``down`` stops the components of :mod:`obshub.core.registry`.

Steps of ``up``: resolve the broker jars from Maven Central into the cache (once) -> write
``server.properties`` -> format the KRaft storage (first start only) -> start ``kafka.Kafka`` with logs
under ``$OBSHUB_HOME/logs`` -> wait until the broker answers metadata requests -> create the topics of
``TOPICS``. ``down`` stops registered components (SIGTERM, then SIGKILL after a grace period), then the
broker.

Errors raise :class:`obshub.core.errors.StackError` with a hint: missing Java or Maven, a busy port, a failed
download, a broker that exits or does not answer in time (the hint quotes the log's last lines).
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Callable

from obshub.core import kafka
from obshub.core.errors import StackError
from obshub.core.registry import components, pid_alive, register_component, unregister_component
from obshub.core.settings import Settings
from obshub.core.topics import partitions, replication_factor, topic_config, topic_specs

Progress = Callable[[str], None]


def _quiet(_msg: str) -> None:
    pass


# ------------------------------------------------------------------------------------------------------
# Install: the broker's jars from Maven Central
# ------------------------------------------------------------------------------------------------------
_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>obshub.local</groupId><artifactId>kafka-broker</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{v}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>{v}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId><version>2.24.3</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>2.24.3</version></dependency>
  </dependencies>
</project>
"""


def java_binary() -> str:
    """Path of ``java`` (``$JAVA_HOME/bin/java`` first). Raises StackError when there is none."""
    home = os.environ.get("JAVA_HOME")
    if home and Path(home, "bin", "java").exists():
        return str(Path(home, "bin", "java"))
    found = shutil.which("java")
    if not found:
        raise StackError(
            "Java was not found (no JAVA_HOME, no `java` on PATH)",
            "install a JDK 17+: apt-get install openjdk-17-jre-headless",
        )
    return found


def java_version(java: str | None = None) -> int:
    """Major version of the Java runtime (17 for '17.0.15'). Raises StackError if it cannot run."""
    java = java or java_binary()
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except OSError as exc:
        raise StackError(f"Failed to run {java}: {exc}", "check the JDK installation") from exc
    for token in out.split():
        token = token.strip('"')
        if token[:1].isdigit():
            head = token.split(".")[0]
            if head == "1":  # 1.8 style
                return int(token.split(".")[1])
            return int(head)
    raise StackError(f"Failed to read the Java version from: {out.strip()!r}", "install a JDK 17+")


def install_kafka(settings: Settings, progress: Progress = _quiet) -> Path:
    """Make sure the broker jars of ``settings.kafka_version`` are in the cache; return the libs folder.

    Uses Maven (``mvn dependency:copy-dependencies``) so the jars and their dependencies come from Maven
    Central with checksums verified, and ``~/.m2`` is reused. Raises StackError when Maven is missing or
    the download fails (the hint names the version and the Maven output).
    """
    libs = settings.kafka_libs
    marker = libs.parent / "complete"
    if marker.exists() and any(libs.glob("kafka_2.13-*.jar")):
        return libs
    mvn = shutil.which("mvn")
    if not mvn:
        raise StackError(
            "Maven (`mvn`) was not found; it fetches the Kafka broker jars from Maven Central", "apt-get install maven"
        )
    progress(f"installing Apache Kafka {settings.kafka_version} jars from Maven Central into {libs}")
    work = libs.parent
    if libs.exists():
        shutil.rmtree(libs)
    work.mkdir(parents=True, exist_ok=True)
    (work / "pom.xml").write_text(_POM.format(v=settings.kafka_version))
    cmd = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(work / "pom.xml"),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={libs}",
        "-DincludeScope=runtime",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not any(libs.glob("kafka_2.13-*.jar")):
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        raise StackError(
            f"Failed to download Apache Kafka {settings.kafka_version} from Maven Central:\n{tail}",
            "check network access to Maven Central, or set OBSHUB_KAFKA_VERSION to a served version",
        )
    marker.write_text(settings.kafka_version + "\n")
    return libs


# ------------------------------------------------------------------------------------------------------
# Config, format, start
# ------------------------------------------------------------------------------------------------------
def _server_properties(settings: Settings) -> str:
    data = settings.kafka_dir / "data"
    return "\n".join(
        [
            "# generated by obshub; edits are overwritten by `obshub up`",
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{settings.controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{settings.kafka_port},CONTROLLER://127.0.0.1:{settings.controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{settings.kafka_port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            f"log.dirs={data}",
            "num.partitions=1",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=8",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "transaction.state.log.num.partitions=1",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=true",
            "log.retention.hours=24",
            "log.segment.bytes=67108864",
            "",
        ]
    )


_LOG4J2 = """status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = WARN
logger.org.name = org.apache.kafka
logger.org.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
"""


def java_failure(output: str, limit: int = 600) -> str:
    """The reason in a failed Java tool's ``output``: its exception lines (``Exception in thread "main"
    java.lang.IllegalArgumentException: requirement failed: ...``, ``Caused by: ...``), without the stack
    frames (``at ...``) and logger noise; the last ``limit`` characters when it has none."""
    lines = [ln.strip() for ln in output.splitlines()]
    why = [
        ln for ln in lines if ("Exception" in ln or ln.startswith(("Error", "Caused by"))) and not ln.startswith("at ")
    ]
    text = " / ".join(dict.fromkeys(why)) if why else output.strip()
    return text[:limit] if why else text[-limit:]


def _cluster_id() -> str:
    """A Kafka cluster id (URL-safe base64 of 16 random bytes). One that starts with '-' would be read as
    an option by kafka-storage's argument parser, so those are drawn again."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _classpath(libs: Path) -> str:
    return str(libs) + "/*"


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts TCP connections on ``host:port``. A connect to an unused port in the
    ephemeral range can be given that same port as its source and meet itself (TCP simultaneous open):
    such a connection is not a listener."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0 and not connected_to_itself(s)


def connected_to_itself(sock: socket.socket) -> bool:
    """Is the connected TCP socket ``sock`` its own peer (same local and remote address and port)?"""
    return sock.getsockname() == sock.getpeername()


def _bindable(port: int, host: str = "127.0.0.1") -> bool:
    """Can a listening socket bind ``host:port`` now (no socket holds it, listening or connected)?"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port_pair() -> int:
    """A port p with p and p+1 both free on 127.0.0.1 (broker and KRaft controller listeners), for a
    private broker (tests, benchmarks). Raises StackError when none is found in 50 tries."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p < 65000 and not port_in_use(p) and not port_in_use(p + 1) and _bindable(p + 1):
            return p
    raise StackError("no free pair of TCP ports on 127.0.0.1", "stop some local services and retry")


# ------------------------------------------------------------------------------------------------------
# The broker's record in the component registry
# ------------------------------------------------------------------------------------------------------
def broker_pid(settings: Settings) -> int | None:
    """PID of the local broker when it runs, else None."""
    rec = broker_record(settings)
    return int(rec["pid"]) if rec else None


def broker_record(settings: Settings) -> dict | None:
    """The registry record of the local broker of ``$OBSHUB_HOME`` when its process runs (``pid``,
    ``port``, ``log``, ``version``), else None."""
    for c in components(settings):
        if c["name"] == "kafka" and c["running"]:
            return c
    return None


# ------------------------------------------------------------------------------------------------------
# up / down
# ------------------------------------------------------------------------------------------------------
def up(settings: Settings, progress: Progress = _quiet, timeout_s: float = 90.0) -> dict:
    """Install (once), start the broker and create the topics. Returns ``{"already": bool, "pid": int,
    "bootstrap": str, "log": str}``. Idempotent: when the broker already runs, only the topics are checked.
    Raises StackError (missing Java/Maven, busy port, failed download, broker that does not start)."""
    rec = broker_record(settings)
    pid = int(rec["pid"]) if rec else None
    log = settings.logs_dir / "kafka.log"
    running_port = rec.get("port") if rec else None
    if pid and running_port is not None and int(running_port) != settings.kafka_port:
        # one state folder holds one broker: its data, logs and registry record are those of the running one
        raise StackError(
            f"the stack of {settings.home} already runs a Kafka broker on 127.0.0.1:{running_port} (pid {pid}); "
            f"one state folder holds one broker, so port {settings.kafka_port} cannot be started from it",
            f"for a second stack beside it, give it its own state folder: "
            f"OBSHUB_HOME=/tmp/obshub-{settings.kafka_port} obshub up --port {settings.kafka_port} "
            f"(or use the running one: OBSHUB_KAFKA_PORT={running_port})",
        )
    if pid:
        if not port_in_use(settings.kafka_port):  # the process of the record lives, but no broker listens
            raise StackError(
                f"the broker of {settings.home} (pid {pid}) runs but nothing listens on "
                f"127.0.0.1:{settings.kafka_port}: it is starting, stuck or failing",
                f"read {log}; `obshub down` stops it, then `obshub up` starts it again",
            )
        ensure_topics(settings, progress)
        return {"already": True, "pid": pid, "bootstrap": settings.bootstrap_servers, "log": str(log)}
    java = java_binary()
    major = java_version(java)
    if major < 17:
        raise StackError(
            f"Java {major} found at {java}; Apache Kafka 4.x brokers need Java 17 or newer",
            "install openjdk-17-jre-headless or set JAVA_HOME to a JDK 17+",
        )
    for port, what in ((settings.kafka_port, "broker"), (settings.controller_port, "controller")):
        if port_in_use(port):
            raise StackError(
                f"port {port} (Kafka {what} listener) on 127.0.0.1 is already in use by another process",
                f"stop that process, or choose another port: OBSHUB_KAFKA_PORT=... obshub up "
                f"(`ss -ltnp 'sport = :{port}'` shows who holds it)",
            )
    libs = install_kafka(settings, progress)
    for d in (settings.kafka_dir, settings.logs_dir, settings.run_dir, settings.state_dir):
        d.mkdir(parents=True, exist_ok=True)
    props = settings.kafka_dir / "server.properties"
    props.write_text(_server_properties(settings))
    log4j = settings.kafka_dir / "log4j2.properties"
    log4j.write_text(_LOG4J2.format(log=log))
    data = settings.kafka_dir / "data"
    if not (data / "meta.properties").exists():
        progress(f"formatting KRaft storage in {data}")
        data.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [
                java,
                "-cp",
                _classpath(libs),
                f"-Dlog4j2.configurationFile={log4j}",
                "kafka.tools.StorageTool",
                "format",
                "-t",
                _cluster_id(),
                "-c",
                str(props),
                "--ignore-formatted",
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise StackError(
                f"Failed to format Kafka storage in {data}: {java_failure(proc.stdout + proc.stderr)}",
                f"read the reason above ({props} is the broker's configuration); if the folder holds a broker's "
                f"old data, remove {data} to start from an empty broker",
            )
    progress(f"starting Apache Kafka {settings.kafka_version} (KRaft) on 127.0.0.1:{settings.kafka_port}")
    stdout = open(settings.logs_dir / "kafka.stdout.log", "ab")
    env = dict(os.environ)
    env.pop("KAFKA_OPTS", None)
    proc = subprocess.Popen(
        [
            java,
            f"-Xms{min(256, settings.kafka_heap_mb)}m",
            f"-Xmx{settings.kafka_heap_mb}m",
            "-XX:+UseG1GC",
            "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={log4j}",
            "-cp",
            _classpath(libs),
            "kafka.Kafka",
            str(props),
        ],
        stdout=stdout,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )
    register_component(
        settings, "kafka", proc.pid, log=str(log), port=settings.kafka_port, version=settings.kafka_version
    )
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                unregister_component(settings, "kafka")
                raise StackError(
                    f"the Kafka broker exited with code {proc.returncode} during start-up:\n"
                    f"{_tail(settings.logs_dir / 'kafka.stdout.log')}\n{_tail(log)}",
                    f"read {log}",
                )
            if port_in_use(settings.kafka_port) and _metadata_ok(settings):
                break
            time.sleep(0.3)
        else:
            raise StackError(f"the Kafka broker did not answer within {timeout_s:.0f} s (stopped again)", f"read {log}")
    except BaseException:
        # a broker that never answered, or a Ctrl-C while it started: stop it rather than leave a process
        # running and registered that the caller does not know it started (a demo's Ctrl-C during "starting
        # Apache Kafka" left one on the port, newuser20)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        unregister_component(settings, "kafka")
        raise
    ensure_topics(settings, progress)
    return {"already": False, "pid": proc.pid, "bootstrap": settings.bootstrap_servers, "log": str(log)}


def _tail(path: Path, n: int = 10) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").strip().splitlines()[-n:])
    except OSError:
        return ""


def _admin(settings: Settings):
    from confluent_kafka.admin import AdminClient

    return AdminClient(kafka.admin_config(kafka.connection(settings), {"socket.timeout.ms": 5000}, quiet=True))


def _metadata_ok(settings: Settings) -> bool:
    from confluent_kafka import KafkaException

    try:
        md = _admin(settings).list_topics(timeout=2)
        return bool(md.brokers)
    except KafkaException:  # no broker answered within the timeout
        return False


def ensure_topics(settings: Settings, progress: Progress = _quiet) -> list[str]:
    """Create any topic of ``TOPICS`` that does not exist, with the settings' partition counts
    (``topic_specs``) and the configs of the one table (``topics.topic_config``: retention, cleanup policy,
    ``min.insync.replicas``); return the names created."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic

    admin = _admin(settings)
    try:
        existing = set(admin.list_topics(timeout=10).topics)
    except KafkaException as exc:  # a broker that listens but does not answer (stuck, or not Kafka)
        raise StackError(
            f"the Kafka broker at {settings.bootstrap_servers} did not answer a metadata request within 10 s",
            f"read {settings.logs_dir / 'kafka.log'}; `obshub down` then `obshub up` restarts the local one",
        ) from exc
    new = [
        NewTopic(
            t.name,
            num_partitions=partitions(t),
            replication_factor=replication_factor(),
            config=topic_config(t.name),
        )
        for t in topic_specs(settings)
        if t.name not in existing
    ]
    created = []
    if new:
        for name, fut in admin.create_topics(new, operation_timeout=20).items():
            try:
                fut.result()
                created.append(name)
            except KafkaException as exc:  # TOPIC_ALREADY_EXISTS from a concurrent `up` is fine
                if "already exists" not in str(exc).lower():
                    raise StackError(f"Failed to create topic {name}: {exc}", "read the broker log") from exc
        progress("created topics " + ", ".join(created))
    return created


def stop_pid(pid: int, grace_s: float = 15.0) -> bool:
    """SIGTERM ``pid`` (its process group when it leads one), wait up to ``grace_s``, then SIGKILL.
    Returns True when it had to be killed."""
    try:
        target = -pid if os.getpgid(pid) == pid else pid
    except ProcessLookupError:
        return False
    try:
        os.kill(target, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            _reap(pid)
            return False
        time.sleep(0.1)
    try:
        os.kill(target, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _reap(pid)
    return True


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def down(settings: Settings, progress: Progress = _quiet) -> list[str]:
    """Stop every registered component, the broker last. Returns the names stopped."""
    stopped = []
    comps = components(settings)
    order = [c for c in comps if c["name"] != "kafka"] + [c for c in comps if c["name"] == "kafka"]
    for c in order:
        if c["running"]:
            progress(f"stopping {c['name']} (pid {c['pid']})")
            killed = stop_pid(int(c["pid"]), grace_s=30.0 if c["name"] == "kafka" else 10.0)
            if killed:
                progress(f"{c['name']} did not stop in time and was killed")
            stopped.append(c["name"])
        unregister_component(settings, c["name"])
    return stopped


# ------------------------------------------------------------------------------------------------------
# status
# ------------------------------------------------------------------------------------------------------
def status(settings: Settings) -> dict:
    """A snapshot for ``obshub status``: broker health, topics with partitions, consumer groups with lag,
    components. Shape::

        {"bootstrap": str, "broker": {"up": bool, "pid": int|None, "log": str, "error": str|None},
         "topics": [{"name", "partitions", "messages"}], "groups": [{"group", "state", "lag"}],
         "components": [{"name", "pid", "running", ...}], "home": str, "logs": str}
    """
    log = settings.logs_dir / "kafka.log"
    out: dict = {
        "bootstrap": settings.bootstrap_servers,
        "home": str(settings.home),
        "logs": str(settings.logs_dir),
        "broker": {"up": False, "pid": broker_pid(settings), "log": str(log), "error": None},
        "topics": [],
        "groups": [],
        "components": components(settings),
    }
    if not port_in_use(settings.kafka_port) and not settings.bootstrap:
        out["broker"]["error"] = f"nothing listens on 127.0.0.1:{settings.kafka_port}"
        return out
    from confluent_kafka import KafkaException

    from obshub.core.kafkacheck import KafkaConnectError, check

    conn = kafka.connection(settings)
    out["security"] = {
        "protocol": conn.security_protocol.value,  # never the password
        "sasl_mechanism": conn.sasl_mechanism.value if conn.sasl_mechanism else None,
        "sasl_username": conn.sasl_username,
        "ssl_ca_location": str(conn.ssl_ca_location) if conn.ssl_ca_location else None,
        "ssl_certificate_location": str(conn.ssl_certificate_location) if conn.ssl_certificate_location else None,
    }
    try:
        check(kafka.admin_config(conn), timeout_s=8.0)
        admin = _admin(settings)
        md = admin.list_topics(timeout=5)
    except KafkaConnectError as exc:
        out["broker"]["error"] = f"{exc}; {exc.hint}"
        return out
    except KafkaException as exc:
        out["broker"]["error"] = f"metadata request failed: {exc}"
        return out
    out["broker"]["up"] = bool(md.brokers)
    watermarks = _watermarks(settings, md)
    for name in sorted(md.topics):
        parts = md.topics[name].partitions
        msgs = sum(hi - lo for (t, _p), (lo, hi) in watermarks.items() if t == name)
        out["topics"].append({"name": name, "partitions": len(parts), "messages": msgs})
    out["groups"] = _group_lag(admin, watermarks)
    return out


def _watermarks(settings: Settings, md) -> dict[tuple[str, int], tuple[int, int]]:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    c = Consumer(
        kafka.consumer_config(kafka.connection(settings), "obshub-status", {"enable.auto.commit": False}, quiet=True)
    )
    out = {}
    try:
        for name, t in md.topics.items():
            for p in t.partitions:
                try:
                    out[(name, p)] = c.get_watermark_offsets(TopicPartition(name, p), timeout=2)
                except KafkaException:  # a partition without a leader now: left out of the status
                    continue
    finally:
        c.close()
    return out


def _group_lag(admin, watermarks) -> list[dict]:
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException

    groups = []
    try:
        listed = admin.list_consumer_groups(request_timeout=5).result()
    except KafkaException:  # the broker does not answer: no group rows
        return groups
    for g in sorted(listed.valid, key=lambda g: g.group_id):
        if g.group_id == "obshub-status":
            continue
        lag = 0
        try:
            res = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(g.group_id)])
            offsets = res[g.group_id].result()
            for tp in offsets.topic_partitions:
                lo_hi = watermarks.get((tp.topic, tp.partition))
                if lo_hi and tp.offset >= 0:
                    lag += max(0, lo_hi[1] - tp.offset)
        except KafkaException:  # offsets of this group unreadable now: shown as lag -1
            lag = -1
        state = getattr(g.state, "name", str(g.state))
        groups.append({"group": g.group_id, "state": state, "lag": lag})
    return groups


# ------------------------------------------------------------------------------------------------------
# A local multi-broker cluster (tests and benchmarks of broker faults)
# ------------------------------------------------------------------------------------------------------
class LocalCluster:
    """``n`` KRaft nodes (each broker and controller, a static quorum of all ``n``) on free ports of
    127.0.0.1, from the jars of ``obshub up`` (``settings.kafka_libs``), for the tests and benchmarks of
    broker faults: ``kill(node)`` (SIGKILL), ``start(node)`` again, ``stop()`` all. Internal topics have
    replication factor ``min(3, n)`` and ``min.insync.replicas`` one less (at least 1).

    ``heap_mb``: JVM heap of each node (MB); three nodes of 256 MB fit beside a test session. Node ids are
    1..n; ``bootstrap`` lists every broker. Raises StackError when a node does not start in ``timeout_s``."""

    def __init__(self, settings: Settings, root: Path, n: int = 3, heap_mb: int = 256):
        self.settings, self.root, self.n, self.heap_mb = settings, Path(root), n, heap_mb
        self.ports: dict[int, tuple[int, int]] = {}
        self.procs: dict[int, subprocess.Popen] = {}
        self.libs: Path | None = None

    @property
    def bootstrap(self) -> str:
        """``host:port`` of every broker, comma-separated."""
        return ",".join(f"127.0.0.1:{p}" for p, _c in self.ports.values())

    def _props(self, node: int) -> str:
        rf = min(3, self.n)
        isr = max(1, rf - 1)
        port, ctl = self.ports[node]
        voters = ",".join(f"{i}@127.0.0.1:{c}" for i, (_p, c) in self.ports.items())
        return "\n".join(
            [
                "process.roles=broker,controller",
                f"node.id={node}",
                f"controller.quorum.voters={voters}",
                f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{ctl}",
                f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
                "controller.listener.names=CONTROLLER",
                "inter.broker.listener.name=PLAINTEXT",
                "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                f"log.dirs={self.root / f'node{node}' / 'data'}",
                "num.partitions=1",
                f"default.replication.factor={rf}",
                f"min.insync.replicas={isr}",
                f"offsets.topic.replication.factor={rf}",
                "offsets.topic.num.partitions=4",
                f"transaction.state.log.replication.factor={rf}",
                f"transaction.state.log.min.isr={isr}",
                "transaction.state.log.num.partitions=2",
                f"share.coordinator.state.topic.replication.factor={rf}",
                f"share.coordinator.state.topic.min.isr={isr}",
                "group.initial.rebalance.delay.ms=0",
                "auto.create.topics.enable=false",
                "broker.session.timeout.ms=6000",
                "broker.heartbeat.interval.ms=1000",
                "log.segment.bytes=16777216",
                "",
            ]
        )

    def start_all(self, timeout_s: float = 120.0) -> "LocalCluster":
        """Format and start every node; return once each broker is listed in the cluster's metadata."""
        java = java_binary()
        self.libs = install_kafka(self.settings)
        while len(self.ports) < self.n:
            p = free_port_pair()
            if all(abs(p - q) > 1 for q, _c in self.ports.values()):
                self.ports[len(self.ports) + 1] = (p, p + 1)
        cid = _cluster_id()
        for node in self.ports:
            d = self.root / f"node{node}"
            (d / "data").mkdir(parents=True, exist_ok=True)
            (d / "server.properties").write_text(self._props(node))
            (d / "log4j2.properties").write_text(_LOG4J2.format(log=d / "kafka.log"))
            proc = subprocess.run(
                [java, "-cp", _classpath(self.libs), f"-Dlog4j2.configurationFile={d / 'log4j2.properties'}"]
                + ["kafka.tools.StorageTool", "format", "-t", cid, "-c", str(d / "server.properties")],
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                raise StackError(f"Failed to format node {node}: {(proc.stdout + proc.stderr)[-600:]}", str(d))
        for node in self.ports:
            self.start(node, wait=False)
        self.wait_brokers(set(self.ports), timeout_s)
        return self

    def start(self, node: int, wait: bool = True, timeout_s: float = 90.0) -> None:
        """Start node ``node`` (again); with ``wait``, return once the cluster lists it as a broker."""
        d = self.root / f"node{node}"
        assert self.libs is not None, "start_all first"
        out = open(d / "stdout.log", "ab")
        env = dict(os.environ)
        env.pop("KAFKA_OPTS", None)
        self.procs[node] = subprocess.Popen(
            [java_binary(), f"-Xms{self.heap_mb // 2}m", f"-Xmx{self.heap_mb}m", "-XX:+UseSerialGC"]
            + ["-XX:TieredStopAtLevel=1", "-Xss512k", "-Djava.awt.headless=true"]
            + [f"-Dlog4j2.configurationFile={d / 'log4j2.properties'}", "-cp", _classpath(self.libs)]
            + ["kafka.Kafka", str(d / "server.properties")],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
        out.close()
        if wait:
            self.wait_brokers({node}, timeout_s)

    def brokers(self) -> set[int]:
        """Node ids the cluster's metadata lists as brokers now (empty when none answers)."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        from obshub.core.log import NullLogger

        try:
            admin = AdminClient({"bootstrap.servers": self.bootstrap, "logger": NullLogger()})
            return set(admin.list_topics(timeout=3).brokers)
        except KafkaException:
            return set()

    def wait_brokers(self, nodes: set[int], timeout_s: float = 90.0) -> None:
        """Wait until every node of ``nodes`` is a listed broker. Raises StackError (naming the node's log)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for node in nodes:
                proc = self.procs.get(node)
                if proc is not None and proc.poll() is not None:
                    d = self.root / f"node{node}"
                    raise StackError(
                        f"Kafka node {node} exited with code {proc.returncode}:\n{_tail(d / 'stdout.log')}",
                        f"read {d / 'kafka.log'}",
                    )
            if nodes <= self.brokers():
                return
            time.sleep(0.3)
        raise StackError(f"Kafka nodes {sorted(nodes)} were not listed as brokers within {timeout_s:.0f} s", "")

    def kill(self, node: int) -> None:
        """SIGKILL node ``node`` (broker and controller at once) and reap it."""
        proc = self.procs.pop(node, None)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)

    def stop_node(self, node: int, grace_s: float = 30.0) -> None:
        """Stop node ``node`` cleanly (SIGTERM: a controlled shutdown moves its partition leaders to the
        other replicas before it exits; SIGKILL after ``grace_s``)."""
        proc = self.procs.pop(node, None)
        if proc is not None and proc.poll() is None:
            stop_pid(proc.pid, grace_s=grace_s)
            proc.wait(10)

    def leaders(self, topic: str) -> dict[int, int]:
        """Partition -> node id of its leader for ``topic`` now (-1: no leader)."""
        from confluent_kafka.admin import AdminClient

        from obshub.core.log import NullLogger

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "logger": NullLogger()})
        md = admin.list_topics(topic, timeout=5)
        return {p.id: p.leader for p in md.topics[topic].partitions.values()}

    def controller(self) -> int:
        """Node id of the active KRaft controller (the quorum leader, from a live node's
        ``__cluster_metadata-0/quorum-state``); -1 when no live node knows one."""
        import json

        for node, proc in self.procs.items():
            if proc.poll() is not None:
                continue
            try:
                qs = self.root / f"node{node}" / "data" / "__cluster_metadata-0" / "quorum-state"
                leader = int(json.loads(qs.read_text()).get("leaderId", -1))
            except (OSError, ValueError):
                continue
            if leader > 0:
                return leader
        return -1

    def stop(self, clean: bool = True, grace_s: float = 20.0) -> None:
        """Stop every node. ``clean``: SIGTERM them one by one while a majority of the KRaft voters,
        this node included, is up (its controlled shutdown needs an active controller to answer it;
        SIGKILL after ``grace_s``), and SIGKILL the rest: without a quorum a broker's controlled shutdown
        only waits out ``grace_s`` (all three stopped one by one took 23 s, most of it the last node's
        wait). ``clean=False``: SIGKILL all at once (a throwaway cluster: the tests' fixture)."""
        quorum = self.n // 2 + 1
        for node in sorted(self.procs):
            alive = sum(1 for p in self.procs.values() if p.poll() is None)
            if clean and alive >= quorum:  # a quorum answers this node's controlled shutdown
                self.stop_node(node, grace_s)
            else:
                self.kill(node)
