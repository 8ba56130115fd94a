"""``aitbc cluster train``: torchrun across real network namespaces, elastic recovery, the helper.

The multi-host tests (``slow``) run each host as a network namespace with its own
``aitbc cluster serve`` agent, mosquitto and the coordinator CLI in a control namespace, and
gloo over the namespaces' veths: nothing is mocked. They need root (``ip netns``), bubblewrap
and mosquitto, and fail (not skip) when those are missing. The pure parts (plan, argv,
parsers, step-log check) run everywhere.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from eth_account import Account

from aitbc_agent_sdk.cluster import ClusterSpec, HostSpec
from aitbc_agent_sdk.cluster._errors import ClusterError
from aitbc_agent_sdk.cluster._inventory import ClusterInventory, GpuInventory, HostInventory
from aitbc_agent_sdk.cluster._plan import plan_launch, torchrun_argv, torchrun_env
from aitbc_agent_sdk.cluster._protocol import RendezvousParser, TorchrunSpec, parse_metric_line
from aitbc_agent_sdk.cluster._recovery import choose_spare, verify_step_log
from aitbc_agent_sdk.audit import AuditLogError, read_log, verify_log

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from netns_hosts import ClusterHarness, NetnsHosts, can_make_namespaces  # noqa: E402


# --- pure: the plan and the torchrun command ---------------------------------------------------

def _host(name: str, *, gpus: int = 0, gpu_mem: int = 0, ram: int = 8 << 30, reachable: bool = True) -> HostInventory:
    address = Account.create().address
    if not reachable:
        return HostInventory.unreachable(name, address, "no reply within 5s")
    return HostInventory(name=name, address=address, cpu_cores=4, ram_total_bytes=ram, ram_available_bytes=ram,
                         gpus=tuple(GpuInventory(index=i, model="H100", memory_total_bytes=gpu_mem,
                                                 memory_free_bytes=gpu_mem) for i in range(gpus)))


def _cluster(*hosts: HostInventory) -> tuple[ClusterInventory, ClusterSpec]:
    spec = ClusterSpec(name="lab", hosts=tuple(HostSpec(name=h.name, address=h.address) for h in hosts))
    return ClusterInventory(cluster="lab", hosts=hosts), spec


def test_plan_prefers_gpu_then_memory_and_keeps_the_rest_as_spares():
    inv, spec = _cluster(_host("cpu-big", ram=64 << 30), _host("gpu-small", gpus=2, gpu_mem=40 << 30),
                         _host("gpu-big", gpus=2, gpu_mem=80 << 30), _host("cpu-small", ram=4 << 30),
                         _host("down", gpus=8, gpu_mem=80 << 30, reachable=False))
    plan = plan_launch(inv, spec, hosts=2, job_id="j1", min_hosts=1)
    assert [h.name for h in plan.hosts] == ["gpu-big", "gpu-small"]
    assert plan.master.name == "gpu-big" and plan.master.role == "master"
    assert [h.name for h in plan.spares] == ["cpu-big", "cpu-small"]  # the unreachable host is never planned
    assert (plan.nproc_per_node, plan.backend, plan.min_nodes, plan.max_nodes) == (2, "nccl", 1, 2)
    cpu = plan_launch(inv, spec, hosts=3, job_id="j2")
    assert cpu.backend == "gloo" and cpu.nproc_per_node == 1 and cpu.hosts[2].name == "cpu-big"


@pytest.mark.parametrize("kwargs, message", [
    ({"hosts": 5}, "4 reachable hosts, 5 wanted"),
    ({"hosts": 2, "min_hosts": 3}, "--min-hosts must be between 1 and --hosts"),
    ({"hosts": 2, "nproc_per_node": 0}, "--nproc-per-node must be >= 1"),
])
def test_plan_refuses_what_cannot_run(kwargs, message):
    inv, spec = _cluster(*(_host(f"h{i}") for i in range(4)), _host("x", reachable=False))
    with pytest.raises(ClusterError, match=message):
        plan_launch(inv, spec, job_id="j", **kwargs)


def test_torchrun_command_has_the_three_multi_namespace_settings():
    spec = TorchrunSpec(job_id="lab-1", script="/data/train.py", script_args=("--steps", "5"), nproc_per_node=1,
                        min_nodes=2, max_nodes=3, max_restarts=3, master_addr="10.0.0.1", port=29400,
                        checkpoint_dir="/shared/ckpt", checkpoint_every=5)
    master = torchrun_argv(spec, is_master=True, local_addr="10.0.0.1", python="/venv/bin/python")
    worker = torchrun_argv(spec, is_master=False, local_addr="10.0.0.2", python="/venv/bin/python")
    assert master[:3] == ["/venv/bin/python", "-m", "torch.distributed.run"]
    for flag in ("--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29400", "--rdzv-id=lab-1", "--nnodes=2:3",
                 "--nproc-per-node=1", "--max-restarts=3"):
        assert flag in master and flag in worker
    assert "--rdzv-conf=is_host=1,last_call_timeout=5,join_timeout=300" in master
    assert "--rdzv-conf=is_host=0,last_call_timeout=5,join_timeout=300" in worker
    assert "--local-addr=10.0.0.1" in master and "--local-addr=10.0.0.2" in worker
    assert master[-3:] == ["/data/train.py", "--steps", "5"]
    env = torchrun_env(spec, ifname="eth0", gpus=False)
    assert env["GLOO_SOCKET_IFNAME"] == "eth0" and "NCCL_SOCKET_IFNAME" not in env
    assert env["CHECKPOINT_DIR"] == "/shared/ckpt" and env["CHECKPOINT_EVERY"] == "5"
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"  # else a joining spare hangs (see torchrun_env)
    assert torchrun_env(spec, ifname="eth0", gpus=True)["NCCL_SOCKET_IFNAME"] == "eth0"


def test_rendezvous_and_metric_lines_are_parsed_from_torchrun_output():
    lines = """I1130 01:36:33.175000 21391 torch/distributed/elastic/agent/server/api.py:553] [default] Rendezvous complete for workers. Result:
I1130 01:36:33.175000 21391 torch/distributed/elastic/agent/server/api.py:553]   restart_count=2
I1130 01:36:33.175000 21391 torch/distributed/elastic/agent/server/api.py:553]   master_addr=10.231.77.1
I1130 01:36:33.175000 21391 torch/distributed/elastic/agent/server/api.py:553]   group_rank=1
I1130 01:36:33.175000 21391 torch/distributed/elastic/agent/server/api.py:553]   group_world_size=3
I1130 01:36:33.175000 21391 torch/distributed/elastic/agent/server/api.py:553]   local_ranks=[0]
I1130 01:36:33.175000 21391 torch/distributed/elastic/agent/server/api.py:553]   global_ranks=[1]
I1130 01:36:33.175000 21391 torch/distributed/elastic/agent/server/api.py:553]   global_world_sizes=[3]""".splitlines()
    parser = RendezvousParser()
    found = [r for r in map(parser.feed, lines) if r is not None]
    assert len(found) == 1
    info = found[0]
    assert (info.restart_count, info.group_rank, info.group_world_size, info.world_size) == (2, 1, 3, 3)
    assert info.master_addr == "10.231.77.1" and info.global_ranks == (1,)
    assert parse_metric_line('AITBC_METRIC {"event": "step", "step": 3}') == {"event": "step", "step": 3}
    assert parse_metric_line("AITBC_METRIC {broken") is None and parse_metric_line("plain") is None


def _rec(event: str, t: float, attempt: str = "", **fields):
    return {"event": event, "time": t, "attempt": attempt, **fields}


def test_step_log_check_accepts_a_resume_from_the_last_checkpoint():
    records = [_rec("resume", 0, "a", resumed_from=0)]
    records += [_rec("step", i, "a", step=i) for i in range(1, 8)]
    records += [_rec("checkpoint", 5.5, step=5)]
    records += [_rec("resume", 10, "b", resumed_from=5)] + [_rec("step", 10 + i, "b", step=i) for i in range(6, 13)]
    report = verify_step_log(records)
    assert report.ok, report.problems
    assert report.effective_steps == 12 and report.rolled_back_steps == 2  # steps 6 and 7 ran again
    assert [a.resumed_from for a in report.attempts] == [0, 5]


@pytest.mark.parametrize("second, problem", [
    ([_rec("resume", 10, "b", resumed_from=0)] + [_rec("step", 10 + i, "b", step=i) for i in range(1, 13)],
     "had been checkpointed"),  # restarted from scratch: steps 1..5 applied twice
    ([_rec("resume", 10, "b", resumed_from=5)] + [_rec("step", 10 + i, "b", step=i) for i in range(7, 13)],
     "not consecutive"),  # step 6 lost
    ([_rec("resume", 10, "b", resumed_from=6)] + [_rec("step", 10 + i, "b", step=i) for i in range(7, 13)],
     "no checkpoint record"),
])
def test_step_log_check_catches_lost_and_repeated_steps(second, problem):
    first = [_rec("resume", 0, "a", resumed_from=0)] + [_rec("step", i, "a", step=i) for i in range(1, 8)]
    report = verify_step_log([*first, _rec("checkpoint", 5.5, step=5), *second])
    assert not report.ok and any(problem in p for p in report.problems), report.problems


def test_spare_choice_skips_used_and_unhealthy_hosts():
    inv, spec = _cluster(_host("a"), _host("b"), _host("c"), _host("d"))
    plan = plan_launch(inv, spec, hosts=1, job_id="j")
    first, second, third = plan.spares
    assert choose_spare(plan.spares, used={first.name}, unhealthy=set()) == second
    assert choose_spare(plan.spares, used={first.name}, unhealthy={second.name}) == third
    assert choose_spare(plan.spares, used={s.name for s in plan.spares}, unhealthy=set()) is None


# --- real hosts: network namespaces -----------------------------------------------------------

# A user's plain DDP script, nothing from the SDK: the example users start from.
DDP_EXAMPLE = REPO / "examples" / "train_ddp.py"


@pytest.fixture
def netns_ok():
    why = can_make_namespaces()
    if why:
        pytest.fail(f"multi-host tests need network namespaces: {why}", pytrace=False)


def _events(home: Path, job_id: str) -> list[dict]:
    path = home / "clusters" / "jobs" / job_id / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _lines(events: list[dict]) -> list[tuple[str, str]]:
    return [(e["host"], line) for e in events if e["kind"] == "log" for line in e["lines"]]


def _diagnose(harness: ClusterHarness, *extra: str) -> str:
    parts = [*extra]
    for name in harness.members:
        log = harness.agent_log(name)
        parts.append(f"--- agent {name}:\n" + (log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"))
    return "\n".join(parts)


@pytest.mark.slow
def test_three_hosts_train_plain_ddp_with_identical_weights_and_falling_loss(netns_ok, tmp_path):
    import torch

    shared = tmp_path / "shared"
    shared.mkdir()
    script = DDP_EXAMPLE  # run in place: each host's sandbox binds its directory read-only
    g = torch.Generator().manual_seed(7)
    x = torch.randn(96, 4, generator=g)
    torch.save({"x": x, "y": x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1}, shared / "data.pt")
    members = ["h0", "h1", "h2"]
    started = time.monotonic()
    with NetnsHosts([*members, "ctl"]) as hosts:
        harness = ClusterHarness(hosts, tmp_path, members).setup()
        for name in members:
            harness.start_agent(name)
        harness.wait_agents()
        too_many = harness.cli("cluster", "train", "--cluster", "lab", "--wallet", "coord", "--hosts", "4",
                               "--script", str(script), "--home", str(harness.home))
        assert too_many.returncode == 2 and "cluster lab has only 3 hosts" in too_many.stderr, too_many.stderr
        unreadable = harness.cli("cluster", "train", "--cluster", "lab", "--wallet", "coord", "--hosts", "3",
                                 "--script", str(script), "--dataset", str(shared / "missing.pt"),
                                 "--home", str(harness.home))
        assert unreadable.returncode == 2, unreadable.stdout + unreadable.stderr
        assert "preflight failed" in unreadable.stderr
        assert all(f"{h}: dataset {shared / 'missing.pt'} unreadable" in unreadable.stderr.replace("\n", " ")
                   for h in members), unreadable.stderr
        done = harness.cli("cluster", "train", "--cluster", "lab", "--wallet", "coord", "--hosts", "3",
                           "--script", str(script), "--dataset", str(shared / "data.pt"), "--max-restarts", "0",
                           "--rendezvous-timeout", "90", "--timeout", "110", "--home", str(harness.home), "--json",
                           "--", str(shared / "data.pt"), "30", timeout=150)
        assert done.returncode == 0, _diagnose(harness, done.stdout[-3000:], done.stderr[-5000:])
    result = json.loads(done.stdout)
    assert result["ok"] and result["world_size_confirmed"] == 3 == result["world_size_expected"]
    assert sorted(result["hosts"]) == members and all(h["state"] == "done" and h["returncode"] == 0
                                                       for h in result["hosts"].values())
    assert sorted(h["group_rank"] for h in result["hosts"].values()) == [0, 1, 2]
    assert result["master"] in members and result["master_addr"].startswith("10.231.77.")
    assert all(r["master_reachable"] and r["ifname"] == "eth0" for r in result["preflight"].values())

    lines = _lines(_events(harness.home, result["job_id"]))
    finals = [json.loads(line[len("FINAL "):]) for _, line in lines if line.startswith("FINAL ")]
    assert sorted(f["rank"] for f in finals) == [0, 1, 2] and {f["world"] for f in finals} == {3}
    assert len({f["digest"] for f in finals}) == 1, finals  # DDP kept every rank's weights identical
    losses = [json.loads(line) for _, line in lines if line.startswith('{"rank": 0, "step"')]
    assert len(losses) == 30 and losses[-1]["loss"] < 0.5 * losses[0]["loss"], losses
    ranks_by_host = {host: json.loads(line[6:])["rank"] for host, line in lines if line.startswith("FINAL ")}
    assert sorted(ranks_by_host) == members  # each host ran one rank, streamed back under its own name

    audit = Path(result["audit_log"])
    assert verify_log(audit).ok
    events = [e.event for e in read_log(audit)]
    for expected in ("job-planned", "preflight", "launched", "rendezvous-formed", "job-finished"):
        assert expected in events, events
    assert events.count("launched") == 3
    print(f"3-host DDP: {time.monotonic() - started:.1f}s")


HELPER_SCRIPT = '''
"""Uses the SDK helper: checkpoints on shared storage, memory-balanced batches, metric lines."""
import json, sys, time
import torch
from aitbc_agent_sdk.cluster import ddp

data_path, steps, delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
oom_at = int(sys.argv[4]) if len(sys.argv) > 4 else 0
info = ddp.setup()
data = torch.load(data_path)
x, y = data["x"], data["y"]
torch.manual_seed(0)
model = torch.nn.Linear(x.shape[1], 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)  # momentum: optimizer state must survive
ckpt = ddp.Checkpointer(info=info)
start = ckpt.load(model, opt)
budget = ddp.local_budget(info, memory_per_sample_bytes=1 << 20, config_memory_bytes=64 << 20)
# Fault injection (CPU-only machine, no allocator to exhaust): rank 1 "runs out of memory" at step oom_at.
inject = (lambda step, rank, size: step == oom_at and rank == 1 and size > 8) if oom_at else None
stepper = ddp.BalancedStep.from_budgets(model, opt, 24, budget, info, inject_oom=inject)
loss_fn = torch.nn.functional.mse_loss
for step in range(start + 1, steps + 1):
    idx = torch.tensor(ddp.global_batch_indices(step, 24, len(x)))
    began = time.perf_counter()
    result = stepper.run(step, lambda off, n: (x[idx[off:off + n]], y[idx[off:off + n]]), loss_fn)
    mem, source = ddp.memory_used(info.device)
    ddp.emit("step", step=step, loss=result.loss, attempt=ckpt.attempt, world_size=info.world_size,
             batch_size=result.sizes[info.rank], sizes=list(result.sizes),
             samples_per_s=result.global_batch / (time.perf_counter() - began), memory_used_bytes=mem,
             memory_source=source, memory_budget_bytes=budget.free_memory_bytes, budget_source=budget.source)
    ckpt.maybe_save(step, model, opt)
    time.sleep(delay)
final = {"rank": info.rank, "world": info.world_size, "digest": ddp.weights_digest(model),
         "weights": [p.detach().flatten().tolist() for p in model.parameters()]}
sys.stdout.write("FINAL " + json.dumps(final) + "\\n")  # one write: ranks sharing a pipe do not interleave
sys.stdout.flush()
ddp.teardown()
'''


def _reference_weights(data_path: Path, steps: int) -> list[list[float]]:
    """The same training in one process on the whole global batch of every step."""
    import torch

    from aitbc_agent_sdk.cluster import ddp

    data = torch.load(data_path)
    x, y = data["x"], data["y"]
    torch.manual_seed(0)
    model = torch.nn.Linear(x.shape[1], 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(1, steps + 1):
        idx = torch.tensor(ddp.global_batch_indices(step, 24, len(x)))
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[idx]), y[idx]).backward()
        opt.step()
    return [p.detach().flatten().tolist() for p in model.parameters()]


def _dataset(shared: Path) -> Path:
    import torch

    g = torch.Generator().manual_seed(11)
    x = torch.randn(200, 4, generator=g)
    path = shared / "data.pt"
    torch.save({"x": x, "y": x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) - 0.3}, path)
    return path


def _wait_step(home: Path, job_dir_parent: Path, at_least: int, proc: subprocess.Popen, timeout: float) -> str:
    """Until rank 0 of the (only) job reports step >= at_least; returns the job id."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the train command ended early ({proc.returncode})"
        for events in job_dir_parent.glob("*/events.jsonl"):
            for line in events.read_text().splitlines():
                event = json.loads(line)
                metric = event.get("metric") or {}
                if metric.get("event") == "step" and metric.get("rank") == 0 and metric.get("step", 0) >= at_least:
                    return events.parent.name
        time.sleep(0.2)
    raise AssertionError(f"rank 0 did not reach step {at_least} within {timeout}s")


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _close_weights(a: list[list[float]], b: list[list[float]], tol: float = 1e-4) -> bool:
    return all(abs(p - q) <= tol * max(1.0, abs(q))
               for pa, pb in zip(a, b, strict=True) for p, q in zip(pa, pb, strict=True))


@pytest.mark.slow
def test_elastic_run_survives_a_killed_host_resumes_from_checkpoint_and_hands_its_slot_to_a_spare(netns_ok, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    script = shared / "train_helper.py"
    script.write_text(HELPER_SCRIPT)
    data = _dataset(shared)
    steps = 32
    members = ["h0", "h1", "h2", "h3"]  # h3: the spare (all equal, so the plan is by name: h0 master)
    started = time.monotonic()
    with NetnsHosts([*members, "ctl"]) as hosts:
        harness = ClusterHarness(hosts, tmp_path, members).setup()
        for name in members:
            harness.start_agent(name)
        harness.wait_agents()
        out, err = tmp_path / "train.out", tmp_path / "train.err"
        proc = harness.spawn_cli("cluster", "train", "--cluster", "lab", "--wallet", "coord", "--hosts", "3",
                                 "--min-hosts", "2", "--max-restarts", "3", "--script", str(script),
                                 "--checkpoint-dir", str(shared / "ckpt"), "--checkpoint-every", "5",
                                 "--dataset", str(data), "--rendezvous-timeout", "100", "--timeout", "170",
                                 "--home", str(harness.home), "--json", "--", str(data), str(steps), "0.3",
                                 stdout=out, stderr=err)
        watched = tmp_path / "monitor.out"
        monitor = harness.spawn_cli("cluster", "monitor", "--cluster", "lab", "--follow", "--timeout", "170",
                                    "--json", "--home", str(harness.home), stdout=watched, stderr=tmp_path / "mon.err")
        try:
            _wait_step(harness.home, harness.home / "clusters" / "jobs", 12, proc, timeout=120)
            victims = hosts.find("h2", str(script))  # torchrun, its worker and their sandbox: not the agent
            assert victims, "no training process found on h2"
            killed_at = time.monotonic()
            _kill(victims)
            proc.wait(timeout=170)
        finally:
            if proc.poll() is None:
                proc.kill()
            monitor.send_signal(signal.SIGINT)  # Ctrl-C: it flushes what it printed and exits
            monitor.wait(timeout=30)
        diagnosis = _diagnose(harness, out.read_text()[-2000:], err.read_text()[-6000:])
        assert proc.returncode == 0, diagnosis
    result = json.loads(out.read_text())
    assert result["ok"], diagnosis
    assert [f["host"] for f in result["failures"]] == ["h2"], result["failures"]
    # aitbc cluster monitor, run from the control host meanwhile, saw every rank's metrics as they came
    rows = [json.loads(line) for line in watched.read_text().splitlines() if line.startswith("{")]
    steps_seen = [r for r in rows if r.get("event") == "step"]
    assert {r["host"] for r in steps_seen} == {"h0", "h1", "h2", "h3"}, watched.read_text()[-2000:]
    assert all(r["memory_source"] == "rss" and r["budget_source"] == "config" and r["samples_per_s"] > 0
               for r in steps_seen)
    assert result["spares_used"] == ["h3"]
    assert result["hosts"]["h2"]["state"] == "failed"
    assert all(result["hosts"][h]["state"] == "done" for h in ("h0", "h1", "h3")), result["hosts"]

    # No optimizer step lost or applied twice beyond the checkpoint: from rank 0's step log ...
    continuity = result["continuity"]
    assert continuity["ok"], continuity
    assert continuity["effective_steps"] == steps and len(continuity["attempts"]) >= 2
    assert continuity["attempts"][1]["resumed_from"] >= 10 and continuity["attempts"][1]["resumed_from"] % 5 == 0
    # ... and from the weights: every rank equal, and equal to one process training on every global batch.
    lines = _lines(_events(harness.home, result["job_id"]))
    finals = [json.loads(line[6:]) for _, line in lines if line.startswith("FINAL ")]
    last = [f for f in finals if f["world"] == 3]
    assert len({f["digest"] for f in last}) == 1 and len(last) == 3, finals
    reference = _reference_weights(data, steps)
    assert _close_weights(last[0]["weights"], reference), (last[0], reference)

    audit = read_log(Path(result["audit_log"]))
    assert verify_log(Path(result["audit_log"])).ok
    names = [e.event for e in audit]
    for expected in ("rendezvous-formed", "host-failed", "spare-assigned", "rendezvous-reformed",
                     "checkpoint-continuity", "job-finished"):
        assert expected in names, names
    reformed = next(e for e in audit if e.event == "rendezvous-reformed")
    assert sorted(reformed.fields["node_ranks"]) == ["h0", "h1", "h3"] and reformed.fields["world_size"] == 3
    assert min(reformed.fields["restart_counts"][h] for h in ("h0", "h1")) >= 1  # the survivors really restarted
    assert names.index("host-failed") < names.index("spare-assigned") < names.index("rendezvous-reformed")
    failed = next(e for e in audit if e.event == "host-failed")
    assert failed.fields["host"] == "h2"
    spare = next(e for e in audit if e.event == "spare-assigned")
    assert (spare.fields["failed"], spare.fields["spare"]) == ("h2", "h3")
    print(f"elastic run: {time.monotonic() - started:.1f}s, {time.monotonic() - killed_at:.1f}s after the kill")


@pytest.mark.slow
def test_a_killed_torchrun_alone_takes_its_orphaned_worker_with_it_and_the_job_ends_promptly(netns_ok, tmp_path):
    """torchrun killed with SIGKILL while its worker runs: without the agent's pid namespace the worker
    lives on and the other hosts wait 300 s in torchrun's exit barrier. Here the worker goes at once,
    the others re-rendezvous without the host (no spare) and the job finishes well before that."""
    shared = tmp_path / "shared"
    shared.mkdir()
    script = shared / "train_helper.py"
    script.write_text(HELPER_SCRIPT)
    data = _dataset(shared)
    members = ["h0", "h1", "h2"]
    with NetnsHosts([*members, "ctl"]) as hosts:
        harness = ClusterHarness(hosts, tmp_path, members).setup()
        for name in members:
            harness.start_agent(name, "--no-sandbox")  # the plain path: torchrun in its own pid namespace
        harness.wait_agents()
        out, err = tmp_path / "train.out", tmp_path / "train.err"
        proc = harness.spawn_cli("cluster", "train", "--cluster", "lab", "--wallet", "coord", "--hosts", "3",
                                 "--min-hosts", "2", "--max-restarts", "3", "--script", str(script),
                                 "--checkpoint-dir", str(shared / "ckpt"), "--checkpoint-every", "5",
                                 "--no-sandbox", "--rendezvous-timeout", "100", "--timeout", "170",
                                 "--home", str(harness.home), "--json", "--", str(data), "30", "0.4",
                                 stdout=out, stderr=err)
        try:
            _wait_step(harness.home, harness.home / "clusters" / "jobs", 8, proc, timeout=120)
            torchrun = [p for p in hosts.find("h2", "torch.distributed.run", str(script))
                        if "unshare" not in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")]
            workers = [p for p in hosts.find("h2", str(script)) if p not in torchrun
                       and "torch.distributed.run" not in Path(f"/proc/{p}/cmdline").read_bytes().decode()]
            assert len(torchrun) == 1 and workers, (torchrun, workers)
            killed_at = time.monotonic()
            _kill(torchrun)  # the agent alone: its worker is not touched
            time.sleep(3)
            assert not [p for p in workers if Path(f"/proc/{p}").exists()
                        and "Z" not in Path(f"/proc/{p}/stat").read_text().split()[2]], "the worker was orphaned"
            proc.wait(timeout=150)
            ended = time.monotonic() - killed_at
        finally:
            if proc.poll() is None:
                proc.kill()
        diagnosis = _diagnose(harness, out.read_text()[-2000:], err.read_text()[-6000:])
        assert proc.returncode == 0, diagnosis
        assert not hosts.find("h2", str(script)), "training processes left on h2"
    assert ended < 120, f"the job took {ended:.0f}s after the kill (torchrun's exit barrier is 300 s)"
    result = json.loads(out.read_text())
    assert result["ok"] and [f["host"] for f in result["failures"]] == ["h2"]
    assert result["continuity"]["ok"], result["continuity"]
    names = [e.event for e in read_log(Path(result["audit_log"]))]
    assert "host-failed" in names and "recovery-continue" in names and "rendezvous-reformed" in names, names
    print(f"killed torchrun: job ended {ended:.1f}s after the kill")


# --- the helper (cluster/ddp.py): exact resume, and an OOM that rebalances instead of killing ----------

def test_checkpointer_resumes_exactly_after_a_crash(tmp_path, monkeypatch):
    """One rank (a world of 1 over gloo): 7 steps, crash, resume from step 5's checkpoint, finish:
    the weights equal an uninterrupted run's, momentum included, and the step log says so."""
    import torch
    import torch.distributed as dist

    from aitbc_agent_sdk.cluster import ddp

    data = _dataset(tmp_path)
    blob = torch.load(data)
    x, y = blob["x"], blob["y"]
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    lines: list[str] = []
    monkeypatch.setattr(ddp.sys, "stdout", type("Out", (), {"write": lambda self, s: lines.append(s),
                                                            "flush": lambda self: None})())
    try:
        info = ddp.dist_info("gloo")

        def run(stop_after: int | None) -> list[float]:
            torch.manual_seed(0)
            model = torch.nn.Linear(4, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            ckpt = ddp.Checkpointer(tmp_path / "shared", every=5, info=info)
            start = ckpt.load(model, opt)
            budget = ddp.local_budget(info, memory_per_sample_bytes=1, config_memory_bytes=1 << 20)
            assert budget.source == "config"  # CPU-only: the budget is configuration, and says so
            stepper = ddp.BalancedStep.from_budgets(model, opt, 24, budget, info)
            for step in range(start + 1, 13):
                idx = torch.tensor(ddp.global_batch_indices(step, 24, len(x)))
                result = stepper.run(step, lambda off, n: (x[idx[off:off + n]], y[idx[off:off + n]]),
                                     torch.nn.functional.mse_loss)
                ddp.emit("step", step=step, loss=result.loss, attempt=ckpt.attempt)
                ckpt.maybe_save(step, model, opt)
                if step == stop_after:
                    return []
            return [v for p in model.parameters() for v in p.detach().flatten().tolist()]

        run(stop_after=7)
        resumed = run(stop_after=None)
    finally:
        dist.destroy_process_group()
    reference = [v for p in _reference_weights(data, 12) for v in p]
    assert resumed == pytest.approx(reference, rel=1e-5, abs=1e-6)
    records = [json.loads(line[len("AITBC_METRIC "):]) for line in lines if line.startswith("AITBC_METRIC ")]
    report = verify_step_log(records)
    assert report.ok and report.effective_steps == 12 and report.rolled_back_steps == 2, report
    assert [a.resumed_from for a in report.attempts] == [0, 5]
    saved = sorted(p.name for p in (tmp_path / "shared" / "checkpoints").iterdir())
    assert saved == ["latest.json", "step-00000005.pt", "step-00000010.pt"]  # no temporary file left


@pytest.mark.slow
def test_an_oom_on_one_rank_shrinks_its_batch_and_training_goes_on_exactly(tmp_path):
    """Two gloo ranks under torchrun on this host; rank 1 gets a *simulated* OutOfMemoryError at step 4
    (fault injection: a CPU-only machine has no allocator to exhaust). The step is re-planned, rank 1's
    share halves, rank 0 takes the rest, no step is lost or doubled, and the weights match the reference."""
    script = tmp_path / "train_helper.py"
    script.write_text(HELPER_SCRIPT)
    data = _dataset(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AITBC_")}
    env.update(CHECKPOINT_DIR=str(tmp_path / "ckpt"), CHECKPOINT_EVERY="5", OMP_NUM_THREADS="1",
               TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(script), str(data), "8", "0", "4"], capture_output=True, text=True, timeout=180,
                          env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = [parse_metric_line(line) for line in done.stdout.splitlines()]
    metrics = [m for m in metrics if m]
    ooms = [m for m in metrics if m["event"] == "oom"]
    # one re-plan, seen by both ranks (each prints it)
    assert sorted(m["rank"] for m in ooms) == [0, 1] and all(m["simulated"] for m in ooms), ooms
    first = ooms[0]
    assert first["step"] == 4 and first["ranks"] == [1] and first["before"] == [12, 12] and first["after"] == [18, 6]
    steps = {(m["rank"], m["step"]): m for m in metrics if m["event"] == "step"}
    assert steps[(1, 3)]["batch_size"] == 12 and steps[(1, 4)]["batch_size"] == 6 and steps[(0, 4)]["batch_size"] == 18
    assert steps[(1, 8)]["sizes"] == [18, 6]  # the smaller share sticks
    assert all(steps[(0, s)]["budget_source"] == "config" and steps[(0, s)]["memory_source"] == "rss"
               for s in range(1, 9))
    assert verify_step_log([m for m in metrics if m["rank"] == 0]).ok
    finals = [json.loads(line[6:]) for line in done.stdout.splitlines() if line.startswith("FINAL ")]
    assert len(finals) == 2 and finals[0]["digest"] == finals[1]["digest"]
    assert _close_weights(finals[0]["weights"], _reference_weights(data, 8))


# --- aitbc cluster monitor ---------------------------------------------------------------------

async def test_cluster_monitor_keeps_the_latest_row_per_rank_of_this_job_from_its_hosts_only():
    import asyncio

    from aitbc_agent_sdk.cluster import ClusterMonitor
    from aitbc_agent_sdk.cluster._protocol import HostStatus, JobEvent, events_topic, status_topic
    from aitbc_agent_sdk.messaging import InMemoryBus, SignedChannel

    bus = InMemoryBus()
    host, impostor = Account.create(), Account.create()
    spec = ClusterSpec(name="mon", hosts=(HostSpec(name="gpu-1", address=host.address),))
    heard: list[dict] = []
    monitor = ClusterMonitor(SignedChannel(bus, Account.create()), spec, job="job-1", on_metric=heard.append)
    ready = asyncio.Event()
    watching = asyncio.create_task(monitor.watch(None, on_ready=ready.set))
    await asyncio.wait_for(ready.wait(), 10)
    ours, theirs = SignedChannel(bus, host), SignedChannel(bus, impostor)
    for seq, (channel, job, step) in enumerate(((theirs, "job-1", 99), (ours, "job-1", 1), (ours, "job-1", 2),
                                                (ours, "job-2", 50))):
        await channel.publish(events_topic("mon", job, host.address),
                              JobEvent(job_id=job, host="gpu-1", seq=seq, kind="metric",
                                       metric={"rank": 0, "step": step}))
    gpu = {"index": 0, "memory_total_bytes": 2 << 30, "memory_free_bytes": 1 << 30}
    await ours.publish(status_topic("mon", host.address),
                       HostStatus(host="gpu-1", job_id="job-1", state="running", gpus=(gpu,)), retain=True)
    async with asyncio.timeout(10):
        while ("gpu-1", "gpu0") not in monitor.latest:
            await asyncio.sleep(0.01)
    watching.cancel()
    await asyncio.gather(watching, return_exceptions=True)
    await bus.close()
    assert [r["step"] for r in heard] == [1, 2]  # the impostor's and the other job's metrics are not there
    assert monitor.latest[("gpu-1", "0")] == {"rank": 0, "step": 2, "host": "gpu-1", "job": "job-1"}
    assert monitor.latest[("gpu-1", "gpu0")]["gpu"] == gpu
    assert [r["host"] for r in monitor.rows()] == ["gpu-1", "gpu-1"]


async def test_monitor_streams_signed_per_rank_metrics_and_ignores_strangers(mosquitto, aitbc_home, aitbc_cmd, cli_env):
    """A host publishes metrics over the real broker while ``aitbc cluster monitor --follow`` runs;
    an impostor's message on the same topic (signed, but not by a cluster host) is not shown."""
    import asyncio

    from aitbc_agent_sdk.cluster._protocol import HostStatus, JobEvent, events_topic, status_topic
    from aitbc_agent_sdk.cluster._spec import save_cluster
    from aitbc_agent_sdk.messaging._mqtt import MqttBus
    from aitbc_agent_sdk.profile import BusSettings

    host, impostor = Account.create(), Account.create()
    save_cluster(aitbc_home, ClusterSpec(name="mon", hosts=(HostSpec(name="gpu-1", address=host.address),),
                                         bus=BusSettings(host="127.0.0.1", port=mosquitto.port)))
    metric = {"event": "step", "rank": 3, "step": 17, "loss": 0.25, "samples_per_s": 812.5,
              "memory_used_bytes": 300 << 20, "memory_source": "rss", "memory_budget_bytes": 1 << 30,
              "budget_source": "config"}
    follow = await asyncio.create_subprocess_exec(
        *aitbc_cmd, "cluster", "monitor", "--cluster", "mon", "--follow", "--timeout", "12", "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=cli_env)
    async with MqttBus("127.0.0.1", mosquitto.port, client_id=f"mon-test-{time.time_ns()}", persistent=False) as bus:
        from aitbc_agent_sdk.messaging import SignedChannel

        ours, theirs = SignedChannel(bus, host), SignedChannel(bus, impostor)
        assert follow.stderr is not None
        ready = await asyncio.wait_for(follow.stderr.readline(), 120)  # subscribed (after importing the CLI)
        assert b"following cluster mon" in ready, ready
        for seq, channel in enumerate((theirs, ours, theirs)):
            fake = {**metric, "step": 99} if channel is theirs else metric
            event = JobEvent(job_id="job-1", host="gpu-1", seq=seq, kind="metric", metric=fake)
            await channel.publish(events_topic("mon", "job-1", host.address), event)
        await ours.publish(status_topic("mon", host.address),
                           HostStatus(host="gpu-1", job_id="job-1", state="running", ranks={"3": metric}), retain=True)
        out, err = await asyncio.wait_for(follow.communicate(), 60)
        snapshot = await asyncio.create_subprocess_exec(
            *aitbc_cmd, "cluster", "monitor", "--cluster", "mon", "--wait", "3", stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env={**cli_env, "COLUMNS": "200"})
        table, _ = await asyncio.wait_for(snapshot.communicate(), 60)
        await ours.clear_retained(status_topic("mon", host.address))
    assert follow.returncode == 0, err.decode()
    rows = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
    assert rows == [{**metric, "host": "gpu-1", "job": "job-1"}], rows  # the impostor's step 99 is not there
    text = table.decode()
    assert "gpu-1" in text and "812.5" in text and "config, CPU-only" in text and "(rss)" in text, text


@pytest.mark.slow
def test_a_host_whose_agent_dies_is_detected_by_its_silence_and_replaced_by_the_spare(netns_ok, tmp_path):
    """kill -9 of a host's agent daemon: its sandboxed torchrun dies with it (bwrap --die-with-parent),
    the coordinator hears nothing from the host for --host-timeout, records it, and the spare joins."""
    shared = tmp_path / "shared"
    shared.mkdir()
    script = shared / "train_helper.py"
    script.write_text(HELPER_SCRIPT)
    data = _dataset(shared)
    members = ["h0", "h1", "h2", "h3"]
    with NetnsHosts([*members, "ctl"]) as hosts:
        harness = ClusterHarness(hosts, tmp_path, members).setup()
        for name in members:
            harness.start_agent(name)
        harness.wait_agents()
        out, err = tmp_path / "train.out", tmp_path / "train.err"
        proc = harness.spawn_cli("cluster", "train", "--cluster", "lab", "--wallet", "coord", "--hosts", "3",
                                 "--min-hosts", "2", "--script", str(script), "--checkpoint-dir", str(shared / "ckpt"),
                                 "--checkpoint-every", "5", "--host-timeout", "8", "--rendezvous-timeout", "100",
                                 "--timeout", "170", "--home", str(harness.home), "--json", "--", str(data), "30",
                                 "0.3", stdout=out, stderr=err)
        try:
            _wait_step(harness.home, harness.home / "clusters" / "jobs", 8, proc, timeout=120)
            agent = harness.agents["h2"]
            assert hosts.find("h2", str(script))
            _kill([agent.pid])
            time.sleep(3)
            assert not hosts.find("h2", str(script)), "h2's training outlived its agent"
            proc.wait(timeout=170)
        finally:
            if proc.poll() is None:
                proc.kill()
        diagnosis = _diagnose(harness, out.read_text()[-2000:], err.read_text()[-6000:])
        assert proc.returncode == 0, diagnosis
    result = json.loads(out.read_text())
    assert result["ok"] and result["spares_used"] == ["h3"], diagnosis
    assert [f["host"] for f in result["failures"]] == ["h2"] and "no event for" in result["failures"][0]["reason"]
    assert result["continuity"]["ok"] and result["continuity"]["effective_steps"] == 30, result["continuity"]
    names = [e.event for e in read_log(Path(result["audit_log"]))]
    assert names.index("host-silent") < names.index("host-failed") < names.index("spare-assigned"), names
    assert "rendezvous-reformed" in names and names[-1] == "job-finished", names


def _agent_audit(tmp_path: Path, host: str) -> list[str]:
    path = tmp_path / "agents" / host / "agent-audit.jsonl"
    assert verify_log(path).ok
    return [e.event for e in read_log(path)]


def _gone(hosts: NetnsHosts, names: list[str], needle: str, within: float) -> float | None:
    """Seconds until no process with ``needle`` is left on any of ``names``, None if still there."""
    began = time.monotonic()
    while time.monotonic() - began < within:
        if not any(hosts.find(n, needle) for n in names):
            return time.monotonic() - began
        time.sleep(0.2)
    return None


def _recorded(tmp_path: Path, names: list[str], event: str, job: str, within: float) -> float | None:
    """Seconds until every agent of ``names`` has ``event`` for ``job`` in its audit log, None if one has not.

    A process that has exited is a zombie with an empty command line, so :func:`_gone` sees it
    go before its agent has reaped it and written ``torchrun-exited``; on a busy host that takes
    seconds (the child watcher, the output pump, an fsync), so the test waits for the record itself.
    """
    began = time.monotonic()
    while time.monotonic() - began < within:
        try:
            if all(any(e.event == event and e.fields.get("job") == job
                       for e in read_log(tmp_path / "agents" / n / "agent-audit.jsonl")) for n in names):
                return time.monotonic() - began
        except AuditLogError:
            pass  # a line being written as we read: read again
        time.sleep(0.2)
    return None


@pytest.mark.slow
def test_agents_stop_their_job_when_the_coordinator_is_interrupted_or_disappears(netns_ok, tmp_path):
    """Ctrl-C on ``aitbc cluster train`` stops the job on every host at once; a coordinator killed
    outright (no goodbye) is noticed by the agents, whose heartbeat watchdog stops the job."""
    shared = tmp_path / "shared"
    shared.mkdir()
    script = shared / "train_helper.py"
    script.write_text(HELPER_SCRIPT)
    data = _dataset(shared)
    members = ["h0", "h1"]
    with NetnsHosts([*members, "ctl"]) as hosts:
        harness = ClusterHarness(hosts, tmp_path, members).setup()
        for name in members:
            harness.start_agent(name)
        harness.wait_agents()
        outcomes = []
        for how in (signal.SIGINT, signal.SIGKILL):
            out, err = tmp_path / f"train-{how.name}.out", tmp_path / f"train-{how.name}.err"
            proc = harness.spawn_cli("cluster", "train", "--cluster", "lab", "--wallet", "coord", "--hosts", "2",
                                     "--script", str(script), "--checkpoint-dir", str(shared / f"ckpt-{how.name}"),
                                     "--home", str(harness.home), "--json", "--", str(data), "1000", "0.2",
                                     stdout=out, stderr=err)
            try:
                job = _wait_step(harness.home, harness.home / "clusters" / "jobs", 2, proc, timeout=120)
            finally:
                proc.send_signal(how)
                proc.wait(timeout=60)
            gone = _gone(hosts, members, str(script), within=40)
            outcomes.append((proc.returncode, gone, _recorded(tmp_path, members, "torchrun-exited", job, within=30)))
            for old in (harness.home / "clusters" / "jobs").glob("*/events.jsonl"):
                old.rename(old.with_suffix(".done"))  # the next round waits for its own job's steps
        audits = {n: _agent_audit(tmp_path, n) for n in members}
    (interrupted_rc, after_interrupt, recorded), (_, after_kill, lag) = outcomes
    assert interrupted_rc == 130
    assert after_interrupt is not None and after_interrupt < 10, f"job still running {after_interrupt}s after Ctrl-C"
    # the agents wait coordinator_timeout_s (10 s) of silence, then stop the job
    assert after_kill is not None and after_kill < 30, f"job outlived its coordinator: {after_kill}"
    assert recorded is not None and lag is not None, f"an agent never recorded its job's end: {audits}"
    print(f"processes gone {after_kill:.2f}s after the coordinator's kill; exit recorded {lag:.2f}s after that")
    for name, events in audits.items():
        assert events.count("launch-accepted") == 2 and "stop-requested" in events, (name, events)
        assert events.index("stop-requested") < events.index("coordinator-lost"), (name, events)
        assert events.count("torchrun-exited") == 2, (name, events)
