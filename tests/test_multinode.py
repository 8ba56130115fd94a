"""The 3-node validation harness (#6): ``scripts/workflow/44_comprehensive_multi_node_scenario.sh``.

The end-to-end tests run the script for real: three hosts as network namespaces (they need root,
or passwordless sudo, and iproute2), anvil, mosquitto and js-ipfs on ``aitbc1``, provider daemons
on ``aitbc`` and ``gitea-runner``. They check its table, its exit code, and that nothing it made
(namespace, process, file) is left afterwards. The other tests are quick: the script without
root, the checks' own verdicts on bad evidence, and the ``--host`` / ``devnet join`` plumbing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO

SCRIPT = REPO / "scripts" / "workflow" / "44_comprehensive_multi_node_scenario.sh"
CHECKS = REPO / "scripts" / "workflow" / "multinode_checks.py"
NAMESPACES = {"aitbc1", "aitbc", "gitea-runner", "aitbc-mn-bridge"}
CHECK_IDS = {"1", "2", "3", "4", "5", "6"}


def _as_root() -> list[str] | None:
    """How to run the script as root here: directly, through passwordless sudo, or not at all."""
    if shutil.which("ip") is None:
        return None
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        return ["sudo", "-n", "--preserve-env=AITBC_MULTINODE_TMP,AITBC_PYTHON"]
    return None


ROOT = _as_root()
needs_root = pytest.mark.skipif(ROOT is None, reason="needs root (or passwordless sudo) and iproute2 for ip netns")


def _namespaces() -> set[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in listed.splitlines() if line.strip()}


def _processes_using(path: Path) -> list[str]:
    """Processes whose argv, environment or working directory mention ``path``."""
    mark = str(path).encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            cwd = os.readlink(f"/proc/{pid}/cwd").encode()
        except OSError:
            continue
        if mark in cmdline or mark in environ or cwd.startswith(mark):
            argv = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{pid} {argv[:160]}")
    return found


def _script_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["AITBC_MULTINODE_TMP"] = str(tmp_path)
    env["AITBC_PYTHON"] = sys.executable
    return env


def _assert_nothing_left(tmp_path: Path) -> None:
    assert not (NAMESPACES & _namespaces()), f"namespaces left: {NAMESPACES & _namespaces()}"
    assert not _processes_using(tmp_path), f"processes left: {_processes_using(tmp_path)}"
    assert not list(tmp_path.iterdir()), f"files left: {list(tmp_path.iterdir())}"
    assert not Path("/run/aitbc-multinode.state").exists()


def _table(stdout: str) -> list[tuple[str, str, str, str]]:
    """(id, check, from, verdict) of each row of the result table."""
    rows = []
    for line in stdout.splitlines():
        match = re.match(r"^([1-6])\s+(.{40})\s(\S+)\s+(PASS|FAIL)\s", line)
        if match:
            rows.append((match[1], match[2].strip(), match[3], match[4]))
    return rows


# -- the script, end to end ---------------------------------------------------------------------------

@pytest.mark.slow
@needs_root
def test_an_interrupted_run_cleans_up_everything(tmp_path):
    """SIGTERM while the hosts and servers are up: the trap removes namespaces, processes and files."""
    assert ROOT is not None
    proc = subprocess.Popen([*ROOT, "bash", str(SCRIPT)], env=_script_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 240
        for line in proc.stderr:  # wait until aitbc1's servers run and the followers are joining
            seen.append(line)
            if "devnet join" in line or time.monotonic() > deadline:
                break
        assert NAMESPACES <= _namespaces(), "".join(seen)
        assert _processes_using(tmp_path), "no process of the run to interrupt"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, "".join(seen) + err
    assert "cleaning up" in err
    _assert_nothing_left(tmp_path)


@pytest.mark.slow
@needs_root
def test_three_nodes_pass_every_check_and_leave_nothing(tmp_path):
    """The whole scenario: every row of the table PASS, exit 0, nothing left (also after the interrupted run)."""
    assert ROOT is not None
    started = time.monotonic()
    done = subprocess.run([*ROOT, "bash", str(SCRIPT)], env=_script_env(tmp_path), capture_output=True, text=True,
                          timeout=600)
    wall = time.monotonic() - started
    report = f"exit {done.returncode} after {wall:.0f}s\n{done.stdout}\n--- stderr (tail)\n{done.stderr[-6000:]}"
    rows = _table(done.stdout)
    assert {row[0] for row in rows} == CHECK_IDS, report
    assert [row for row in rows if row[3] != "PASS"] == [], report
    assert done.returncode == 0, report
    assert "RESULT: PASS" in done.stdout, report
    # every node probed every service over the namespaces' network
    assert {row[2] for row in rows if row[0] == "1" and "broker, chain RPC" in row[1]} == {"aitbc1", "aitbc",
                                                                                        "gitea-runner"}, report
    _assert_nothing_left(tmp_path)


def test_without_root_it_says_so_and_exits_2(tmp_path):
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv (util-linux) is needed to drop root")
        argv = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "bash", str(SCRIPT)]
    else:
        argv = ["bash", str(SCRIPT)]
    before = _namespaces() if shutil.which("ip") else set()
    done = subprocess.run(argv, env=_script_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "needs root" in done.stderr and "sudo" in done.stderr
    assert done.stdout == ""
    if shutil.which("ip"):
        assert _namespaces() == before


def test_unknown_arguments_are_refused(tmp_path):
    done = subprocess.run(["bash", str(SCRIPT), "--frobnicate"], env=_script_env(tmp_path), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "unknown argument" in done.stderr


# -- the checks' verdicts on bad evidence -------------------------------------------------------------

def check(*args: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, str(CHECKS), *args], capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr


def _write(path: Path, value: object) -> str:
    path.write_text(json.dumps(value))
    return str(path)


def _probe(node: str, head: int, hashes: dict[int, str]) -> dict:
    return {"node": node, "head_number": head, "head_hash": hashes[head], "hashes": {str(k): v for k, v in hashes.items()}}


def test_chain_heads_agree_disagree_and_race(tmp_path):
    same = {4: "0xaa", 5: "0xbb"}
    files = [_write(tmp_path / f"{n}.json", _probe(n, 5, same)) for n in ("aitbc1", "aitbc", "gitea-runner")]
    assert check("chain-heads", *files) == (0, "PASS block 5 0xbb… on all 3 nodes")
    # one node saw a block more: compared at the common height
    _write(tmp_path / "aitbc.json", _probe("aitbc", 6, {**same, 6: "0xcc"}))
    code, line = check("chain-heads", *files)
    assert code == 0 and line.startswith("PASS block 5 0xbb")
    # a fork: the same height, another hash
    _write(tmp_path / "aitbc.json", _probe("aitbc", 5, {4: "0xaa", 5: "0xdd"}))
    code, line = check("chain-heads", *files)
    assert code == 1 and line.startswith("FAIL the nodes disagree")


def _monitor(accuracies: list[float], phase: str = "complete") -> dict:
    return {"phase": phase, "round_metrics": [{"round": i + 1, "accuracy": a} for i, a in enumerate(accuracies)]}


def _hired(tmp_path: Path, workers: dict[str, str]) -> str:
    return _write(tmp_path / "hired.json", {"workers": [{"worker_id": a, "role": r} for a, r in workers.items()]})


NODES = ["--node", "aitbc:0xA", "--node", "aitbc:0xB", "--node", "gitea-runner:0xC"]


def test_training_check_wants_every_round_the_target_and_both_followers(tmp_path):
    hired = _hired(tmp_path, {"0xA": "worker", "0xC": "worker", "0xB": "spare"})
    args = ["--rounds", "4", "--target", "0.9", "--hired", hired, *NODES, "--worker-nodes", "aitbc", "gitea-runner"]
    good = _write(tmp_path / "m.json", _monitor([0.91, 0.94, 0.95, 0.96]))
    code, line = check("training", "--monitor", good, *args)
    assert code == 0 and "accuracy 0.9600 >= 0.9" in line and "workers on aitbc and gitea-runner" in line
    low = _write(tmp_path / "low.json", _monitor([0.5, 0.6, 0.7, 0.8]))
    assert check("training", "--monitor", low, *args)[1].startswith("FAIL final accuracy 0.8000 < 0.9")
    short = _write(tmp_path / "short.json", _monitor([0.91, 0.95], phase="failed"))
    code, line = check("training", "--monitor", short, *args)
    assert code == 1 and "phase 'failed'" in line and "rounds [1, 2]" in line
    one_node = _hired(tmp_path, {"0xA": "worker", "0xB": "worker", "0xC": "spare"})
    args[args.index("--hired") + 1] = one_node
    assert "workers hired on ['aitbc']" in check("training", "--monitor", good, *args)[1]


def test_recovery_check_fails_when_the_killed_provider_was_paid_or_not_replaced(tmp_path):
    hired = _hired(tmp_path, {"0xA": "worker", "0xC": "worker", "0xB": "spare"})
    monitor = _write(tmp_path / "m.json", _monitor([0.9] * 4))
    kill = _write(tmp_path / "kill.json", {"round": 2, "killed_at": 100.0, "pid": 1, "epoch": 0, "job_id": "j"})
    entries = [{"event": "worker_failed", "ts": 104.0, "fields": {"worker": "0xA", "round": 2, "silent_s": 3.4}},
               {"event": "worker_replaced", "ts": 105.0, "fields": {"worker": "0xA", "replacement": "0xB"}},
               {"event": "payment", "ts": 110.0, "fields": {"worker": "0xB"}},
               {"event": "payment", "ts": 110.0, "fields": {"worker": "0xC"}}]
    audit = _write(tmp_path / "audit.json", {"ok": True, "entries": entries})
    paid = {"payments": [{"worker_id": "0xB", "amount_wei": 3}, {"worker_id": "0xC", "amount_wei": 4}]}
    payments = _write(tmp_path / "pay.json", paid)
    args = ["--monitor", monitor, "--audit", audit, "--hired", hired, "--killed", "0xA", "--kill", kill, *NODES]
    code, line = check("recovery", *args, "--payments", payments)
    assert code == 0 and "worker_replaced by the spare 0xB (aitbc)" in line and "worker_failed (round 2, 3.4s silent)" in line
    # a straggler deadline may see the dead worker before its silence does
    straggled = [{"event": "straggler_detected", "ts": 102.5, "fields": {"worker": "0xA", "round": 2}}, *entries[1:]]
    _write(tmp_path / "audit.json", {"ok": True, "entries": straggled})
    code, line = check("recovery", *args, "--payments", payments)
    assert code == 0 and "straggler_detected (round 2, 2.5s after the kill)" in line
    _write(tmp_path / "audit.json", {"ok": True, "entries": entries})

    paid["payments"].append({"worker_id": "0xA", "amount_wei": 2})
    code, line = check("recovery", *args, "--payments", _write(tmp_path / "pay2.json", paid))
    assert code == 1 and "the killed provider was paid 2 wei" in line

    _write(tmp_path / "audit.json", {"ok": False, "first_bad_line": 3, "reason": "hash mismatch",
                                     "entries": entries[2:]})
    code, line = check("recovery", *args, "--payments", payments)
    assert code == 1 and "does not verify" in line and "no worker_failed or straggler_detected event" in line

    _write(tmp_path / "audit.json", {"ok": True, "entries": entries})
    _write(tmp_path / "kill.json", {"round": 4, "killed_at": 200.0, "pid": 1, "epoch": 0, "job_id": "j"})
    assert "after the training was settled" in check("recovery", *args, "--payments", payments)[1]


# -- the SDK's part: --host and devnet join ------------------------------------------------------------

def test_servers_bind_one_given_address_never_a_wildcard():
    from aitbc_agent_sdk.devnet._ipfs import configure
    from aitbc_agent_sdk.devnet._mosquitto import mosquitto_config
    from aitbc_agent_sdk.devnet._network import DevnetOptions
    from aitbc_agent_sdk.devnet._service import ServiceError, check_bind_host

    assert check_bind_host("10.231.44.1") == "10.231.44.1"
    for bad in ("0.0.0.0", "localhost", "255.255.255.255", "224.0.0.1", "::", "10.0.0.300"):
        with pytest.raises(ServiceError):
            check_bind_host(bad)
    assert DevnetOptions().host == "127.0.0.1"
    assert DevnetOptions(host="10.231.44.1").host == "10.231.44.1"
    with pytest.raises(ValueError, match="refusing to bind"):
        DevnetOptions(host="0.0.0.0")
    config = configure({}, api_port=5001, gateway_port=None, swarm_port=4001, host="10.231.44.1")
    assert config["Addresses"]["API"] == "/ip4/10.231.44.1/tcp/5001"
    assert config["Addresses"]["Swarm"] == ["/ip4/10.231.44.1/tcp/4001"]
    assert configure({}, api_port=5001, gateway_port=None, swarm_port=4001)["Addresses"]["API"] == "/ip4/127.0.0.1/tcp/5001"
    assert "listener 1883 10.231.44.1" in mosquitto_config(Path("/tmp"), host="10.231.44.1", port=1883)


def test_devnet_up_refuses_a_wildcard_host(aitbc_cmd, cli_env):
    done = subprocess.run([*aitbc_cmd, "devnet", "up", "--providers", "0", "--host", "0.0.0.0"], env=cli_env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "refusing to bind" in done.stderr


async def test_devnet_join_refuses_a_host_local_store_and_a_dead_chain(tmp_path):
    from aitbc_agent_sdk.devnet._network import devnet_join
    from aitbc_agent_sdk.errors import ConfigError
    from aitbc_agent_sdk.profile import BusSettings, ChainSettings, Profile, StoreSettings

    chain = ChainSettings(rpc_url="http://127.0.0.1:9", chain_id=31337,
                          escrow="0x5FbDB2315678afecb367f032d93F642f64180aa3")
    local = Profile(bus=BusSettings(), store=StoreSettings(kind="local", root=tmp_path / "store"), chain=chain)
    source = tmp_path / "profile.json"
    source.write_text(local.model_dump_json())
    with pytest.raises(ConfigError, match="local to its host"):
        await devnet_join(tmp_path / "home", source)
    kubo = local.model_copy(update={"store": StoreSettings(kind="kubo", api="http://127.0.0.1:9")})
    source.write_text(kubo.model_dump_json())
    with pytest.raises(ConfigError, match="not reachable"):
        await devnet_join(tmp_path / "home", source, ["provider-x"])
    assert not (tmp_path / "home" / "profile.json").exists()
    assert not (tmp_path / "home" / "wallets").exists()
