"""docs/RULES.md holds the field reference generated from the schema (scripts/rules_reference.py), a
glossary and the YAML pitfalls; every field, payload key and payload.symbol value is in it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from obshub.core import schema
from obshub.producer.probes import CUDA_SYMBOLS
from obshub.rules import fields

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "RULES.md"


def test_generated_reference_is_up_to_date():
    res = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "rules_reference.py"), "--check"], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_reference_names_every_field_payload_key_and_symbol_with_type_and_unit():
    text = DOC.read_text()
    ref = text[text.index("<!-- BEGIN GENERATED FIELD REFERENCE") :]
    for name in fields.STEP_VARS:
        assert f"| `{name}` |" in ref, name
    for base, members in fields.NESTED_VARS.items():
        for m in members:
            assert f"| `{base}.{m}` |" in ref, (base, m)
    for name in (
        "blame[].layer",
        "straggler.group[].late_ns",
        "hang.hosts[].state",
        "layer_stats[layer].time_p99_ns",
        "layers[k][layer].time_ns",
    ):
        assert f"| `{name}` |" in ref, name
    assert "| `baseline.median_ns` | int | ns |" in ref and "| `duration_us` | double | µs |" in ref
    for name in {**fields.EVENT_VARS, **fields.HEALTH_VARS}:
        assert f"| `{name}` |" in ref, name
    for kind in schema.Kind:
        row = next(line for line in ref.splitlines() if line.startswith(f"| `{kind.name}` | "))
        for key in schema.KIND_INFO[kind].payload:
            assert f"`{key}`" in row, (kind, key)
    for sym in CUDA_SYMBOLS:
        assert f"`{sym.symbol}`" in ref, sym


def test_glossary_and_pitfalls():
    text = DOC.read_text()
    glossary = text[text.index("## Glossary") : text.index("## YAML pitfalls")]
    for term in ("Spread", "Evidence", "CUSUM", "Item-invariant", "Straggler", "Interim record"):
        assert f"**{term}" in glossary, term
    pitfalls = text[text.index("## YAML pitfalls") :]
    assert "`n`" in pitfalls and "baseline: {n: 50}" in pitfalls and "`10s`, `5m`" in pitfalls
