"""``aitbc chat``: ask in plain words; the assistant plans SDK calls, asks before anything that
spends money, changes hosts or stops work, runs them and answers with the CLI's tables.

One request: ``aitbc chat "detect which nodes have GPUs"``; no request: an interactive session.
Offline it understands requests with the deterministic planner; with an OpenAI-compatible
endpoint (``--llm-base-url``/``$AITBC_LLM_BASE_URL``, model, key) the model calls the same tools.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from aitbc_agent_sdk.errors import ConfigError
from aitbc_agent_sdk.records import terminal_markup, visible
from aitbc_agent_sdk.profile import devnet_password

from .common import (
    HomeOption, JsonOption, PasswordFileOption, PasswordSource, given_password, no_terminal_to_ask, print_json,
    resolve_home,
)
from .render import eth

if TYPE_CHECKING:  # the assistant's tools import torch and web3: only when chat runs
    from aitbc_agent_sdk.assistant import StepOutcome
    from aitbc_agent_sdk.assistant import Assistant, Reply

EXIT_WORDS = {"exit", "quit", "bye", ":q"}


def chat(
    request: Annotated[Optional[str], typer.Argument(help="what to do, in plain words; omitted: interactive")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="run actions that spend money, change hosts or stop "
                                                           "work without asking")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="only show the plan; run nothing")] = False,
    llm_base_url: Annotated[Optional[str], typer.Option(help="OpenAI-compatible endpoint, e.g. "
                                                             "http://127.0.0.1:8000/v1 [$AITBC_LLM_BASE_URL]")] = None,
    llm_model: Annotated[Optional[str], typer.Option(help="model name [$AITBC_LLM_MODEL]")] = None,
    offline: Annotated[bool, typer.Option("--offline", help="use the built-in planner even if an LLM is set")] = False,
    password_file: PasswordFileOption = None,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Ask the assistant to do something: train, detect GPUs, mount data, balance memory, recover, pay.

    The LLM's API key is read from $AITBC_LLM_API_KEY only, never from the command line (argv is
    visible to every user of the machine and lands in shell history). Exit 1 when a step failed or
    the request was not understood, 2 when a step's arguments were invalid.

    Example: aitbc chat --dry-run "train an mlp on digits with 2 workers"
    """
    from aitbc_agent_sdk.assistant import LlmConfig
    from aitbc_agent_sdk.assistant import Assistant

    root = resolve_home(home)
    llm = None if offline else LlmConfig.resolve(llm_base_url, llm_model)
    out = Console(stderr=as_json)  # with --json, stdout carries one JSON object and nothing else
    password = _password_source(root, PasswordSource(password_file, interactive=not as_json))
    assistant = Assistant(home=root, password=password, llm=llm,
                          notice=lambda line: out.print(f"  {visible(line)}", highlight=False, markup=False))
    if request is not None:
        reply = asyncio.run(_handle(assistant, request, out, yes=yes, dry_run=dry_run, as_json=as_json))
        raise typer.Exit(_exit_code(reply))
    _repl(assistant, out, yes=yes, dry_run=dry_run, as_json=as_json)


def _repl(assistant: Assistant, out: Console, *, yes: bool, dry_run: bool, as_json: bool) -> None:
    out.print("aitbc assistant: ask in plain words ('help' lists what I can do, 'exit' leaves).")
    while True:
        out.print("[bold]you>[/] ", end="")
        line = sys.stdin.readline()
        if not line:
            return
        text = line.strip()
        if not text:
            continue
        if text.lower() in EXIT_WORDS:
            return
        if text.lower() in {"help", "?", "what can you do"}:
            out.print("\n".join(f"  - {c}" for c in assistant.registry.capabilities()), highlight=False,
                      markup=False)
            continue
        try:
            asyncio.run(_handle(assistant, text, out, yes=yes, dry_run=dry_run, as_json=as_json))
        except ConfigError as exc:
            out.print(f"[red]error:[/] {terminal_markup(exc)}")


async def _handle(assistant: Assistant, request: str, out: Console, *, yes: bool, dry_run: bool,
                  as_json: bool) -> Reply:
    from aitbc_agent_sdk.assistant import plan_lines

    quiet = as_json and dry_run

    def show(outcomes: list[StepOutcome]) -> None:
        if not quiet:
            out.print("[bold]plan[/]" + (" (dry run)" if dry_run else "") + ":")
            for line in plan_lines(outcomes):
                out.print(f"  {line}", highlight=False, markup=False)

    unasked: list[str] = []  # what needed a yes that nobody could give (no terminal, no --yes)

    def confirm(outcomes: list[StepOutcome]) -> bool:
        gated = [o for o in outcomes if o.gated]
        effects = ' and '.join(sorted({_effect(o.effect) for o in gated}))
        out.print(f"[yellow]this {'plan' if len(outcomes) > 1 else 'step'} {effects}[/]")
        if yes:
            out.print("confirmed by --yes")
            return True
        if not sys.stdin.isatty():  # declined here, refused below: exit 2 as run and distribute do
            unasked.append(f"this request {effects}")
            return False
        try:
            return typer.confirm("Go ahead?", default=False, err=True)
        except typer.Abort:  # end of input: no answer is a no
            return False

    reply = await assistant.handle(request, dry_run=dry_run, confirm=confirm, show=show)
    if unasked:
        raise no_terminal_to_ask(unasked[0])
    if as_json:
        if dry_run:
            print_json(reply.plan.as_json())
        else:
            print_json({"understood": reply.understood, "via": reply.via, "answer": reply.text,
                        "steps": [o.as_json() for o in reply.outcomes]})
        return reply
    for o in reply.outcomes:
        if o.status == "done" and o.result is not None:
            _render(out, o.tool, o.result.data)
    out.print(reply.text, highlight=False, markup=False)  # inert already (assistant.reply)
    return reply


def _exit_code(reply: Reply) -> int:
    if not reply.understood or any(o.status == "failed" for o in reply.outcomes):
        return 1
    if any(o.status == "invalid" for o in reply.outcomes):
        return 2
    return 0


def _effect(effect: str) -> str:
    return {"spend": "spends money", "change-hosts": "changes hosts", "stop": "stops or restarts work"}[effect]


def _password_source(home: Path, source: PasswordSource):  # type: ignore[no-untyped-def]
    def password(wallet: str) -> str:
        found = given_password(source)
        if found is None:
            found = devnet_password(home)
        if found is not None:
            return found
        if source.interactive and sys.stdin.isatty():  # the request itself may have come on stdin
            return str(typer.prompt(f"password of wallet {wallet!r}", hide_input=True, err=True))
        raise ConfigError(f"wallet {wallet!r} needs a password and there is no terminal to ask "
                          f"(or --json): set $AITBC_PASSWORD or pass --password-file PATH")
    return password


# -- the CLI's tables for what a tool returned -------------------------------------------------

def _render(out: Console, tool: str, data: dict[str, Any]) -> None:
    if tool in ("cluster_inventory",):
        from aitbc_agent_sdk.cluster import ClusterInventory

        from .cluster_render import render_inventory
        render_inventory(out, ClusterInventory.model_validate(data))
    elif tool == "monitor":
        from aitbc_agent_sdk.coordinator import Snapshot

        from .training_views import render_snapshot
        out.print(render_snapshot(Snapshot.model_validate(data)))
    elif tool in ("payments", "pay_workers") and data.get("payments"):
        out.print(_table(f"payments of {data['training_id']}", ("worker", "amount ETH", "tx hash"),
                         [(p["worker_id"], eth(p["amount_wei"]), p["tx_hash"]) for p in data["payments"]]))
    elif tool == "discover_workers":
        out.print(_table(f"selected {len(data['workers'])} workers", ("worker", "role", "hardware", "price/round ETH",
                                                                      "reputation", "score"),
                         [(w["worker_id"], w["role"], w["gpu"], eth(w["price_wei"]), f"{w['reputation']:.2f}",
                           f"{w['score']:.3f}") for w in data["workers"]]))
    elif tool == "market_offers":
        out.print(_table(f"{len(data['offers'])} offers", ("provider", "hardware", "price/round ETH", "bond ETH",
                                                           "reputation", "free", "score"),
                         [(r["provider"], r["hardware"], eth(r["price_wei"]), eth(r["stake_wei"]),
                           f"{r['reputation']:.2f}", str(r["free_slots"]), f"{r['score']:.3f}")
                          for r in data["offers"]]))
    elif tool == "cluster_balance":
        out.print(_table(f"batch plan, global batch {data['global_batch']}", ("rank", "device", "free memory GiB",
                                                                             "cap", "batch", "memory used"),
                         [(str(r["rank"]), r["label"], f"{r['free_memory_bytes'] / 2**30:.1f}", str(r["capacity"]),
                           str(r["batch"]), f"{100 * (r['memory_share'] or 0):.0f}%") for r in data["ranks"]]))


def _table(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> Table:
    table = Table(title=terminal_markup(title))
    for col in columns:
        table.add_column(col)
    for row in rows:  # offers, payments, hosts: other parties' words, shown as written
        table.add_row(*map(terminal_markup, row))
    return table

