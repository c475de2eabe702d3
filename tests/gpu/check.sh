#!/usr/bin/env bash
# GPU checks for a person with one (or more) CUDA GPUs: gpu, gpu_ids, bf16, fp16, fp8, auto, the default recipe,
# and parallel=fsdp (bf16 policy; NCCL sharding and resharded resume with 2+ GPUs), torch.compile and runner plan.
# Prints one PASS/FAIL line per check; the logs of failed checks are kept under $WORK (printed at the end).
#   bash tests/gpu/check.sh            (from the repository root, in the venv where runner is installed)
set -u
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
WORK="$(mktemp -d -t runner-gpu-check-XXXX)"
TINY="data.num_train=256 data.num_validation=64 trainer.batch_size=32 trainer.progress_bar=false trainer.max_steps=3"
FAILED=0
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
unset CUDA_VISIBLE_DEVICES

# check NAME EXPECTED_RC GREP_PATTERN -- COMMAND...: passes when the exit code matches and the output holds the pattern.
check() {
  local name="$1" want_rc="$2" pattern="$3"; shift 4
  local log="$WORK/$name.log"
  (cd "$WORK" && "$@") >"$log" 2>&1
  local rc=$?
  if [[ $rc -eq $want_rc ]] && grep -qE -- "$pattern" "$log"; then
    echo "PASS $name"
  else
    echo "FAIL $name (exit $rc, wanted $want_rc and /$pattern/; log: $log)"; FAILED=$((FAILED + 1))
  fi
}

NGPU=$(python -c "import torch; print(torch.cuda.device_count())")
LAST=$((NGPU - 1))
CAP=$(python -c "import torch; print('%d%d' % torch.cuda.get_device_capability() if torch.cuda.is_available() else '0')")
if [[ $NGPU -eq 0 ]]; then
  echo "FAIL cuda (torch $(python -c 'import torch; print(torch.__version__)') sees no CUDA GPU; nothing else to check)"
  exit 1
fi
echo "runner GPU checks: $NGPU GPU(s), compute capability ${CAP:0:1}.${CAP:1}, logs in $WORK"

check env 0 "cuda available +: yes" -- python -m runner.env
check gpu 0 "device cuda:0 \| precision fp32" -- python -m runner $TINY hardware=gpu
check auto 0 "hardware=auto: CUDA is present" -- python -m runner $TINY hardware=auto
check gpu_ids_last 0 "physical $LAST -> rank 0 -> cuda:0" -- python -m runner $TINY hardware=gpu "gpu_ids=[$LAST]"
check gpu_ids_string 0 "physical $LAST -> rank 0 -> cuda:0" -- python -m runner $TINY hardware=gpu "gpu_ids=\"$LAST\""
check gpu_ids_out_of_range 1 "names GPUs this machine does not have; it has $NGPU GPU" -- python -m runner $TINY hardware=gpu "gpu_ids=[$NGPU]"
check gpu_ids_conflict 1 "conflicts with CUDA_VISIBLE_DEVICES" -- env CUDA_VISIBLE_DEVICES=0 python -m runner $TINY hardware=gpu "gpu_ids=[$NGPU]"
check bf16 0 "autocast bfloat16 \| grad scaler off" -- python -m runner $TINY hardware=gpu precision=bf16
check fp16 0 "autocast float16 \| grad scaler on" -- python -m runner $TINY hardware=gpu precision=fp16 trainer.max_grad_norm=1.0
if [[ $CAP -ge 89 ]]; then
  check fp8 0 "fp8 modules converted [1-9]" -- python -m runner $TINY hardware=gpu precision=fp8
else
  check fp8_refused 1 "needs compute capability >= 8.9" -- python -m runner $TINY hardware=gpu precision=fp8
fi
if [[ $NGPU -ge 2 ]]; then
  check multi_gpu 0 "physical 1 -> rank 1 -> cuda:1" -- python -m runner $TINY hardware=multi_gpu "gpu_ids=[0,1]"
fi
# parallel=fsdp: one GPU runs it unsharded (its checkpoints are sharded all the same: layout dcp); 2+ GPUs shard
# over NCCL, and the last sharded checkpoint continues on one GPU (resharding N -> 1).
check fsdp_bf16_one_gpu 0 '"layout": "dcp"' -- bash -c "python -m runner $TINY hardware=gpu parallel=fsdp precision=bf16 \
  checkpoint.every_n_steps=1 hydra.run.dir=fsdp1 && cat fsdp1/checkpoints/step_00000003/manifest.json"
check plan_fsdp_bf16 0 "fits: yes, .* of .* per process" -- python -m runner plan hardware=multi_gpu parallel=fsdp precision=bf16
check compile_inductor 0 "torch.compile: the model \(backend inductor\)" -- python -m runner $TINY hardware=gpu compile.enabled=true
if [[ $NGPU -ge 2 ]]; then
  check fsdp_bf16_nccl 0 "fsdp: [0-9]+ block\(s\) and the model sharded over $NGPU processes" -- python -m runner $TINY \
    hardware=multi_gpu parallel=fsdp precision=bf16 checkpoint.every_n_steps=1 hydra.run.dir=fsdpN
  check fsdp_reshard_to_one_gpu 0 "was written by $NGPU process\(es\) and this run has 1" -- python -m runner $TINY \
    hardware=gpu parallel=fsdp precision=bf16 trainer.max_steps=5 resume=fsdpN/checkpoints/step_00000003 hydra.run.dir=fsdp_resumed
fi
check default_recipe 0 "final .*val/accuracy=(0\.9[5-9]|1\.0)" -- python -m runner hardware=gpu trainer.progress_bar=false
check pytest_gpu 0 "passed" -- python -m pytest -q -m gpu "$ROOT/tests/gpu" -p no:cacheprovider -o addopts="" --rootdir "$ROOT"

echo "$FAILED check(s) failed; logs in $WORK"
exit $((FAILED > 0))
