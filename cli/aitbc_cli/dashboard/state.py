"""What the dashboard shows, read from the home through the functions ``list``, ``monitor`` and ``payments`` use:
the training database and each training's audit log. Nothing here writes, and nothing unlocks a wallet."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aitbc_agent_sdk import flow
from aitbc_agent_sdk.audit import AuditEntry, read_log
from aitbc_agent_sdk.coordinator import Snapshot, snapshot
from aitbc_agent_sdk.errors import AitbcError
from aitbc_agent_sdk.records import id_path

from ..common import wei_strings

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

AUDIT_TAIL = 500  # the page lists the newest entries; the CLI's `audit` shows the whole chain


def trainings_dir(home: Path) -> Path:
    return home / "trainings"


def check_training_id(home: Path, training_id: str) -> None:
    """UnsafeNameError (shown as 404) for an id that is not an id: it never becomes a path."""
    id_path(trainings_dir(home), training_id)


def audit_entries(home: Path, training_id: str) -> list[AuditEntry]:
    """The training's verified audit log (none without one); AuditLogError if the chain is broken."""
    return read_log(id_path(trainings_dir(home), training_id) / "audit.jsonl")


async def read_snapshot(home: Path, training_id: str, entries: list[AuditEntry] | None = None
                        ) -> tuple[Snapshot, dict[int, dict[str, float]]]:
    """The snapshot ``monitor`` shows, and each accepted round's training loss per worker (as ``run`` reports it);
    ``entries``: the audit log, if read already. NotFoundError for an unknown training; no database is created."""
    from aitbc_agent_sdk.coordinator import TrainingDatabase

    check_training_id(home, training_id)
    await flow.load_training(home, training_id)  # no database yet: say so, do not create one
    async with TrainingDatabase(flow.db_path(home)) as db:
        snap = await snapshot(db, training_id, audit_dir=trainings_dir(home), entries=entries)
        losses: dict[int, dict[str, float]] = {}
        for c in await db.checkpoints(training_id, "accepted"):
            losses.setdefault(c.round, {})[c.worker_id] = c.loss
    return snap, losses


async def training_view(home: Path, training_id: str) -> dict[str, Any]:
    """``GET /api/trainings/{id}``: the snapshot as ``monitor --json`` prints it, with worker losses per round,
    the audit log's newest entries and the cost figures."""
    check_training_id(home, training_id)  # before its id names a file
    entries = await asyncio.to_thread(audit_entries, home, training_id)
    snap, losses = await read_snapshot(home, training_id, entries)
    view = wei_strings(snap.model_dump(mode="json"))
    view["finished"] = snap.finished
    view["worker_losses"] = [{"round": r, "losses": losses[r]} for r in sorted(losses)]
    view["audit"] = wei_strings([{"seq": e.seq, "ts": e.ts, "event": e.event, "fields": e.fields}
                                 for e in entries[-AUDIT_TAIL:]])
    view["audit_entries"] = len(entries)
    return view


async def training_rows(home: Path) -> list[dict[str, Any]]:
    """``GET /api/trainings``: what ``list --json`` prints, with the spend so far against the deposit."""
    rows = []
    for summary in await flow.list_trainings(home):
        row: dict[str, Any] = {**summary.__dict__, "spent_wei": None, "deposit_wei": None, "error": None}
        try:
            snap, _ = await read_snapshot(home, summary.training_id)
        except AitbcError as exc:  # a broken audit log: this row says so, the others still show
            row["error"] = str(exc)
        else:
            if snap.cost is not None:
                row["spent_wei"] = str(snap.cost.spent_wei)
                row["deposit_wei"] = None if snap.cost.deposit_wei is None else str(snap.cost.deposit_wei)
        rows.append(row)
    return rows


class MarketUnavailable(Exception):
    """The market cannot be read now (no devnet or network to ask): the API answers 503."""


MARKET_TIMEOUT_S = 30.0


async def market_offers(home: Path, network: str, reader: LocalAccount) -> list[dict[str, Any]]:
    """``GET /api/market``: the offers ``aitbc market list`` shows, wei amounts as strings. ``reader`` signs
    the discovery requests: a key of the dashboard's own that holds nothing, made once per dashboard, so the
    devnet's broker gains one account at most, and no wallet is ever unlocked."""
    if network == "embedded":
        raise MarketUnavailable("the embedded network's market lives only inside a run: start one with "
                                "'aitbc devnet up', or serve the dashboard with --network NAME")
    from aitbc_agent_sdk.config import AgentConfig

    from ..market import offer_rows

    try:
        config = AgentConfig(name="aitbc-dashboard", network=network, home=home)
        rows = await asyncio.wait_for(offer_rows(config, reader), MARKET_TIMEOUT_S)
    except (AitbcError, ValueError, OSError, TimeoutError) as exc:  # ValueError: pydantic's, a bad network name
        raise MarketUnavailable(f"the market of network {network!r} cannot be read: {exc}") from exc
    return wei_strings(sorted(rows, key=lambda r: r["score"], reverse=True))
