"""The on-disk spool: order, acknowledgement, restart, bound with exact drop accounting, torn tails, lock."""

from __future__ import annotations

import pytest

from obshub.producer.errors import SpoolError
from obshub.producer.spool import Spool

HEADER = 12


def _val(i: int, size: int = 1000) -> bytes:
    return i.to_bytes(4, "big") * (size // 4)


def _drain(sp: Spool, ack: bool = True) -> list[int]:
    got = []
    while (rec := sp.read_next()) is not None:
        pos, key, value = rec
        assert key == b"host"
        got.append(int.from_bytes(value[:4], "big"))
        if ack:
            sp.ack(pos)
    return got


def test_order_across_segments_ack_and_restart(tmp_path):
    sp = Spool(tmp_path / "s", max_bytes=1 << 20, segment_bytes=16 * 1024)
    for i in range(100):
        sp.append(b"host", _val(i))
    assert sp.pending_batches == 100 and sp.pending_bytes == 100 * (HEADER + 4 + 1000)
    assert len(list((tmp_path / "s").glob("*.seg"))) > 5
    first = []
    for _ in range(30):
        pos, _k, v = sp.read_next()
        first.append(int.from_bytes(v[:4], "big"))
        sp.ack(pos)
    assert first == list(range(30))
    pos, _k, _v = sp.read_next()  # read, not acknowledged: must come back after a restart
    sp.close()

    sp = Spool(tmp_path / "s", max_bytes=1 << 20, segment_bytes=16 * 1024)
    assert sp.pending_batches == 70
    for i in range(100, 110):
        sp.append(b"host", _val(i))
    assert _drain(sp) == list(range(30, 110))
    assert sp.pending_batches == 0 and sp.pending_bytes == 0
    assert not list((tmp_path / "s").glob("*.seg")), "fully acknowledged segments are deleted"
    sp.append(b"host", _val(7))
    sp.close()
    sp = Spool(tmp_path / "s", max_bytes=1 << 20, segment_bytes=16 * 1024)
    assert _drain(sp) == [7]
    sp.close()


def test_rewind_reads_again_from_the_oldest_unacknowledged(tmp_path):
    sp = Spool(tmp_path / "s", max_bytes=1 << 20, segment_bytes=16 * 1024)
    for i in range(40):
        sp.append(b"host", _val(i))
    recs = [sp.read_next() for _ in range(25)]
    for pos, _k, _v in recs[:10]:
        sp.ack(pos)
    sp.rewind()
    assert _drain(sp) == list(range(10, 40))
    sp.append(b"host", _val(98))
    sp.append(b"host", _val(99))
    (p1, _k, _v), (p2, _k, _v) = sp.read_next(), sp.read_next()
    with pytest.raises(ValueError, match="out of order"):
        sp.ack(p2)
    sp.ack(p1)
    with pytest.raises(ValueError, match="out of order"):
        sp.ack(p1)
    sp.ack(p2)
    assert sp.pending_batches == 0
    sp.close()


def test_full_spool_drops_oldest_and_counts_exactly(tmp_path):
    rec = HEADER + 4 + 1000
    sp = Spool(tmp_path / "s", max_bytes=64 * 1024, segment_bytes=16 * 1024)
    for i in range(500):
        sp.append(b"host", _val(i))
        assert sp.disk_bytes <= 64 * 1024
    kept = _drain(sp, ack=False)
    assert sp.dropped_batches > 0
    assert sp.dropped_batches + len(kept) == 500
    assert sp.dropped_bytes == sp.dropped_batches * rec
    assert kept == list(range(sp.dropped_batches, 500)), "the newest records are kept, contiguous"
    # drop accounting also holds when part of the oldest segment was already acknowledged
    sp.rewind()
    for _ in range(3):
        sp.ack(sp.read_next()[0])
    before_dropped, before_pending = sp.dropped_batches, sp.pending_batches
    for i in range(500, 600):
        sp.append(b"host", _val(i))
    assert sp.pending_batches + (sp.dropped_batches - before_dropped) == before_pending + 100
    sp.rewind()
    tail = _drain(sp, ack=False)
    assert tail[-1] == 599 and tail == list(range(tail[0], 600))
    sp.close()


def test_torn_tail_is_cut_on_open(tmp_path):
    sp = Spool(tmp_path / "s", max_bytes=1 << 20, segment_bytes=16 * 1024)
    for i in range(5):
        sp.append(b"host", _val(i))
    sp.close()
    seg = sorted((tmp_path / "s").glob("*.seg"))[-1]
    with open(seg, "ab") as f:
        f.write(b"\x5b\x0b\x04\x00\xff\xff\x00\x00garbage")  # a header promising more than is there
    sp = Spool(tmp_path / "s", max_bytes=1 << 20, segment_bytes=16 * 1024)
    assert sp.pending_batches == 5
    sp.append(b"host", _val(5))
    assert _drain(sp) == [0, 1, 2, 3, 4, 5]
    sp.close()


def test_one_agent_per_spool(tmp_path):
    sp = Spool(tmp_path / "s", max_bytes=1 << 20, segment_bytes=16 * 1024)
    with pytest.raises(SpoolError, match="in use by another running agent"):
        Spool(tmp_path / "s", max_bytes=1 << 20, segment_bytes=16 * 1024)
    sp.close()
    Spool(tmp_path / "s", max_bytes=1 << 20, segment_bytes=16 * 1024).close()


def test_a_spool_held_by_a_stopping_agent_is_waited_for_and_a_running_one_refused_at_once(tmp_path):
    """An agent restarted at once found its predecessor's spool locked and exited (a new user lost 288
    steps of a job): a holder that marked itself stopping is waited for, one that runs still refuses."""
    import threading
    import time

    first = Spool(tmp_path / "s", max_bytes=1 << 20, segment_bytes=16 * 1024)
    t0 = time.monotonic()
    with pytest.raises(SpoolError, match="in use by another running agent"):
        Spool(tmp_path / "s", max_bytes=1 << 20, segment_bytes=16 * 1024, stopping_wait_s=5)
    assert time.monotonic() - t0 < 1.0  # a running holder: no wait
    first.append(b"k", b"kept")
    first.mark_stopping()
    got: list = []
    th = threading.Thread(target=lambda: got.append(Spool(tmp_path / "s", max_bytes=1 << 20, segment_bytes=16 * 1024)))
    th.start()
    time.sleep(0.5)
    assert th.is_alive() and not got  # waiting for the stopping holder
    first.close()
    th.join(5)
    assert len(got) == 1 and got[0].pending_batches == 1
    got[0].close()
