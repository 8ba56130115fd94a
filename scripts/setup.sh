#!/usr/bin/env bash
# One-time (and idempotent) set-up: a virtualenv with the SDK, and the Solidity compiler.
# Re-running is cheap: each step is skipped when its inputs have not changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv
STAMPS=.stamps
mkdir -p "$STAMPS"

stamp_ok() {  # stamp_ok NAME FILES... : true when the files' hash matches the stamp
  local name=$1; shift
  local want; want=$(cat "$@" 2>/dev/null | sha256sum | cut -d' ' -f1)
  [[ -f "$STAMPS/$name" && "$(cat "$STAMPS/$name")" == "$want" ]] && return 0
  echo "$want" > "$STAMPS/$name.want"
  return 1
}
stamp_done() { mv "$STAMPS/$1.want" "$STAMPS/$1"; }

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "setup: Python 3.11 or newer is required ($PYTHON is $("$PYTHON" --version 2>&1))" >&2
  exit 2
fi

if [[ ! -x $VENV/bin/python ]]; then
  echo "setup: creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi

if ! stamp_ok python pyproject.toml scripts/setup.sh; then
  echo "setup: installing Python packages"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
  # torch first and pinned: the CPU wheel. A loose torch requirement would pull a multi-GB CUDA build.
  "$VENV/bin/python" -m pip install --quiet "torch==2.13.0" 2>&1 | grep -v '^WARNING: Location' || true
  # Where nvidia-smi finds a GPU, the CUDA build replaces the CPU wheel (same version), so providers
  # and the trusted cluster train on the GPU. AITBC_TORCH_INDEX picks another CUDA index.
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU' \
      && ! "$VENV/bin/python" -c 'import sys, torch; sys.exit(torch.version.cuda is None)' 2>/dev/null; then
    echo "setup: a GPU is here: installing the CUDA build of torch 2.13.0"
    "$VENV/bin/python" -m pip install --quiet --force-reinstall "torch==2.13.0" \
      --index-url "${AITBC_TORCH_INDEX:-https://download.pytorch.org/whl/cu128}" 2>&1 \
      | grep -v '^WARNING: Location' || echo "setup: the CUDA build did not install; keeping the CPU wheel" >&2
  fi
  # dev: the test tools; docs: mkdocs-material, which builds the docs site (the tests build it too).
  "$VENV/bin/python" -m pip install --quiet -e ".[dev,docs,dashboard]" 2>&1 | grep -v '^WARNING: Location' || true
  "$VENV/bin/python" -c 'import aitbc_agent_sdk, aitbc_cli, torch, mkdocs' \
    || { echo "setup: the Python install failed" >&2; exit 1; }
  stamp_done python
fi

# Debian packages: mosquitto (MQTT broker), bubblewrap (job sandbox), and for shared cluster
# datasets s3fs (FUSE), the userspace NFS tools and the nfs-ganesha server the tests export from.
missing=()
[[ -x /usr/sbin/mosquitto ]] || command -v mosquitto >/dev/null 2>&1 || missing+=(mosquitto)
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v s3fs >/dev/null 2>&1 || missing+=(s3fs)
command -v nfs-ls >/dev/null 2>&1 || missing+=(libnfs-utils)
command -v ganesha.nfsd >/dev/null 2>&1 || missing+=(nfs-ganesha nfs-ganesha-vfs)
# The dashboard's browser tests drive Debian's Chromium (Playwright's own browser download is never used).
[[ -x /usr/bin/chromium ]] || missing+=(chromium)
if (( ${#missing[@]} )); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "setup: npm is required (Node.js 20) for solc, anvil and js-ipfs" >&2
  exit 2
fi
if ! stamp_ok npm-contracts contracts/package.json contracts/package-lock.json; then
  echo "setup: installing the Solidity compiler (npm solc)"
  npm ci --prefix contracts --no-audit --no-fund --loglevel=error
  stamp_done npm-contracts
fi
# anvil (Ethereum node) and js-ipfs (Kubo RPC API); the js-ipfs tree takes minutes on a cold
# npm cache, seconds on a warm one.
if ! stamp_ok npm-tools tools/node/package.json tools/node/package-lock.json; then
  echo "setup: installing anvil and js-ipfs (npm)"
  # 'npm install', not 'npm ci': js-ipfs pulls an optional dependency from a tarball URL that
  # npm ci rejects as out of sync with the lock file; install still follows the lock.
  npm install --prefix tools/node --no-audit --no-fund --loglevel=error
  stamp_done npm-tools
fi
echo "setup: ready"
