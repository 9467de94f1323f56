"""The Go programs the tests and the deployment checks run for real: Prometheus, Alertmanager and helm,
each built from its Go module with ``go install <module>/cmd/<name>@<version>`` and cached under
``$OBSHUB_CACHE/go`` (binaries in ``bin/<name>-<version>/``, the module and build caches beside them), so
the first set-up takes minutes and every later one takes milliseconds.

Versions (``TOOLS``):

- Prometheus ``v0.316.0``: the Go module versions of Prometheus 3.x are ``v0.3xx.y``; this one's go.mod
  has no ``replace``/``exclude`` directive, which ``go install pkg@version`` refuses. Built with the tag
  ``remove_all_sd`` (static and file service discovery stay; the cloud and Kubernetes discovery plugins,
  most of the build time, are left out) and without ``builtinassets`` (the HTTP API works, the web UI
  pages do not; nothing here needs them).
- Alertmanager ``v0.27.0``: the last module version whose tree carries the web UI assets it embeds.
- helm ``v3.22.0``.

Go itself: the ``go`` on PATH when it is 1.26 or later, else the Go toolchain fetched once from the
module proxy (module ``golang.org/toolchain``, the same archive ``GOTOOLCHAIN`` downloads) into
``$OBSHUB_CACHE/go/toolchain``. Needs the Go module proxy (``$GOPROXY``, default proxy.golang.org).
"""

from __future__ import annotations

import fcntl
import os
import platform
import shutil
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from obshub.core.errors import ObshubError


@dataclass(frozen=True)
class GoTool:
    """One Go program: ``package`` is the importable main package, ``version`` the module version."""

    name: str
    package: str
    version: str
    tags: str = ""  # Go build tags (``go install -tags``)


TOOLS: dict[str, GoTool] = {
    t.name: t
    for t in (
        GoTool("prometheus", "github.com/prometheus/prometheus/cmd/prometheus", "v0.316.0", tags="remove_all_sd"),
        GoTool("alertmanager", "github.com/prometheus/alertmanager/cmd/alertmanager", "v0.27.0"),
        GoTool("helm", "helm.sh/helm/v3/cmd/helm", "v3.22.0"),
    )
}


GO_VERSION = "1.26.8"  # the toolchain fetched when no go >= GO_MIN is installed
GO_MIN = (1, 26)


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
    return {
        **os.environ,
        "GOMODCACHE": str(d / "mod"),
        "GOCACHE": str(d / "build"),
        "GOTOOLCHAIN": "local",
        "GOFLAGS": "-modcacherw",
    }


def _version(go: str) -> tuple[int, ...]:
    try:
        out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ()
    try:
        return tuple(int(x) for x in out.removeprefix("go").split(".")[:2])
    except ValueError:
        return ()


def go_command(cache: Path, progress: Callable[[str], None] = lambda _m: None) -> str:
    """A ``go`` command of at least ``GO_MIN``: the one on PATH, or the toolchain cached (fetched now from
    the module proxy when missing, ~70 MB). Raises GoToolError when neither works."""
    on_path = shutil.which("go")
    if on_path and _version(on_path) >= GO_MIN:
        return on_path
    root = go_dir(cache) / "toolchain" / f"go{GO_VERSION}"
    go = root / "bin" / "go"
    if go.is_file():
        return str(go)
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    proxy = next(
        (p for p in os.environ.get("GOPROXY", "https://proxy.golang.org").split(",") if p.startswith("http")),
        "https://proxy.golang.org",
    )
    mod = f"v0.0.1-go{GO_VERSION}.linux-{arch}"
    url = f"{proxy.rstrip('/')}/golang.org/toolchain/@v/{mod}.zip"
    progress(f"no go >= {'.'.join(map(str, GO_MIN))} on PATH: fetching Go {GO_VERSION} from {url}")
    import httpx

    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    archive = tmp / "go.zip"
    try:
        with httpx.stream("GET", url, timeout=120, follow_redirects=True) as r:
            r.raise_for_status()
            with open(archive, "wb") as fh:
                for chunk in r.iter_bytes(1 << 20):
                    fh.write(chunk)
    except httpx.HTTPError as exc:
        raise GoToolError(
            f"cannot fetch the Go toolchain from {url}: {exc}",
            "install Go 1.26 or later, or set GOPROXY to a reachable Go module proxy",
        ) from None
    prefix = f"golang.org/toolchain@{mod}/"
    with zipfile.ZipFile(archive) as z:
        for info in z.infolist():
            if not info.filename.startswith(prefix) or info.is_dir():
                continue
            dest = tmp / "go" / info.filename[len(prefix) :]
            dest.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out)
            mode = info.external_attr >> 16
            if mode:
                dest.chmod(mode & 0o777)
    archive.unlink()
    shutil.rmtree(root, ignore_errors=True)
    (tmp / "go").rename(root)
    shutil.rmtree(tmp, ignore_errors=True)
    return str(go)


def ensure(cache: Path, name: str, progress: Callable[[str], None] = lambda _m: None) -> Path:
    """The binary of tool ``name``: the cached one, or built now with ``go install`` (minutes on first use;
    the build log goes to ``$OBSHUB_CACHE/go/logs/<name>.log``). Raises GoToolError when ``go`` is missing
    or the build fails (with the log's tail).

    Several processes may ask at once (two ``make test`` on one machine, a deployment test beside
    ``python -m tests.support.gobuild``): each build holds ``$OBSHUB_CACHE/go/<name>.lock`` (``flock``), and
    a process that waited for it finds the binary the other one built. Without the lock the second build
    removed the first's half-written output folder and reported a build of exit 0 as failed."""
    have = cached(cache, name)
    if have:
        return have
    go_dir(cache).mkdir(parents=True, exist_ok=True)
    with open(go_dir(cache) / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        have = cached(cache, name)
        if have:
            return have
        return _build(cache, name, progress)


def _build(cache: Path, name: str, progress: Callable[[str], None]) -> Path:
    """``go install`` tool ``name`` into its cache folder (the caller holds its lock)."""
    t = TOOLS[name]
    go = go_command(cache, progress)
    target = binary_path(cache, name)
    logs = go_dir(cache) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{t.name}.log"
    progress(
        f"building {t.name} {t.version} with `go install {t.package}@{t.version}` "
        f"(first time only: several minutes; log {log_path})"
    )
    tmp = target.parent.with_name(target.parent.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with open(log_path, "wb") as log:
        tags = [f"-tags={t.tags}"] if t.tags else []
        rc = subprocess.run(
            [go, "install", *tags, f"{t.package}@{t.version}"],
            env={**go_env(cache), "GOBIN": str(tmp)},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        ).returncode
    if rc != 0 or not (tmp / t.name).is_file():
        tail = log_path.read_text(errors="replace")[-2000:]
        raise GoToolError(
            f"`go install {t.package}@{t.version}` failed (exit {rc}):\n{tail}",
            f"check `go env GOPROXY` reaches the module proxy; full log in {log_path}",
        )
    shutil.rmtree(target.parent, ignore_errors=True)
    tmp.rename(target.parent)
    progress(f"{t.name} {t.version} built: {target}")
    return target


def main() -> int:
    """``python -m tests.support.gobuild``: build (or find cached) every tool of ``TOOLS`` in
    ``$OBSHUB_CACHE/go``; ``make test`` runs it before the suite so no test waits minutes for a build.
    Exit 0 when every tool is there, 1 with the reason on a failed build."""
    import sys

    from obshub.core.settings import load_settings

    cache = load_settings().cache
    say = lambda m: print(f"test tools: {m}", flush=True)  # noqa: E731
    try:
        for name in TOOLS:
            path = ensure(cache, name, progress=say)
            say(f"{name} {TOOLS[name].version}: {path}")
    except GoToolError as exc:
        print(f"test tools: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
