"""bench/worker_profile.py's sorting of py-spy stacks: the innermost frame of the application's own code
wins, else the Faust / aiokafka / asyncio machinery on the stack."""

from __future__ import annotations

from bench.worker_profile import category, classify


def test_stacks_sorted_by_innermost_own_frame_then_machinery():
    loop = "_run_once (asyncio/base_events.py:1)"
    fold = "fold_agent (obshub/streams/app.py:204);apply (obshub/streams/fold.py:90);part (obshub/streams/fold.py:200)"
    assert (
        category(f"{loop};{fold};merge (obshub/streams/accumulate.py:300)".split(";"))
        == "reduce + merge (streams.accumulate)"
    )
    assert (
        category(
            f"{loop};{fold};__setitem__ (faust/tables/table.py:83);send (aiokafka/producer/producer.py:1)".split(";")
        )
        == "Faust table writes (changelog records)"
    )
    assert (
        category(f"{loop};one (obshub/streams/app.py:161);send (faust/topics.py:159)".split(";"))
        == "produce path (Faust topics/producer, aiokafka producer)"
    )
    assert category([loop, "select (selectors.py:451)"]) == "asyncio event loop"
    assert classify(f"{loop};{fold} 3\n{loop} 2\nnot a sample line\n") == {
        "fold + ingest logic (streams.fold, streams.ingest)": 3,
        "asyncio event loop": 2,
    }
