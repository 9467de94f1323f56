"""A minimal Faust application that proves Faust (through aiokafka) works with the project's broker
(Kafka 4.x removed old protocol versions, KIP-896).

It exercises exactly what the stream application relies on, with nothing pre-created by obshub: Faust
creates its own topics (the table changelog, the leader topic), joins a consumer group, commits offsets,
writes a changelog-backed table and recovers it on the next start. Run::

    python -m tests.support.compat --bootstrap 127.0.0.1:19092 --app-id compat-1 --topic compat-in --out /tmp/n

It counts the messages of ``--topic`` in a table and writes the current total to ``--out`` after each
message (``<total>\\n``). Stop it with SIGTERM; a restart continues the count from the changelog.
tests/streams/test_streams_faust_kafka.py drives it against the broker of ``obshub up``.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    """Parse the options and run the worker until SIGTERM/SIGINT."""
    import faust

    ap = argparse.ArgumentParser(prog="python -m tests.support.compat", description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--app-id", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--state-dir", default="/tmp/obshub-compat")
    a = ap.parse_args(argv)
    app = faust.App(
        a.app_id,
        broker=f"kafka://{a.bootstrap}",
        store="memory://",
        datadir=a.state_dir,
        topic_partitions=1,
        topic_replication_factor=1,
        web_enabled=False,
        autodiscover=False,
        broker_session_timeout=6.0,
        broker_heartbeat_interval=1.0,
        broker_commit_interval=0.5,
    )
    src = app.topic(a.topic, key_serializer="raw", value_serializer="raw", partitions=1)
    counts = app.Table("counts", default=int, partitions=1)

    @app.agent(src)
    async def count(stream):
        async for _value in stream:
            counts["total"] += 1
            a.out.write_text(f"{counts['total']}\n")

    faust.Worker(app, loglevel="INFO", quiet=True).execute_from_commandline()


if __name__ == "__main__":
    main()
