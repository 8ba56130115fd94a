"""`aitbc mcp serve` as an MCP client sees it: the official SDK's stdio client starts the server as
a separate process, lists the tools, and calls inventory and a dry-run distribute."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

from mcp import ClientSession, StdioServerParameters, stdio_client

from aitbc_agent_sdk.assistant._audit import assistant_log_path
from aitbc_agent_sdk.assistant._market_tools import InitArgs, training_spec
from aitbc_agent_sdk.assistant._planner import plan_request
from aitbc_agent_sdk.assistant._tools import REGISTRY
from aitbc_agent_sdk.audit import read_log, verify_log
from aitbc_agent_sdk.records import TaskRef

TID = "training_0123456789abcdef"


def server(home: Path) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "aitbc_cli.app", "mcp", "serve"],
                                 env={"AITBC_HOME": str(home)})


def choices(prop: dict) -> set[str]:  # type: ignore[type-arg]
    """The enum of an optional Literal argument's JSON schema."""
    return {v for option in prop.get("anyOf", [prop]) for v in option.get("enum", [])}


async def test_mcp_round_trip(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with stdio_client(server(home)) as (read, write), ClientSession(read, write) as session:
        await session.initialize()

        listed = {t.name: t for t in (await session.list_tools()).tools}
        assert list(listed) == REGISTRY.names
        for tool in REGISTRY:
            schema = listed[tool.name].input_schema
            assert {k: v for k, v in schema["properties"].items() if k not in ("dry_run", "request", "confirm")} \
                == tool.schema["properties"]
            assert ("confirm" in schema["properties"]) == tool.gated
            assert listed[tool.name].annotations.read_only_hint == (tool.effect == "read")
        assert listed["distribute"].annotations.destructive_hint is True

        inventory = await session.call_tool("cluster_inventory", {"request": "detect which nodes have GPUs"})
        assert not inventory.is_error
        data = inventory.structured_content["result"]["data"]
        assert len(data["hosts"]) == 1 and data["hosts"][0]["reachable"]
        assert "hosts" in inventory.content[0].text

        dry = await session.call_tool("distribute", {"training_id": TID, "dry_run": True})
        assert not dry.is_error and dry.structured_content["status"] == "dry-run"
        assert dry.structured_content["arguments"] == {"training_id": TID}
        assert "nothing ran" in dry.content[0].text

        unconfirmed = await session.call_tool("distribute", {"training_id": TID, "request": "start it"})
        assert unconfirmed.structured_content["status"] == "needs-confirmation"
        assert "confirm=true" in unconfirmed.content[0].text

        confirmed = await session.call_tool("distribute", {"training_id": TID, "confirm": True})
        assert confirmed.is_error and confirmed.structured_content["status"] == "failed"
        assert TID in confirmed.structured_content["error"]  # it ran, and said why it could not

        bad = await session.call_tool("cluster_balance", {"global_batch": -1})
        assert bad.is_error and bad.structured_content["status"] == "invalid"

        # a language model: the choices are in the schema, and a call builds what the chat plans
        init = listed["training_init"].input_schema["properties"]
        assert {"gpt", "mlp"} <= choices(init["task"]) and choices(init["outer"]) == {"fedavg", "diloco"}
        assert choices(init["update_encoding"]) == {"weights", "float32", "bf16", "int8"}
        assert init["task_params"]["type"] == "object"
        assert "text_corpus" in listed["upload_data"].input_schema["properties"]
        gpt = await session.call_tool("training_init", {"task": "gpt", "task_params": {"layers": 2}, "outer": "diloco",
                                                        "update_encoding": "int8", "dry_run": True})
        assert not gpt.is_error and gpt.structured_content["status"] == "dry-run"
        spec = training_spec(InitArgs.model_validate(gpt.structured_content["arguments"]))
        planned = plan_request("train a 2-layer GPT on my text corpus ./wiki with int8 updates").steps[0]
        assert spec == training_spec(InitArgs.model_validate(planned.arguments))
        assert spec.task == TaskRef(name="gpt", params={"layers": 2}) and spec.upload_encoding == "int8"
        missing = await session.call_tool("upload_data", {"data_path": str(tmp_path / "wiki"), "text_corpus": True,
                                                          "dry_run": True})
        assert missing.is_error and missing.structured_content["status"] == "invalid"
        assert "wiki: no such directory" in missing.structured_content["error"]

    # what ran is in the audit trail with the request that caused it; the dry run left nothing
    log = read_log(assistant_log_path(home))
    assert verify_log(assistant_log_path(home)).ok
    calls = [(e.fields["tool"], e.fields["request"]) for e in log if e.event == "tool_call"]
    assert calls == [("cluster_inventory", "detect which nodes have GPUs"), ("distribute", "(MCP call to distribute)")]
    assert all(e.fields["source"] == "mcp" for e in log)
    assert [e.fields["confirmed"] for e in log if e.event == "tool_request" and e.fields["tool"] == "distribute"] \
        == [False, True]
    if (home / "aitbc.db").exists():
        with sqlite3.connect(home / "aitbc.db") as db:
            assert db.execute("SELECT COUNT(*) FROM trainings").fetchone() == (0,)
