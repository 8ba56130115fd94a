#!/usr/bin/env python3
"""The checks of ``44_comprehensive_multi_node_scenario.sh``, one sub-command each.

Each sub-command runs inside one host's network namespace (``ip netns exec NS ...``) and
talks to the others over the namespaces' network only. A check prints its evidence as
JSON (to ``--out`` when given) and, as its last line on stdout, ``PASS <detail>`` or
``FAIL <detail>``; it exits 0 on PASS and 1 on FAIL, so the bash script can both read the
verdict and show the detail in its table. Helpers that are not checks (``export``,
``balances``, ``kill-on-progress``) print one JSON line and exit 0, or print the error and exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import socket
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

WEI_PER_ETH = 10**18


class CheckFailed(Exception):
    """A check's verdict: FAIL with this detail."""


def eth(wei: int) -> str:
    whole, frac = divmod(int(wei), WEI_PER_ETH)
    return f"{whole}.{frac:018d}".rstrip("0").rstrip(".") if frac else str(whole)


def short(address: str) -> str:
    return address[:10]


def load_json(path: str | Path) -> Any:
    """A JSON file, or the last JSON line of a CLI's output (``monitor --follow --json`` prints many)."""
    text = Path(path).read_text().strip()
    try:
        return json.loads(text)
    except ValueError:
        return json.loads(text.splitlines()[-1])


def load_profile_file(path: str | Path) -> Any:
    from aitbc_agent_sdk.profile import Profile
    return Profile.model_validate_json(Path(path).read_text())


def write_out(args: argparse.Namespace, data: Any) -> None:
    if getattr(args, "out", None):
        Path(args.out).write_text(json.dumps(data, indent=1, sort_keys=True, default=str))


def labels(pairs: list[str] | None) -> dict[str, str]:
    """``node:address`` arguments as {address (lowercase): node}."""
    found = {}
    for pair in pairs or []:
        node, _, address = pair.rpartition(":")
        found[address.lower()] = node
    return found


def local_address_to(host: str, port: int, timeout: float = 3.0) -> str:
    """Connect to host:port and return the local address the kernel picked (which interface we used)."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        return str(sock.getsockname()[0])


# -- 1. health ---------------------------------------------------------------------------------------

async def probe(args: argparse.Namespace) -> str:
    """From this node: the broker (MQTT CONNECT), the chain RPC and the IPFS API, each over the network."""
    import httpx

    from aitbc_agent_sdk.chain import connect_rpc
    from aitbc_agent_sdk.messaging._settings import connect_bus

    profile = load_profile_file(args.profile)
    result: dict[str, Any] = {"node": args.node, "address": args.address}
    problems = []

    # broker
    try:
        result["broker_from"] = local_address_to(profile.bus.host, profile.bus.port)
        async with connect_bus(profile.bus, f"probe-{args.node}-{time.time_ns()}",
                               persistent=False, reconnect=False, timeout=5.0):
            pass
        result["broker"] = f"{profile.bus.host}:{profile.bus.port}"
    except Exception as exc:  # noqa: BLE001 - any failure is this check's verdict
        problems.append(f"broker {profile.bus.host}:{profile.bus.port}: {exc}")

    # chain
    rpc = urlparse(profile.chain.rpc_url)
    try:
        result["chain_from"] = local_address_to(rpc.hostname, rpc.port)
        w3 = await connect_rpc(profile.chain.rpc_url, timeout=5.0)
        try:
            chain_id = int(await w3.eth.chain_id)
            code = await w3.eth.get_code(profile.chain.escrow)
            latest = await w3.eth.get_block("latest")
            number = int(latest["number"])
            hashes = {}
            for n in range(max(0, number - 7), number + 1):
                hashes[str(n)] = (await w3.eth.get_block(n))["hash"].to_0x_hex()
        finally:
            await w3.provider.disconnect()
        result.update(chain_id=chain_id, head_number=number, head_hash=latest["hash"].to_0x_hex(),
                      hashes=hashes, escrow_code=len(code))
        if chain_id != profile.chain.chain_id:
            problems.append(f"chain id {chain_id} != {profile.chain.chain_id}")
        if not code:
            problems.append(f"no escrow code at {profile.chain.escrow}")
    except Exception as exc:  # noqa: BLE001
        problems.append(f"chain {profile.chain.rpc_url}: {exc}")

    # IPFS
    api = urlparse(profile.store.api or "")
    try:
        result["ipfs_from"] = local_address_to(api.hostname, api.port)
        async with httpx.AsyncClient(base_url=profile.store.api, timeout=10.0) as http:
            reply = await http.post("/api/v0/id")
            reply.raise_for_status()
            result["ipfs_id"] = reply.json()["ID"]
    except Exception as exc:  # noqa: BLE001
        problems.append(f"ipfs {profile.store.api}: {exc}")

    wrong = {k: v for k, v in result.items() if k.endswith("_from") and v != args.address}
    if wrong:
        problems.append(f"not over this node's network ({args.address}): {wrong}")
    result["problems"] = problems
    write_out(args, result)
    if problems:
        raise CheckFailed("; ".join(problems))
    return (f"from {args.address}: broker {result['broker']}, chain id {result['chain_id']} "
            f"(block {result['head_number']}), IPFS {str(result['ipfs_id'])[:12]}…")


async def heartbeats(args: argparse.Namespace) -> str:
    """On the coordinator's host: every expected provider is present, its signed offer retained on the broker.
    (An idle provider does not heartbeat; its presence is its offer, which the broker clears if it dies.)"""
    from eth_account import Account

    from aitbc_agent_sdk.market import collect_offers
    from aitbc_agent_sdk.messaging import SignedChannel
    from aitbc_agent_sdk.messaging._settings import connect_bus

    profile = load_profile_file(args.profile)
    expected = labels(args.expect)
    offers: set[str] = set()
    async with connect_bus(profile.bus, f"coordinator-watch-{time.time_ns()}",
                           persistent=False, reconnect=False) as bus:
        channel = SignedChannel(bus, Account.create())  # collect_offers keeps offers signed by their provider
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(args.timeout):  # waits for slow starters
                while not set(expected) <= offers:
                    offers = {o.provider.lower() for o in await collect_offers(channel, timeout=2.0)}
    no_offer = [f"{node} {short(a)}" for a, node in expected.items() if a not in offers]
    write_out(args, {"offers": sorted(offers), "expected": expected})
    if no_offer:
        raise CheckFailed(f"no offer from {no_offer}")
    by_node: dict[str, int] = {}
    for node in expected.values():
        by_node[node] = by_node.get(node, 0) + 1
    return (f"{len(expected)}/{len(expected)} providers present (signed offers) seen from aitbc1 ("
            + ", ".join(f"{n} on {node}" for node, n in by_node.items()) + ")")


def _proc_sockets() -> list[tuple[str, int, str, int, str]]:
    """(local ip, local port, remote ip, remote port, state) of this namespace's TCP sockets."""
    found = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(name) as table:
            next(table)
            for line in table:
                fields = line.split()
                (lip, lport), (rip, rport) = (f.split(":") for f in fields[1:3])
                found.append((_ip(lip), int(lport, 16), _ip(rip), int(rport, 16), fields[3]))
    return found


def _ip(hexed: str) -> str:
    raw = bytes.fromhex(hexed)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))  # /proc prints each 32-bit word little-endian
    return socket.inet_ntop(socket.AF_INET6, words)


def sockets(args: argparse.Namespace) -> str:
    """On aitbc1: every listening socket is on its own address, and the broker has clients from each peer."""
    listen = sorted({(ip, port) for ip, port, _, _, state in _proc_sockets() if state == "0A"})
    elsewhere = [f"{ip}:{port}" for ip, port in listen if ip != args.address]
    missing = [p for p in args.ports if (args.address, p) not in listen]
    clients: dict[str, int] = {}
    for ip, port, rip, _, state in _proc_sockets():
        if state == "01" and ip == args.address and port == args.broker_port:
            clients[rip] = clients.get(rip, 0) + 1
    no_clients = [p for p in args.peers if p not in clients]
    write_out(args, {"listening": listen, "broker_clients": clients})
    problems = []
    if elsewhere:
        problems.append(f"listening off {args.address}: {elsewhere}")
    if missing:
        problems.append(f"nothing listening on {args.address} port(s) {missing}")
    if no_clients:
        problems.append(f"no broker connection from {no_clients}")
    if problems:
        raise CheckFailed("; ".join(problems))
    return (f"{len(listen)} listening sockets, all on {args.address} (none on 127.0.0.1 or 0.0.0.0); "
            f"broker clients from " + ", ".join(f"{ip} ({n})" for ip, n in sorted(clients.items())))


# -- 2. one chain -----------------------------------------------------------------------------------

def chain_heads(args: argparse.Namespace) -> str:
    probes = [load_json(p) for p in args.probes]
    if any("head_number" not in p for p in probes):
        raise CheckFailed(f"no chain head from {[p['node'] for p in probes if 'head_number' not in p]}")
    heads = {p["node"]: (p["head_number"], p["head_hash"]) for p in probes}
    if len(set(heads.values())) == 1:
        number, block_hash = next(iter(heads.values()))
        return f"block {number} {block_hash[:18]}… on all {len(heads)} nodes"
    # A block was mined between two probes: compare at the lowest head every node saw.
    common = min(p["head_number"] for p in probes)
    at = {p["node"]: p["hashes"].get(str(common)) for p in probes}
    if len(set(at.values())) == 1 and None not in at.values():
        return f"block {common} {next(iter(at.values()))[:18]}… on all {len(at)} nodes (heads {heads})"
    raise CheckFailed(f"the nodes disagree: {heads}")


# -- 3/4. the training ------------------------------------------------------------------------------

async def kill_on_progress(args: argparse.Namespace) -> dict[str, Any]:
    """On the provider's own host: SIGKILL its daemon as soon as it reports a ``--round`` job running.

    The watcher follows the training's signed progress messages over the broker (as any agent
    could), so the kill lands while the training runs and after the earlier rounds are done:
    a job of round ``--round`` only starts once round ``--round`` - 1 has been aggregated.
    """
    import os
    import signal

    from eth_account import Account

    from aitbc_agent_sdk.messaging import SignedChannel, topics
    from aitbc_agent_sdk.messaging._settings import connect_bus
    from aitbc_agent_sdk.records import Progress
    from aitbc_agent_sdk.profile import load_profile

    home = Path(args.home)
    status = home / "providers" / args.address / "status.json"
    pid = int(json.loads(status.read_text())["pid"])
    if os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net"):
        raise RuntimeError(f"pid {pid} from {status} is not a process of this host")
    profile = load_profile(home)
    target = args.address.lower()
    async with connect_bus(profile.bus, f"killer-{time.time_ns()}", persistent=False) as bus:
        channel = SignedChannel(bus, Account.create())
        async with channel.subscribe(topics.all_progress(args.training_id), Progress) as stream:
            Path(args.ready).write_text("subscribed\n")
            async with asyncio.timeout(args.timeout):
                async for item in stream:
                    seen = item.message
                    if (item.sender.lower() == target and seen.worker_id.lower() == target
                            and seen.round >= args.round and seen.status == "running"):
                        os.kill(pid, signal.SIGKILL)  # kill -9
                        killed_at = time.time()
                        break
    for _ in range(100):  # reaped by its parent (the shell), or at least gone from /proc
        if not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z":
            break
        await asyncio.sleep(0.05)
    return {"pid": pid, "round": seen.round, "epoch": seen.epoch, "job_id": seen.job_id, "killed_at": killed_at}


def training(args: argparse.Namespace) -> str:
    snap = load_json(args.monitor)
    metrics = snap.get("round_metrics") or []
    rounds = [m["round"] for m in metrics]
    problems = []
    if snap.get("phase") != "complete":
        problems.append(f"phase {snap.get('phase')!r}")
    if rounds != list(range(1, args.rounds + 1)):
        problems.append(f"rounds {rounds}, expected 1..{args.rounds}")
    accuracy = float(metrics[-1]["accuracy"]) if metrics else 0.0
    if accuracy < args.target:
        problems.append(f"final accuracy {accuracy:.4f} < {args.target}")
    nodes = labels(args.node)
    hired = load_json(args.hired)["workers"]
    worker_nodes = sorted({nodes.get(w["worker_id"].lower(), "?") for w in hired if w["role"] == "worker"})
    if worker_nodes != sorted(args.worker_nodes):
        problems.append(f"workers hired on {worker_nodes}, expected on {sorted(args.worker_nodes)}")
    if problems:
        raise CheckFailed("; ".join(problems))
    curve = " ".join(f"{m['accuracy']:.3f}" for m in metrics)
    return (f"complete, {len(rounds)} rounds, accuracy {accuracy:.4f} >= {args.target} (per round: {curve}); "
            f"workers on {' and '.join(worker_nodes)}")


DETECTION_EVENTS = ("worker_failed", "straggler_detected")


def recovery(args: argparse.Namespace) -> str:
    snap, audit, pays = load_json(args.monitor), load_json(args.audit), load_json(args.payments)
    hired, kill = load_json(args.hired)["workers"], load_json(args.kill)
    killed = args.killed.lower()
    nodes = labels(args.node)
    spares = [w["worker_id"] for w in hired if w["role"] == "spare"]
    problems = []
    if snap.get("phase") != "complete":
        problems.append(f"training ended {snap.get('phase')!r}")
    paid = sum(int(p["amount_wei"]) for p in pays["payments"] if p["worker_id"].lower() == killed)
    if paid:
        problems.append(f"the killed provider was paid {paid} wei")
    if not audit.get("ok"):
        problems.append(f"audit log does not verify (line {audit.get('first_bad_line')}: {audit.get('reason')})")
    entries = audit.get("entries", [])
    settled = [e["ts"] for e in entries if e["event"] == "payment"]
    if settled and kill["killed_at"] >= min(settled):
        problems.append("the kill came after the training was settled, not in the middle of it")
    named = [e for e in entries if str(e["fields"].get("worker", "")).lower() == killed]
    # Whichever saw it first: the silence (no heartbeat, no pong) or the round's straggler deadline.
    detected = [e for e in named if e["event"] in DETECTION_EVENTS]
    replaced = [e for e in named if e["event"] == "worker_replaced"]
    if not detected:
        problems.append(f"no {' or '.join(DETECTION_EVENTS)} event for {short(args.killed)} "
                        f"(its events: {[e['event'] for e in named] or 'none'})")
    if not replaced:
        problems.append(f"no worker_replaced event for {short(args.killed)}")
    replacement = str(replaced[0]["fields"].get("replacement", "")) if replaced else ""
    if replaced and replacement.lower() not in {s.lower() for s in spares}:
        problems.append(f"replaced by {replacement}, not by the spare {spares}")
    if replacement and not any(p["worker_id"].lower() == replacement.lower() for p in pays["payments"]):
        problems.append(f"the spare {short(replacement)} that took over was not paid")
    if problems:
        raise CheckFailed("; ".join(problems))
    first = detected[0]
    how = f"{first['event']} (round {first['fields'].get('round')}"
    how += f", {first['fields']['silent_s']}s silent)" if "silent_s" in first["fields"] else \
        f", {first['ts'] - kill['killed_at']:.1f}s after the kill)"
    where = nodes.get(replacement.lower(), "?")
    return (f"kill -9 of {short(args.killed)} (aitbc) as its round-{kill['round']} job ran: {how}, "
            f"worker_replaced by the spare {short(replacement)} ({where}); "
            f"training complete; killed provider paid 0; audit chain verified ({len(entries)} entries)")


# -- 5. payments, from the chain --------------------------------------------------------------------

async def export(args: argparse.Namespace) -> dict[str, Any]:
    """On the coordinator's host: the training's results, as the coordinator recorded them."""
    from aitbc_agent_sdk.coordinator._training_db import TrainingDatabase

    async with TrainingDatabase(Path(args.home) / "aitbc.db") as db:
        record = await db.training(args.training_id)
        contracts = await db.contracts(args.training_id)
        accepted = await db.checkpoints(args.training_id)
        pays = await db.payments(args.training_id)
        rounds = await db.rounds(args.training_id)
    data = {"training_id": record.training_id, "phase": record.phase.value, "coordinator": record.coordinator,
            "dataset_cid": record.dataset_cid, "manifest_cid": record.manifest_cid, "model_cid": record.model_cid,
            "rounds": record.spec.rounds,
            "contracts": [c.model_dump(mode="json") for c in contracts],
            "accepted": [c.model_dump(mode="json") for c in accepted],
            "payments": [p.model_dump(mode="json") for p in pays],
            "round_metrics": [r.model_dump(mode="json") for r in rounds]}
    Path(args.out).write_text(json.dumps(data, indent=1, sort_keys=True))
    return {"out": args.out, "accepted": len(accepted), "payments": len(pays)}


async def _balances(w3: Any, addresses: list[str], block: int) -> dict[str, dict[str, int]]:
    found = {}
    for address in addresses:
        checksum = w3.to_checksum_address(address)
        found[address.lower()] = {"wei": int(await w3.eth.get_balance(checksum, block)),
                                  "nonce": int(await w3.eth.get_transaction_count(checksum, block))}
    return found


async def balances(args: argparse.Namespace) -> dict[str, Any]:
    """Balances and nonces of ``--address`` at the current head (before the training is funded)."""
    from aitbc_agent_sdk.chain import connect_rpc

    profile = load_profile_file(args.profile)
    w3 = await connect_rpc(profile.chain.rpc_url)
    try:
        block = int(await w3.eth.block_number)
        data = {"block": block, "balances": await _balances(w3, [*args.address, profile.chain.escrow], block)}
    finally:
        await w3.provider.disconnect()
    Path(args.out).write_text(json.dumps(data, indent=1, sort_keys=True))
    return {"block": block, "addresses": len(data["balances"])}


async def payments(args: argparse.Namespace) -> str:
    """From outside: the escrow's events and everyone's balances, checked against the training's results."""
    from eth_utils import keccak

    from aitbc_agent_sdk.chain import EscrowClient, connect_rpc

    profile = load_profile_file(args.profile)
    results, before = load_json(args.results), load_json(args.before)
    tid = results["training_id"]
    killed = args.killed.lower()
    problems: list[str] = []
    w3 = await connect_rpc(profile.chain.rpc_url)
    try:
        escrow = EscrowClient(w3, profile.chain.escrow)
        (key, _), *_ = await escrow.trainings_named(tid, from_block=profile.chain.deployed_block)
        state = await escrow.training(key)
        held = (await escrow.held(key)).amount  # unpaid rests of active slots, redeemable by receipts for a while
        events = await escrow.events(key, from_block=profile.chain.deployed_block)
        head = int(await w3.eth.block_number)
        tracked = sorted(before["balances"])
        after = await _balances(w3, tracked, head)
        fees, sent = await _coordinator_spending(w3, results["coordinator"], before["block"] + 1, head)
        slots = {w: await escrow.slot(key, w) for w in {e.args["worker"] for e in events if e.name == "Released"}}
    finally:
        await w3.provider.disconnect()

    def named(name: str) -> list[Any]:
        return [e for e in events if e.name == name]

    # the totals: deposit = paid + refunded + held, and the events add up to the contract's books
    # Every slot, opened with the training or added later (a spare funded for a speculative
    # copy), is one SlotOpened; together they are the deposit.
    deposit = sum(int(e.args["amount"]) for e in named("SlotOpened"))
    released: dict[str, int] = {}
    for e in named("Released"):
        released[e.args["worker"].lower()] = released.get(e.args["worker"].lower(), 0) + int(e.args["amount"])
    redeemed = sum(int(e.args["amount"]) for e in named("Redeemed"))
    refunded = sum(int(e.args["amount"]) for e in (*named("Refunded"), *named("Reclaimed")))
    if not (state.exists and state.closed):
        problems.append(f"escrow not closed (exists={state.exists}, closed={state.closed})")
    if not (deposit == state.deposited == state.paid + state.refunded + held):
        problems.append(f"deposit {deposit} / deposited {state.deposited} != paid {state.paid} + refunded "
                        f"{state.refunded} + held {held}")
    if sum(released.values()) + redeemed != state.paid or refunded != state.refunded:
        problems.append(f"events (released {sum(released.values())}, redeemed {redeemed}, refunded {refunded}) "
                        f"differ from the contract (paid {state.paid}, refunded {state.refunded})")
    if named("PaymentDeferred"):
        problems.append(f"deferred payments: {[e.args for e in named('PaymentDeferred')]}")

    # every paid worker delivered an accepted result, and was paid what its accepted rounds earn
    accepted: dict[str, list[dict[str, Any]]] = {}
    for ref in results["accepted"]:
        accepted.setdefault(ref["worker_id"].lower(), []).append(ref)
    price = {c["worker_id"].lower(): int(c["price_wei"]) for c in results["contracts"]}
    for e in named("Released"):
        worker = e.args["worker"].lower()
        mine = accepted.get(worker, [])
        if not mine:
            problems.append(f"{short(worker)} was paid {e.args['amount']} wei with no accepted result")
            continue
        latest = max(mine, key=lambda r: r["round"])
        if keccak(text=latest["cid"]) != bytes(e.args["resultHash"]):
            problems.append(f"{short(worker)}'s payment carries result hash {bytes(e.args['resultHash']).hex()[:12]}…, "
                            f"not its accepted checkpoint {latest['cid']}")
        slot = slots[e.args["worker"]]
        due = min(price.get(worker, 0) * len({r["round"] for r in mine}), slot.amount)
        if released[worker] != due or slot.paid != released[worker]:
            problems.append(f"{short(worker)} paid {released[worker]} wei (slot says {slot.paid}), "
                            f"its {len({r['round'] for r in mine})} accepted rounds earn {due}")
    for p in results["payments"]:
        if released.get(p["worker_id"].lower(), 0) < int(p["amount_wei"]):
            problems.append(f"the coordinator records a payment to {short(p['worker_id'])} the chain lacks")
    if released.get(killed):
        problems.append(f"the killed provider {short(killed)} was paid {released[killed]} wei")
    if not any(e.args["oldWorker"].lower() == killed for e in named("WorkerReplaced")):
        problems.append(f"no WorkerReplaced event moved {short(killed)}'s slot")

    # balances: each provider gained exactly its payments (it sent nothing meanwhile), the escrow
    # holds only what it still holds for receipts, and the coordinator lost the deposit less the refund, plus gas
    for address in tracked:
        b, a = before["balances"][address], after[address]
        delta = a["wei"] - b["wei"]
        if address == profile.chain.escrow.lower():
            if delta != held:
                problems.append(f"the escrow's balance changed by {delta} wei over a closed training "
                                f"holding {held} for receipts")
        elif address == results["coordinator"].lower():
            expected = -sent - fees + refunded
            if delta != expected or sent != deposit:
                problems.append(f"coordinator balance changed by {delta}, expected -{sent} - gas {fees} + refund "
                                f"{refunded} = {expected} (deposit {deposit})")
        elif a["nonce"] == b["nonce"] and delta != released.get(address, 0):
            problems.append(f"{short(address)}'s balance changed by {delta} wei, its payments are "
                            f"{released.get(address, 0)}")
        elif a["nonce"] != b["nonce"]:
            problems.append(f"{short(address)} sent transactions during the training: balance not checkable")
    data = {"state": state.__dict__, "released": released, "redeemed": redeemed, "refunded": refunded,
            "held": held, "deposit": deposit,
            "balances_before": before, "balances_after": after, "coordinator_fees": fees, "problems": problems}
    write_out(args, data)
    if problems:
        raise CheckFailed("; ".join(problems))
    return (f"deposit {eth(deposit)} = paid {eth(state.paid)} + refunded {eth(refunded)} + held {eth(held)} ETH; "
            f"{len(released)} paid workers, each for its accepted results (result hash = its checkpoint); "
            f"killed provider paid 0; {len(tracked)} balances match the events (blocks {before['block']}..{head})")


async def _coordinator_spending(w3: Any, coordinator: str, first: int, last: int) -> tuple[int, int]:
    """Gas fees and value the coordinator's transactions in blocks first..last spent."""
    fees = sent = 0
    for number in range(first, last + 1):
        block = await w3.eth.get_block(number, full_transactions=True)
        for tx in block["transactions"]:
            if tx["from"].lower() != coordinator.lower():
                continue
            receipt = await w3.eth.get_transaction_receipt(tx["hash"])
            fees += int(receipt["gasUsed"]) * int(receipt["effectiveGasPrice"])
            sent += int(tx["value"])
    return fees, sent


# -- 6. data ----------------------------------------------------------------------------------------

async def data(args: argparse.Namespace) -> str:
    """Fetch every shard, the test set, the dataset, each accepted checkpoint and the model by CID."""
    from aitbc_agent_sdk.records import ShardManifest
    from aitbc_agent_sdk.storage._kubo import KuboClient, KuboContentStore

    results = load_json(args.results)
    fetched: dict[str, dict[str, Any]] = {}
    problems = []
    async with KuboClient(args.api, timeout=30.0) as client:
        store = KuboContentStore(client)

        async def fetch(what: str, cid: str | None) -> bytes:
            if not cid:
                problems.append(f"no CID for {what}")
                return b""
            try:
                body = await store.cat(cid)  # every block is verified against its CID
            except Exception as exc:  # noqa: BLE001
                problems.append(f"{what} {cid}: {exc}")
                return b""
            if not body:
                problems.append(f"{what} {cid} is empty")
            fetched[what] = {"cid": cid, "bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()}
            return body

        manifest = ShardManifest.model_validate_json(await fetch("manifest", results["manifest_cid"]))
        for shard in manifest.shards:
            await fetch(f"shard {shard.index}", shard.cid)
        await fetch("test set", manifest.test_cid)
        await fetch("dataset", results["dataset_cid"])
        for ref in results["accepted"]:
            await fetch(f"checkpoint r{ref['round']} {short(ref['worker_id'])}", ref["cid"])
        await fetch("model", results["model_cid"])
    write_out(args, fetched)
    if problems:
        raise CheckFailed("; ".join(problems))
    total = sum(f["bytes"] for f in fetched.values())
    return (f"{len(manifest.shards)} shards, test set, dataset, {len(results['accepted'])} checkpoints and the model "
            f"({len(fetched)} CIDs, {total / 1e6:.2f} MB) fetched from {args.api} and verified; "
            f"model sha256 {fetched['model']['sha256'][:16]}…")


# -- the command line -------------------------------------------------------------------------------

CHECKS = {"probe": probe, "heartbeats": heartbeats, "sockets": sockets, "chain-heads": chain_heads,
          "training": training, "recovery": recovery, "payments": payments, "data": data}
HELPERS = {"kill-on-progress": kill_on_progress, "export": export, "balances": balances}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="command", required=True)
    p = sub.add_parser("jget")
    p.add_argument("file")
    p.add_argument("expr")
    p = sub.add_parser("probe")
    p.add_argument("--profile", required=True)
    p.add_argument("--node", required=True)
    p.add_argument("--address", required=True, help="this node's own address")
    p.add_argument("--out")
    p = sub.add_parser("heartbeats")
    p.add_argument("--profile", required=True)
    p.add_argument("--expect", action="append", help="NODE:ADDRESS of a provider (repeatable)")
    p.add_argument("--timeout", type=float, default=15.0)
    p.add_argument("--out")
    p = sub.add_parser("sockets")
    p.add_argument("--address", required=True)
    p.add_argument("--ports", type=int, nargs="+", required=True)
    p.add_argument("--broker-port", type=int, required=True)
    p.add_argument("--peers", nargs="+", required=True)
    p.add_argument("--out")
    p = sub.add_parser("chain-heads")
    p.add_argument("probes", nargs="+")
    p = sub.add_parser("kill-on-progress")
    p.add_argument("--home", required=True, help="the provider's host's AITBC_HOME")
    p.add_argument("--address", required=True, help="the provider's address")
    p.add_argument("--training-id", required=True)
    p.add_argument("--round", type=int, required=True, help="kill once it runs a job of this round (or later)")
    p.add_argument("--ready", required=True, help="file written once the watcher is subscribed")
    p.add_argument("--timeout", type=float, default=150.0)
    p = sub.add_parser("training")
    p.add_argument("--monitor", required=True)
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--target", type=float, required=True)
    p.add_argument("--hired", required=True, help="discover-workers --json output")
    p.add_argument("--node", action="append", help="NODE:ADDRESS, to name where a provider runs")
    p.add_argument("--worker-nodes", nargs="+", required=True, help="the nodes the workers must be on")
    p = sub.add_parser("recovery")
    for name in ("--monitor", "--audit", "--payments", "--hired", "--killed", "--kill"):
        p.add_argument(name, required=True)
    p.add_argument("--node", action="append", help="NODE:ADDRESS, to name where a provider runs")
    p = sub.add_parser("export")
    p.add_argument("--home", required=True)
    p.add_argument("--training-id", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("balances")
    p.add_argument("--profile", required=True)
    p.add_argument("--address", action="append", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("payments")
    for name in ("--profile", "--results", "--before", "--killed"):
        p.add_argument(name, required=True)
    p.add_argument("--out")
    p = sub.add_parser("data")
    p.add_argument("--results", required=True)
    p.add_argument("--api", required=True)
    p.add_argument("--out")
    return top


def jget(args: argparse.Namespace) -> None:
    """Print ``expr`` evaluated with ``d`` = the JSON in ``file`` (for the bash script; no jq needed)."""
    names = {"__builtins__": {"next": next, "str": str, "len": len, "sorted": sorted}, "d": load_json(args.file)}
    value = eval(args.expr, names)  # noqa: S307 - the script's own expressions
    print(value)


def _call(fn: Any, args: argparse.Namespace) -> Any:
    value = fn(args)
    return asyncio.run(value) if asyncio.iscoroutine(value) else value


def main() -> int:
    args = parser().parse_args()
    if args.command == "jget":
        try:
            jget(args)
        except Exception as exc:  # noqa: BLE001
            print(f"error: jget {args.file} {args.expr!r}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command in HELPERS:
        try:
            print(json.dumps(_call(HELPERS[args.command], args), sort_keys=True))
        except Exception as exc:  # noqa: BLE001
            print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        return 0
    try:
        detail = _call(CHECKS[args.command], args)
    except CheckFailed as exc:
        print(f"FAIL {exc}")
        return 1
    except Exception as exc:  # noqa: BLE001 - a check that cannot run has failed
        print(f"FAIL {type(exc).__name__}: {exc}")
        return 1
    print(f"PASS {detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
