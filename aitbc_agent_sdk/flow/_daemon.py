"""The coordinator daemon: drives one funded training to the end with no terminal attached.

``aitbc distributed-training distribute`` starts it detached as
``python -m aitbc_agent_sdk.flow._daemon --training-id T --wallet W``; it reads the
wallet password from the first line of stdin, so it never appears in argv or the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

from eth_account.signers.local import LocalAccount

from ..config import AgentConfig, default_home
from ..coordinator._lock import training_lock
from ..records import Settlement
from ..profile import training_dir

log = logging.getLogger("aitbc.coordinator")


async def serve_training(home: Path, account: LocalAccount, training_id: str, *,
                         resume: bool = False) -> Settlement | None:
    from .._agent import Agent
    from ..coordinator.round._run import drive_training, resume_training

    # One stable client id per training: a restarted daemon resumes the same broker session.
    config = AgentConfig(name="coordinator", network="devnet", home=home, client_id=f"coord-{training_id}")

    def observe(event: object) -> None:
        log.info("%s", event)

    with training_lock(home, training_id):
        async with Agent(config, account=account, observer=observe) as agent:
            if resume:
                outcome = await resume_training(agent.coordinator, training_id)
                if outcome is None:
                    log.info("training %s had already ended; nothing to resume", training_id)
                    return None
                settlement, compute = outcome
            else:
                settlement, compute = await drive_training(agent.coordinator, training_id)
    log.info("training %s complete: paid %d wei, refunded %d wei, %.1f s of training compute",
             training_id, settlement.escrow.paid_wei, settlement.refund_wei, compute)
    return settlement


def spawn_coordinator(home: Path, wallet: str, password: str, training_id: str, *,
                      resume: bool = False) -> subprocess.Popen[bytes]:
    """Start the daemon detached from this process's terminal and session."""
    directory = training_dir(home, training_id)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "coordinator.log", "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "aitbc_agent_sdk.flow._daemon", "--home", str(home), "--wallet", wallet,
             "--training-id", training_id, *(["--resume"] if resume else [])],
            stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    assert proc.stdin is not None
    proc.stdin.write((password + "\n").encode())
    proc.stdin.close()
    (directory / "coordinator.pid").write_text(str(proc.pid))
    return proc


async def _main(args: argparse.Namespace) -> int:
    from ..chain import WalletStore

    password = sys.stdin.readline().rstrip("\n")
    account = await WalletStore(args.home / "wallets").unlock(args.wallet, password)
    await serve_training(args.home, account, args.training_id, resume=args.resume)
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description="aitbc coordinator daemon (reads the wallet password from stdin)")
    parser.add_argument("--home", type=Path, default=default_home())
    parser.add_argument("--wallet", required=True)
    parser.add_argument("--training-id", required=True)
    parser.add_argument("--resume", action="store_true", help="carry on after a coordinator died")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.info("coordinator daemon %d for %s", os.getpid(), args.training_id)
    sys.exit(asyncio.run(_main(args)))


if __name__ == "__main__":
    main()
