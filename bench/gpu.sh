#!/usr/bin/env bash
# Every GPU figure in one run (budget: <= 10 minutes on one H200; each step has its own timeout):
#   1. the CUDA tests (tests/gpu) and the strict-communication unit tests, on the GPU;
#   2. a bf16 training step of a ~1B preset (qwen2.5-1.5b) on one GPU: tokens/s and MFU against the
#      H200's datasheet bf16 peak, and its peak memory predicted (planner) against measured
#      (torch.cuda.max_memory_allocated);
#   3. greedy generation tokens/s, meshrl against transformers.generate, same weights and GPU;
#   4. `meshrl profile --gpu h200` (bf16 matmul FLOP/s, HBM bandwidth) into a profile the planner
#      reads, and `meshrl plan` with it;
#   5. on the host's CPU cores (a core per rank, which 2-core machines lack): asynchronous RL on 4
#      gloo ranks, 2 generating and 2 training, at k = 0, 1, 2, 4 (bench/off_policy.py, with a quick
#      CPU profile for its predictions).
# --dry-run runs the CPU-safe parts (tiny preset on the CPU, small sizes) to check the script itself.
#
#   bash bench/gpu.sh [--dry-run] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
DRY=0
OUT=${TMPDIR:-/tmp}/meshrl-gpu-bench
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --out) OUT=$2; shift ;;
    *) echo "usage: bash bench/gpu.sh [--dry-run] [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$OUT"
export MESHRL_STRICT_COMM=1
t0=$(date +%s)
step() { echo; echo "== $1 ($(( $(date +%s) - t0 )) s in)"; }

if [ "$DRY" = 1 ]; then
  step "tests (CPU: the CUDA ones skip)"
  python -m pytest -q tests/gpu tests/parallel/test_precision.py tests/plan/test_gpu_profile.py
  step "bf16 training step + generation vs transformers (tiny preset, CPU)"
  python bench/gpu_step.py --preset tiny --device cpu --dtype bfloat16 --batch 4 --seq 64 --steps 2 \
    --gen-batch 2 --prompt-len 8 --new-tokens 8 --repeats 1 | tee "$OUT/step.json"
  python bench/gpu_step.py --preset tiny --device cpu --dtype float32 --batch 2 --seq 16 --steps 1 \
    --gen-batch 2 --prompt-len 8 --new-tokens 8 --repeats 1 --gen-compile | tee "$OUT/step_compiled.json"
  step "asynchronous RL on 4 CPU ranks (2 iterations a lag: the script's own check)"
  meshrl profile --quick --out "$OUT/profile-cpu.json" > /dev/null
  MESHRL_PROFILE="$OUT/profile-cpu.json" python bench/off_policy.py --workload llama3m --nprocs 4 --iterations 6 \
    --ks 0,2 | tee "$OUT/off_policy.txt"
  step "profile --gpu (expected to refuse on a CPU-only machine)"
  if meshrl profile --gpu h200 --out "$OUT/profile-h200.json"; then :; else echo "(no GPU: refused, as expected)"; fi
  step "done in $(( $(date +%s) - t0 )) s"
  exit 0
fi

python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'bench/gpu.sh: no CUDA device (use --dry-run)')"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
step "CUDA tests"
timeout 240 python -m pytest -q -x tests/gpu tests/parallel/test_precision.py tests/parallel/test_comm.py
step "bf16 training step of qwen2.5-1.5b (MFU, memory) + generation vs transformers.generate"
timeout 180 python bench/gpu_step.py --preset qwen2.5-1.5b --device cuda --dtype bfloat16 --batch 8 --seq 1024 \
  --steps 5 --gen-batch 16 --prompt-len 128 --new-tokens 128 --repeats 3 | tee "$OUT/step.json"
step "generation with gen.compile (CUDA graphs) vs transformers.generate"
timeout 120 python bench/gpu_step.py --preset qwen2.5-1.5b --device cuda --dtype bfloat16 --steps 1 --batch 1 \
  --seq 128 --gen-batch 16 --prompt-len 128 --new-tokens 128 --repeats 3 --gen-compile | tee "$OUT/step_compiled.json" \
  || echo "(gen.compile row failed or timed out: see above)"
step "meshrl profile --gpu h200, then the planner with it"
timeout 60 meshrl profile --gpu h200 --out "$OUT/profile-h200.json"
meshrl plan cluster.device=h200 cluster.devices_per_node=8 models.actor.preset=llama2-7b \
  models.critic.preset=llama2-7b models.ref.preset=llama2-7b --strategy heuristic --profile "$OUT/profile-h200.json" | tail -12
step "asynchronous RL on 4 CPU ranks, 2 generating and 2 training (bench/off_policy.py)"
timeout 60 meshrl profile --quick --out "$OUT/profile-cpu.json" > /dev/null
MESHRL_PROFILE="$OUT/profile-cpu.json" timeout 150 python bench/off_policy.py --workload llama3m --nprocs 4 \
  --iterations 10 | tee "$OUT/off_policy.txt" || echo "(off_policy rows failed or timed out: see above)"
step "done in $(( $(date +%s) - t0 )) s; figures in $OUT"
