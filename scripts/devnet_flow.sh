#!/usr/bin/env bash
# The README's step-by-step devnet flow, start to finish, each step its own process:
#   scripts/devnet_flow.sh [AITBC_CMD...]
# Uses a throw-away $AITBC_HOME; prints the training's final phase and accuracy.
set -euo pipefail
AITBC=("${@:-aitbc}")
export AITBC_HOME=${AITBC_HOME:-$(mktemp -d /tmp/aitbc-flow.XXXXXX)}
unset AITBC_WALLET_PASSWORD
trap '"${AITBC[@]}" devnet down >/dev/null 2>&1 || true' EXIT
data="$AITBC_HOME/digits.npz"
"${AITBC[@]}" devnet up --providers 3 --ipfs daemon --json >/dev/null
PY=${PYTHON:-$(dirname "$(command -v "${AITBC[0]}")")/python}
"$PY" -c 'import sys, numpy as np
from aitbc_agent_sdk.data._datasets import load_dataset
d = load_dataset("digits"); np.savez(sys.argv[1], x=d.features.numpy(), y=d.labels.numpy())' "$data"
last() { tail -n 1; }
tid=$("${AITBC[@]}" distributed-training init --wallet dev --model-type mlp --target-workers 3 --rounds 3 --json \
      | last | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["training_id"])')
"${AITBC[@]}" distributed-training upload-data --training-id "$tid" --data-path "$data" --json >/dev/null
"${AITBC[@]}" distributed-training discover-workers --training-id "$tid" --min-gpu cpu --required-workers 3 --json >/dev/null
"${AITBC[@]}" distributed-training distribute --training-id "$tid" --strategy data-parallel --yes --json >/dev/null
"${AITBC[@]}" distributed-training monitor --training-id "$tid" --follow --interval 0.5 --json | last \
  | "$PY" -c 'import json,sys; s=json.load(sys.stdin); print(s["phase"], s["round_metrics"][-1]["accuracy"])'
