#!/usr/bin/env bash
# Build the Solidity artifacts with the pinned solc.
#   scripts/build_contracts.sh          rebuild into the repository
#   scripts/build_contracts.sh --check  rebuild into a temp dir and fail (exit 1) if the
#                                       committed artifacts differ
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ARTIFACTS=(
  "aitbc_agent_sdk/chain/artifacts/TrainingEscrow.json"
  "aitbc_agent_sdk/chain/artifacts/ProviderRegistry.json"
  "tests/artifacts/RevertingReceiver.json"
  "tests/artifacts/TestToken.json"
  "tests/artifacts/ReentrantAttacker.json"
)

mode="build"
case "${1:-}" in
  "") ;;
  --check) mode="check" ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

command -v node >/dev/null || { echo "node is not on PATH" >&2; exit 2; }

if [[ ! -d "$ROOT/contracts/node_modules/solc" ]]; then
  # --no-audit/--no-fund: keep the output quiet; the lock file pins everything.
  npm ci --prefix "$ROOT/contracts" --no-audit --no-fund >&2
fi

if [[ "$mode" == "build" ]]; then
  node "$ROOT/contracts/build.mjs" --out-root "$ROOT"
  exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
node "$ROOT/contracts/build.mjs" --out-root "$tmp" >/dev/null

status=0
for rel in "${ARTIFACTS[@]}"; do
  if ! diff -u "$ROOT/$rel" "$tmp/$rel" >/dev/null 2>&1; then
    echo "stale artifact: $rel (run scripts/build_contracts.sh and commit the result)" >&2
    diff -u "$ROOT/$rel" "$tmp/$rel" 2>&1 | head -n 40 >&2 || true
    status=1
  fi
done
[[ $status -eq 0 ]] && echo "artifacts up to date"
exit $status
