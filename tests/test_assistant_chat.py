"""`aitbc chat`: the confirmation gate, dry runs, the audit trail and secrets, one-shot and REPL,
and the plain-words requests carried out for real.

The gate is checked on the executor with a registry whose tools record their own calls (what
ran is read from the execution trace and those records; nothing is mocked), and end to end on
real servers: a devnet (mosquitto, anvil, provider daemons), where "no" must leave the chain and
the database untouched and --yes must fund an escrow that pays the workers; a trusted cluster in
network namespaces, trained across hosts and recovered after its master node dies; and two
cluster agents that mount a dataset from a js-ipfs daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from aitbc_agent_sdk.assistant._audit import AssistantAudit, Secrets, assistant_log_path
from aitbc_agent_sdk.assistant._base import Tool, ToolArgs, ToolContext, ToolResult
from aitbc_agent_sdk.assistant._executor import Executor
from aitbc_agent_sdk.assistant._planner import Plan, Step
from aitbc_agent_sdk.assistant._session import Assistant
from aitbc_agent_sdk.assistant._tools import Registry
from aitbc_agent_sdk.audit import read_log, verify_log
from aitbc_agent_sdk.errors import ConfigError

KEY = "0x" + "4f" * 32  # shaped like a private key


class Amount(ToolArgs):
    amount: int = 1


def recording_registry(calls: list[str]) -> Registry:
    def handler(name: str):  # type: ignore[no-untyped-def]
        async def run(ctx: ToolContext, args: Amount) -> ToolResult:
            calls.append(name)
            if name == "explode":
                raise ConfigError(f"cannot unlock with {ctx.password('dev')}")
            return ToolResult(f"{name} done with {args.amount}")
        return run

    return Registry([Tool("look", "reads", Amount, "read", handler("look"), "look"),
                     Tool("spend", "spends", Amount, "spend", handler("spend"), "spend"),
                     Tool("explode", "fails", Amount, "read", handler("explode"), "explode")])


def executor(tmp_path: Path, calls: list[str], secrets: Secrets | None = None) -> Executor:
    secrets = secrets or Secrets()
    ctx = ToolContext(home=tmp_path, password=lambda wallet: "pw-" + "s3cr3t" * 3)
    return Executor(ctx, registry=recording_registry(calls), audit=AssistantAudit(tmp_path, source="test",
                                                                                      secrets=secrets),
                    secrets=secrets)


PLAN = Plan("look, then spend 5", [Step("look", {}), Step("spend", {"amount": 5})], ["x", "y"])


async def test_declining_runs_nothing_not_even_the_read_step(tmp_path: Path) -> None:
    calls: list[str] = []
    asked: list[list[str]] = []
    ex = executor(tmp_path, calls)

    def no(outcomes):  # type: ignore[no-untyped-def]
        asked.append([o.tool for o in outcomes if o.gated])
        return False

    outcomes = await ex.run_plan(PLAN, confirm=no)
    assert asked == [["spend"]]  # asked once, about the gated step
    assert calls == [] and ex.trace == []
    assert [o.status for o in outcomes] == ["declined", "declined"]
    events = [(e.event, e.fields.get("granted")) for e in read_log(assistant_log_path(tmp_path))]
    assert ("confirmation", False) in events and not any(e == "tool_call" for e, _ in events)


async def test_confirming_runs_every_step_in_order(tmp_path: Path) -> None:
    calls: list[str] = []
    ex = executor(tmp_path, calls)
    outcomes = await ex.run_plan(PLAN, confirm=lambda outcomes: True)
    assert calls == ["look", "spend"]
    assert [t["tool"] for t in ex.trace] == ["look", "spend"] and ex.trace[1]["arguments"] == {"amount": 5}
    assert [o.status for o in outcomes] == ["done", "done"]
    entries = read_log(assistant_log_path(tmp_path))
    assert verify_log(assistant_log_path(tmp_path)).ok
    called = [e.fields for e in entries if e.event == "tool_call"]
    assert [f["tool"] for f in called] == ["look", "spend"]
    assert all(f["request"] == "look, then spend 5" for f in called)


async def test_no_confirmer_means_no(tmp_path: Path) -> None:
    calls: list[str] = []
    outcomes = await executor(tmp_path, calls).run_plan(PLAN)
    assert calls == [] and {o.status for o in outcomes} == {"declined"}


async def test_dry_run_asks_nothing_and_runs_nothing(tmp_path: Path) -> None:
    calls: list[str] = []
    ex = executor(tmp_path, calls)
    outcomes = await ex.run_plan(PLAN, dry_run=True, confirm=lambda o: pytest.fail("a dry run asked"))
    assert calls == [] and ex.trace == []
    assert [o.status for o in outcomes] == ["dry-run", "dry-run"]
    assert outcomes[1].arguments == {"amount": 5}


async def test_a_single_gated_call_needs_confirmed(tmp_path: Path) -> None:
    calls: list[str] = []
    ex = executor(tmp_path, calls)
    assert (await ex.call("spend", {}, request="spend")).status == "needs-confirmation"
    assert (await ex.call("spend", {}, request="spend", dry_run=True, confirmed=True)).status == "dry-run"
    assert calls == []
    assert (await ex.call("look", {}, request="look")).status == "done"
    assert (await ex.call("spend", {"amount": 2}, request="spend", confirmed=True)).status == "done"
    assert calls == ["look", "spend"]


async def test_bad_arguments_or_tools_stop_the_plan_before_anything_runs(tmp_path: Path) -> None:
    calls: list[str] = []
    ex = executor(tmp_path, calls)
    bad = Plan("r", [Step("look", {}), Step("spend", {"amount": "lots"}), Step("nope", {})])
    outcomes = await ex.run_plan(bad, confirm=lambda o: True)
    assert calls == []
    assert [o.status for o in outcomes] == ["skipped", "invalid", "invalid"]
    assert "amount" in (outcomes[1].error or "")
    assert (await ex.call("look", {"colour": "red"}, request="r")).status == "invalid"


async def test_a_failure_skips_the_rest_and_secrets_never_show(tmp_path: Path) -> None:
    calls: list[str] = []
    secrets = Secrets()
    ex = executor(tmp_path, calls, secrets)
    ex.ctx.password = lambda wallet: secrets.add("pw-" + "s3cr3t" * 3) or "pw-" + "s3cr3t" * 3  # as Assistant does
    plan = Plan(f"explode, then look; by the way my key is {KEY} and password: hunter22",
                [Step("explode", {}), Step("look", {})])
    outcomes = await ex.run_plan(plan, confirm=lambda o: True)
    assert calls == ["explode"]
    assert [o.status for o in outcomes] == ["failed", "skipped"]
    assert "s3cr3t" not in (outcomes[0].error or "") and "<redacted>" in (outcomes[0].error or "")
    raw = assistant_log_path(tmp_path).read_text()
    assert KEY[2:] not in raw and "hunter22" not in raw and "s3cr3t" not in raw
    assert verify_log(assistant_log_path(tmp_path)).ok


async def test_assistant_answers_and_logs_without_the_key_a_user_pasted(tmp_path: Path) -> None:
    assistant = Assistant(home=tmp_path)
    reply = await assistant.handle(f"detect which nodes have GPUs, key {KEY}")
    assert reply.ok and [t["tool"] for t in assistant.trace] == ["cluster_inventory"]
    assert "hosts" in reply.text and KEY[2:] not in reply.text
    raw = assistant_log_path(tmp_path).read_text()
    assert KEY[2:] not in raw and "detect which nodes have GPUs" in raw


# -- the CLI ----------------------------------------------------------------------------------

def chat(aitbc_cmd, env, *args: str, stdin: str = "", timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*aitbc_cmd, "chat", *args], env=env, input=stdin, capture_output=True, text=True,
                          timeout=timeout)


def test_one_shot_and_repl(aitbc_cmd, cli_env, aitbc_home) -> None:
    done = chat(aitbc_cmd, cli_env, "detect which nodes have GPUs")
    assert done.returncode == 0, done.stderr
    assert "plan" in done.stdout and "cluster_inventory" in done.stdout
    assert "summary" in done.stdout  # the CLI's inventory tables
    repl = chat(aitbc_cmd, cli_env, stdin="help\nwhich hosts have graphics cards?\nsing me a song\n"
                                          "balance GPU memory usage with a global batch of 64\nexit\n")
    assert repl.returncode == 0, repl.stderr
    assert repl.stdout.count("cluster_inventory") >= 2 and "did not understand" in repl.stdout
    assert "batch plan, global batch 64" in repl.stdout and "no rank overflows" in repl.stdout
    log = read_log(assistant_log_path(aitbc_home))
    assert [e.fields["request"] for e in log if e.event == "tool_call"] == [
        "detect which nodes have GPUs", "which hosts have graphics cards?",
        "balance GPU memory usage with a global batch of 64"]


def chain_balance(home: Path) -> int:
    from aitbc_agent_sdk.chain import connect_rpc
    from aitbc_agent_sdk.devnet._network import wallet_store
    from aitbc_agent_sdk.profile import load_profile

    async def read() -> int:
        address = (await wallet_store(home).get("dev")).address
        w3 = await connect_rpc(load_profile(home).chain.rpc_url)
        try:
            return int(await w3.eth.get_balance(address))
        finally:
            await w3.provider.disconnect()
    return asyncio.run(read())


def trainings(home: Path) -> list[tuple[str, str]]:
    if not (home / "aitbc.db").exists():
        return []
    with sqlite3.connect(home / "aitbc.db") as conn:
        return conn.execute("SELECT training_id, phase FROM trainings").fetchall()


@pytest.fixture
def devnet(aitbc_cmd, cli_env, aitbc_home):
    aitbc_home.mkdir(parents=True, exist_ok=True)
    cli_env.pop("AITBC_WALLET_PASSWORD", None)
    up = subprocess.run([*aitbc_cmd, "devnet", "up", "--providers", "2", "--json"], env=cli_env, capture_output=True,
                        text=True, timeout=300)
    assert up.returncode == 0, up.stderr
    try:
        yield
    finally:
        subprocess.run([*aitbc_cmd, "devnet", "down"], env=cli_env, capture_output=True, timeout=120)


@pytest.mark.slow
def test_gate_on_a_real_devnet(aitbc_cmd, cli_env, aitbc_home, devnet) -> None:
    request = "find 2 workers under 1 eth each and train an mlp on digits for 1 round"
    before = chain_balance(aitbc_home)

    planned = chat(aitbc_cmd, cli_env, "--dry-run", request)
    assert planned.returncode == 0, planned.stderr
    assert "discover_workers" in planned.stdout and "Dry run" in planned.stdout
    # No terminal to ask and no --yes: exit 2 naming the flag, as run and distribute do; nothing spent.
    refused = chat(aitbc_cmd, cli_env, request, stdin="y\n")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "--yes" in refused.stderr and "Traceback" not in refused.stderr
    assert trainings(aitbc_home) == [] and chain_balance(aitbc_home) == before

    # A cost question gets a figure from the market's offers (workers x price x rounds), not a plan.
    priced = chat(aitbc_cmd, cli_env, "--json", "how much would 2 workers for 3 rounds cost?")
    assert priced.returncode == 0, priced.stderr
    step, = json.loads(priced.stdout)["steps"]
    estimate = step["result"]["data"]
    assert step["tool"] == "cost_estimate" and len(estimate["workers"]) == 2
    deposit = sum(int(w["price_wei"]) for w in estimate["workers"]) * 3
    assert estimate["cost"]["deposit_wei"] == str(deposit)
    assert f"{deposit / 10**18:.4f} ETH" in step["result"]["summary"]
    assert chain_balance(aitbc_home) == before

    done = chat(aitbc_cmd, cli_env, "--yes", "--json", request)
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert [s["status"] for s in reply["steps"]] == ["done"] * 4
    tid = reply["steps"][0]["result"]["training_id"]
    assert chain_balance(aitbc_home) < before  # the escrow is funded

    deadline = time.monotonic() + 240
    while True:
        status = json.loads(chat(aitbc_cmd, cli_env, "--json", f"how is {tid} doing?").stdout)
        snap = status["steps"][0]["result"]["data"]
        if snap["phase"] in ("complete", "failed") or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert snap["phase"] == "complete", snap
    paid = json.loads(chat(aitbc_cmd, cli_env, "--json", "show me the payments").stdout)
    payments = paid["steps"][0]["result"]["data"]["payments"]
    assert len(payments) == 2 and all(p["tx_hash"].startswith("0x") for p in payments)
    again = json.loads(chat(aitbc_cmd, cli_env, "--json", "--yes", "pay the workers").stdout)
    assert again["steps"][0]["result"]["data"]["payments"] == []  # already paid: nothing twice

    # the training's own log holds the chat's actions next to the coordinator's, and verifies
    audit = subprocess.run([*aitbc_cmd, "distributed-training", "audit", "--training-id", tid, "--json"],
                           env=cli_env, capture_output=True, text=True, timeout=120)
    entries = json.loads(audit.stdout)["entries"]
    actions = [e["fields"]["tool"] for e in entries if e["event"] == "assistant_action"]
    assert actions[:4] == ["training_init", "upload_data", "discover_workers", "distribute"]
    assert all(e["fields"]["request"] == request for e in entries if e["event"] == "assistant_action"
               and e["fields"]["tool"] != "pay_workers")
    assert "escrow_funded" in [e["event"] for e in entries] and json.loads(audit.stdout)["ok"]
    log = read_log(assistant_log_path(aitbc_home))
    assert [e.fields["granted"] for e in log if e.event == "confirmation"] == [False, True, True]
    password = (aitbc_home / "devnet" / "wallet-password").read_text().strip()
    assert password not in assistant_log_path(aitbc_home).read_text()


# -- the trusted cluster: train across hosts, lose the master, recover -------------------------

CKPT_SCRIPT = '''
import sys, time
import torch
from aitbc_agent_sdk.cluster import ddp

info = ddp.setup()
torch.manual_seed(info.rank)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = ddp.Checkpointer(info=info)
start = ckpt.load(model, opt)
steps, delay = int(sys.argv[1]), float(sys.argv[2])
for step in range(start + 1, steps + 1):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    ddp.emit("step", step=step, loss=loss.item(), attempt=ckpt.attempt, world_size=info.world_size)
    ckpt.maybe_save(step, model, opt)
    time.sleep(delay)
ddp.teardown()
'''


def rank0_step(jobs: Path) -> int:
    best = 0
    for events in jobs.glob("*/events.jsonl"):
        for line in events.read_text().splitlines():
            metric = json.loads(line).get("metric") or {}
            if metric.get("event") == "step" and metric.get("rank") == 0:
                best = max(best, int(metric["step"]))
    return best


@pytest.mark.slow
def test_chat_trains_across_hosts_and_recovers_from_a_crashed_master(tmp_path: Path) -> None:
    import sys as _sys

    _sys.path.insert(0, str(Path(__file__).parent))
    from netns_hosts import ClusterHarness, NetnsHosts, can_make_namespaces

    if why := can_make_namespaces():
        pytest.fail(f"multi-host tests need network namespaces: {why}", pytrace=False)
    shared = tmp_path / "shared"
    shared.mkdir()
    script = shared / "train_ckpt.py"
    script.write_text(CKPT_SCRIPT)
    members = ["h0", "h1", "h2"]  # equal hosts: the plan goes by name, so h0 is the master
    with NetnsHosts([*members, "ctl"]) as hosts:
        harness = ClusterHarness(hosts, tmp_path, members).setup()
        for name in members:
            harness.start_agent(name, "--no-sandbox")
        harness.wait_agents()
        jobs = harness.home / "clusters" / "jobs"
        out, err = tmp_path / "train.out", tmp_path / "train.err"
        request = (f"distribute {script} across 3 hosts of cluster lab, checkpoints in {shared / 'ckpt'} "
                   f"-- 40 0.25")
        proc = harness.spawn_cli("chat", "--yes", "--json", "--home", str(harness.home), request,
                                 stdout=out, stderr=err)
        try:
            deadline = time.monotonic() + 150
            while rank0_step(jobs) < 15:
                assert proc.poll() is None and time.monotonic() < deadline, err.read_text()[-4000:]
                time.sleep(0.3)
            for pid in hosts.pids("h0"):  # the master's whole node goes down: agent, torchrun, workers
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait(timeout=150)
        finally:
            if proc.poll() is None:
                proc.kill()
        first = json.loads(out.read_text())
        assert first["steps"][0]["tool"] == "cluster_train" and first["steps"][0]["status"] == "failed", first
        assert first["steps"][0]["arguments"]["hosts"] == 3

        recovered = harness.cli("chat", "--yes", "--json", "--home", str(harness.home),
                                "recover from a crashed node", timeout=240)
        assert recovered.returncode == 0, recovered.stdout[-6000:] + recovered.stderr[-3000:]
    reply = json.loads(recovered.stdout)
    [step] = reply["steps"]
    assert step["tool"] == "cluster_recover" and step["status"] == "done", step
    data = step["result"]["data"]
    assert data["left_out"] == ["h0"] and data["relaunched"]["ok"]
    assert sorted(data["relaunched"]["hosts"]) == ["h1", "h2"]
    continuity = data["continuity"]
    assert continuity["ok"] and continuity["effective_steps"] == 40, continuity
    assert continuity["attempts"][-1]["resumed_from"] >= 10
    assert "exactly once" in reply["answer"] and "Not answering now: h0" in reply["answer"]
    assert "BROKEN" not in reply["answer"]
    print(f"\nrecover answer: {reply['answer']}")
    log = read_log(assistant_log_path(harness.home))
    assert [e.fields["tool"] for e in log if e.event == "tool_call"] == ["cluster_train", "cluster_recover"]
    relaunch_audit = read_log(Path(data["relaunched"]["audit_log"]))
    assert relaunch_audit[0].event == "assistant-recovery" and relaunch_audit[0].fields["left_out"] == ["h0"]


async def test_chat_mounts_a_shared_dataset_on_every_node(aitbc_cmd, cli_env, aitbc_home, tmp_path, mosquitto,
                                                          ipfs_daemon) -> None:
    """Two cluster agents (real MQTT, a real js-ipfs daemon), one plain-words request: the data is
    fetched, verified and identical on both hosts, and the mount is audited."""
    from aitbc_agent_sdk.cluster._host_agent import ClusterAgent, HostAgentConfig
    from aitbc_agent_sdk.cluster.mounts import MountSettings
    from aitbc_agent_sdk.cluster._spec import ClusterSpec, HostSpec, save_cluster
    from aitbc_agent_sdk.devnet._network import wallet_store
    from aitbc_agent_sdk.messaging._channel import SignedChannel
    from aitbc_agent_sdk.messaging._mqtt import MqttBus
    from aitbc_agent_sdk.profile import BusSettings, devnet_password
    from aitbc_agent_sdk.storage._kubo import KuboClient

    payload = os.urandom(300_000)
    async with KuboClient(ipfs_daemon, timeout=60.0) as client:
        cid = await client.add(payload)
    password = devnet_password(aitbc_home, create=True)
    store = wallet_store(aitbc_home)
    made = {name: await store.create(name, password) for name in ("coord", "h0", "h1")}
    spec = ClusterSpec(name="lab", hosts=tuple(HostSpec(name=n, address=made[n].address) for n in ("h0", "h1")),
                       coordinators=(made["coord"].address,),
                       bus=BusSettings(host=mosquitto.host, port=mosquitto.port))
    save_cluster(aitbc_home, spec)
    cli_env.pop("AITBC_WALLET_PASSWORD", None)
    mountpoint = tmp_path / "mnt" / "dataset"
    async with contextlib.AsyncExitStack() as stack:
        for name in ("h0", "h1"):
            bus = await stack.enter_async_context(MqttBus(mosquitto.host, mosquitto.port,
                                                          client_id=f"mount-{name}-{time.time_ns()}", persistent=False))
            account = await store.unlock(name, password)
            await stack.enter_async_context(ClusterAgent(
                SignedChannel(bus, account), spec, broker_host=mosquitto.host,
                config=HostAgentConfig(work_root=tmp_path / name, mounts=MountSettings(ipfs_api=ipfs_daemon))))
        proc = await asyncio.create_subprocess_exec(
            *aitbc_cmd, "chat", "--yes", "--json", f"mount ipfs://{cid} at {mountpoint} on every node",
            env=cli_env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), timeout=240)
    assert proc.returncode == 0, out.decode()[-3000:] + err.decode()[-3000:]
    [step] = json.loads(out)["steps"]
    assert step["tool"] == "cluster_mount" and step["status"] == "done"
    assert step["arguments"]["source"] == f"ipfs://{cid}" and step["arguments"]["mount_point"] == str(mountpoint)
    report = step["result"]["data"]
    assert report["ok"] and sorted(report["hosts"]) == ["h0", "h1"]
    assert report["comparison"]["agreeing"] == ["h0", "h1"]
    assert all(h["access"]["readable"] and h["access"]["writable"] for h in report["hosts"].values())
    assert (mountpoint / cid).read_bytes() == payload
    mounts = read_log(aitbc_home / "clusters" / "mounts" / "lab.audit.jsonl")
    assert [e.event for e in mounts] == ["mount"] and mounts[0].fields["ok"]
    calls = [e.fields for e in read_log(assistant_log_path(aitbc_home)) if e.event == "tool_call"]
    assert [c["tool"] for c in calls] == ["cluster_mount"] and cid in calls[0]["request"]
