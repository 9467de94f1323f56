"""The step summary's wire bytes are pinned: typed records inside the analysis (msgspec Structs for the
baseline, the evidence, the network statistics and blame, the quality counters and the collectives) must
encode to the same msgpack maps as the dicts they replaced: same keys, same order, no default left out.

The golden file ``data/summary_wire.msgpack.z`` is zlib-compressed msgpack of
``[[case, [summary bytes, ...]], ...]`` written by the analysis before the Structs came in (main d152858),
over synthetic steps that reach every branch of ``summarize`` that builds a sub-record: a clean and a
guilty step per time layer, a network fault (directed view, connection blame, network evidence), slowed
steps of a network fault (the window of recent steps' retransmits), a one-node job of several ranks (rank units) and a wide step (compact).

A deliberate change of the summary's content regenerates the file::

    .venv/bin/python tests/streams/test_streams_summary_wire.py --write
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import msgspec

from obshub.core import schema
from obshub.streams import analysis, offline, synthetic, wire

GOLDEN = Path(__file__).with_name("data") / "summary_wire.msgpack.z"


def _cases() -> dict[str, list[bytes]]:
    """``{case: [packb(summary) of each step, in step order]}`` (a few hundred ms in all)."""
    scns = {
        f"layer-{layer}": (
            synthetic.Scenario(job=f"w-{layer}", hosts=4, steps=14, guilty_steps=(11, 13), guilty_layer=layer),
            1,
        )
        for layer in ("sched", "memory", "cuda", "nic", "pytorch")
    }
    scns["network"] = (
        synthetic.Scenario(job="w-net", hosts=5, steps=14, guilty_steps=(10, 11, 12, 13), guilty_layer="network"),
        1,
    )
    scns["network-slowed"] = (  # 200 ms late: slowed steps read the retransmits of the job's recent steps
        synthetic.Scenario(
            job="w-slow", hosts=5, steps=14, guilty_steps=(10, 11, 12, 13), guilty_layer="network", extra_ms=200
        ),
        1,
    )
    scns["one-node-ranks"] = (
        synthetic.Scenario(job="w-ranks", hosts=4, steps=14, straggler=3, guilty_steps=(11, 12), guilty_layer="cuda"),
        4,
    )
    scns["ranks-wide"] = (
        synthetic.Scenario(job="w-wide", hosts=136, steps=12, straggler=77, guilty_steps=(11,), guilty_layer="memory"),
        2,
    )
    out: dict[str, list[bytes]] = {}
    for name, (scn, per) in scns.items():
        batches = synthetic.generate(scn) if per == 1 else synthetic.generate_ranks(scn, per)
        sums = offline.summarize_batches(b for _k, b in batches)
        keep = sorted(sums)[-3:] if name == "ranks-wide" else sorted(sums)  # 68 hosts > compact.FULL_ROWS: the last 3
        out[name] = [wire.packb(sums[k]) for k in keep]
    return out


def _diff(want: dict, got: dict, path: str = "") -> str:
    """The first difference of two decoded summaries: key order, a key, or a value ("" for none)."""
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
    return ""


def test_summary_bytes_unchanged_by_typed_records():
    want = msgspec.msgpack.decode(zlib.decompress(GOLDEN.read_bytes()))
    got = _cases()
    assert sorted(got) == sorted(name for name, _ in want)
    for name, golden in want:
        assert len(got[name]) == len(golden), name
        for i, (a, b) in enumerate(zip(golden, got[name])):
            if a != b:
                raise AssertionError(f"{name} step #{i}: {_diff(wire.unpackb(a), wire.unpackb(b)) or 'bytes differ'}")


def test_each_records_fields_are_the_documented_keys_in_their_order():
    """Each Struct the summary is made of encodes to the keys ``schema.STEP_SUMMARY_FIELDS`` documents,
    in the documented order (a record the synthetic steps do not reach, ``Inconsistent``, included)."""

    def documented(field: str) -> list[str]:
        text = schema.STEP_SUMMARY_FIELDS[field]
        keys, depth, cur = [], 0, ""
        for ch in text[text.index("{") :]:  # the top-level keys of the first {...}
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return [k.split(":")[0].strip() for k in [*keys, cur]]
            elif ch == "," and depth == 1:
                keys.append(cur)
                cur = ""
            elif depth == 1:
                cur += ch
        raise AssertionError(f"no {{...}} in the description of {field}")

    records = {
        "baseline": analysis.Baseline(),
        "quality": analysis.Quality(),
        "collectives": analysis.Collective("0", 1, "all_reduce", 5, 2, "n1"),
        "inconsistent": analysis.Inconsistent("0", 1, "all_reduce", "waited longer than it lasted"),
        "evidence": analysis.Evidence(1, {"n1": analysis.HostEvidence(network=1.0)}, {"n1": 3}),
    }
    for field, rec in records.items():
        encoded = wire.unpackb(wire.packb(rec))
        assert list(encoded) == documented(field), field
        assert encoded == msgspec.to_builtins(rec)  # what summarize puts in the summary
    assert list(msgspec.to_builtins(analysis.HostEvidence())) == list(analysis.EVIDENCE_LAYERS)
    blame = msgspec.to_builtins(analysis.NetBlame("n2", "network", 0, 0, 0, 6))
    assert list(blame) == ["host", "layer", "excess_ns", "straggler_ns", "peer_median_ns", "count", "max_ns"]


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    GOLDEN.parent.mkdir(exist_ok=True)
    cases = _cases()
    GOLDEN.write_bytes(zlib.compress(msgspec.msgpack.encode([[k, cases[k]] for k in sorted(cases)]), 9))
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size:,} bytes, {sum(map(len, cases.values()))} summaries)")
