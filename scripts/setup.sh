#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian machine (root): distribution packages, the virtual environment at
# .venv, bcc made importable inside it, the kernel header tree for bcc, tracefs, the Kafka broker jars.
# A second run that has nothing to do finishes in seconds. Each step prints what it does.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\033[2msetup:\033[0m %s\n' "$*"; }

APT_PKGS=(bpfcc-tools python3-bpfcc libbpfcc linux-headers-amd64 systemtap-sdt-dev
          nftables iproute2 maven openjdk-17-jre-headless gcc make procps)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" != 0 ]; then
    echo "setup: missing Debian packages: ${missing[*]}; run as root or: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
  say "installing Debian packages: ${missing[*]}"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
else
  say "Debian packages present (bcc, kernel headers, sys/sdt.h, nftables, maven, java)"
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  say "creating virtual environment .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
stamp=.venv/.obshub-installed
want=$(cat pyproject.toml $(ls obshub/instrument/*.c obshub/producer/*.c obshub/bpf/record.h 2>/dev/null) | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  # uv (PyPI's `uv`, pinned) resolves like pip and installs from its own cache under $OBSHUB_CACHE/uv by hard
  # links: a fresh clone's install of torch and its CUDA wheels took ~150 s with pip, 24 s with uv on a cold cache
  # and 26 s (most of it compiling bytecode, needed where PYTHONDONTWRITEBYTECODE is set) on a warm one.
  # Where uv cannot be installed, pip does the same install.
  cache=${OBSHUB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/obshub}
  say "installing obshub and its dependencies into .venv with uv (cache $cache/uv; the first run downloads PyTorch, ~3 GB)"
  if .venv/bin/pip install -q 'uv==0.13.10'; then
    UV_CACHE_DIR="$cache/uv" .venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python \
      -e '.[all,test,bench,torch]'
  else
    say "uv could not be installed: installing with pip instead (minutes)"
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q -e '.[all,test,bench,torch]'
  fi
  echo "$want" > "$stamp"
else
  say ".venv is up to date"
fi

# bcc is Debian's python3-bpfcc (not PyPI's `bcc`): expose just that package to the venv through a .pth
# file and a private folder holding one symlink, so no other Debian module leaks into the venv.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p .venv/obshub-system
ln -sfn /usr/lib/python3/dist-packages/bcc .venv/obshub-system/bcc
echo "$(pwd)/.venv/obshub-system" > "$site/obshub-system-bcc.pth"
.venv/bin/python -c 'import bcc' 2>/dev/null && say "bcc importable in .venv (Debian python3-bpfcc)" \
  || { echo "setup: bcc is not importable in .venv" >&2; exit 1; }

# obshub is installed editable, so pip compiled none of its modules; where PYTHONDONTWRITEBYTECODE is set (CI
# runners, containers) no process writes them either, and every obshub process (CLI call, agent, worker,
# engine, benchmark part) compiled what it imports again: 0.25-0.4 s of CPU each. Compiled once here
# (unchanged files are skipped on later runs; Python ignores a .pyc whose source changed since).
.venv/bin/python -m compileall -q -j 0 obshub bench tests/support >/dev/null \
  || { echo "setup: Failed to byte-compile obshub, bench, tests/support (python -m compileall)" >&2; exit 1; }

.venv/bin/obshub setup
