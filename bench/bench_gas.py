"""Benchmark: gas of one batched TrainingEscrow.release vs. N plain transfers, ETH and ERC-20.

Runs on the embedded py-evm chain (eth-tester, Prague rules; gas is deterministic, so one run
suffices). For each batch size N the same N payees are paid three ways:

* ``plain``: N separate transactions (ETH value transfers, or the test token's ``transfer``)
  to payees that already exist and hold a balance (an untimed first round made sure);
* ``steady``: a ``release`` to those payees on a slot that was already paid once, i.e. the
  usual settlement of a later round (payee accounts and token balances exist, slot non-zero);
* ``fresh``: the first ``release`` to N never-seen addresses (account creation for ETH, a
  zero token balance for ERC-20, zero slots), compared with N plain transfers to fresh
  addresses.

    python bench/bench_gas.py [--sizes 1 4 10 32]

Prints a table, then one JSON line. The goal from issue #4: steady batch at N=10 <= 1.5x plain.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from eth_account import Account

from aitbc_agent_sdk.chain import (
    ContractArtifact,
    EscrowClient,
    TransactionSender,
    deploy,
    load_artifact,
    result_hash,
    sign_consent,
    start_embedded_chain,
    training_key,
    training_salt,
)

from quick import parse_args

ETH = 10**18
UNIT = 10**15  # per-payment amount; slots hold three of them
TOKEN_ARTIFACT = Path(__file__).resolve().parents[1] / "tests" / "artifacts" / "TestToken.json"


async def _plain(sender: TransactionSender, payees: list[str], token: Any | None) -> int:
    """Total gas of one plain transfer per payee (sequential, as a wallet would send them)."""
    total = 0
    for payee in payees:
        if token is None:
            tx: dict[str, Any] = {"to": payee, "value": UNIT}
        else:
            tx = {"to": token.address, "data": token.encode_abi("transfer", args=[payee, UNIT])}
        total += int((await sender.send(tx))["gasUsed"])  # type: ignore[arg-type]
    return total


async def _measure(n: int, asset: str) -> dict[str, Any]:
    chain = await start_embedded_chain()
    account = Account.create()
    await chain.fund(account.address, 1000 * ETH)
    sender = TransactionSender(chain.w3, account)
    escrow = EscrowClient(chain.w3, await deploy(sender, load_artifact("TrainingEscrow")))
    token = None
    token_address = "0x" + "00" * 20
    if asset == "erc20":
        artifact = ContractArtifact.from_file(TOKEN_ARTIFACT)
        token_address = await deploy(sender, artifact)
        token = chain.w3.eth.contract(address=token_address, abi=artifact.abi)
        for fn, args in (("mint", [account.address, 1000 * ETH]), ("approve", [escrow.address, 2**256 - 1])):
            await sender.send({"to": token_address, "data": token.encode_abi(fn, args=args)})

    async def open_training(name: str, accounts: list[Any]) -> tuple[bytes, list[str]]:
        tid, chain_id = training_key(sender.address, name), await escrow.chain_id()
        consents = [sign_consent(a, chain_id, escrow.address, tid) for a in accounts]  # each payee agrees
        payees = [a.address for a in accounts]
        await escrow.open(sender, training_salt(name), payees, [3 * UNIT] * n, consents, token=token_address)
        return tid, payees

    async def release(tid: bytes, payees: list[str]) -> int:
        hashes = [result_hash(f"bafy-{i}") for i in range(n)]
        return int((await escrow.release(sender, tid, payees, [UNIT] * n, hashes))["gasUsed"])

    existing_accounts = [Account.create() for _ in range(n)]
    existing = [a.address for a in existing_accounts]
    await _plain(sender, existing, token)  # untimed: the payees now exist and hold a balance
    plain_steady = await _plain(sender, existing, token)
    tid, _ = await open_training("steady", existing_accounts)
    first_existing = await release(tid, existing)
    steady = await release(tid, existing)

    tid, fresh = await open_training("fresh", [Account.create() for _ in range(n)])
    fresh_batch = await release(tid, fresh)
    plain_fresh = await _plain(sender, [Account.create().address for _ in range(n)], token)
    return {
        "asset": asset,
        "n": n,
        "plain": plain_steady,
        "steady": steady,
        "steady_ratio": round(steady / plain_steady, 3),
        "steady_per_worker": steady // n,
        "first_existing": first_existing,
        "plain_fresh": plain_fresh,
        "fresh": fresh_batch,
        "fresh_ratio": round(fresh_batch / plain_fresh, 3),
        "fresh_per_worker": fresh_batch // n,
    }


async def _run(sizes: list[int]) -> list[dict[str, Any]]:
    return [await _measure(n, asset) for asset in ("eth", "erc20") for n in sizes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 10, 32])
    args = parse_args(parser, sizes=[1, 4])
    rows = asyncio.run(_run(args.sizes))
    header = ("asset", "N", "plain", "steady", "ratio", "per worker", "plain fresh", "fresh", "ratio", "per worker")
    print(" | ".join(header))
    for r in rows:
        print(" | ".join(str(v) for v in (
            r["asset"], r["n"], r["plain"], r["steady"], r["steady_ratio"], r["steady_per_worker"],
            r["plain_fresh"], r["fresh"], r["fresh_ratio"], r["fresh_per_worker"])))
    goal = next((r for r in rows if r["asset"] == "eth" and r["n"] == 10), None)
    print(json.dumps({"bench": "gas", "rows": rows,
                      "goal_eth_n10_ratio_le_1_5": None if goal is None else goal["steady_ratio"] <= 1.5}))


if __name__ == "__main__":
    main()
