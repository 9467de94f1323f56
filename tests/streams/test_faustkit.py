"""The Faust adapter (obshub/streams/faustkit.py) is the only place that uses Faust's internals: these
tests pin what it relies on to the installed faust-streaming, so an upgrade that moves one of them fails
here, by name, instead of in a running worker."""

from __future__ import annotations

import asyncio

import faust
import faust.streams

from obshub.streams import faustkit


def test_the_installed_faust_is_one_the_adapter_was_checked_on():
    assert faustkit.check_internals() == []
    assert faustkit.SUPPORTED[0] <= faustkit.faust_version()[:2] < faustkit.SUPPORTED[1]


def test_as_current_sets_the_event_faust_reads_for_table_writes():
    class Event:  # what faust.streams.current_event() hands back: the object itself
        pass

    ev = Event()

    async def run():
        faustkit.as_current(ev)
        return faust.streams.current_event()

    assert asyncio.run(run()) is ev


def test_only_the_adapter_touches_faust_internals():
    """No other module of the worker reaches into Faust's private names."""
    import re
    from pathlib import Path

    import obshub.streams as pkg

    offenders = []
    for path in Path(pkg.__file__).parent.rglob("*.py"):
        if path.name == "faustkit.py":
            continue
        text = path.read_text()
        if re.search(r"faust\.[\w.]*\._\w|_current_event|apply_changelog_batch|SensorDelegate", text):
            offenders.append(path.name)
    assert offenders == []


def test_recovering_table_skips_what_the_predicate_marks(tmp_path):
    skipped = []

    class T(faustkit.RecoveringTable):
        is_bad = staticmethod(lambda x: x == "bad")
        on_skip = staticmethod(lambda table, msg, which, bad: skipped.append((table.name, which, bad)))

    applied = []

    class Base(faust.Table):
        def apply_changelog_batch(self, batch):
            applied.extend(batch)

    class Probe(T, Base):
        pass

    app = faust.App("faustkit-test", broker="kafka://127.0.0.1:1", store="memory://", datadir=str(tmp_path))
    table = Probe(app, name="t")

    class Ev:
        def __init__(self, key, value):
            self.key, self.value, self.message = key, value, None

    good, bad_key, bad_value = Ev("k", "v"), Ev("bad", "v"), Ev("k", "bad")
    table.apply_changelog_batch([good, bad_key, bad_value])
    assert applied == [good]
    assert skipped == [("t", "key", "bad"), ("t", "value", "bad")]


def test_idempotent_producer_asks_aiokafka_for_idempotence(tmp_path):
    """The worker's producer (built, not started: no broker) is aiokafka's idempotent one with acks=all,
    so a batch retried after a broker loss is not written twice; another app's producer is left as is."""
    app = faust.App("faustkit-idem", broker="kafka://127.0.0.1:1", store="memory://", datadir=str(tmp_path / "a"))
    other = faust.App("faustkit-plain", broker="kafka://127.0.0.1:1", store="memory://", datadir=str(tmp_path / "b"))
    faustkit.idempotent_producer(app)

    async def build(a):
        return a.transport.create_producer(loop=asyncio.get_running_loop(), beacon=a.beacon)._new_producer()

    idem, plain = asyncio.run(build(app)), asyncio.run(build(other))
    assert idem._txn_manager is not None and idem._txn_manager.transactional_id is None
    assert idem._sender._acks == -1
    assert plain._txn_manager is None
