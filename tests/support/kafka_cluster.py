"""A real three-broker Kafka cluster for the tests of broker faults: three KRaft nodes (each broker and
controller) from the jars of ``obshub up`` (``~/.cache/obshub/kafka``), on free ports, heaps of 256 MB
(``obshub.stack.LocalCluster``). Internal topics have replication factor 3 and ``min.insync.replicas`` 2.

Use the ``kafka_cluster`` fixture (module scope: one cluster per test module, stopped at its end); it
yields ``(cluster, settings)`` where ``settings.bootstrap_servers`` lists the three brokers."""

from __future__ import annotations

import pytest

from obshub.core.settings import load_settings
from obshub.stack import LocalCluster


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory):
    """Three brokers for the module; ``(LocalCluster, Settings)``."""
    root = tmp_path_factory.mktemp("kafka-cluster")
    cluster = LocalCluster(load_settings(home=root / "home"), root, n=3, heap_mb=256)
    try:
        cluster.start_all(timeout_s=180)
        yield cluster, load_settings(home=root / "home", bootstrap=cluster.bootstrap)
    finally:
        cluster.stop(clean=False)  # a throwaway cluster: no controlled shutdown to wait for
