#!/usr/bin/env bash
# GPU checks for a person with one (or more) CUDA GPUs, in about 8 minutes on one H200: gpu, gpu_ids, auto, the
# default and gpt recipes in fp32, bf16, fp16 and fp8, parallel=fsdp (bf16 policy; NCCL sharding and resharded
# resume with 2+ GPUs), torch.compile, runner plan, kill -9 + resume=auto bitwise on the GPU (tests/gpu), and the
# runner's steps/s against a raw bf16 loop on a GPT-2-small-shaped transformer with its MFU.
# Prints one PASS/FAIL line per check; the logs of failed checks are kept under $WORK (printed at the end).
#   bash tests/gpu/check.sh            (from the repository root, in the venv where runner is installed)
#
# On a machine that has torch but not the project's other dependencies and no network, carry wheels: in a folder
# named by RUNNER_GPU_WHEELS (default: <repo>/.whl), tests/gpu/fetch_wheels.sh puts what is missing; this script
# installs them into a temporary folder, ahead on PYTHONPATH, when hydra, datasets or torchao does not import.
set -u
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
WORK="$(mktemp -d -t runner-gpu-check-XXXX)"
RESULTS="$WORK/results"
TINY="data.num_train=256 data.num_validation=64 trainer.batch_size=32 trainer.progress_bar=false trainer.max_steps=3"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
unset CUDA_VISIBLE_DEVICES
started=$(date +%s)

WHEELS="${RUNNER_GPU_WHEELS:-$ROOT/.whl}"
if ! python -c "import hydra, omegaconf, datasets, torchao" 2>/dev/null; then
  if compgen -G "$WHEELS/*.whl" >/dev/null; then
    python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" "$WHEELS"/*.whl \
      && export PYTHONPATH="$ROOT:$WORK/site:${PYTHONPATH#"$ROOT:"}" && echo "installed the carried wheels from $WHEELS into $WORK/site"
  fi
fi

# check NAME EXPECTED_RC GREP_PATTERN -- COMMAND...: passes when the exit code matches and the output holds the pattern.
# Checks run in the background, a few at a time (`settle` waits for them); each writes one line to $RESULTS.
check() {
  local name="$1" want_rc="$2" pattern="$3"; shift 4
  local log="$WORK/$name.log" line
  (cd "$WORK" && "$@") >"$log" 2>&1
  local rc=$?
  if [[ $rc -eq $want_rc ]] && grep -qE -- "$pattern" "$log"; then
    line="PASS $name"
  else
    line="FAIL $name (exit $rc, wanted $want_rc and /$pattern/; log: $log)"
  fi
  echo "$line" | tee -a "$RESULTS"
}
bg() { check "$@" & }
settle() { wait; }

NGPU=$(python -c "import torch; print(torch.cuda.device_count())")
LAST=$((NGPU - 1))
CAP=$(python -c "import torch; print('%d%d' % torch.cuda.get_device_capability() if torch.cuda.is_available() else '0')")
if [[ $NGPU -eq 0 ]]; then
  echo "FAIL cuda (torch $(python -c 'import torch; print(torch.__version__)') sees no CUDA GPU; nothing else to check)"
  exit 1
fi
echo "runner GPU checks: $NGPU GPU(s) $(python -c 'import torch; print(torch.cuda.get_device_name(0))'), compute" \
     "capability ${CAP:0:1}.${CAP:1}, torch $(python -c 'import torch; print(torch.__version__)'), logs in $WORK"
# A text corpus for the gpt recipe, made here (no download).
python -c "import sys; sys.path.insert(0, '$ROOT/benchmarks'); import transformer_throughput as t, pathlib; \
t.write_corpus(pathlib.Path('$WORK/corpus.txt'), 1)"
GPT="recipe=gpt data.train=$WORK/corpus.txt trainer.max_steps=60 trainer.eval_every_steps=60 trainer.log_every_steps=20 \
trainer.progress_bar=false checkpoint.enabled=false"

touch "$RESULTS"
bg env 0 "cuda available +: yes" -- python -m runner env
bg gpu 0 "device cuda:0 \| precision fp32" -- python -m runner $TINY hardware=gpu
bg auto 0 "hardware=auto: CUDA is present" -- python -m runner $TINY hardware=auto
bg gpu_ids_last 0 "physical $LAST -> rank 0 -> cuda:0" -- python -m runner $TINY hardware=gpu "gpu_ids=[$LAST]"
settle
bg gpu_ids_string 0 "physical $LAST -> rank 0 -> cuda:0" -- python -m runner $TINY hardware=gpu "gpu_ids=\"$LAST\""
bg gpu_ids_out_of_range 1 "names GPUs this machine does not have; it has $NGPU GPU" -- python -m runner $TINY hardware=gpu "gpu_ids=[$NGPU]"
bg gpu_ids_conflict 1 "conflicts with CUDA_VISIBLE_DEVICES" -- env CUDA_VISIBLE_DEVICES=0 python -m runner $TINY hardware=gpu "gpu_ids=[$NGPU]"
bg bf16 0 "autocast bfloat16 \| grad scaler off" -- python -m runner $TINY hardware=gpu precision=bf16
settle
bg fp16 0 "autocast float16 \| grad scaler on" -- python -m runner $TINY hardware=gpu precision=fp16 trainer.max_grad_norm=1.0
if [[ $CAP -ge 89 ]]; then
  bg fp8 0 "fp8 modules converted [1-9]" -- python -m runner $TINY hardware=gpu precision=fp8
else
  bg fp8_refused 1 "needs compute capability >= 8.9" -- python -m runner $TINY hardware=gpu precision=fp8
fi
# The gpt recipe, 60 steps in each precision: each must train (its final val/loss is printed below to compare).
for precision in fp32 bf16; do
  bg "gpt_$precision" 0 "final val/loss=" -- python -m runner $GPT hardware=gpu precision=$precision
done
settle
bg gpt_fp16 0 "final val/loss=" -- python -m runner $GPT hardware=gpu precision=fp16
if [[ $CAP -ge 89 ]]; then
  bg gpt_fp8 0 "final val/loss=" -- python -m runner $GPT hardware=gpu precision=fp8
fi
if [[ $NGPU -ge 2 ]]; then
  bg multi_gpu 0 "physical 1 -> rank 1 -> cuda:1" -- python -m runner $TINY hardware=multi_gpu "gpu_ids=[0,1]"
fi
# parallel=fsdp: one GPU runs it unsharded (its checkpoints are sharded all the same: layout dcp); 2+ GPUs shard
# over NCCL, and the last sharded checkpoint continues on one GPU (resharding N -> 1).
bg fsdp_bf16_one_gpu 0 '"layout": "dcp"' -- bash -c "python -m runner $TINY hardware=gpu parallel=fsdp precision=bf16 \
  checkpoint.every_n_steps=1 hydra.run.dir=fsdp1 && cat fsdp1/checkpoints/step_00000003/manifest.json"
bg plan_fsdp_bf16 0 "fits: yes, .* of .* per process" -- python -m runner plan hardware=multi_gpu parallel=fsdp precision=bf16
settle
bg compile_inductor 0 "torch.compile: the model \(backend inductor\)" -- python -m runner $TINY hardware=gpu compile.enabled=true
if [[ $NGPU -ge 2 ]]; then
  bg fsdp_bf16_nccl 0 "fsdp: [0-9]+ block\(s\) and the model sharded over $NGPU processes" -- python -m runner $TINY \
    hardware=multi_gpu parallel=fsdp precision=bf16 checkpoint.every_n_steps=1 hydra.run.dir=fsdpN
fi
bg default_recipe 0 "final .*val/accuracy=(0\.9[5-9]|1\.0)" -- python -m runner hardware=gpu trainer.progress_bar=false
# tests/gpu: the Accelerator on CUDA, mixed precision against fp32, fp8, gpu_ids, and SIGKILL + resume=auto bitwise.
bg pytest_gpu 0 " passed" -- python -m pytest -q -m gpu "$ROOT/tests/gpu" -p no:cacheprovider -o addopts="" --rootdir "$ROOT"
settle
if [[ $NGPU -ge 2 ]]; then
  check fsdp_reshard_to_one_gpu 0 "was written by $NGPU process\(es\) and this run has 1" -- python -m runner $TINY \
    hardware=gpu parallel=fsdp precision=bf16 trainer.max_steps=5 resume=fsdpN/checkpoints/step_00000003 hydra.run.dir=fsdp_resumed
fi

echo "--- the gpt recipe, 60 steps (its precision line and final validation):"
for precision in fp32 bf16 fp16 fp8; do
  log="$WORK/gpt_$precision.log"
  [[ -f "$log" ]] && echo "$precision: $(grep -oE 'precision [a-z0-9]+ \|[^|]*\|[^|]*(\| fp8 modules converted [0-9]+)?' "$log" | head -1);" \
    "$(grep -oE 'final val/loss=[0-9.]+' "$log" | tail -1)"
done
echo "--- throughput, alone on the GPU (benchmarks/transformer_throughput.py):"
check throughput 0 "ratio runner/plain" -- python "$ROOT/benchmarks/transformer_throughput.py" --rounds 2
tail -n 7 "$WORK/throughput.log"

FAILED=$(grep -c "^FAIL" "$RESULTS")
echo "$FAILED of $(wc -l <"$RESULTS") check(s) failed in $(( $(date +%s) - started )) s; logs in $WORK"
for log in "$WORK"/*.log; do
  name=$(basename "$log" .log)
  if grep -q "^FAIL $name " "$RESULTS"; then echo "--- $name (last lines):"; tail -n 25 "$log"; fi
done
exit $((FAILED > 0))
