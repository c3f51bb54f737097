#!/usr/bin/env bash
# The agent-learning pipeline (base -> SFT -> SFT+RL on the curriculum's held-out split) at a larger
# batch on one GPU (sized for one H200 in <= 10 minutes). Prepared for a session that is lent a
# device; it has not run on one yet. It needs PyPI (make setup) and bubblewrap there: the machine this
# project is lent has neither, so there use bench/gpu_sft.py (SFT on the GPU, episodes here) instead.
# Run from the repository root:
#   bash bench/gpu_agent_learning.sh            # writes bench/results/gpu/agent_learning.json
# What runs on the GPU: SFT (full fine-tune, bf16 autocast), evaluation sampling (bf16), and the RL
# learner + rollouts (HF backend). Sandboxed episodes, grading and the curriculum build stay on the
# CPU cores, so the time is bounded by tests, not by the GPU, at this model size.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/results/gpu
if [ ! -x .venv/bin/etude ]; then
  make setup
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || { echo "gpu_agent_learning: no GPU visible" >&2; exit 2; }
export ETUDE_CACHE=${ETUDE_CACHE:-$PWD/.cache-gpu}
start=$(date +%s)
timeout 570 .venv/bin/python bench/agent_learning.py \
  --work runs/gpu_agent_learning --out bench/results/gpu/agent_learning.json \
  --workers 32 --sft-tasks 400 --sft-epochs 2 --rl-steps 10 \
  || echo "gpu_agent_learning: stopped at the 570 s budget (stages done so far are kept in runs/gpu_agent_learning)" >&2
echo "gpu_agent_learning: $(( $(date +%s) - start )) s" >&2
