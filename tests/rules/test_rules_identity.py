"""Alert identity: fingerprints and PagerDuty dedup keys come from an unambiguous encoding of the label
set, so two different label sets never collide (label values may hold newlines, '=' or separators) and
the same set always gives the same identity, in any order, in any version (pinned values below)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from obshub.rules.engine import Engine
from obshub.rules.lifecycle import encode_labels, fingerprint
from obshub.rules.loader import load_ruleset
from obshub.rules.sinks.pagerduty import dedup_key

TEXT = st.text(alphabet=st.sampled_from("ab=\n,:0123456789\x1f\x00é"), max_size=6)
LABELS = st.dictionaries(TEXT, TEXT, max_size=4)
HYP = settings(max_examples=500, deadline=None, derandomize=True)


@HYP
@given(a=LABELS, b=LABELS)
def test_different_label_sets_never_share_an_encoding(a, b):
    assert (encode_labels(a) == encode_labels(b)) == (a == b)
    if a != b:
        assert fingerprint(a) != fingerprint(b)
        assert dedup_key({"rule": "r", "fingerprint": fingerprint(a)}) != dedup_key(
            {"rule": "r", "fingerprint": fingerprint(b)}
        )


@HYP
@given(a=LABELS)
def test_same_set_same_identity_in_any_order(a):
    reordered = dict(reversed(list(a.items())))
    assert fingerprint(a) == fingerprint(reordered) == fingerprint(dict(a))


def test_newline_in_a_value_cannot_merge_two_alerts():
    one = {"alertname": "x", "host": "a\nhost=b"}
    two = {"alertname": "x", "host": "a", "host=b": ""}
    assert fingerprint(one) != fingerprint(two)
    assert fingerprint({"a": "1\nb=2"}) != fingerprint({"a": "1", "b": "2"})


def test_encoding_and_fingerprint_are_pinned():
    """The documented format (docs/RULES.md); a change here breaks every open incident's dedup key."""
    assert encode_labels({"host": "a=b", "alertname": "x"}) == b"9:alertname,1:x,4:host,3:a=b,"
    assert encode_labels({"é": "1"}) == "2:é,1:1,".encode()
    assert fingerprint({"alertname": "host_stopped_reporting", "host": "node7", "job": "llm"}) == "91c6e5c6d005a1af"


def test_correlation_keys_do_not_merge_different_values(tmp_path):
    rules = tmp_path / "r.yaml"
    rules.write_text("""\
version: 1
rules:
  - id: corr
    description: correlated
    severity: warning
    signal: steps
    condition: "true"
    correlate:
      signal: steps
      condition: "true"
      this_keys: {a: job, b: closed_by}
      other_keys: {a: job, b: closed_by}
      within: 30s
    group_by: {job: job}
    window: 10s
""")
    eng = Engine(load_ruleset([rules]), lambda c: None)
    rule = eng.ruleset.rules["corr"]
    from obshub.rules.expr import Activation

    k1 = eng._key(rule.correlate.this_keys, Activation({"job": "x\x1fb=y", "closed_by": "z"}))
    k2 = eng._key(rule.correlate.this_keys, Activation({"job": "x", "closed_by": "y\x1fb=z"}))
    assert k1 is not None and k1 != k2


def test_alert_saved_with_an_older_fingerprint_keeps_it_until_resolved(tmp_path):
    rules = tmp_path / "r.yaml"
    rules.write_text("""\
version: 1
rules:
  - id: lost
    description: lost batches
    severity: warning
    signal: steps
    condition: quality.lost_batches > 0
    group_by: {job: job}
    window: 10s
""")
    out: list[dict] = []
    eng = Engine(load_ruleset([rules]), out.append)
    labels = {"alertname": "lost", "severity": "warning", "job": "j"}
    t0 = 1_764_000_000_000_000_000
    eng.restore(
        {
            "now_ns": t0,
            "instances": [
                {
                    "fingerprint": "0ld0ld0ld0ld0ld0",
                    "rule": "lost",
                    "labels": labels,
                    "severity": "warning",
                    "state": "firing",
                    "active_since_ns": t0,
                    "fired_at_ns": t0,
                    "true_until_ns": t0 + 10**10,
                }
            ],
            "runtime": {"lost": {"hits": {"0ld0ld0ld0ld0ld0": [[t0, 1.0]]}, "this_buf": {}, "other_buf": {}}},
        }
    )
    assert list(eng.instances) == [fingerprint(labels)]
    assert list(eng.runtime["lost"].hits) == [fingerprint(labels)]
    eng.tick(t0 + 60 * 10**9)
    assert [(c["status"], c["fingerprint"]) for c in out] == [("resolved", "0ld0ld0ld0ld0ld0")]
    assert eng.instances == {}
