"""The one table of event kinds (schema.KIND_INFO) and what the stages derive from it: the stream
accumulator's per-kind rules, the agent reader's payload layouts, the probe catalogue's layers."""

from __future__ import annotations

from obshub.core import schema
from obshub.core.schema import KIND_INFO, STEP_RULES, Kind


def test_every_kind_is_in_the_table_with_known_rules():
    assert set(KIND_INFO) == set(Kind)
    for kind, info in KIND_INFO.items():
        assert info.step is None or (len(info.step) == 3 and set(info.step) <= set(STEP_RULES)), kind
    structural = {k for k, i in KIND_INFO.items() if i.step is None}
    assert structural == {
        Kind.REGISTER,
        Kind.STEP_BEGIN,
        Kind.STEP_END,
        Kind.COLLECTIVE_BEGIN,
        Kind.COLLECTIVE_END,
        Kind.RANK_STATE,
        Kind.AGENT_LOSS,
    }


def test_accumulator_rules_follow_the_table():
    from obshub.streams import accumulate

    assert set(accumulate.KIND_RULES) | accumulate.STRUCTURAL == set(Kind)
    for kind, (layer, *_fns) in accumulate.KIND_RULES.items():
        assert layer == KIND_INFO[kind].layer
    e = schema.Event(Kind.SCHED_OFFCPU, 0, 500, 0, 1, 1, 1, -1, 0, None)
    assert accumulate.KIND_RULES[Kind.SCHED_OFFCPU][1](e) == 500  # preempted: counts
    assert accumulate.KIND_RULES[Kind.SCHED_OFFCPU][1](e._replace(value=1)) == 0  # voluntary sleep: not


def test_reader_has_a_layout_for_every_record_and_probes_match_their_kinds_layer():
    from obshub.producer import probes, reader

    for kind, info in KIND_INFO.items():
        if info.record:
            assert callable(getattr(reader.Decoder, f"_{info.record}")), kind
    for p in probes.PROBES:
        assert all(KIND_INFO[k].layer == p.layer for k in p.kinds), p.name
