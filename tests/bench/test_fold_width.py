"""bench/fold_width.py at small widths: it runs the worker's own join code, every step is summarised, and
the changelog bytes per step (deterministic, unlike CPU) grow linearly with hosts while the replaced
layout's grow with hosts²."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_changelog_bytes_linear_and_previous_layout_quadratic(tmp_path, monkeypatch):
    monkeypatch.setenv("OBSHUB_BENCH_RESULTS", str(tmp_path))
    from bench import fold_width

    res = fold_width.run(quick=True, widths=(8, 16, 32, 64), old_max=64)
    assert (
        res["exponents"]["changelog_bytes"] <= 1.15
    )  # linear or better (fixed per-step records weigh less as H grows)
    assert res["exponents_previous_layout"]["changelog_bytes"] >= 1.7
    rows = json.loads((tmp_path / "fold_width.json").read_text())["rows"]
    assert set(rows) == {"8", "16", "32", "64"}
    assert all(r["changelog_bytes"] < r["old"]["changelog_bytes"] for r in rows.values())
