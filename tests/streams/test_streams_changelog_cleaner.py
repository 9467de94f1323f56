"""The log cleaner's settings of the stream worker's changelogs (``core.topics.changelog_cleaner_config``,
docs/STREAMS.md "Retention"): proportional to the job retention, so the records a restarted worker reads
are bounded by what the last few retentions wrote, never by the jobs ever seen."""

from __future__ import annotations

import pytest

from obshub.core.topics import changelog_cleaner_config, topic_config


def _ms(cfg: dict[str, str], key: str) -> float:
    return int(cfg[key]) / 1000


@pytest.mark.parametrize("retention_s", [10.0, 60.0, 600.0, 3600.0])
def test_segment_and_compaction_lag_follow_the_retention(retention_s):
    # the active segment (never compacted) and a closed dirty segment (compacted within the lag) each hold
    # at most one retention of writes: a 10 s retention gives 10 s segments, not a 60 s floor (6 retentions)
    cfg = changelog_cleaner_config(retention_s)
    assert _ms(cfg, "segment.ms") == retention_s
    assert _ms(cfg, "max.compaction.lag.ms") == retention_s
    assert cfg["min.compaction.lag.ms"] == "0"
    assert float(cfg["min.cleanable.dirty.ratio"]) == 0.5


def test_bounds_of_the_cleaner_settings():
    short, long = changelog_cleaner_config(1.0), changelog_cleaner_config(86_400.0)
    assert _ms(short, "segment.ms") == 10.0  # no segment file per second per partition
    assert _ms(short, "delete.retention.ms") == 60.0  # longer than a restart's read of the changelogs
    assert _ms(long, "segment.ms") == _ms(long, "max.compaction.lag.ms") == 3600.0
    assert _ms(long, "delete.retention.ms") == 3600.0
    assert _ms(changelog_cleaner_config(600.0), "delete.retention.ms") == 600.0


def test_only_changelogs_with_a_retention_get_the_cleaner_settings():
    cfg = topic_config("app-jobs-changelog", rf=1, changelog_retention_s=10.0)
    assert cfg["cleanup.policy"] == "compact"
    assert cfg["segment.ms"] == "10000" and cfg["max.compaction.lag.ms"] == "10000"
    assert "segment.ms" not in topic_config("app-jobs-changelog", rf=1)
    assert "segment.ms" not in topic_config("rules-state", rf=1, changelog_retention_s=10.0)
