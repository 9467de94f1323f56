"""``BrokerWatch`` on a cluster of several brokers: one line per broker that leaves the cluster's metadata
and one per broker back (a broker first seen is not news), and a connection error of one broker is not
"cannot reach the Kafka broker" while another bootstrap address accepts connections."""

from __future__ import annotations

import logging
import socket

from confluent_kafka import KafkaError

from obshub.core.reach import BrokerWatch


def _said(caplog) -> list[str]:
    out = [r.getMessage() for r in caplog.records]
    caplog.clear()
    return out


def test_one_line_per_broker_lost_and_back(caplog):
    caplog.set_level(logging.INFO)
    w = BrokerWatch("a:1,b:2,c:3", logging.getLogger("t.members"), "the thing")
    w.member_change({1: "a:1", 2: "b:2", 3: "c:3"})
    assert _said(caplog) == []
    w.member_change({1: "a:1", 3: "c:3"})
    w.member_change({1: "a:1", 3: "c:3"})
    assert _said(caplog) == ["Kafka broker 2 (b:2) left the cluster; 2 of 3 broker(s) serve and the thing continues"]
    w.member_change({1: "a:1"})
    assert _said(caplog) == ["Kafka broker 3 (c:3) left the cluster; 1 of 3 broker(s) serve and the thing continues"]
    w.member_change({1: "a:1", 2: "b:2", 3: "c:3", 4: "d:4"})
    assert _said(caplog) == [
        "Kafka broker 2 (b:2) is back; 4 of 4 broker(s) serve",
        "Kafka broker 3 (c:3) is back; 4 of 4 broker(s) serve",
    ]  # broker 4 is new, not back
    assert not w.is_down


def test_a_transport_error_of_one_broker_is_not_the_cluster_unreachable(caplog):
    caplog.set_level(logging.DEBUG)
    with socket.socket() as live, socket.socket() as dead:
        live.bind(("127.0.0.1", 0))
        live.listen()
        dead.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        lp, dp = live.getsockname()[1], dead.getsockname()[1]
        w = BrokerWatch(f"127.0.0.1:{dp},127.0.0.1:{lp}", logging.getLogger("t.partial"), "the thing")
        w.on_error(KafkaError(KafkaError._TRANSPORT, f"127.0.0.1:{dp}/2: Connect failed"))
        assert not w.is_down and not [r for r in caplog.records if r.levelno >= logging.WARNING]
        alone = BrokerWatch(f"127.0.0.1:{dp}", logging.getLogger("t.alone"), "the thing")
        alone.on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "all down"))
        alone.on_error(KafkaError(KafkaError._TRANSPORT, "again"))
    assert alone.is_down and alone.outages == 1
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and f"cannot reach the Kafka broker at 127.0.0.1:{dp}" in warned[0]
