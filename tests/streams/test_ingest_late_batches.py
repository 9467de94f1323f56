"""A batch that arrives after newer ones of its agent (the agent's spool replayed behind them after a broker
failover, obshub/producer/transport.py) fills its gap: folded, not dropped as a duplicate."""

from obshub.core import schema
from obshub.streams import ingest, synthetic


def _batches(n_steps: int = 10) -> list[schema.Batch]:
    return [b for _key, b in synthetic.generate(synthetic.Scenario(job="late", hosts=1, steps=n_steps))]


def _parts(res: ingest.IngestResult) -> list[str]:
    return [v["bid"] for what, _k, v in res.sends if what == "part"]


def test_a_late_batch_fills_its_gap_and_a_repeat_is_still_a_duplicate():
    b = _batches()
    agents: dict = {}
    ing = ingest.Ingest(agents)
    off = 0
    seen = {}
    for seq in (0, 1, 2, 5, 6, 3, 4, 3, 7, 4):
        seen.setdefault(seq, []).append(ing.handle(schema.encode_batch(b[seq]), "events", 0, off))
        off += 1
    aid = b[0].agent_id
    gap = seen[5][0]
    assert gap.lost == 2 and not gap.late
    for seq in (3, 4):
        first, again = seen[seq]
        assert first.late and not first.dup and first.lost == 0
        assert _parts(first) == [f"{aid}:{seq}"], "a late batch's parts are forwarded to the fold"
        assert again.dup and not again.sends, "the same batch once more is a duplicate"
    assert not seen[7][0].late and seen[7][0].lost == 0
    st = agents[aid]
    assert st["seq"] == 7 and "gaps" not in st
    assert st["offset"] == off - 1, "a late batch moves the offset a restart's replay is recognised by"


def test_a_replay_after_a_restart_is_neither_late_nor_a_duplicate():
    b = _batches()
    agents: dict = {}
    ing = ingest.Ingest(agents)
    for off, seq in enumerate((0, 1, 4, 2)):
        ing.handle(schema.encode_batch(b[seq]), "events", 0, off)
    again = ing.handle(schema.encode_batch(b[2]), "events", 0, 3)  # re-read from a committed offset
    assert again.replay and not again.late and not again.dup and _parts(again)
    assert agents[b[0].agent_id]["gaps"] == [[3, 3]]


def test_gaps_remembered_are_bounded():
    st: dict = {}
    for i in range(ingest.GAP_RANGES + 5):
        ingest._note_gap(st, 10 * i, 10 * i + 1)
    last = 10 * (ingest.GAP_RANGES + 4)
    assert len(st["gaps"]) == ingest.GAP_RANGES and st["gaps"][-1] == [last, last + 1]
    ingest._note_gap(st, 10 * ingest.GAP_SPAN, 10 * ingest.GAP_SPAN)
    assert st["gaps"] == [[10 * ingest.GAP_SPAN, 10 * ingest.GAP_SPAN]], "gaps far behind the newest are forgotten"
    assert not ingest._fill_gap(st, 5) and ingest._fill_gap(st, 10 * ingest.GAP_SPAN) and "gaps" not in st
