"""Broker reachability, said once and clearly, for every command and service.

Commands (``tail``, ``trace export``, ``replay``, ``streams worker`` start-up checks) call
``require_broker``: it returns as soon as the broker answers a metadata request, or raises
:class:`BrokerUnreachable` after ``timeout_s`` (``CONNECT_TIMEOUT_S`` by default) with one message naming
the address, the reason (connection refused, name not resolved, timed out) and what to check. One-shot
commands (``alerts``, ``tail``, ``trace export``, ``topics``) raise it at once when the bootstrap is this
machine's loopback and its port refuses connections (``refused_fails``: no local broker runs, waiting
cannot help; walk24: they waited 10 s silently).

Services (``rules serve``, ``streams worker``) keep running and retrying: a :class:`BrokerWatch` passed to
their confluent-kafka clients (``watch.client_conf()``) drops librdkafka's own log lines and reports the
state once per change: one warning when the broker cannot be reached, one line when it is back. On a
cluster of several brokers, one broker gone is not "unreachable": ``watch_members`` logs one line per
broker that leaves the cluster's metadata and one per broker back, and the service keeps working.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

from obshub.core import kafka
from obshub.core.errors import ObshubError
from obshub.core.log import NullLogger

CONNECT_TIMEOUT_S = 10.0
HINT = (
    "start the local broker with `obshub up` (`obshub status` shows it), or set OBSHUB_BOOTSTRAP "
    "(or --bootstrap where a command has it) to your cluster"
)


class BrokerUnreachable(ObshubError):
    """No broker of ``bootstrap`` answered within the time allowed."""


def _endpoints(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for part in bootstrap.split(","):
        part = part.strip()
        if "://" in part:
            part = part.split("://", 1)[1]
        host, _, port = part.rpartition(":")
        host = host.strip("[]") or "localhost"
        try:
            out.append((host, int(port)))
        except ValueError:
            out.append((part, 9092))
    return out


def tcp_reason(bootstrap: str, timeout_s: float = 2.0) -> str | None:
    """None when some bootstrap address accepts a TCP connection, else why none does (for messages):
    ``connection refused``, ``name not resolved``, ``timed out``..."""
    reasons = []
    for host, port in _endpoints(bootstrap):
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return None
        except socket.gaierror:
            reasons.append(f"{host}: name not resolved")
        except ConnectionRefusedError:
            reasons.append(f"{host}:{port}: connection refused")
        except TimeoutError:
            reasons.append(f"{host}:{port}: no answer within {timeout_s:.0f} s")
        except OSError as exc:
            reasons.append(f"{host}:{port}: {exc.strerror or exc}")
    return "; ".join(reasons) or "no address given"


def _loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback (``127.0.0.0/8``, ``::1``, ``localhost``)."""
    import ipaddress

    if host.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: not known to be local without resolving it
        return False


def local_refused(bootstrap: str) -> str | None:
    """Why no broker can answer now, when every address of ``bootstrap`` is a loopback one and each
    refuses a TCP connection (ECONNREFUSED: nothing listens on that port of this machine, so waiting cannot
    help a one-shot command): ``"127.0.0.1:19999: connection refused"``. None otherwise: a remote address
    (a broker may be restarting behind it), a port that accepts, or any other answer (a timeout)."""
    ends = _endpoints(bootstrap)
    if not ends or not all(_loopback(h) for h, _p in ends):
        return None
    reasons = []
    for host, port in ends:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return None
        except ConnectionRefusedError:
            reasons.append(f"{host}:{port}: connection refused")
        except OSError:
            return None
    return "; ".join(reasons)


def unreachable_message(bootstrap: str, reason: str, waited_s: float | None = None) -> str:
    """The one sentence every component uses."""
    within = f" within {waited_s:.0f} s" if waited_s else ""
    return f"cannot reach the Kafka broker at {bootstrap}{within} ({reason})"


def require_broker(
    bootstrap: str,
    timeout_s: float = CONNECT_TIMEOUT_S,
    *,
    extra_conf: dict | None = None,
    stop: threading.Event | None = None,
    refused_fails: bool = False,
) -> bool:
    """Return True once the broker answers a metadata request; raise BrokerUnreachable after
    ``timeout_s`` seconds (the whole wait, connection attempts included). ``extra_conf``: more client
    settings (security). Returns False as soon as ``stop`` is set (checked every 0.5 s at most).
    ``refused_fails`` (one-shot commands: ``alerts``, ``tail``, ``trace export``, ``topics``): raise
    BrokerUnreachable at once, without the wait, when every bootstrap address is a loopback one whose port
    refuses connections (:func:`local_refused`: the local broker is not running); a remote broker still gets
    ``timeout_s``. Services that retry in a loop leave it False (each try then waits its time). Raises
    :class:`obshub.core.kafkacheck.KafkaConnectError` at once, naming the setting, when the broker answers
    but rejects the SASL credentials or the client certificate, or its certificate is not trusted."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from obshub.core.kafkacheck import explain

    deadline = time.monotonic() + timeout_s
    errors: list[tuple[str, str]] = []
    # the settings first (an incomplete security configuration is named whether or not a broker runs)
    conf = kafka.admin_config(
        kafka.KafkaConnection(bootstrap=bootstrap),
        {"logger": NullLogger(), "socket.timeout.ms": 2000, **(extra_conf or {})},
    )
    if refused_fails:
        refused = local_refused(bootstrap)
        if refused is not None:
            raise BrokerUnreachable(unreachable_message(bootstrap, refused), HINT)
    client_conf: dict[str, Any] = {**conf, "error_cb": lambda e: errors.append((e.name(), e.str()))}
    admin = AdminClient(client_conf)
    reason = "no answer"
    while True:
        left = deadline - time.monotonic()
        if stop is not None and stop.is_set():
            return False
        if left <= 0:
            break
        try:
            admin.list_topics(timeout=min(0.5, left))
            return True
        except KafkaException as exc:  # transport, timeout: retried until the deadline
            reason = str(exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else exc)
        admin.poll(0)
        wrong = explain(errors, conf)  # rejected credentials or certificates: retrying cannot help
        if wrong is not None:
            raise wrong
    tcp = tcp_reason(bootstrap, 1.0)
    raise BrokerUnreachable(unreachable_message(bootstrap, tcp or reason, timeout_s), HINT)


class BrokerWatch:
    """Broker state for a long-running service: ``client_conf()`` goes into every confluent-kafka client
    of the service (no librdkafka log lines; errors to ``on_error``). ``down(reason)`` logs one warning
    per outage, ``up()`` one line when the broker is back (call it on any sign of life: a message, an
    assignment, a delivered flush)."""

    _DOWN_CODES = ("_ALL_BROKERS_DOWN", "_TRANSPORT", "_RESOLVE")

    def __init__(self, bootstrap: str, log: logging.Logger, component: str):
        self.bootstrap, self.log, self.component = bootstrap, log, component
        self.is_down = False
        self.outages = 0
        self._lock = threading.Lock()
        self.members: dict[int, str] = {}  # node id -> host:port of the brokers last listed
        self.ever: set[int] = set()

    def client_conf(self) -> dict:
        """``logger`` and ``error_cb`` settings for a confluent-kafka client."""
        return {"logger": NullLogger(), "error_cb": self.on_error}

    def on_error(self, err: Any) -> None:
        """confluent-kafka ``error_cb``: connection-type errors mark the broker down; others are logged at
        debug level (the client retries them itself)."""
        from confluent_kafka import KafkaError

        codes = {getattr(KafkaError, c) for c in self._DOWN_CODES}
        if err.code() not in codes:
            self.log.debug("kafka client: %s", err)
            return
        reason = tcp_reason(self.bootstrap, 1.0)
        if reason is None and len(_endpoints(self.bootstrap)) > 1:
            # another broker of the cluster accepts connections: one broker is gone (or one client's
            # connections are), not the cluster; ``watch_members`` says which broker, once
            self.log.debug("kafka client (the cluster still answers): %s", err)
            return
        self.down(reason or err.str())

    def watch_members(self, conf: dict, stop: threading.Event, every_s: float = 2.0) -> threading.Thread:
        """Start a daemon thread that asks the cluster for its brokers every ``every_s`` seconds (one
        metadata request, client settings ``conf``) until ``stop`` is set, and logs one warning per broker
        that left the cluster's metadata (``lost``: the controller fenced it, about 6-9 s after it died)
        and one line per broker that came back, with how many of how many serve. Three failed requests in
        a row while no bootstrap address accepts a connection are :meth:`down` (one warning), the next
        answer :meth:`up`."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        client: dict[str, Any] = {**conf, "logger": NullLogger(), "socket.timeout.ms": max(1000, int(every_s * 1000))}
        admin = AdminClient(client)

        def run() -> None:
            failed = 0
            while not stop.is_set():
                try:
                    md = admin.list_topics(timeout=every_s)
                except KafkaException as exc:
                    failed += 1
                    reason = tcp_reason(self.bootstrap, 1.0) if failed >= 3 else None
                    if reason is not None:  # 3 requests in a row failed and no broker accepts a connection
                        self.down(reason)
                    else:
                        self.log.debug("broker metadata request failed: %s", exc)
                    stop.wait(every_s)
                    continue
                failed = 0
                self.up()
                now = {b.id: f"{b.host}:{b.port}" for b in md.brokers.values()}
                self.member_change(now)
                stop.wait(every_s)

        t = threading.Thread(target=run, name=f"broker-members {self.component}", daemon=True)
        t.start()
        return t

    def member_change(self, now: dict[int, str]) -> None:
        """Compare the brokers of one metadata answer (node id -> ``host:port``) with the last ones: one
        warning per broker lost, one line per broker back (a broker first seen is not news)."""
        before, ever = self.members, self.ever
        for node in sorted(set(before) - set(now)):
            self.log.warning(
                "Kafka broker %d (%s) left the cluster; %d of %d broker(s) serve and %s continues",
                node,
                before[node],
                len(now),
                len(ever | set(now)),
                self.component,
            )
        for node in sorted(set(now) - set(before)):
            if node in ever:
                self.log.warning(
                    "Kafka broker %d (%s) is back; %d of %d broker(s) serve",
                    node,
                    now[node],
                    len(now),
                    len(ever | set(now)),
                )
        self.members, self.ever = dict(now), ever | set(now)

    def down(self, reason: str) -> None:
        with self._lock:
            if self.is_down:
                return
            self.is_down = True
            self.outages += 1
        self.log.warning(
            "%s; %s keeps retrying quietly: %s", unreachable_message(self.bootstrap, reason), self.component, HINT
        )

    def up(self) -> None:
        with self._lock:
            if not self.is_down:
                return
            self.is_down = False
        self.log.warning("reached the Kafka broker at %s again; %s resumes", self.bootstrap, self.component)
