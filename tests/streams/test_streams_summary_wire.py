"""The step summary's wire bytes are pinned: typed records inside the analysis (msgspec Structs for the
baseline, the evidence, the network statistics and blame, the quality counters and the collectives) must
encode to the same msgpack maps as the dicts they replaced: same keys, same order, no default left out.

The golden file ``data/summary_wire.msgpack.z`` is zlib-compressed msgpack of
``[[case, [summary bytes, ...]], ...]`` written by the analysis before the Structs came in (main d152858),
over synthetic steps that reach every branch of ``summarize`` that builds a sub-record: a clean and a
guilty step per time layer, a network fault (directed view, connection blame, network evidence), a loss
spread over a window of steps, a one-node job of several ranks (rank units) and a wide step (compact).

A deliberate change of the summary's content regenerates the file::

    .venv/bin/python tests/streams/test_streams_summary_wire.py --write
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import msgspec

from obshub.streams import offline, synthetic, wire

GOLDEN = Path(__file__).with_name("data") / "summary_wire.msgpack.z"


def _cases() -> dict[str, list[bytes]]:
    """``{case: [packb(summary) of each step, in step order]}`` (a few hundred ms in all)."""
    scns = {
        f"layer-{layer}": (
            synthetic.Scenario(job=f"w-{layer}", hosts=4, steps=24, guilty_steps=(20, 22), guilty_layer=layer),
            1,
        )
        for layer in ("sched", "memory", "cuda", "nic", "pytorch")
    }
    scns["network"] = (
        synthetic.Scenario(job="w-net", hosts=5, steps=24, guilty_steps=(19, 20, 21, 22), guilty_layer="network"),
        1,
    )
    scns["one-node-ranks"] = (
        synthetic.Scenario(job="w-ranks", hosts=4, steps=24, straggler=3, guilty_steps=(20, 21), guilty_layer="cuda"),
        4,
    )
    scns["ranks-wide"] = (
        synthetic.Scenario(job="w-wide", hosts=144, steps=22, straggler=77, guilty_steps=(21,), guilty_layer="memory"),
        2,
    )
    out: dict[str, list[bytes]] = {}
    for name, (scn, per) in scns.items():
        batches = synthetic.generate(scn) if per == 1 else synthetic.generate_ranks(scn, per)
        sums = offline.summarize_batches(b for _k, b in batches)
        keep = sorted(sums)[-3:] if name == "ranks-wide" else sorted(sums)  # the wide steps' last 3: 15 KB each
        out[name] = [wire.packb(sums[k]) for k in keep]
    return out


def _diff(want: dict, got: dict, path: str = "") -> str:
    """The first difference of two decoded summaries: key order, a key, or a value."""
    if list(want) != list(got):
        return f"{path or 'summary'}: keys {list(want)} became {list(got)}"
    for k in want:
        a, b = want[k], got[k]
        if isinstance(a, dict) and isinstance(b, dict):
            d = _diff(a, b, f"{path}.{k}")
            if d:
                return d
        elif a != b or type(a) is not type(b):
            return f"{path}.{k}: {a!r} became {b!r}"
    return "bytes differ with equal values"


def test_summary_bytes_unchanged_by_typed_records():
    want = msgspec.msgpack.decode(zlib.decompress(GOLDEN.read_bytes()))
    got = _cases()
    assert sorted(got) == sorted(name for name, _ in want)
    for name, golden in want:
        assert len(got[name]) == len(golden), name
        for i, (a, b) in enumerate(zip(golden, got[name])):
            if a != b:
                raise AssertionError(f"{name} step #{i}: {_diff(wire.unpackb(a), wire.unpackb(b))}")


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    GOLDEN.parent.mkdir(exist_ok=True)
    cases = _cases()
    GOLDEN.write_bytes(zlib.compress(msgspec.msgpack.encode([[k, cases[k]] for k in sorted(cases)]), 9))
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size:,} bytes, {sum(map(len, cases.values()))} summaries)")
