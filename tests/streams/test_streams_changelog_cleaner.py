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


def test_partition_cache_holds_the_keys_of_the_last_two_periods_only():
    from aiokafka.partitioner import murmur2

    from obshub.streams.topics import PartitionCache

    now = [0.0]
    c = PartitionCache(period_s=10.0, clock=lambda: now[0])
    for j in range(5000):  # more dead steps' keys than the old fixed-size LRU (4,096) held
        key = f"soak-{j}|0".encode()
        assert c.get(key, 4) == (murmur2(key) & 0x7FFFFFFF) % 4
    assert len(c) == 5000  # all used within one period
    now[0] = 10.0
    c.get(b"live|1", 4)  # a new period: the last one's keys are the previous generation
    c.get(b"soak-7|0", 4)  # used again: moves to the current one
    assert len(c.cur) == 2 and len(c.old) == 5000
    now[0] = 20.0
    c.get(b"live|1", 4)
    assert len(c) == 3  # the dead keys are gone after two periods; the ones still used stay
    assert c.get(b"soak-7|0", 8) == (murmur2(b"soak-7|0") & 0x7FFFFFFF) % 8  # per partition count
