"""tests/support/gobuild.py: concurrent requests for one Go tool build it once (the per-tool flock)."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

from tests.support import gobuild


def test_concurrent_ensure_builds_once(tmp_path: Path, monkeypatch) -> None:
    """Three callers ask for helm at once; ``go install`` (faked: it takes 0.5 s, then writes the binary into
    ``$GOBIN``) runs once, and every caller gets the one binary. Without the lock each caller ran its own
    build, and a later one removed the first's output folder: a build of exit 0 reported as failed."""
    runs: list[str] = []

    def fake_go_install(argv, env, **_kw):
        runs.append(argv[-1])
        time.sleep(0.5)
        out = Path(env["GOBIN"])
        out.mkdir(parents=True, exist_ok=True)
        (out / "helm").write_text("#!/bin/sh\n")
        (out / "helm").chmod(0o755)
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(gobuild, "go_command", lambda cache, progress=None: "go")
    monkeypatch.setattr(gobuild.subprocess, "run", fake_go_install)
    got: list[object] = []

    def ask() -> None:
        try:
            got.append(gobuild.ensure(tmp_path, "helm"))
        except gobuild.GoToolError as exc:
            got.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert got == [gobuild.binary_path(tmp_path, "helm")] * 3
    assert len(runs) == 1, f"go install ran {len(runs)} times"
