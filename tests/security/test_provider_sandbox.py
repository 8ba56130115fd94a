"""Attack: a job whose data gets code execution in the provider's training process.

Before the fix the training process ran as the provider's own user, unconfined: it could read
the keystore and the devnet password, reach the network and the host's sockets, and exhaust
the machine. Now it runs in the bwrap sandbox with rlimits and a wall-clock limit, and a
provider without a working bwrap refuses to start unless it is told ``--no-sandbox``.

Our worker code has no such hole, so the tests use a labelled fault-injection hook: the real
launcher (``TrainingProcess`` with the daemon's sandbox policy) started with a probe entry
point instead of the worker module. The probe speaks the worker's protocol and, on its job,
tries every escape and reports what worked.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from pathlib import Path

import pytest

from aitbc_agent_sdk.errors import TrainingError
from aitbc_agent_sdk.host._errors import SandboxError
from aitbc_agent_sdk.host._sandbox import available_backends
from aitbc_agent_sdk.messaging import topics
from aitbc_agent_sdk.records import JobConfig
from aitbc_agent_sdk.profile import PASSWORD_FILE
from aitbc_agent_sdk.flow._provider_daemon import build_parser, provider_dir
from aitbc_agent_sdk.provider._process import TrainingProcess
from aitbc_agent_sdk.provider._sandbox import TrainingSandbox
from aitbc_agent_sdk.data._datasets import load_dataset
from aitbc_agent_sdk.tasks._networks import model_spec_for

from tests.security.provider_rig import provider_rig, servers  # noqa: F401 (servers: a fixture)

MiB = 1 << 20
FORK_TRIES = 150
# Tight enough to trip on purpose, loose enough for the probe itself (no torch imported).
LIMITS = TrainingSandbox(memory_bytes=512 * MiB, processes=32, file_size_bytes=4 * MiB, job_timeout_s=20)

# FAULT INJECTION: stands in for the worker after a hostile shard got code execution in it.
PROBE = r"""
import json, os, signal, socket, sys, time
def emit(e):
    sys.stdout.write(json.dumps(e) + "\n"); sys.stdout.flush()
emit({"event": "ready", "pid": os.getpid()})
req = json.loads(sys.stdin.readline())
t = json.loads(req["job_id"].split("~", 1)[1])
if req["job_id"].startswith("hang"):
    time.sleep(3600)
seen = {}
def attempt(name, fn):
    try:
        seen[name] = ["ok", fn()]
    except BaseException as exc:
        seen[name] = ["failed", type(exc).__name__]
def read(p): return open(p).read()
def write(p): open(p, "w").write("x"); return p
attempt("keystore", lambda: [read(os.path.join(t["wallets"], f)) for f in os.listdir(t["wallets"])])
attempt("devnet_password", lambda: read(t["password"]))
attempt("shadow", lambda: read("/etc/shadow")[:10])
attempt("tcp", lambda: socket.create_connection(("127.0.0.1", t["port"]), timeout=2).close())
def unix(addr):
    s = socket.socket(socket.AF_UNIX); s.settimeout(2); s.connect(addr); s.close()
attempt("unix_socket", lambda: unix(t["unix"]))
attempt("abstract_socket", lambda: unix("\0" + t["abstract"]))
for name, d in t["outside"].items():
    attempt("write_" + name, lambda d=d: write(os.path.join(d, t["marker"])))
attempt("write_out", lambda: write(os.path.join(req["out_dir"], "scratch")))
attempt("write_inputs", lambda: write(os.path.join(req["job_dir"], "shard.json")))
attempt("memory", lambda: len(bytearray(1 << 30)))
def fork_bomb():
    r, w = os.pipe(); kids = []
    try:
        for _ in range(t["forks"]):
            pid = os.fork()
            if pid == 0:
                os.close(w); os.read(r, 1); os._exit(0)
            kids.append(pid)
    except OSError as exc:
        return ["stopped", len(kids), exc.errno]
    finally:
        os.close(w)
        for pid in kids: os.waitpid(pid, 0)
    return ["unbounded", len(kids)]
attempt("fork", fork_bomb)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so the size cap shows as an error, not a kill
def big():
    with open(os.path.join(req["out_dir"], "big"), "wb") as f:
        for _ in range(16):
            f.write(b"\0" * (1 << 20))
    return "16 MiB"
attempt("file_size", big)
if req["job_id"].startswith("link"):  # hand back the keystore under the checkpoint's name
    key = os.path.join(t["wallets"], os.listdir(t["wallets"])[0]) if seen["keystore"][0] == "ok" else t["wallets"]
    os.symlink(key, os.path.join(req["out_dir"], "checkpoint.safetensors"))
else:
    open(os.path.join(req["out_dir"], "checkpoint.safetensors"), "wb").write(b"ckpt")
emit({"event": "done", "samples": 0, "loss": 0.0, "seconds": 0.0, "seen": seen})
"""


@pytest.fixture
def secrets(aitbc_home: Path) -> Path:
    """A provider home with a keystore and the devnet password, as the daemon leaves them."""
    (aitbc_home / "wallets").mkdir(parents=True)
    (aitbc_home / "wallets" / "provider.json").write_text('{"crypto": "the provider key"}')
    (aitbc_home / "devnet").mkdir()
    (aitbc_home / "devnet" / PASSWORD_FILE).write_text("devnet-password")
    for p in (aitbc_home / "wallets" / "provider.json", aitbc_home / "devnet" / PASSWORD_FILE):
        p.chmod(0o600)
    return aitbc_home


@pytest.fixture
def host_services(tmp_path: Path):
    """What a job must not reach: a TCP port on 127.0.0.1, a UNIX socket by path, an abstract one."""
    tcp, path_sock, abstract = socket.socket(), socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
    tcp.bind(("127.0.0.1", 0))
    path_sock.bind(str(tmp_path / "agent.sock"))
    name = f"aitbc-test-{tmp_path.name}"
    abstract.bind("\0" + name)
    for s in (tcp, path_sock, abstract):
        s.listen()
    yield {"port": tcp.getsockname()[1], "unix": str(tmp_path / "agent.sock"), "abstract": name}
    for s in (tcp, path_sock, abstract):
        s.close()


def _targets(tmp_path: Path, home: Path, services: dict) -> dict:
    return {**services, "wallets": str(home / "wallets"), "password": str(home / "devnet" / PASSWORD_FILE),
            "marker": f"escaped-{tmp_path.name}", "forks": FORK_TRIES,
            "outside": {"tmp_path": str(tmp_path), "tmp": "/tmp", "home": str(home), "dev_shm": "/dev/shm"}}


def _job_dir(work_dir: Path, name: str) -> Path:
    job_dir = work_dir / "jobs" / name
    job_dir.mkdir(parents=True)
    for f in ("shard.json", "weights.safetensors"):
        (job_dir / f).write_bytes(b"inputs")
    return job_dir


async def _probe(process: TrainingProcess, work_dir: Path, kind: str, targets: dict) -> dict:
    spec = model_spec_for("mlp", load_dataset("digits").subset(list(range(8))))
    job_id = f"{kind}~{json.dumps(targets)}"  # the probe reads its targets from the job id it is given
    return await process.train(_job_dir(work_dir, kind), job_id=job_id, model=spec, config=JobConfig(), seed=0)


def _escaped(tmp_path: Path, home: Path, targets: dict) -> list[Path]:
    marker = targets["marker"]
    return [p for p in (tmp_path / marker, Path("/tmp") / marker, home / marker, Path("/dev/shm") / marker)
            if p.exists()]


async def test_a_job_with_code_execution_is_contained(tmp_path, secrets, host_services):
    work_dir = provider_dir(secrets, "0xprovider")
    targets = _targets(tmp_path, secrets, host_services)
    process = TrainingProcess(work_dir, sandbox=LIMITS.model_copy(update={"hidden_paths": (secrets,)}),
                              entry=("-c", PROBE))
    try:
        done = await _probe(process, work_dir, "attack", targets)
    finally:
        await process.stop()
    seen = done["seen"]
    for name in ("keystore", "devnet_password", "shadow", "tcp", "unix_socket", "abstract_socket",
                 "write_tmp_path", "write_tmp", "write_home", "write_inputs"):
        assert seen[name][0] == "failed", (name, seen[name])
    assert seen["write_dev_shm"][0] == "failed" or not (Path("/dev/shm") / targets["marker"]).exists()
    assert _escaped(tmp_path, secrets, targets) == []
    assert seen["write_out"][0] == "ok"  # the one writable directory
    assert seen["memory"] == ["failed", "MemoryError"]
    assert seen["fork"][0] == "ok" and seen["fork"][1][0] == "stopped" and seen["fork"][1][1] < LIMITS.processes
    assert seen["file_size"] == ["failed", "OSError"]  # EFBIG at the cap
    assert (work_dir / "jobs" / "attack" / "checkpoint.safetensors").read_bytes() == b"ckpt"


async def test_control_unconfined_the_same_probe_reaches_everything(tmp_path, secrets, host_services):
    """Without the sandbox (``--no-sandbox``, and every provider before the fix) each escape works."""
    work_dir = provider_dir(secrets, "0xprovider")
    targets = _targets(tmp_path, secrets, host_services)
    process = TrainingProcess(work_dir, entry=("-c", PROBE))
    try:
        seen = (await _probe(process, work_dir, "attack", targets))["seen"]
    finally:
        await process.stop()
    for marker in _escaped(tmp_path, secrets, targets):
        marker.unlink()
    for name in ("keystore", "devnet_password", "tcp", "unix_socket", "abstract_socket", "write_tmp"):
        assert seen[name][0] == "ok", (name, seen[name])
    assert seen["fork"][1][0] == "unbounded"


async def test_a_hanging_job_is_killed_and_a_linked_checkpoint_is_refused(tmp_path, secrets, host_services):
    work_dir = provider_dir(secrets, "0xprovider")
    targets = _targets(tmp_path, secrets, host_services)
    policy = LIMITS.model_copy(update={"hidden_paths": (secrets,), "job_timeout_s": 3})
    process = TrainingProcess(work_dir, sandbox=policy, entry=("-c", PROBE))
    try:
        with pytest.raises(TrainingError, match="ran past"):
            await _probe(process, work_dir, "hang", targets)
        # The symlink points at the keystore: copying it back would upload the key to IPFS.
        with pytest.raises(TrainingError, match="checkpoint"):
            await _probe(process, work_dir, "link", targets)
        assert not (work_dir / "jobs" / "link" / "checkpoint.safetensors").exists()
    finally:
        await process.stop()


async def test_the_daemon_finishes_a_normal_job_after_a_failed_one(servers):  # noqa: F811
    async with provider_rig(servers, sandbox=TrainingSandbox(hidden_paths=(servers.home,))) as rig:
        assert rig.provider.process.sandboxed
        contract = await rig.hire()
        spec = model_spec_for("mlp", load_dataset("digits").subset(list(range(64))), hidden=16)
        broken = await rig.job(contract, model=spec)  # weights that are not safetensors: the job fails
        await rig.send(topics.jobs(rig.provider.address), broken)
        await rig.feeds["progress"].first(lambda v: v.message.job_id == broken.job_id and v.message.status == "failed")
        valid = await rig.job(contract)
        await rig.send(topics.jobs(rig.provider.address), valid)
        done = await rig.feeds["results"].first(lambda v: v.message.job_id == valid.job_id)
        assert done.sender == rig.provider.address and done.message.samples == 64


@pytest.fixture
def path_without_bwrap(tmp_path, monkeypatch):
    """A real condition: PATH has unshare and setpriv (the weaker fallback) but no bwrap."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("unshare", "setpriv", "sh", "true"):
        found = next((Path(d) / tool for d in os.environ["PATH"].split(":") if (Path(d) / tool).exists()), None)
        if found:
            (bin_dir / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(bin_dir))
    available_backends.cache_clear()
    yield
    available_backends.cache_clear()


async def test_without_bwrap_the_provider_refuses_unless_no_sandbox(servers, path_without_bwrap):  # noqa: F811
    assert "bwrap" not in available_backends()
    with pytest.raises(SandboxError, match="--no-sandbox"):
        async with provider_rig(servers):
            pass
    assert build_parser().parse_args(["--wallet", "w", "--price-wei", "1", "--no-sandbox"]).no_sandbox
    async with provider_rig(dataclasses.replace(servers, home=servers.home / "unconfined"), sandbox=None) as rig:
        assert not rig.provider.process.sandboxed
        valid = await rig.job(await rig.hire())
        await rig.send(topics.jobs(rig.provider.address), valid)
        await rig.feeds["results"].first(lambda v: v.message.job_id == valid.job_id)


PID_PROBE = r"""
import json, os, sys
from pathlib import Path
me = os.urandom(8).hex()  # pids repeat: each sandbox has its own pid namespace
print(json.dumps({"event": "ready"}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    out = Path(request["out_dir"])
    planted = sorted(p.name for p in out.iterdir())
    (out / "planted-by-last-job").write_text("x")  # what a hostile job would leave behind
    (out / "checkpoint.safetensors").write_bytes(b"ckpt")
    print(json.dumps({"event": "done", "samples": 0, "loss": 0.0, "seconds": 0.0, "pid": me,
                      "planted": planted}), flush=True)
"""


async def test_a_sandboxed_process_never_serves_two_trainings(tmp_path, secrets):
    """Torch is imported once per training, not per job; a job of another training (another
    customer) always gets a fresh process and never sees what an earlier job left behind."""
    work_dir = provider_dir(secrets, "0xprovider")
    process = TrainingProcess(work_dir, sandbox=LIMITS.model_copy(update={"hidden_paths": (secrets,)}),
                              entry=("-c", PID_PROBE))
    spec = model_spec_for("mlp", load_dataset("digits").subset(list(range(8))))

    async def job(name: str, owner: str | None) -> dict:
        return await process.train(_job_dir(work_dir, name), job_id=name, model=spec, config=JobConfig(), seed=0,
                                   owner=owner)

    try:
        first, again = await job("a1", "training_a"), await job("a2", "training_a")
        other = await job("b1", "training_b")
        back = await job("a3", "training_a")
        anonymous = [await job("n1", None), await job("n2", None)]
    finally:
        await process.stop()
    assert first["pid"] == again["pid"]  # the same training: the same process
    assert again["planted"] == ["planted-by-last-job"]  # ...which saw only its own training's leftovers
    assert other["pid"] != first["pid"] and other["planted"] == []
    assert back["pid"] not in (first["pid"], other["pid"]) and back["planted"] == []
    assert anonymous[0]["pid"] != anonymous[1]["pid"] and anonymous[1]["planted"] == []
