"""The Go programs the tests and the deployment checks run for real: Prometheus, Alertmanager and helm,
each built from its Go module with ``go install <module>/cmd/<name>@<version>`` and cached under
``$OBSHUB_CACHE/go`` (binaries in ``bin/<name>-<version>/``, the module and build caches beside them), so
the first set-up takes minutes and every later one takes milliseconds.

Versions (``TOOLS``):

- Prometheus ``v0.316.0``: the Go module versions of Prometheus 3.x are ``v0.3xx.y``; this one's go.mod
  has no ``replace``/``exclude`` directive, which ``go install pkg@version`` refuses. Built without the
  ``builtinassets`` tag: the HTTP API works, the web UI pages do not (nothing here needs them).
- Alertmanager ``v0.27.0``: the last module version whose tree carries the web UI assets it embeds.
- helm ``v3.22.0``.

Needs the ``go`` command (1.26 or later) and the Go module proxy (``go env GOPROXY``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from obshub.errors import ObshubError


@dataclass(frozen=True)
class GoTool:
    """One Go program: ``package`` is the importable main package, ``version`` the module version."""

    name: str
    package: str
    version: str


TOOLS: dict[str, GoTool] = {t.name: t for t in (
    GoTool("prometheus", "github.com/prometheus/prometheus/cmd/prometheus", "v0.316.0"),
    GoTool("alertmanager", "github.com/prometheus/alertmanager/cmd/alertmanager", "v0.27.0"),
    GoTool("helm", "helm.sh/helm/v3/cmd/helm", "v3.22.0"),
)}


class GoToolError(ObshubError):
    """A Go tool could not be built (no ``go``, no module proxy, a compile error)."""


def go_dir(cache: Path) -> Path:
    """``$OBSHUB_CACHE/go``: ``bin/``, ``mod/`` (GOMODCACHE), ``build/`` (GOCACHE), ``logs/``."""
    return cache / "go"


def binary_path(cache: Path, name: str) -> Path:
    """Where the binary of tool ``name`` is (or will be) cached. Raises KeyError for an unknown tool."""
    t = TOOLS[name]
    return go_dir(cache) / "bin" / f"{t.name}-{t.version}" / t.name


def cached(cache: Path, name: str) -> Path | None:
    """The cached binary of ``name``, or None when it has not been built yet."""
    p = binary_path(cache, name)
    return p if p.is_file() and os.access(p, os.X_OK) else None


def go_env(cache: Path) -> dict[str, str]:
    """The environment of ``go install``: module and build caches under ``cache``, no toolchain download."""
    d = go_dir(cache)
    return {**os.environ, "GOMODCACHE": str(d / "mod"), "GOCACHE": str(d / "build"), "GOTOOLCHAIN": "local",
            "GOFLAGS": "-modcacherw"}


def ensure(cache: Path, name: str, progress: Callable[[str], None] = lambda _m: None) -> Path:
    """The binary of tool ``name``: the cached one, or built now with ``go install`` (minutes on first use;
    the build log goes to ``$OBSHUB_CACHE/go/logs/<name>.log``). Raises GoToolError when ``go`` is missing
    or the build fails (with the log's tail)."""
    have = cached(cache, name)
    if have:
        return have
    t = TOOLS[name]
    go = shutil.which("go")
    if go is None:
        raise GoToolError(f"cannot build {t.name} {t.version}: the `go` command is not installed",
                          "install Go 1.26 or later (Debian: golang-go from bookworm-backports, or go.dev/dl)")
    target = binary_path(cache, name)
    logs = go_dir(cache) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{t.name}.log"
    progress(f"building {t.name} {t.version} with `go install {t.package}@{t.version}` "
             f"(first time only: several minutes; log {log_path})")
    tmp = target.parent.with_name(target.parent.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with open(log_path, "wb") as log:
        rc = subprocess.run([go, "install", f"{t.package}@{t.version}"], env={**go_env(cache), "GOBIN": str(tmp)},
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    if rc != 0 or not (tmp / t.name).is_file():
        tail = log_path.read_text(errors="replace")[-2000:]
        raise GoToolError(f"`go install {t.package}@{t.version}` failed (exit {rc}):\n{tail}",
                          f"check `go env GOPROXY` reaches the module proxy; full log in {log_path}")
    shutil.rmtree(target.parent, ignore_errors=True)
    tmp.rename(target.parent)
    progress(f"{t.name} {t.version} built: {target}")
    return target
