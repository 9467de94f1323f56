"""``python -m bench.stall_replay``'s bad input: a folder that does not exist, a kept run cut off while it
was written, or folders without a kept run exit 2 naming what and where, never a traceback."""

from __future__ import annotations

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
