"""The OpenAI-compatible tool-calling path, against a small local HTTP server that speaks the
chat-completions format (no model can run here, so this stand-in is the one place one is used).

The server answers from a script: first a ``tool_calls`` message, then, once the tool's result
came back as a ``tool`` message, a final answer. It records every request, so the tests can
check what the client really sent: the registry's tools, the model, the key, the tool results.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from aitbc_agent_sdk.assistant._audit import assistant_log_path
from aitbc_agent_sdk.assistant._llm import LlmConfig, LlmError
from aitbc_agent_sdk.assistant._session import Assistant
from aitbc_agent_sdk.assistant._tools import REGISTRY
from aitbc_agent_sdk.audit import read_log

API_KEY = "sk-test-" + "k3y" * 8
Reply = Callable[[dict[str, Any]], dict[str, Any]]


class FakeOpenAI:
    """Chat completions on 127.0.0.1: each POST is answered by the next scripted function."""

    def __init__(self, script: list[Reply]) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.errors: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                outer.headers.append(dict(self.headers))
                if self.path != "/v1/chat/completions" or not outer.script:
                    self.send_error(404 if self.path != "/v1/chat/completions" else 500)
                    return
                try:
                    message = outer.script.pop(0)(body)
                except AssertionError as exc:  # a check on the request failed: say so, in the test too
                    outer.errors.append(str(exc) or repr(exc))
                    self.send_error(500, "request check failed")
                    return
                data = json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "model": body["model"],
                                   "choices": [{"index": 0, "message": message,
                                                "finish_reason": "tool_calls" if message.get("tool_calls")
                                                else "stop"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def call(name: str, arguments: dict[str, Any], call_id: str = "call_1") -> Reply:
    return lambda body: {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def final(text: str) -> Reply:
    return lambda body: {"role": "assistant", "content": text}


def tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [json.loads(m["content"]) for m in body["messages"] if m["role"] == "tool"]


def assert_carries_the_registry(body: dict[str, Any]) -> None:
    tools = {t["function"]["name"]: t["function"] for t in body["tools"]}
    assert list(tools) == REGISTRY.names
    for tool in REGISTRY:
        assert tools[tool.name]["parameters"] == tool.schema
    assert body["tools"][0]["type"] == "function"


async def test_a_tool_call_runs_and_its_result_goes_back(tmp_path: Path) -> None:
    with FakeOpenAI([call("cluster_inventory", {}), final("One host, no GPU: it can train on CPU.")]) as api:
        assistant = Assistant(home=tmp_path, llm=LlmConfig(api.url, "local-model", API_KEY))
        reply = await assistant.handle("detect which nodes have GPUs")
    assert reply.via == "llm" and reply.text == "One host, no GPU: it can train on CPU."
    assert [t["tool"] for t in assistant.trace] == ["cluster_inventory"]
    assert reply.plan.as_json() == {"understood": True, "steps": [{"tool": "cluster_inventory", "arguments": {}}]}
    first, second = api.requests
    assert first["model"] == "local-model" and first["messages"][-1] == {"role": "user",
                                                                        "content": "detect which nodes have GPUs"}
    assert_carries_the_registry(first)
    assert api.headers[0]["Authorization"] == f"Bearer {API_KEY}"
    assert second["messages"][-2]["tool_calls"][0]["function"]["name"] == "cluster_inventory"
    [result] = tool_results(second)
    assert result["status"] == "done" and result["result"]["data"]["hosts"]
    assert second["messages"][-1]["tool_call_id"] == "call_1"
    log = read_log(assistant_log_path(tmp_path))
    assert [e.event for e in log] == ["tool_request", "tool_call", "tool_result"]
    assert log[1].fields["request"] == "detect which nodes have GPUs" and log[1].fields["source"] == "chat"
    assert API_KEY not in assistant_log_path(tmp_path).read_text()


async def test_the_gate_holds_for_a_model_too(tmp_path: Path) -> None:
    asked: list[str] = []

    def no(outcomes):  # type: ignore[no-untyped-def]
        asked.extend(o.tool for o in outcomes)
        return False

    script = [call("pay_workers", {"training_id": "training_0123456789abcdef"}), final("I did not pay anyone.")]
    with FakeOpenAI(script) as api:
        assistant = Assistant(home=tmp_path, llm=LlmConfig(api.url, "m"))
        reply = await assistant.handle("pay the workers", confirm=no)
    assert asked == ["pay_workers"] and assistant.trace == []
    assert [o.status for o in reply.outcomes] == ["needs-confirmation"]
    [result] = tool_results(api.requests[1])
    assert result["status"] == "needs-confirmation" and "declined" in result["note"]
    assert "Authorization" not in api.headers[0]  # no key configured, none sent


async def test_dry_run_plans_from_the_model_and_runs_nothing(tmp_path: Path) -> None:
    script = [call("distribute", {"training_id": "training_0123456789abcdef"}), final("That would fund it.")]
    with FakeOpenAI(script) as api:
        assistant = Assistant(home=tmp_path, llm=LlmConfig(api.url, "m"))
        reply = await assistant.handle("start training_0123456789abcdef", dry_run=True,
                                       confirm=lambda o: pytest.fail("a dry run asked"))
    assert assistant.trace == [] and [o.status for o in reply.outcomes] == ["dry-run"]
    assert reply.plan.as_json()["steps"] == [{"tool": "distribute",
                                              "arguments": {"training_id": "training_0123456789abcdef"}}]
    assert not assistant_log_path(tmp_path).exists()


async def test_unknown_tools_and_broken_endpoints_are_reported(tmp_path: Path) -> None:
    with FakeOpenAI([call("format_disk", {}), final("Sorry.")]) as api:
        reply = await Assistant(home=tmp_path, llm=LlmConfig(api.url, "m")).handle("wipe it")
    assert reply.outcomes[0].status == "invalid" and not reply.understood
    assert tool_results(api.requests[1])[0]["status"] == "invalid"
    with FakeOpenAI([]) as api:  # the server answers 500
        with pytest.raises(LlmError, match="HTTP 500"):
            await Assistant(home=tmp_path, llm=LlmConfig(api.url, "m")).handle("anything")


@pytest.fixture
def fake_api() -> Iterator[FakeOpenAI]:
    def check_tools(body: dict[str, Any]) -> dict[str, Any]:
        assert_carries_the_registry(body)
        return call("cluster_inventory", {})(body)

    with FakeOpenAI([check_tools, final("Your host has no GPU."), check_tools, final("planned")]) as api:
        yield api


def test_cli_uses_the_endpoint_from_the_environment(aitbc_cmd, cli_env, aitbc_home, fake_api) -> None:
    env = {**cli_env, "AITBC_LLM_BASE_URL": fake_api.url, "AITBC_LLM_MODEL": "qwen-local",
           "AITBC_LLM_API_KEY": API_KEY}
    done = subprocess.run([*aitbc_cmd, "chat", "which machines have a GPU?"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert not fake_api.errors, fake_api.errors
    assert done.returncode == 0, done.stderr
    assert "Your host has no GPU." in done.stdout and API_KEY not in done.stdout + done.stderr
    plan = subprocess.run([*aitbc_cmd, "chat", "--dry-run", "--json", "which machines have a GPU?"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert json.loads(plan.stdout) == {"understood": True, "steps": [{"tool": "cluster_inventory", "arguments": {}}]}
    assert [r["model"] for r in fake_api.requests] == ["qwen-local"] * 4
    offline = subprocess.run([*aitbc_cmd, "chat", "--offline", "--dry-run", "--json", "pay the workers"], env=env,
                             capture_output=True, text=True, timeout=120)
    assert json.loads(offline.stdout)["steps"] == [{"tool": "pay_workers", "arguments": {}}]
    assert len(fake_api.requests) == 4  # --offline never called the endpoint
