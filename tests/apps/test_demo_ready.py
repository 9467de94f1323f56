"""When the demo counts its stream worker ready, and what ``obshub status`` says of a worker that recovers
its tables (docs/DEMO.md step 1, docs/STREAMS.md "Start-up and readiness"). Real registry records in a
temporary state folder; the worker's own side is tests/streams/test_streams_ready_kafka.py."""

from __future__ import annotations

import os
from pathlib import Path

from obshub.cli import component_state
from obshub.core.registry import components, register_component, update_component
from obshub.core.settings import load_settings
from obshub.demo import parts
from obshub.streams.analysis.thresholds import Thresholds


def test_a_worker_recovering_its_tables_is_not_ready_and_status_says_so(tmp_path):
    settings = load_settings(home=tmp_path)
    part = parts.PipelinePart("streams", [], "streams", ())  # no group: only the record decides
    me = os.getpid()
    assert not parts.ready(settings, part, me)  # not registered yet
    register_component(settings, "streams-1", me, app_id="a", ready=False)
    assert not parts.ready(settings, part, me)
    rec = next(c for c in components(settings) if c["name"] == "streams-1")
    started = rec["started"]
    assert "recovering its tables" in component_state(rec, True)
    assert update_component(settings, "streams-1", ready=True, ready_s=12.5)
    rec = next(c for c in components(settings) if c["name"] == "streams-1")
    assert parts.ready(settings, part, me)
    assert parts.registered(settings, part, me)["ready_s"] == 12.5
    assert rec["started"] == started and rec["app_id"] == "a"  # merged: the record keeps what it had
    assert component_state(rec, True) == "yes"
    # another process's record is not this part's; a record without `ready` (the rule engine's) is ready
    assert not parts.ready(settings, part, me + 1)
    rules = parts.PipelinePart("rules", [], "rules", ())
    register_component(settings, "rules", me)
    assert parts.ready(settings, rules, me)
    # a removed record is not written back by a late update
    (settings.run_dir / "streams-1.json").unlink()
    assert not update_component(settings, "streams-1", ready=True)
    assert not (settings.run_dir / "streams-1.json").exists()


def test_the_demo_worker_keeps_a_hung_jobs_state_and_reads_back_only_a_few_runs():
    argv = parts.pipeline("j", "r", Path("/tmp/alerting.yaml"))[0].argv
    retention = float(argv[argv.index("--job-retention-s") + 1])
    assert retention == parts.STREAMS_JOB_RETENTION_S
    # above the hang hold (docs/STREAMS.md "Retention"), far below the default hour that made a demo
    # worker read back 20 earlier runs
    assert Thresholds().hang_hold_ns / 1e9 < retention <= 600
