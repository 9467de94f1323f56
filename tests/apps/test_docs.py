"""Documentation stays true to the code: every event kind, envelope field and summary field of the schema
is documented in docs/SCHEMA.md; the README starts with the two set-up commands; CI runs `make test`."""

from __future__ import annotations

import re

from obshub.core import schema, topics
from tests.conftest import REPO


def test_schema_doc_lists_every_kind_and_field():
    doc = (REPO / "docs" / "SCHEMA.md").read_text()
    for k in schema.Kind:
        assert f"`{k.name}`" in doc, f"docs/SCHEMA.md does not document kind {k.name}"
    for f in schema.EVENT_FIELDS:
        assert f"`{f}`" in doc, f"docs/SCHEMA.md does not document event field {f}"
    for f in schema.STEP_SUMMARY_FIELDS:
        assert f"`{f}`" in doc, f"docs/SCHEMA.md does not document step summary field {f}"
    for t in topics.TOPICS:
        assert re.search(rf"`{re.escape(t.name)}` \|[^\n]*\| {t.partitions} \|", doc), t.name


def test_readme_starts_with_the_two_commands():
    lines = [ln for ln in (REPO / "README.md").read_text().splitlines() if ln.strip()]
    block = lines[lines.index("```sh") + 1 : lines.index("```sh") + 3]
    assert block[0].startswith("make demo") and block[1].startswith("make test")


def test_ci_runs_make_test():
    assert "make test" in (REPO / ".ci" / "run").read_text()
