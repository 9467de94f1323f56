"""Lean installs: the package declares no unconditional dependency, and what runs inside a training
process (``obshub.instrument``: hooks, USDT wrappers, the ``obshub run`` bootstrap) works in a bare virtual
environment that holds nothing but the obshub wheel: only standard-library modules are imported and the
USDT C extension's probe sites run. The roles' extras name what each component imports."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import venv
from importlib import metadata

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow  # builds a bare virtual environment

CHECK = r"""
import json, sys
before = set(sys.modules)
import obshub.instrument as inst
import obshub.instrument.hooks, obshub.instrument.run, obshub.instrument.usdt as usdt
from obshub.instrument.bootstrap import sitecustomize  # what `obshub run` puts first on PYTHONPATH
usdt.register("job", 0, 1, 3, 0)
usdt.step_begin(7, 0x1234)
usdt.step_end(7, 0x1234)
new = sorted({m.split(".")[0] for m in set(sys.modules) - before})
third = [m for m in new if m not in sys.stdlib_module_names and m != "obshub"]
print(json.dumps({"third_party": third, "lib": usdt.library_path(), "enabled": inst.is_enabled()}))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return next(out.glob("obshub-*.whl"))


def test_instrumentation_runs_in_a_bare_virtualenv(wheel, tmp_path):
    env_dir = tmp_path / "bare"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )  # no index: a dependency would fail here
    assert r.returncode == 0, r.stderr[-3000:]
    listed = subprocess.run(
        [py, "-c", "import importlib.metadata as m; print(sorted(d.metadata['Name'] for d in m.distributions()))"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert listed.stdout.strip() == "['obshub']", listed.stdout
    r = subprocess.run([py, "-c", CHECK], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout)
    assert got["third_party"] == [] and got["enabled"] is False
    assert got["lib"].startswith(str(env_dir)) and got["lib"].endswith(".so")
    cli = subprocess.run(
        [env_dir / "bin" / "obshub", "--help"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert cli.returncode == 1 and "pip install 'obshub[all]'" in cli.stderr


def test_extras_cover_what_each_role_imports():
    reqs = metadata.requires("obshub") or []
    assert reqs and all("extra ==" in r for r in reqs), [r for r in reqs if "extra ==" not in r]
    by_extra: dict[str, set[str]] = {}
    for r in reqs:
        name = re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].strip().lower()  # "faust-streaming<0.16,>=0.15; ..."
        extra = r.split('extra == "')[1].rstrip('"')
        by_extra.setdefault(extra, set()).add(name)
    assert {"confluent-kafka", "prometheus-client"} <= by_extra["agent"]
    assert {"faust-streaming", "confluent-kafka"} <= by_extra["streams"]
    assert {"httpx", "ruamel.yaml", "common-expression-language", "jinja2", "tenacity"} <= by_extra["rules"]
    runtime = set().union(*(by_extra[e] for e in ("cli", "agent", "streams", "rules", "all")))
    assert "pyyaml" not in runtime and "cel-python" not in runtime  # nothing at run time imports them
