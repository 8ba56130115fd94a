"""Add one provider daemon of a given kind (Byzantine or troubled, see byzantine.py) to a running devnet.

The devnet (``aitbc devnet up``) keeps its profile in ``$AITBC_HOME``; the new daemon gets its
own wallet there, funded and bonded like the devnet's own providers, and is recorded in the
profile so ``aitbc devnet down`` stops it too.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path

from aitbc_agent_sdk.chain import TransactionSender, connect_rpc
from aitbc_agent_sdk.chain._deployment import fund_accounts
from aitbc_agent_sdk.devnet._anvil import dev_accounts
from aitbc_agent_sdk.devnet._network import DEVNET_PROVIDER_ARGS, wait_for_offers, wallet_store
from aitbc_agent_sdk.devnet._service import spawn
from aitbc_agent_sdk.errors import ConfigError
from aitbc_agent_sdk.profile import devnet_password, load_profile, save_profile

REPO = Path(__file__).resolve().parents[2]
ETH = 10**18


async def add_provider_daemon(home: Path, wallet: str, behaviour: str, *, price_wei: int,
                              stake_wei: int = ETH // 10, funding_wei: int = ETH,
                              extra_args: Sequence[str] = ()) -> str:
    """Start the daemon, wait until every provider of the devnet advertises; returns its address.
    ``extra_args`` go to byzantine_provider.py (for example ``--stall-s`` for "throttled")."""
    profile = load_profile(home)
    password = devnet_password(home)
    assert password is not None, "not a devnet home (no wallet password file)"
    wallets = wallet_store(home)
    try:
        address = (await wallets.get(wallet)).address
    except ConfigError:
        address = (await wallets.create(wallet, password)).address
    w3 = await connect_rpc(profile.chain.rpc_url)
    try:
        await fund_accounts(TransactionSender(w3, dev_accounts(1)[0]), [address], funding_wei)
    finally:
        with contextlib.suppress(Exception):
            await w3.provider.disconnect()
    service = spawn(f"provider:{wallet}",
                    [sys.executable, str(REPO / "scripts" / "chaos" / "byzantine_provider.py"), "--home", str(home),
                     "--wallet", wallet, "--price-wei", str(price_wei), "--stake-wei", str(stake_wei),
                     "--behaviour", behaviour, *DEVNET_PROVIDER_ARGS, *extra_args],
                    port=0, log=home / "devnet" / "logs" / f"{wallet}.log", cwd=REPO,
                    stdin_data=(password + "\n").encode())
    profile = profile.model_copy(update={"services": (*profile.services, service)})
    save_profile(home, profile)
    providers = sum(s.name.startswith("provider:") for s in profile.services)
    await wait_for_offers(profile, providers)
    return address
