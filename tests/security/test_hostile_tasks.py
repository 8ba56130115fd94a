"""Attack: a customer ships a training task (user code, by CID) that attacks the provider running it.

The tasks in ``tests/hostile_tasks/`` read the keystore, the devnet password and a file in
``$HOME``; connect to the broker and the IPFS API on 127.0.0.1; write outside the job's one
writable directory; fork-bomb; fill the disk with files each below the file-size limit; allocate
memory past the limit; and hang. Each is packed and stored as a coordinator does and sent in a
signed job to ONE real provider daemon that runs any task (``TaskPolicy(accepts="any")``) in its
bwrap sandbox with tight limits. For every attack: the job fails with a clear reason, no secret
reaches anything the coordinator sees, nothing lands outside the sandbox, nothing it started
survives, and afterwards an honest built-in job completes on the same daemon.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aitbc_agent_sdk.chain._escrow import training_salt
from aitbc_agent_sdk.messaging import topics
from aitbc_agent_sdk.records import ContractProposal, ContractReply, ModelSpec, TaskPolicy, TaskRef, new_id
from aitbc_agent_sdk.profile import PASSWORD_FILE
from aitbc_agent_sdk.provider._process import MAX_LOG_BYTES, WORKER_LOG
from aitbc_agent_sdk.provider._sandbox import ENTRY_BYTES, TrainingSandbox, disk_problem, disk_usage
from aitbc_agent_sdk.tasks._networks import build_model
from aitbc_agent_sdk.wire._checkpoint import encode_state
from aitbc_agent_sdk.data._datasets import load_dataset
from aitbc_agent_sdk.tasks._task_package import encode_package, pack_task

from tests.security.provider_rig import PRICE, WAIT_S, Rig, provider_rig, servers  # noqa: F401 (servers: a fixture)

HOSTILE = Path(__file__).resolve().parents[1] / "hostile_tasks"
MiB = 1 << 20
# Tight, so each attack trips quickly; loose enough for torch and an honest digits job.
LIMITS = TrainingSandbox(memory_bytes=1280 * MiB, processes=64, file_size_bytes=8 * MiB, job_timeout_s=10,
                         disk_bytes=64 * MiB)
SETTLE_S = 15.0  # for a killed sandbox's processes to be gone from the host's /proc


@dataclass(frozen=True)
class Attack:
    file: str
    reason: str  # what the job's failure must say (a regular expression)
    params: dict[str, Any]


def attacks(secrets: dict[str, Path], ports: tuple[int, ...], outside: tuple[Path, ...], marker: str,
            sleep_marker: str) -> list[Attack]:
    return [
        Attack("read_secrets.py", r"FileNotFoundError|PermissionError", {"paths": tuple(map(str, secrets.values()))}),
        Attack("open_socket.py", r"Connection refused|Network is unreachable", {"ports": ports}),
        Attack("write_outside.py", r"Read-only file system|No such file or directory|Permission denied",
               {"directories": tuple(map(str, outside)), "marker": marker}),
        Attack("fork_bomb.py", r"fork bomb stopped after \d+ processes: Resource temporarily unavailable",
               {"marker": sleep_marker, "forks": 4 * LIMITS.processes}),
        Attack("fill_disk.py", r"wrote more than \d+ bytes .* and was killed",
               {"log_bytes": 8 * MAX_LOG_BYTES, "file_bytes": LIMITS.file_size_bytes // 2, "total_bytes": 512 * MiB}),
        Attack("eat_memory.py", r"can't allocate memory|Cannot allocate memory|MemoryError",
               {"total_bytes": 3 * LIMITS.memory_bytes}),  # type: ignore[operator]
        Attack("hang.py", r"ran past \d+s and was killed", {}),
    ]


async def ship(rig: Rig, attack: Attack) -> TaskRef:
    """Pack the task and store it under its CID, as the coordinator's TaskCache does."""
    package = pack_task(HOSTILE / attack.file)
    cid = await rig.store.add(encode_package(package))
    return TaskRef(name=package.manifest.name, cid=cid, params=attack.params)


async def hire_for(rig: Rig, task: TaskRef | None, training_id: str) -> str:
    """A contract naming ``task``, and its training opened and funded on chain with the provider's consent."""
    contract_id = new_id("contract")
    proposal = ContractProposal.model_construct(contract_id=contract_id, training_id=training_id,
                                                coordinator=rig.attacker.address, price_wei=PRICE, rounds=5, task=task)
    reply = await rig.attacker.request(
        topics.negotiate(rig.provider.address), proposal, topics.negotiate_reply(rig.attacker.address, contract_id),
        ContractReply, timeout=WAIT_S, expected_sender=rig.provider.address)
    assert reply.accepted, reply
    await rig.escrow.open(rig.sender, training_salt(training_id), [rig.provider.address], [PRICE * 5],
                          [bytes.fromhex(reply.consent[2:])])
    return contract_id


def processes_with(argument: str) -> list[int]:
    """Host pids whose command line holds ``argument`` (a fork bomb's children: ``sleep MARKER``)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and argument.encode() in (entry / "cmdline").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue  # gone meanwhile
    return found


def plant_secrets(home: Path, user_home: Path) -> dict[str, Path]:
    """The keystore the rig created, the devnet password and an SSH key in the provider user's $HOME."""
    keystore = next((home / "wallets").glob("*.json"))
    (home / "devnet").mkdir(exist_ok=True)
    (home / "devnet" / PASSWORD_FILE).write_text(f"devnet-password-{new_id('s')}")
    (user_home / ".ssh").mkdir(parents=True)
    (user_home / ".ssh" / "id_ed25519").write_text(f"-----BEGIN OPENSSH PRIVATE KEY----- {new_id('k')}")
    return {"keystore": keystore, "devnet_password": home / "devnet" / PASSWORD_FILE,
            "home_key": user_home / ".ssh" / "id_ed25519"}


def secret_words(secrets: dict[str, Path]) -> list[str]:
    keystore = json.loads(secrets["keystore"].read_text())
    words = [secrets["devnet_password"].read_text(), secrets["home_key"].read_text().split()[-1],
             keystore["crypto"]["ciphertext"]]
    assert all(len(w) >= 16 for w in words)
    return words


async def wait_gone(argument: str) -> list[int]:
    """The processes still alive with ``argument``, after waiting for them to go (a pidfd per survivor)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SETTLE_S
    for pid in processes_with(argument):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        gone = asyncio.Event()
        loop.add_reader(fd, gone.set)  # a pidfd turns readable when its process exits
        try:
            async with asyncio.timeout(max(deadline - loop.time(), 0.1)):
                await gone.wait()
        except TimeoutError:
            pass
        finally:
            loop.remove_reader(fd)
            os.close(fd)
    return processes_with(argument)


async def failure_of(rig: Rig, attack: Attack) -> str:
    """Ship ``attack``'s task in a job of a training of its own; the error its failed job reports."""
    task, training_id = await ship(rig, attack), new_id("training")
    job = (await rig.job(await hire_for(rig, task, training_id), training_id=training_id)).model_copy(
        update={"task": task})
    await started(rig)
    await rig.send(topics.jobs(rig.provider.address), job)
    ended = await rig.feeds["progress"].first(
        lambda v: v.message.job_id == job.job_id and v.message.status in ("failed", "complete"),
        timeout=LIMITS.job_timeout_s + 60)
    assert ended.message.status == "failed", (attack.file, ended.message)
    return ended.message.error or ""


async def started(rig: Rig) -> None:
    """Wait until the provider's process has imported torch: the job's wall-clock limit is then its own."""
    async with asyncio.timeout(WAIT_S):
        await rig.provider.process.ready()


async def honest_job(rig: Rig) -> bytes:
    """A built-in job on the same daemon, after every attack: it completes; returns its checkpoint."""
    training_id = new_id("training")
    data = load_dataset("digits").subset(list(range(64)))
    spec = ModelSpec(name="mlp", input_shape=data.feature_shape, num_classes=data.num_classes, hidden=128)
    weights = encode_state(build_model(spec, seed=0).state_dict())
    job = (await rig.job(await hire_for(rig, None, training_id), training_id=training_id)).model_copy(
        update={"model": spec, "weights_cid": await rig.store.add(weights), "weights_bytes": len(weights)})
    await started(rig)
    await rig.send(topics.jobs(rig.provider.address), job)
    done = await rig.feeds["results"].first(lambda v: v.message.job_id == job.job_id)
    assert done.sender == rig.provider.address and done.message.samples == 64
    results = [v.message.job_id for v in rig.feeds["results"].items]
    assert results == [job.job_id]  # no hostile job delivered anything
    return await rig.store.cat(done.message.checkpoint_cid)


async def test_hostile_tasks_are_contained_and_the_provider_goes_on_serving(servers, tmp_path, monkeypatch):  # noqa: F811
    user_home = tmp_path / "user-home"
    monkeypatch.setenv("HOME", str(user_home))  # the provider's user: the sandbox hides its $HOME
    marker, sleep_marker = new_id("planted"), f"86399.{os.getpid()}{tmp_path.stat().st_ino}"
    sandbox = LIMITS.model_copy(update={"hidden_paths": (servers.home,)})
    async with provider_rig(servers, tasks=TaskPolicy(accepts="any"), sandbox=sandbox) as rig:
        assert rig.provider.process.sandboxed
        secrets = plant_secrets(servers.home, user_home)
        work_dir = rig.provider.config.work_dir
        outside = (tmp_path, Path("/tmp"), servers.home, work_dir, user_home, Path("/dev/shm"),
                   Path(__file__).parent)
        ipfs_port = int(servers.ipfs_api.rsplit(":", 1)[1].split("/")[0])
        try:
            for attack in attacks(secrets, (servers.broker_port, ipfs_port), outside, marker, sleep_marker):
                error = await failure_of(rig, attack)
                assert re.search(attack.reason, error), (attack.file, error)
                if attack.file == "fill_disk.py":  # the killed sandbox's files went with it; its log is capped
                    assert list(work_dir.rglob("fill")) == []
                    assert (work_dir / WORKER_LOG).stat().st_size <= 2 * MAX_LOG_BYTES
            assert await wait_gone(sleep_marker) == [], "a forked child outlived its sandbox"
            checkpoint = await honest_job(rig)
        finally:
            for pid in processes_with(sleep_marker):  # an uncontained bomb's children: never left running
                os.kill(pid, 9)
        # Nothing the coordinator can see holds a secret: progress, results, the one checkpoint.
        seen = [json.dumps(v.message.model_dump(mode="json")) for name in ("progress", "results")
                for v in rig.feeds[name].items]
        for word in secret_words(secrets):
            assert not any(word in text for text in seen)
            assert word.encode() not in checkpoint
    planted = [d / marker for d in outside if (d / marker).exists()]
    for path in planted:
        path.unlink()
    assert planted == []


def test_disk_usage_counts_every_entry_and_follows_no_link(tmp_path):
    """The quota's measure: blocks of every file, a floor per entry (empty inodes fill a disk too), no link followed."""
    out = tmp_path / "out"
    (out / "a" / "b").mkdir(parents=True)
    (out / "a" / "b" / "data").write_bytes(os.urandom(1 * MiB))
    for i in range(100):
        (out / f"empty{i}").touch()
    big = tmp_path / "outside"
    big.write_bytes(os.urandom(4 * MiB))
    (out / "link").symlink_to(big)
    used = disk_usage(out, 1 << 40)
    assert 1 * MiB + 100 * ENTRY_BYTES <= used < 2 * MiB  # the 4 MiB behind the link are not counted
    assert disk_usage(out, 8192) > 8192  # counting stops once past the limit
    assert disk_problem(LIMITS.model_copy(update={"disk_bytes": MiB}), out) is not None
    assert disk_problem(LIMITS, out) is None
    assert disk_usage(tmp_path / "missing", 1) == 0
