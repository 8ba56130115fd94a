#!/usr/bin/env bash
# The GPU check of issue #15, for whenever a GPU is at hand:  scripts/gpu_check.sh [--quick]
#   1. NVML inventory of the card (detect_hardware, what a provider's offer advertises);
#   2. the whole market flow on the devnet (devnet up, init, upload-data, discover-workers,
#      distribute, monitor; escrow paid) with a provider daemon training the built-in mlp and
#      examples/tasks/resnet_small.py, and the GPU memory its training process took;
#   3. samples/s of the provider path against a plain PyTorch loop (bench/bench_task_path.py),
#      bf16 autocast on and off, and tokens/s of the built-in gpt task against nanoGPT's loop;
#   4. the trusted cluster's BalancedStep under torchrun (NCCL on a GPU, gloo on a CPU) and a
#      bf16 weights_digest, plus tests/test_cluster_gpu_paths.py;
#   5. (issue #18) how far re-executed committed segments land from the committed end state, on the
#      GPU and on the CPU, honest against skipped (scripts/spot_check_tolerance.py), and the tolerance
#      table rows they give (issue #29), in $OUT/tolerances.json;
#   6. (issue #27) tokens/s of a GPT-2-small-shaped gpt job on the provider path against the plain bf16 loop;
#   7. (issue #29) whether a dispute narrows by hash on this device: two traced re-executions of a segment
#      and each step replayed alone (scripts/dispute_trace_check.py).
# Without a GPU (torch sees no CUDA device) the GPU-only rows say SKIP and everything else runs
# on the CPU, so the script itself is checked on any machine. --quick: smaller benchmark, no
# market flow. Prints a markdown table (also to $OUT/gpu_check.md when $OUT is set); exits 1
# when a check failed (a ratio below its goal is reported, not failed).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# $PYTHON and $AITBC_CMD override the interpreter and the CLI (default: the project's .venv, else python3).
PY=${PYTHON:-.venv/bin/python}
command -v "$PY" >/dev/null || PY=$(command -v python3)
read -r -a AITBC <<<"${AITBC_CMD:-.venv/bin/aitbc}"
command -v "${AITBC[0]}" >/dev/null || AITBC=("$PY" -c 'import sys; from aitbc_cli.app import main; sys.argv[0] = "aitbc"; main()')
quick=0
[[ ${1:-} == --quick ]] && quick=1
work=$(mktemp -d /tmp/aitbc-gpu-check.XXXXXX)
log=$work/gpu_check.log
export AITBC_HOME=$work/home
unset AITBC_WALLET_PASSWORD
rows=()
failed=0
devnet_started=0
cleanup() {
  if ((devnet_started)); then "${AITBC[@]}" devnet down >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

row() { rows+=("| $1 | $2 | $3 |"); }
# check NAME COMMAND...: COMMAND prints "RESULT|DETAIL" lines (one row each); a failure is a FAIL row.
# It runs in a background subshell: inside `if` bash would ignore set -e, and a check must stop at its
# first failing command.
check() {
  local name=$1 line
  shift
  echo "== $name" >>"$log"
  (set -e; "$@") >"$work/out" 2>"$work/err" &
  if wait $!; then
    cat "$work/err" >>"$log"
    while IFS= read -r line; do
      [[ -n $line ]] && row "$name" "${line%%|*}" "${line#*|}"
    done <"$work/out"
  else
    cat "$work/out" "$work/err" >>"$log"
    failed=1
    row "$name" "FAIL" "$(grep -v '^\s*$' "$work/err" | tail -n 1 | tr '|' '/' | cut -c1-300) (log: $log)"
  fi
}
# json_field KEY [INDEX KEY]: a field of the JSON object on stdin's last line, e.g. json_field workers 0 gpu
json_field() {
  "$PY" -c 'import json, sys
v = json.loads(sys.stdin.read().strip().splitlines()[-1])
for key in sys.argv[1:]:
    v = v[int(key)] if isinstance(v, list) else v[key]
print(v)' "$@"
}

gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
device=cpu
((gpus > 0)) && device=cuda

inventory() {
  "$PY" - "$gpus" <<'EOF'
import sys
import torch
from aitbc_agent_sdk.provider._hardware import detect_hardware

hw = detect_hardware()
cuda = int(sys.argv[1])
torch_cuda = f"torch {torch.__version__}, CUDA {f'yes: {cuda} device(s)' if cuda else 'no'}"
for i, g in enumerate(hw.gpus):
    free = (g.memory_free_bytes or 0) / 2**30
    print(f"INFO|GPU {i}: {g.name}, {g.memory_total_bytes / 2**30:.1f} GiB ({free:.1f} free),"
          f" driver {g.driver_version}, CUDA {g.cuda_version}, utilisation {g.utilization_percent}%")
if not hw.gpus:
    print(f"SKIP|NVML finds no GPU: CPU-only host, GPU rows skipped; {hw.cpu_cores} cores of {hw.cpu_model};"
          f" {torch_cuda}")
elif not cuda:
    raise SystemExit(f"NVML finds {len(hw.gpus)} GPU(s) but torch has no CUDA ({torch_cuda}): run scripts/setup.sh")
else:
    print(f"PASS|the offer advertises {len(hw.gpus)} GPU(s), type {hw.gpu_type}; {torch_cuda}")
EOF
}

# The peak GPU memory of compute processes while a command runs (nvidia-smi, sampled).
with_gpu_memory() {
  local peak=$work/gpu_peak sampler
  echo 0 >"$peak"
  if [[ $device == cuda ]] && command -v nvidia-smi >/dev/null; then
    (while true; do
       used=$(nvidia-smi --query-compute-apps=used_memory --format=csv,noheader,nounits 2>/dev/null \
              | awk '{s+=$1} END {print s+0}') || used=0
       if ((used > $(cat "$peak"))); then echo "$used" >"$peak"; fi
       sleep 0.3
     done) &
    sampler=$!
  fi
  local rc=0
  "$@" || rc=$?
  if [[ -n ${sampler:-} ]]; then kill "$sampler" 2>/dev/null || true; fi
  return $rc
}

# flow TASK: one training of TASK (a built-in name or a task file) on the digits images, 1 worker, 2 rounds.
flow() {
  local task=$1 tid hired snap
  tid=$("${AITBC[@]}" distributed-training init --wallet dev --task "$task" --target-workers 1 --rounds 2 --json \
        | json_field training_id)
  "${AITBC[@]}" distributed-training upload-data --training-id "$tid" --data-path "$work/images.npz" --json >/dev/null
  hired=$("${AITBC[@]}" distributed-training discover-workers --training-id "$tid" --min-gpu cpu \
          --required-workers 1 --json | json_field workers 0 gpu)
  "${AITBC[@]}" distributed-training distribute --training-id "$tid" --strategy data-parallel --yes --json >/dev/null
  with_gpu_memory "${AITBC[@]}" distributed-training monitor --training-id "$tid" --follow --interval 0.5 --json \
    | tail -n 1 >"$work/snap.json"
  "$PY" - "$work/snap.json" "$hired" "$device" "$(cat "$work/gpu_peak")" <<'EOF'
import json, sys
snap, hired, device, peak = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3], int(sys.argv[4])
escrow = snap["escrow"]
deposited, paid, refunded, held = (int(escrow[k]) for k in ("deposited_wei", "paid_wei", "refunded_wei", "held_wei"))
if snap["phase"] != "complete" or not paid or deposited != paid + refunded + held:
    raise SystemExit(f"phase {snap['phase']}, escrow {escrow}")
if device == "cuda" and (hired == "cpu" or peak == 0):
    raise SystemExit(f"trained, but not on the GPU: offer {hired!r}, peak GPU memory {peak} MiB")
gpu = f", peak GPU memory {peak} MiB" if device == "cuda" else " (no GPU: on the CPU)"
last = snap["round_metrics"][-1]
print(f"PASS|{device}: offer {hired}, {snap['round']} rounds, accuracy {last['accuracy']:.3f}, "
      f"{last['throughput']:.0f} samples/s{gpu}; escrow paid {paid / 1e18:g} ETH of {deposited / 1e18:g}")
EOF
}

market_flow() {
  "${AITBC[@]}" devnet up --providers 1 --ipfs local --json >/dev/null
  "$PY" examples/tasks/make_data.py "$work/images.npz" >/dev/null
  echo "PASS|broker, anvil (escrow deployed), local store, 1 provider daemon (slot 0 on GPU 0 where there is one)"
}

# bench ARGS...: bench/bench_task_path.py's JSON line as rows, one per task.
bench() {
  "$PY" bench/bench_task_path.py --device "$device" "$@" | tail -n 1 >"$work/bench.json"
  "$PY" - "$work/bench.json" <<'EOF'
import json, sys
result = json.load(open(sys.argv[1]))
goal = 0.8 if result["device"] == "cuda" else 0.9
for name, r in result["tasks"].items():
    pairs, met = r["steady_ratio_of_pairs"], "meets" if r["steady_ratio"] >= goal else "BELOW"
    unit = r.get("unit", "samples")
    print(f"{r['steady_ratio']:.2f}x|{name} on {result['device']}, bf16 {'on' if r['bf16'] else 'off'}, sandboxed "
          f"{result['sandboxed']}: provider {r['provider_samples_per_s']['median']:.0f} {unit}/s, plain loop "
          f"{r['plain_samples_per_s']['median']:.0f} (medians of {result['repeats']}; pairs {pairs['min']:.2f}-"
          f"{pairs['max']:.2f}); first job {r['first_job_ratio']:.2f}x; {met} the goal of {goal:.0%}")
EOF
}

balanced_step() {
  cat >"$work/balanced_step.py" <<'EOF'
import json
import os
from pathlib import Path

import torch

from aitbc_agent_sdk.cluster import ddp

info = ddp.setup()
device = torch.device(info.device)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
budget = ddp.local_budget(info, memory_per_sample_bytes=4096, config_memory_bytes=1 << 30)
step = ddp.BalancedStep.from_budgets(model, optimizer, 64, budget, info)
g = torch.Generator().manual_seed(1)
x, y = torch.randn(64, 16, generator=g).to(device), torch.randint(0, 4, (64,), generator=g).to(device)
losses = [step.run(s, lambda off, n: (x[off:off + n], y[off:off + n]), torch.nn.functional.cross_entropy).loss
          for s in range(1, 9)]
# A file per rank: the ranks share one stdout, where their lines can interleave.
result = {"rank": info.rank, "world": info.world_size, "backend": info.backend, "device": info.device,
          "sizes": list(step.plan.sizes), "losses": losses, "digest": ddp.weights_digest(model),
          "bf16_digest": ddp.weights_digest(model.bfloat16())}
Path(os.environ["RESULTS_DIR"], f"rank{info.rank}.json").write_text(json.dumps(result))
ddp.teardown()
EOF
  local ranks=2
  [[ $device == cuda ]] && ranks=$gpus  # NCCL takes one GPU per rank
  mkdir -p "$work/ranks"
  RESULTS_DIR=$work/ranks OMP_NUM_THREADS=1 TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "$PY" -m torch.distributed.run \
    --standalone --nproc-per-node="$ranks" "$work/balanced_step.py" >&2
  "$PY" - "$work/ranks" <<'EOF'
import json, math, sys
from pathlib import Path
results = [json.loads(p.read_text()) for p in sorted(Path(sys.argv[1]).glob("rank*.json"))]
if not results or len(results) != results[0]["world"]:
    raise SystemExit(f"{len(results)} ranks reported")
first = results[0]
losses = first["losses"]
if not all(math.isfinite(l) for l in losses) or losses[-1] >= losses[0]:
    raise SystemExit(f"losses {losses}")
if len({r["digest"] for r in results}) != 1 or len({r["bf16_digest"] for r in results}) != 1:
    raise SystemExit("ranks ended with different weights")
print(f"PASS|{first['world']} rank(s), {first['backend']} on {first['device']}, batch split {first['sizes']}: loss "
      f"{losses[0]:.3f} -> {losses[-1]:.3f}, equal weights and bf16 digests on every rank")
EOF
}

unit_tests() {
  "$PY" -m pytest tests/test_cluster_gpu_paths.py -q -p no:cacheprovider >>"$log"
  echo "PASS|tests/test_cluster_gpu_paths.py (bf16 digests, where collectives run)"
}

skip() { echo "SKIP|$1"; }

# Issue #18: how far honest re-executions of committed segments land (same device, and the CPU a
# coordinator has) against segments a worker skipped: the room FaultPolicy.reexec_tolerance has.
spot_check_tolerance() {
  # the measured rows, merged into a copy of the shipped table: bring it back and commit it
  local table=${OUT:-$work}/tolerances.json
  cp aitbc_agent_sdk/proof/tolerances.json "$table"
  "$PY" scripts/spot_check_tolerance.py --device "$device" --table "$table" | grep '|'
}

# Issue #29: two traces of one segment, and each step alone, on the device that trained it.
dispute_traces() {
  "$PY" scripts/dispute_trace_check.py --device "$device" | grep '|'
}

check "NVML inventory" inventory
if ((quick)); then
  row "market flow" "SKIP" "--quick"
else
  devnet_started=1  # set here: a check runs in a subshell
  check "devnet up (1 provider daemon)" market_flow
  check "market flow: built-in mlp" flow mlp
  check "market flow: resnet_small" flow examples/tasks/resnet_small.py
fi
if ((quick)); then
  check "provider path / plain loop" bench --quick
  check "gpt: provider / plain (tokens/s)" bench --quick --tasks gpt
elif [[ $device == cuda ]]; then
  check "provider path / plain loop" bench --samples 16384 --side 32 --width 64 --batch-size 256 --epochs 2 --repeats 3
  check "bf16 off: provider / plain" bench --tasks resnet --no-bf16 --samples 16384 --side 32 --width 64 \
    --batch-size 256 --epochs 2 --repeats 3
  check "gpt: provider / plain (tokens/s)" bench --tasks gpt --gpt-layers 6 --gpt-heads 6 --gpt-width 384 \
    --gpt-context 256 --gpt-windows 12800 --batch-size 64 --epochs 2 --repeats 3
  # GPT-2 small's shape (85M parameters with a byte vocabulary): the provider path, trajectory included.
  check "gpt2-small: provider / plain (tokens/s)" bench --tasks gpt --gpt-layers 12 --gpt-heads 12 \
    --gpt-width 768 --gpt-context 512 --gpt-windows 2048 --batch-size 16 --epochs 1 --repeats 2
else
  check "provider path / plain loop" bench --samples 1024 --epochs 1 --repeats 3
  check "gpt: provider / plain (tokens/s)" bench --tasks gpt --gpt-layers 2 --gpt-width 64 --gpt-context 64 \
    --gpt-windows 256 --epochs 1 --repeats 3
fi
[[ $device == cpu ]] && check "bf16 on and off" skip "no GPU: bf16 autocast is used on CUDA only"
check "BalancedStep under torchrun" balanced_step
[[ $device == cpu ]] && row "BalancedStep with NCCL" "SKIP" "no GPU: ran over gloo above"
check "cluster GPU paths (unit)" unit_tests
check "spot-check re-execution distance" spot_check_tolerance
check "dispute traces, same device" dispute_traces

mode="on $gpus GPU(s)"
((gpus == 0)) && mode="with no GPU: CPU-only parts"
table=$(printf '%s\n' "### GPU check ($mode, $(date -u +%Y-%m-%dT%H:%MZ))" "" "| check | result | detail |" \
        "|---|---|---|" "${rows[@]}")
echo "$table"
if [[ -n ${OUT:-} ]]; then
  mkdir -p "$OUT"
  echo "$table" >"$OUT/gpu_check.md"
  cp "$log" "$OUT/gpu_check.log"
fi
exit $failed
