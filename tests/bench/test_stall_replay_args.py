"""``python -m bench.stall_replay``'s bad input: a folder that does not exist, a kept run cut off while it
was written, or folders without a kept run exit 2 naming what and where, never a traceback."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bench import stall_replay

REPO = Path(__file__).resolve().parents[2]  # a checkout of obshub: the --base of these runs


def _replay(capsys, *dirs: Path) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(stall_replay.main(["--base", str(REPO), *map(str, dirs)]))
    return exc.value.code, capsys.readouterr().err


def _kept(tmp_path: Path, report: str, steps: str) -> Path:
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "report.json").write_text(report)
    (run / "steps.jsonl").write_text(steps)
    return tmp_path / "runs"


def _unpacked(tmp_path):
    """``SMALL`` unpacked as a kept run (report.json beside steps.jsonl) in ``tmp_path/runs/stall-node-01``:
    ``(folder, report, steps)``."""
    rep, steps = stall_replay.read_packed(SMALL)
    kept = tmp_path / "runs" / "stall-node-01"
    kept.mkdir(parents=True)
    (kept / "report.json").write_text(json.dumps(rep))
    (kept / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    return kept, rep, steps


def test_a_folder_that_does_not_exist_is_named(capsys, tmp_path):
    code, err = _replay(capsys, tmp_path / "nope")
    assert code == 2 and f"{tmp_path / 'nope'}: no such folder" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "report,steps,where",
    [
        ('{"episodes": []}', '{"closed_at_ns": 1, "step": 1}\n{"step": 2, "clo', "steps.jsonl:2: not JSON"),
        ('{"episodes": []}', '{"closed_at_ns": 1}\n\n["a list"]\n', "steps.jsonl:3: not a step summary"),
        ('{"episodes": [', '{"closed_at_ns": 1}\n', "report.json: not JSON"),
    ],
)
def test_a_kept_run_cut_off_while_written_is_named_with_its_line(capsys, tmp_path, report, steps, where):
    code, err = _replay(capsys, _kept(tmp_path, report, steps))
    assert code == 2 and f"{tmp_path / 'runs' / 'r1'}/{where}" in err, err


def test_folders_without_a_kept_run_say_so(capsys, tmp_path):
    code, err = _replay(capsys, tmp_path)
    assert code == 2 and f"no kept run (steps.jsonl beside report.json) under {tmp_path}" in err


SMALL = REPO / "bench" / "corpus" / "stop19-base-1-stall-node-01.jsonl.gz"  # the smallest packed run (58 KB)


def _totals(out: str) -> str:
    return next(ln for ln in out.splitlines() if ln.startswith("runs="))


def test_the_committed_corpus_is_replayed_by_default_and_a_packed_run_replays_as_its_kept_folder(
    capsys, tmp_path, monkeypatch
):
    # the default folder: the committed corpus (here one of its runs, so the test stays short)
    one = tmp_path / "corpus"
    one.mkdir()
    (one / SMALL.name).write_bytes(SMALL.read_bytes())
    monkeypatch.setattr(stall_replay, "CORPUS", one)
    assert stall_replay.main(["--base", str(REPO)]) == 0
    packed = _totals(capsys.readouterr().out)
    assert packed.startswith("runs=1 closed=") and "stalls=4" in packed, packed
    # unpacked into a kept folder (report.json beside steps.jsonl) it replays the same
    kept, rep, steps = _unpacked(tmp_path)
    assert stall_replay.main(["--base", str(REPO), str(tmp_path / "runs")]) == 0
    assert _totals(capsys.readouterr().out) == packed
    # and packed again it is the same packed run
    out = tmp_path / "again"
    out.mkdir()
    assert stall_replay.main(["--pack", str(out), str(tmp_path / "runs")]) == 0
    again = next(out.glob("*.jsonl.gz"))
    assert stall_replay.read_packed(again) == (rep, steps)


@pytest.mark.parametrize(
    "data,where",
    [
        (b"not gzip", "not a gzip of JSON lines"),
        (gzip.compress(b'{"closed_at_ns": 1}\n'), ":1: no report line first"),
        (gzip.compress(b'{"report": {}}\n{"step": 1}\n'), ":2: not a step summary"),
        (gzip.compress(b'{"report": {}}\n{"step": 1, "clo'), ":2: not JSON"),
    ],
    ids=["not-gzip", "no-report", "no-summary", "cut-off"],
)
def test_a_packed_run_that_is_not_one_is_named_with_its_line(capsys, tmp_path, data, where):
    (tmp_path / "bad.jsonl.gz").write_bytes(data)
    code, err = _replay(capsys, tmp_path)
    assert code == 2 and f"{tmp_path / 'bad.jsonl.gz'}" in err and where in err and "Traceback" not in err, err


def test_a_persistent_fault_is_in_effect_until_its_removal_where_the_kept_report_says_when(tmp_path):
    """A single-fault run's report has no ``removed_ns``: its ``scenario`` says when the fault went (the
    numbers of the kept run /work/runs19/frame21-lightning-netloss: injected at +15 s, removed at +45 s,
    30 s after ``t0_ns``; its step_stall alerts on node-01 / network went on for 30 s). Its episode lasts to
    5 s after that removal (it lasted 5 s after the injection, and the later right alerts counted wrong); a
    report that does not say (a packed run of before) is taken to last until its last step summary, a
    sporadic fault until its last stall; ``--pack`` keeps the scenario's times."""
    t0 = 1_796_639_507_641_768_686
    rep = {
        "scenario": {"fault": "net-loss", "fault_at_s": 15.0, "duration_s": 45.0, "steps": None, "sequence": []},
        "verdict": {"fault": "net-loss", "host": "node-01", "layer": "network", "t0_ns": t0, "stalls": []},
    }
    ((kind, host, layer, lo, hi, starts),) = stall_replay._episodes(rep)
    assert (kind, host, layer, lo, starts) == ("net-loss", "node-01", "network", t0, [])
    assert hi == t0 + 35_000_000_000  # removed 30 s after the injection, + 5 s
    last = t0 + 38_000_000_000  # without the scenario: the run's last step summary, + 5 s
    assert stall_replay._episodes({"verdict": rep["verdict"]}, last)[0][4] == last + 5_000_000_000
    for sc in ({**rep["scenario"], "steps": 500}, {**rep["scenario"], "fault_at_s": "x"}, "not a dict"):
        assert stall_replay.removed_at({**rep, "scenario": sc}, t0) is None  # not known: the fallback
    stall = {"fault": "stall", "host": "node-01", "layer": "network", "t0_ns": t0, "stalls": [{"t0_ns": t0 + 9}]}
    assert stall_replay._episodes({"verdict": stall}, last)[0][4] == t0 + 9 + 5_000_000_000
    assert stall_replay._episodes({**rep, "verdict": stall}, last)[0][4] == t0 + 35_000_000_000
    run = tmp_path / "runs" / "net-loss"
    run.mkdir(parents=True)
    (run / "report.json").write_text(json.dumps({**rep, "alerts": []}))
    (run / "steps.jsonl").write_text(json.dumps({"closed_at_ns": t0 + 1, "step": 1}) + "\n")
    stall_replay.pack_run(run / "steps.jsonl", tmp_path / "p.jsonl.gz")
    packed, _steps = stall_replay.read_packed(tmp_path / "p.jsonl.gz")
    assert packed["scenario"] == {"fault_at_s": 15.0, "duration_s": 45.0, "steps": None, "sequence": []}
    assert stall_replay._episodes(packed) == stall_replay._episodes(rep)


def test_a_run_named_by_its_file_replays_as_its_folder(capsys, tmp_path):
    """mends24: on cfd471b a packed ``NAME.jsonl.gz`` or a kept ``steps.jsonl`` named directly exited 2 with
    ``no such folder``; only their folders were read."""
    assert stall_replay.main(["--base", str(REPO), str(SMALL)]) == 0
    packed = _totals(capsys.readouterr().out)
    assert packed.startswith("runs=1 closed=") and "stalls=4" in packed, packed
    kept, rep, steps = _unpacked(tmp_path)
    assert stall_replay.main(["--base", str(REPO), str(kept / "steps.jsonl")]) == 0
    assert _totals(capsys.readouterr().out) == packed
    # --pack takes a kept run's steps.jsonl named directly too
    out = tmp_path / "out"
    out.mkdir()
    assert stall_replay.main(["--pack", str(out), str(kept / "steps.jsonl")]) == 0
    assert stall_replay.read_packed(out / "runs-stall-node-01.jsonl.gz") == (rep, steps)


@pytest.mark.parametrize(
    "argv,frag",
    [
        (["{tmp}/notes.txt"], "notes.txt: not a kept run's steps.jsonl (no report.json beside it"),
        (["{tmp}/nope.jsonl.gz"], "nope.jsonl.gz: no such folder or file"),
        (["--pack", "{tmp}", "{small}"], f"{SMALL}: packed already"),
        (["--pack", "{tmp}", "--base", "{tmp}", "{tmp}"], "--base: only when replaying, not with --pack"),
        (["--pack", "{tmp}", "--wrong", "{tmp}"], "--wrong: only when replaying, not with --pack"),
    ],
    ids=["not-a-run", "missing-file", "pack-packed", "pack-base", "pack-wrong"],
)
def test_a_named_file_that_is_no_run_and_options_pack_does_not_read_are_refused(capsys, tmp_path, argv, frag):
    (tmp_path / "notes.txt").write_text("x\n")
    argv = [x.format(tmp=tmp_path, small=SMALL) for x in argv]
    with pytest.raises(SystemExit) as exc:
        stall_replay.main(argv if "--pack" in argv else ["--base", str(REPO), *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and frag in err and "Traceback" not in err, err
