"""Writes the golden files of tests/streams/test_streams_typed.py with the dict-form code (run on main `a87518b`,
before the typed accumulators): ``PYTHONPATH=<checkout of a87518b> python tests/streams/data/typed_golden.py tests/streams/data``.
The changelog file differs from run to run in its wall-clock stamps (``agents`` ``seen_ns``) only.
quiet22 patched the ``culprit`` of the summaries whose sched straggler is now ``starved`` (a straggler blamed
for its run queue is judged as an evidence culprit is: g1's steps 4-7, the old changelog job's 2): decoded,
that field replaced by the new code's, re-encoded; every other byte as the dict-form code wrote it."""

import sys
import zlib

from obshub.core import schema
from obshub.streams import synthetic, wire
from obshub.streams.inproc import InProcess


def clock():
    return 1_780_000_000_000_000_000


def generated_summaries(clock) -> list:
    """The summaries of three generated jobs (one, four and eight ranks per host; sched, network and memory
    stragglers) at the fixed ``clock`` (tests/streams/test_streams_typed.py compares them with the golden file)."""
    summ = []
    for scn, rph in (
        (synthetic.Scenario(job="g1", hosts=6, steps=10, guilty_steps=(4, 5, 6, 7), guilty_layer="sched"), 1),
        (
            synthetic.Scenario(
                job="g2", hosts=16, steps=10, straggler=5, guilty_steps=(5, 6, 7, 8), guilty_layer="network"
            ),
            4,
        ),
        (synthetic.Scenario(job="g3", hosts=8, steps=8, straggler=3, guilty_steps=(3, 4, 5), guilty_layer="memory"), 8),
    ):
        pipe = InProcess(partitions=3, clock=clock)
        batches = synthetic.generate(scn) if rph == 1 else synthetic.generate_ranks(scn, rph)
        for _k, b in batches:
            pipe.feed(schema.encode_batch(b))
        pipe.close_all()
        summ.extend(pipe.summaries)
    return summ


def main(out: str) -> None:
    summ = generated_summaries(clock)
    open(f"{out}/typed_summaries.msgpack.z", "wb").write(zlib.compress(wire.packb(summ), 9))
    print("summaries", len(summ))

    # a parts record and part messages in today's format: steps left open (no close)
    scn = synthetic.Scenario(job="old", hosts=8, steps=3, straggler=3, guilty_steps=(1, 2), guilty_layer="sched")
    pipe = InProcess(partitions=1, clock=clock)
    msgs = []
    for _k, b in synthetic.generate_ranks(scn, 4)[:-1]:  # the last host's last batch missing: last step stays open
        for v, _p in pipe.parts_of(schema.encode_batch(b)):
            msgs.append(wire.packb(v))
    open(f"{out}/typed_old_parts.msgpack.z", "wb").write(zlib.compress(wire.packb(msgs), 9))
    print("messages", len(msgs))

    # a worker's changelog (every table) with the last step open, in today's format, and what today's code
    # summarises after the missing batch arrives (before and after a restart on that changelog)
    batches = synthetic.generate_ranks(scn, 4)
    pipe = InProcess(partitions=1, clock=clock)
    held = [b for _k, b in batches if b.host == "node1" and b.seq >= 1]
    for _k, b in batches:
        if b not in held:
            pipe.feed(schema.encode_batch(b))
    logs = {name: dict(t.log) for name, t in pipe.tables.items()}
    last = [schema.encode_batch(b) for b in held]
    for x in last:
        pipe.feed(x)
    pipe.close_all()
    open(f"{out}/typed_old_changelog.msgpack.z", "wb").write(
        zlib.compress(wire.packb({"logs": logs, "last": last, "summaries": pipe.summaries}), 9)
    )
    print("changelog", {k: len(v) for k, v in logs.items()}, len(pipe.summaries))


if __name__ == "__main__":
    main(sys.argv[1])
