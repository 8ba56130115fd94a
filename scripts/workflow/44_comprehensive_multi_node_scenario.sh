#!/usr/bin/env bash
# 44_comprehensive_multi_node_scenario.sh: a 3-node validation run on Linux network namespaces.
#
# Three hosts, each a network namespace with one veth pair to a bridge that lives in a fourth
# namespace (10.231.44.0/24, never routed anywhere else):
#   aitbc1        10.231.44.1  genesis/primary: anvil, mosquitto, js-ipfs, the coordinator
#   aitbc         10.231.44.2  follower: 2 provider daemons
#   gitea-runner  10.231.44.3  automation/CI: 1 provider daemon, and the checks from outside
# Every server binds to its host's address, and every client is given explicit addresses
# (all namespaces share the machine's hostname, which resolves to 127.0.0.1).
#
# The checks, in order, printed as a pass/fail table at the end:
#   1. cross-node health    2. one chain    3. a full training    4. recovery from kill -9
#   5. payments checked from outside (chain vs. the training's results)    6. data everywhere
#
# Usage: sudo scripts/workflow/44_comprehensive_multi_node_scenario.sh [--keep]
#        sudo scripts/workflow/44_comprehensive_multi_node_scenario.sh --down   (after --keep)
# Exit: 0 every check passed, 1 a check failed, 2 cannot run (not root, missing tools, busy),
#       130/143 interrupted. Everything it made (namespaces, processes, files) is removed on the
#       way out, also when a check fails or the run is interrupted; --keep leaves it up.
# Environment: AITBC_MULTINODE_TMP (parent of the run directory, default $TMPDIR or /tmp),
#              AITBC_PYTHON (default REPO/.venv/bin/python).

set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${AITBC_PYTHON:-$REPO/.venv/bin/python}"
CHECKS_PY="$REPO/scripts/workflow/multinode_checks.py"

HOSTS=(aitbc1 aitbc gitea-runner)
declare -A ADDR=([aitbc1]=10.231.44.1 [aitbc]=10.231.44.2 [gitea-runner]=10.231.44.3)
PREFIX_LEN=24
BRIDGE_NS=aitbc-mn-bridge
STATE_FILE=/run/aitbc-multinode.state   # written before anything is made: what a later run may remove
LOCK_FILE=/run/lock/aitbc-multinode.lock

ROUNDS=4
WORKERS=2
SPARES=1
EPOCHS=1
TARGET_ACCURACY=0.9
HEARTBEAT_TIMEOUT=3
# Prices pick the roles: the cheapest on each follower are the workers, the dearest is the spare.
declare -A PRICE=([provider-aitbc-0]=0.010 [provider-gitea-runner-0]=0.011 [provider-aitbc-1]=0.012)
STAKE=0.1
FUNDING=1

KEEP=0
DOWN=0

usage() { sed -n '2,/^$/{s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

for arg in "$@"; do
    case "$arg" in
        --keep) KEEP=1 ;;
        --down) DOWN=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "error: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
    esac
done

if [[ "$(id -u)" -ne 0 ]]; then
    echo "error: this script needs root: it creates network namespaces and veth pairs with 'ip netns'." >&2
    echo "       run it as: sudo $0${*:+ $*}" >&2
    exit 2
fi
for tool in ip flock timeout; do
    command -v "$tool" >/dev/null || { echo "error: '$tool' not found (Debian: apt-get install iproute2 util-linux)" >&2; exit 2; }
done
[[ -x "$PY" ]] || { echo "error: no Python at $PY: run 'make setup' first (or set AITBC_PYTHON)" >&2; exit 2; }

mkdir -p "$(dirname "$LOCK_FILE")"
exec 9>"$LOCK_FILE"
if ! flock -w 10 9; then
    echo "error: another run of this script holds $LOCK_FILE" >&2
    exit 2
fi

# -- timing and the result table ---------------------------------------------------------------------

T0=$EPOCHREALTIME
PHASE_NAMES=()
PHASE_SECS=()
PHASE_START=$T0
phase_done() {  # record the seconds since the last phase ended under NAME
    local now=$EPOCHREALTIME
    PHASE_NAMES+=("$1")
    PHASE_SECS+=("$(awk -v a="$PHASE_START" -v b="$now" 'BEGIN{printf "%.1f", b-a}')")
    PHASE_START=$now
}
elapsed() { awk -v a="$T0" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}'; }
log() { printf '[%6ss] %s\n' "$(elapsed)" "$*" >&2; }

R_ID=(); R_NAME=(); R_NODE=(); R_VERDICT=(); R_DETAIL=()
record() {  # record ID NAME NODE PASS|FAIL DETAIL
    R_ID+=("$1"); R_NAME+=("$2"); R_NODE+=("$3"); R_VERDICT+=("$4"); R_DETAIL+=("$5")
    log "check $1 $2 ($3): $4 $5"
}
record_output() {  # record ID NAME NODE FILE: the verdict is the file's last line, "PASS ..." or "FAIL ..."
    local line
    line="$(tail -n 1 "$4" 2>/dev/null)"
    case "$line" in
        PASS\ *) record "$1" "$2" "$3" PASS "${line#PASS }" ;;
        FAIL\ *) record "$1" "$2" "$3" FAIL "${line#FAIL }" ;;
        *) record "$1" "$2" "$3" FAIL "the check did not run to the end: $(tail -n 3 "$4" 2>/dev/null | tr '\n' ' ')" ;;
    esac
}

print_table() {
    local i id failed=0
    echo
    echo "== 3-node scenario: aitbc1 (${ADDR[aitbc1]}), aitbc (${ADDR[aitbc]}), gitea-runner (${ADDR[gitea-runner]}) =="
    printf '%-3s %-40s %-13s %-6s %s\n' "#" "check" "from" "result" "detail"
    printf '%-3s %-40s %-13s %-6s %s\n' "--" "-----" "----" "------" "------"
    for id in 1 2 3 4 5 6; do  # in the checks' order, whichever order they ran in
        for i in "${!R_ID[@]}"; do
            [[ "${R_ID[$i]}" == "$id" ]] || continue
            printf '%-3s %-40s %-13s %-6s %s\n' "${R_ID[$i]}" "${R_NAME[$i]}" "${R_NODE[$i]}" "${R_VERDICT[$i]}" "${R_DETAIL[$i]}"
            [[ "${R_VERDICT[$i]}" == PASS ]] || failed=$((failed + 1))
        done
    done
    echo
    printf 'timings:'
    for i in "${!PHASE_NAMES[@]}"; do printf ' %s %ss,' "${PHASE_NAMES[$i]}" "${PHASE_SECS[$i]}"; done
    printf ' total %ss\n' "$(elapsed)"
    if ((failed)); then echo "RESULT: FAIL ($failed of ${#R_ID[@]} checks failed)"; else echo "RESULT: PASS (${#R_ID[@]} checks)"; fi
}

all_passed() {
    local v
    for v in "${R_VERDICT[@]}"; do [[ "$v" == PASS ]] || return 1; done
    [[ ${#R_VERDICT[@]} -gt 0 ]]
}

# -- namespaces ---------------------------------------------------------------------------------------

ns_exists() { ip netns list | awk '{print $1}' | grep -qx -- "$1"; }

namespace_pids() {  # every process whose network namespace is one of ours (or of those named)
    local ns list=("$@")
    ((${#list[@]})) || list=("${HOSTS[@]}" "$BRIDGE_NS")
    for ns in "${list[@]}"; do ns_exists "$ns" && ip netns pids "$ns" 2>/dev/null; done
}

term_and_wait() {  # term_and_wait TENTHS NS...: SIGTERM every process in NS..., wait until gone (at most TENTHS/10 s)
    local tenths=$1 pids i
    shift
    pids="$(namespace_pids "$@" | tr '\n' ' ')"
    [[ -n "${pids// }" ]] || return 0
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null
    for ((i = 0; i < tenths; i++)); do
        [[ -n "$(namespace_pids "$@")" ]] || return 0
        sleep 0.1
    done
}

kill_namespace_processes() {
    local pids i
    # The providers first, while the broker is there for them to leave cleanly (without it, each
    # of their unsubscribes waits 10 s for an answer), then the servers and the coordinator.
    term_and_wait 30 aitbc gitea-runner
    term_and_wait 30 aitbc1 aitbc gitea-runner "$BRIDGE_NS"
    pids="$(namespace_pids | tr '\n' ' ')"
    [[ -n "${pids// }" ]] || return 0
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null
    for i in $(seq 1 50); do
        pids="$(namespace_pids | tr '\n' ' ')"
        [[ -n "${pids// }" ]] || return 0
        sleep 0.1
    done
    echo "warning: processes still in our namespaces after SIGKILL: $pids" >&2
}

teardown() {  # everything a run (this one or an interrupted earlier one) made
    local ns dir=${1:-}
    kill_namespace_processes
    for ns in "${HOSTS[@]}" "$BRIDGE_NS"; do ns_exists "$ns" && ip netns del "$ns"; done
    if [[ -n "$dir" && -d "$dir" && "$(basename "$dir")" == aitbc-multinode.* ]]; then rm -rf -- "$dir"; fi
    rm -f "$STATE_FILE"
}

previous_run_dir() { [[ -f "$STATE_FILE" ]] && sed -n 's/^RUN_DIR=//p' "$STATE_FILE"; }

clean_leftovers() {
    local ns ours=0 foreign=()
    [[ -f "$STATE_FILE" ]] && ours=1
    for ns in "${HOSTS[@]}" "$BRIDGE_NS"; do
        ns_exists "$ns" && ((ours == 0)) && foreign+=("$ns")
    done
    if ((${#foreign[@]})); then
        echo "error: network namespace(s) ${foreign[*]} exist but were not made by this script (no $STATE_FILE)." >&2
        echo "       remove them first (ip netns del NAME) if they are not in use." >&2
        exit 2
    fi
    if ((ours)); then
        log "removing what an earlier run left (namespaces, processes, $(previous_run_dir))"
        teardown "$(previous_run_dir)"
    fi
}

make_hosts() {
    local host i=0
    ip netns add "$BRIDGE_NS" || return 1
    ip -n "$BRIDGE_NS" link add br0 type bridge || return 1
    ip -n "$BRIDGE_NS" link set br0 up || return 1
    for host in "${HOSTS[@]}"; do
        ip netns add "$host" || return 1
        # One veth pair, created straight into the two namespaces: nothing appears in the root namespace.
        ip link add eth0 netns "$host" type veth peer name "veth$i" netns "$BRIDGE_NS" || return 1
        ip -n "$BRIDGE_NS" link set "veth$i" master br0 up || return 1
        ip -n "$host" addr add "${ADDR[$host]}/$PREFIX_LEN" dev eth0 || return 1
        ip -n "$host" link set eth0 up || return 1
        ip -n "$host" link set lo up || return 1
        i=$((i + 1))
    done
}

# Run a command on a host: its network namespace, its own AITBC_HOME, nothing inherited that names a server.
# (9>&-: the servers it starts must not hold this run's lock.)
on() {
    local host=$1; shift
    ip netns exec "$host" env -u AITBC_WALLET_PASSWORD -u AITBC_RPC_URL -u AITBC_IPFS_API \
        AITBC_HOME="$RUN/$host/home" PYTHONUNBUFFERED=1 "$@" 9>&-
}
aitbc() { local host=$1; shift; on "$host" "$PY" -m aitbc_cli.app "$@"; }
checks() { local host=$1; shift; on "$host" "$PY" "$CHECKS_PY" "$@"; }
# jget FILE EXPR: EXPR evaluated on the JSON in FILE (a JSON document, or the last line of a CLI's --json output)
jget() { "$PY" "$CHECKS_PY" jget "$@"; }

# Long steps run in the background and are waited for, so INT/TERM stop the script at once.
wait_for() { "$@" & wait $!; }

# -- the way out ---------------------------------------------------------------------------------------

INTERRUPTED=0
RUN=""
on_exit() {
    local rc=$?
    trap - EXIT INT TERM
    if ((KEEP)) && ((INTERRUPTED == 0)) && ((DOWN == 0)); then
        echo
        echo "--keep: the hosts are still up. Look around with, e.g.:"
        echo "  ip netns exec aitbc1 ss -ltnp"
        echo "  ip netns exec gitea-runner env AITBC_HOME=$RUN/gitea-runner/home $PY -m aitbc_cli.app devnet status"
        echo "  less $RUN/aitbc1/home/trainings/*/coordinator.log"
        echo "Tear everything down with: $0 --down"
        exit "$rc"
    fi
    if [[ -n "$RUN" ]]; then
        local t=$EPOCHREALTIME jobs
        # This shell's background jobs first (subshells in the root namespace that would go on to
        # start the next step), then everything in the namespaces.
        jobs="$(jobs -p)"
        # shellcheck disable=SC2086
        [[ -z "$jobs" ]] || kill -TERM $jobs 2>/dev/null
        teardown "$RUN"
        log "cleaned up: namespaces, processes and $RUN removed ($(awk -v a="$t" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}')s)"
    fi
    exit "$rc"
}
trap on_exit EXIT
trap 'INTERRUPTED=1; echo "interrupted: cleaning up" >&2; exit 130' INT
trap 'INTERRUPTED=1; echo "terminated: cleaning up" >&2; exit 143' TERM

if ((DOWN)); then
    clean_leftovers
    echo "nothing of an earlier run is left"
    exit 0
fi

clean_leftovers
RUN="$(mktemp -d "${AITBC_MULTINODE_TMP:-${TMPDIR:-/tmp}}/aitbc-multinode.XXXXXX")" || exit 2
printf 'RUN_DIR=%s\n' "$RUN" >"$STATE_FILE"
log "run directory $RUN"
mkdir -p "$RUN/shared" "$RUN/out"
for host in "${HOSTS[@]}"; do mkdir -p "$RUN/$host/home"; done

FATAL=""
fatal() {  # fatal MESSAGE [LOG...]: a step the checks need failed; show its logs, skip what depends on it
    FATAL="$1"
    log "FAILED: $1"
    shift
    local f
    for f in "$@"; do [[ -f "$f" ]] && { echo "--- last lines of $f" >&2; tail -n 25 "$f" >&2; }; done
}

# ===================================================================================================
# Set-up: hosts, servers on aitbc1, providers on aitbc and gitea-runner
# ===================================================================================================

if ! make_hosts; then fatal "could not create the namespaces"; fi
phase_done "namespaces"

OUT="$RUN/out"
prepare_training() {  # aitbc1: init and upload-data (check 3's first steps)
    aitbc aitbc1 distributed-training init --wallet dev --model-type mlp --target-workers "$WORKERS" \
        --rounds "$ROUNDS" --epochs "$EPOCHS" --spares "$SPARES" --heartbeat-timeout "$HEARTBEAT_TIMEOUT" \
        --json >"$OUT/init.json" 2>"$OUT/init.err" || return 1
    aitbc aitbc1 distributed-training upload-data --training-id "$(jget "$OUT/init.json" 'd["training_id"]')" \
        --data-path digits --json >"$OUT/upload.json" 2>"$OUT/upload.err"
}
if [[ -z "$FATAL" ]]; then
    log "aitbc1: devnet up --providers 0 --ipfs daemon --host ${ADDR[aitbc1]}"
    if wait_for aitbc aitbc1 devnet up --providers 0 --ipfs daemon --host "${ADDR[aitbc1]}" --json \
            >"$OUT/devnet-up.json" 2>"$OUT/devnet-up.err"; then
        # The only thing the other hosts get from aitbc1: its profile (addresses, chain id, escrow).
        cp "$RUN/aitbc1/home/profile.json" "$RUN/shared/profile.json"
        RPC="$(jget "$OUT/devnet-up.json" 'd["chain"]["rpc_url"]')"
        IPFS_API="$(jget "$OUT/devnet-up.json" 'd["store"]["api"]')"
        BROKER_PORT="$(jget "$OUT/devnet-up.json" 'd["bus"]["port"]')"
        SERVICE_PORTS="$(jget "$OUT/devnet-up.json" '" ".join(str(s["port"]) for s in d["services"])')"
        log "aitbc1 serves: broker ${ADDR[aitbc1]}:$BROKER_PORT, chain $RPC, IPFS $IPFS_API"
        # The training's first two steps need only the servers: they run while the providers start.
        prepare_training &
        PREPARE=$!
    else
        fatal "devnet up on aitbc1 failed" "$OUT/devnet-up.err"
    fi
fi
phase_done "servers"

declare -A WALLET_ADDR=()
declare -A PROVIDER_NODE=([provider-aitbc-0]=aitbc [provider-aitbc-1]=aitbc [provider-gitea-runner-0]=gitea-runner)
if [[ -z "$FATAL" ]]; then
    log "aitbc, gitea-runner: devnet join (profile from aitbc1) and a wallet per provider"
    aitbc aitbc devnet join --profile "$RUN/shared/profile.json" --wallet provider-aitbc-0 --wallet provider-aitbc-1 \
        --json >"$OUT/join-aitbc.json" 2>"$OUT/join-aitbc.err" &
    j1=$!
    aitbc gitea-runner devnet join --profile "$RUN/shared/profile.json" --wallet provider-gitea-runner-0 \
        --json >"$OUT/join-gitea-runner.json" 2>"$OUT/join-gitea-runner.err" &
    j2=$!
    wait $j1; r1=$?
    wait $j2; r2=$?
    if ((r1 || r2)); then
        fatal "devnet join failed" "$OUT/join-aitbc.err" "$OUT/join-gitea-runner.err"
    else
        for wallet in "${!PROVIDER_NODE[@]}"; do
            WALLET_ADDR[$wallet]="$(jget "$OUT/join-${PROVIDER_NODE[$wallet]}.json" "d['wallets']['$wallet']")"
        done
    fi
fi
if [[ -z "$FATAL" ]]; then
    # The broker admits only accounts its host made: the operator issues one per joined wallet (and
    # the read-only 'observer') and hands the 0600 password files over, as it handed over the profile.
    log "aitbc1: broker accounts for the joined wallets (devnet accounts --export)"
    for node in aitbc gitea-runner; do
        addrs=()
        for wallet in "${!PROVIDER_NODE[@]}"; do
            [[ ${PROVIDER_NODE[$wallet]} == "$node" ]] && addrs+=("${WALLET_ADDR[$wallet]}")
        done
        if ! aitbc aitbc1 devnet accounts "${addrs[@]}" observer --export "$RUN/$node/home/devnet/bus-accounts" \
                --json >"$OUT/accounts-$node.json" 2>"$OUT/accounts-$node.err"; then
            fatal "broker accounts for $node failed" "$OUT/accounts-$node.err"
            break
        fi
    done
fi
if [[ -z "$FATAL" ]]; then
    log "aitbc1: fund the provider wallets from the 'dev' wallet (aitbc wallet send)"
    for wallet in provider-aitbc-0 provider-aitbc-1 provider-gitea-runner-0; do
        if ! AITBC_WALLET_PASSWORD="$(cat "$RUN/aitbc1/home/devnet/wallet-password")" \
                ip netns exec aitbc1 env AITBC_HOME="$RUN/aitbc1/home" "$PY" -m aitbc_cli.app wallet send dev \
                --to "${WALLET_ADDR[$wallet]}" --eth "$FUNDING" --rpc "$RPC" --json \
                >"$OUT/fund-$wallet.json" 2>"$OUT/fund-$wallet.err" 9>&-; then
            fatal "funding $wallet failed" "$OUT/fund-$wallet.err"
            break
        fi
    done
fi
if [[ -z "$FATAL" ]]; then
    for wallet in provider-aitbc-0 provider-aitbc-1 provider-gitea-runner-0; do
        node=${PROVIDER_NODE[$wallet]}
        log "$node: provider start --wallet $wallet --price ${PRICE[$wallet]} --stake $STAKE"
        # One thread each: the three "hosts" share this machine's cores (a real host uses all of its own).
        aitbc "$node" provider start --wallet "$wallet" --price "${PRICE[$wallet]}" --stake "$STAKE" --gpu none \
            --threads 1 >"$RUN/$node/$wallet.log" 2>&1 &
    done
fi
phase_done "providers"

# ===================================================================================================
# 1. Cross-node health      2. One chain
# ===================================================================================================

if [[ -z "$FATAL" ]]; then
    log "check 1: every node probes the broker, the chain RPC and the IPFS API"
    probes=()
    for host in "${HOSTS[@]}"; do
        checks "$host" probe --profile "$RUN/shared/profile.json" --node "$host" --address "${ADDR[$host]}" \
            --out "$OUT/probe-$host.json" >"$OUT/probe-$host.txt" 2>&1 &
        probes+=($!)
    done
    wait "${probes[@]}"
    for host in "${HOSTS[@]}"; do
        record_output "1" "health: broker, chain RPC, IPFS API" "$host" "$OUT/probe-$host.txt"
    done
    expect=()
    for wallet in provider-aitbc-0 provider-aitbc-1 provider-gitea-runner-0; do
        expect+=(--expect "${PROVIDER_NODE[$wallet]}:${WALLET_ADDR[$wallet]}")
    done
    wait_for checks aitbc1 heartbeats --profile "$RUN/shared/profile.json" "${expect[@]}" --timeout 90 \
        --out "$OUT/heartbeats.json" >"$OUT/heartbeats.txt" 2>&1
    record_output "1" "health: providers present" "aitbc1" "$OUT/heartbeats.txt"
    # shellcheck disable=SC2086
    checks aitbc1 sockets --address "${ADDR[aitbc1]}" --ports $SERVICE_PORTS --broker-port "$BROKER_PORT" \
        --peers "${ADDR[aitbc]}" "${ADDR[gitea-runner]}" --out "$OUT/sockets.json" >"$OUT/sockets.txt" 2>&1
    record_output "1" "health: no loopback, peers connected" "aitbc1" "$OUT/sockets.txt"
    phase_done "health"

    log "check 2: the chain head from every node"
    checks gitea-runner chain-heads "$OUT"/probe-{aitbc1,aitbc,gitea-runner}.json >"$OUT/chain.txt" 2>&1
    record_output "2" "one chain: same head on every node" "all" "$OUT/chain.txt"
fi

# ===================================================================================================
# 3. A full training from aitbc1      4. Recovery from kill -9 of a provider on aitbc
# ===================================================================================================

TID=""
KILLED=""
if [[ -z "$FATAL" ]]; then
    log "check 3: the step-by-step CLI on aitbc1 ($WORKERS workers + $SPARES spare, $ROUNDS rounds)"
    if ! wait "$PREPARE"; then
        fatal "distributed-training init or upload-data failed" "$OUT/init.err" "$OUT/upload.err"
    else
        TID="$(jget "$OUT/init.json" 'd["training_id"]')"
        COORDINATOR="$(jget "$OUT/init.json" 'd["coordinator"]')"
        log "training $TID initialised, dataset $(jget "$OUT/upload.json" 'd["dataset_cid"]') uploaded (while the providers started)"
    fi
fi
if [[ -z "$FATAL" ]]; then
    # The balances the payment check compares with, read from outside before the escrow is funded
    # (the providers are registered by now: they advertise only after bonding).
    node_args=()
    for wallet in "${!WALLET_ADDR[@]}"; do node_args+=(--address "${WALLET_ADDR[$wallet]}"); done
    checks gitea-runner balances --profile "$RUN/shared/profile.json" --address "$COORDINATOR" "${node_args[@]}" \
        --out "$OUT/balances-before.json" >"$OUT/balances-before.txt" 2>&1 &
    BALANCES=$!
    if ! wait_for aitbc aitbc1 distributed-training discover-workers --training-id "$TID" --min-gpu cpu \
            --required-workers "$WORKERS" --json >"$OUT/hired.json" 2>"$OUT/hired.err"; then
        fatal "discover-workers failed" "$OUT/hired.err"
    elif ! wait "$BALANCES"; then
        fatal "reading the balances before the training failed" "$OUT/balances-before.txt"
    fi
fi
if [[ -z "$FATAL" ]]; then
    # The victim: a provider on aitbc hired as a worker (not the spare).
    for wallet in provider-aitbc-0 provider-aitbc-1; do
        role="$(jget "$OUT/hired.json" "next((w['role'] for w in d['workers'] if w['worker_id'].lower() == '${WALLET_ADDR[$wallet]}'.lower()), 'none')")"
        log "hired ${WALLET_ADDR[$wallet]} ($wallet on aitbc) as $role"
        if [[ "$role" == worker && -z "$KILLED" ]]; then KILLED=$wallet; fi
    done
    role="$(jget "$OUT/hired.json" "next((w['role'] for w in d['workers'] if w['worker_id'].lower() == '${WALLET_ADDR[provider-gitea-runner-0]}'.lower()), 'none')")"
    log "hired ${WALLET_ADDR[provider-gitea-runner-0]} (provider-gitea-runner-0 on gitea-runner) as $role"
    [[ -n "$KILLED" ]] || fatal "no provider on aitbc was hired as a worker: $(cat "$OUT/hired.json")"
fi
if [[ -z "$FATAL" ]]; then
    # On aitbc, a watcher follows the training's progress over the broker and kill -9s the victim's
    # daemon the moment it runs a round-2 job: round 1 is done, and the training is mid-way.
    checks aitbc kill-on-progress --home "$RUN/aitbc/home" --address "${WALLET_ADDR[$KILLED]}" --training-id "$TID" \
        --round 2 --ready "$OUT/killer.ready" >"$OUT/kill.json" 2>"$OUT/kill.err" &
    WATCH=$!
    for _ in $(seq 1 600); do [[ -f "$OUT/killer.ready" ]] || ! kill -0 "$WATCH" 2>/dev/null && break; sleep 0.1; done
    [[ -f "$OUT/killer.ready" ]] || fatal "the watcher on aitbc did not start" "$OUT/kill.err"
fi
if [[ -z "$FATAL" ]]; then
    if ! wait_for aitbc aitbc1 distributed-training distribute --training-id "$TID" --strategy data-parallel --yes --json \
            >"$OUT/distribute.json" 2>"$OUT/distribute.err"; then
        fatal "distribute failed" "$OUT/distribute.err"
    fi
fi
if [[ -z "$FATAL" ]]; then
    # A wedged training must not hang the script: the monitor gets three minutes.
    on aitbc1 timeout 180 "$PY" -m aitbc_cli.app distributed-training monitor --training-id "$TID" --follow \
        --interval 0.5 --json >"$OUT/monitor.jsonl" 2>"$OUT/monitor.err" &
    MONITOR=$!
    wait "$MONITOR"
    phase_done "training"
    if kill -0 "$WATCH" 2>/dev/null; then  # the training ended, and the watcher is still waiting
        kill -TERM "$WATCH" 2>/dev/null
        echo "the training ended before $KILLED ran a round-2 job" >>"$OUT/kill.err"
    fi
    wait "$WATCH"; watched=$?
    if ((watched == 0)); then
        log "check 4: $KILLED's daemon on aitbc was killed with SIGKILL: $(cat "$OUT/kill.json")"
    else
        record "4" "recovery: kill -9 mid-training" "aitbc" FAIL "the kill did not happen: $(tail -n 3 "$OUT/kill.err" | tr '\n' ' ')"
    fi
    aitbc aitbc1 distributed-training audit --training-id "$TID" --json >"$OUT/audit.json" 2>"$OUT/audit.err" &
    reads=($!)
    aitbc aitbc1 distributed-training payments --training-id "$TID" --json >"$OUT/payments.json" 2>"$OUT/payments.err" &
    reads+=($!)
    # The training's results as the coordinator recorded them, handed to gitea-runner for check 5 and 6.
    checks aitbc1 export --home "$RUN/aitbc1/home" --training-id "$TID" --out "$RUN/shared/results.json" \
        >"$OUT/export.txt" 2>&1 &
    reads+=($!)
    wait "${reads[@]}"
    [[ -s "$RUN/shared/results.json" ]] || fatal "exporting the training's results failed" "$OUT/export.txt"

    node_args=()
    for wallet in "${!WALLET_ADDR[@]}"; do node_args+=(--node "${PROVIDER_NODE[$wallet]}:${WALLET_ADDR[$wallet]}"); done
    checks aitbc1 training --monitor "$OUT/monitor.jsonl" --rounds "$ROUNDS" --target "$TARGET_ACCURACY" \
        --hired "$OUT/hired.json" "${node_args[@]}" --worker-nodes aitbc gitea-runner >"$OUT/training.txt" 2>&1
    record_output "3" "training: step-by-step CLI from aitbc1" "aitbc1" "$OUT/training.txt"
    if ((watched == 0)); then
        checks aitbc1 recovery --monitor "$OUT/monitor.jsonl" --audit "$OUT/audit.json" --payments "$OUT/payments.json" \
            --hired "$OUT/hired.json" --killed "${WALLET_ADDR[$KILLED]}" --kill "$OUT/kill.json" "${node_args[@]}" \
            >"$OUT/recovery.txt" 2>&1
        record_output "4" "recovery: kill -9 mid-training" "aitbc1" "$OUT/recovery.txt"
    fi
fi

# ===================================================================================================
# 5. Payments checked from outside      6. Data everywhere
# ===================================================================================================

if [[ -z "$FATAL" ]]; then
    log "check 5: gitea-runner reads the escrow's events and the balances from the chain"
    checks gitea-runner payments --profile "$RUN/shared/profile.json" --results "$RUN/shared/results.json" \
        --before "$OUT/balances-before.json" --killed "${WALLET_ADDR[$KILLED]}" --out "$OUT/payments-check.json" \
        >"$OUT/payments-check.txt" 2>&1
    record_output "5" "payments: chain vs. results" "gitea-runner" "$OUT/payments-check.txt"

    log "check 6: gitea-runner fetches every shard and the model by CID from aitbc1's IPFS API"
    checks gitea-runner data --results "$RUN/shared/results.json" --api "$IPFS_API" --out "$OUT/data.json" \
        >"$OUT/data.txt" 2>&1
    record_output "6" "data: shards and model by CID" "gitea-runner" "$OUT/data.txt"
    if [[ "${R_VERDICT[-1]}" == PASS ]]; then  # and once more through the CLI, byte for byte
        model="$(jget "$RUN/shared/results.json" 'd["model_cid"]')"
        want="$(jget "$OUT/data.json" 'd["model"]["sha256"]')"
        got="$(aitbc gitea-runner ipfs cat "$model" --api "$IPFS_API" 2>"$OUT/ipfs-cat.err" | sha256sum | cut -d' ' -f1)"
        if [[ "$got" != "$want" ]]; then
            R_VERDICT[-1]=FAIL
            R_DETAIL[-1]="aitbc ipfs cat $model gave sha256 $got, expected $want: $(tail -n 2 "$OUT/ipfs-cat.err" | tr '\n' ' ')"
        else
            R_DETAIL[-1]="${R_DETAIL[-1]}; 'aitbc ipfs cat' agrees"
        fi
    fi
    phase_done "checks"
fi

# Anything not reached because a step failed is a failed check, with the reason.
declare -A SEEN=()
for i in "${!R_ID[@]}"; do SEEN[${R_ID[$i]}]=1; done
declare -A NAMES=([1]="health" [2]="one chain" [3]="training: step-by-step CLI from aitbc1"
                  [4]="recovery: kill -9 mid-training" [5]="payments: chain vs. results" [6]="data: shards and model by CID")
for id in 1 2 3 4 5 6; do
    [[ -n "${SEEN[$id]:-}" ]] || record "$id" "${NAMES[$id]}" "-" FAIL "not run: ${FATAL:-an earlier step failed}"
done

if ! all_passed; then
    echo >&2
    echo "=== logs (last lines) ===" >&2
    for f in "$RUN"/aitbc1/home/trainings/*/coordinator.log "$RUN"/*/provider-*.log "$RUN"/aitbc1/home/devnet/logs/*.log; do
        [[ -f "$f" ]] && { echo "--- $f" >&2; grep -v ' httpx: ' "$f" | tail -n 15 >&2; }
    done
fi
print_table
all_passed
