"""The stream worker's broad catches are counted (issue #29 item 5): the skipped-offsets check of
``streams.reread.OffsetGuard`` goes on when the table it reads the next offset from raises, and reports
it through ``on_error`` (the worker's ``obshub_streams_housekeeping_errors_total{task="offset_check"}``)."""

from __future__ import annotations

from typing import NamedTuple

from obshub.streams import reread


class TP(NamedTuple):
    topic: str
    partition: int


def test_offset_guard_counts_an_unreadable_start_and_checks_the_next_record():
    errors, skips = [], []

    def start(p: int) -> int | None:
        raise TypeError("int() argument must be ... not 'Undecodable'")  # a damaged table value

    g = reread.OffsetGuard("fold", skips.append, start, lambda: errors.append(1))
    tp = TP("obshub-steps", 0)
    assert g.check(tp, 10, 1) is None and errors == [1]  # unchecked, counted
    assert g.check(tp, 11, 1) is None and errors == [1]  # in order: start not asked again
    assert g.check(tp, 15, 1) == (12, 15) and skips == [3]  # the next ones are checked
