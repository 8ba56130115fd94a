"""Sandboxed execution, tested for real: a script inside tries to read the keystore, write outside its
work directory, reach the host's network, read the wallet password and unmount what hides the keystore.

bubblewrap is required (setup installs it). The unshare + setpriv fallback runs wherever it works
(root, or unprivileged user namespaces) and is skipped, saying so, where it does not.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from aitbc_agent_sdk.cluster import SandboxLimits, SandboxSpec, available_backends, run_sandboxed, verify_sandbox
from aitbc_agent_sdk.host._errors import SandboxError
from aitbc_agent_sdk.host._sandbox import build_command, sandbox_env
from aitbc_agent_sdk.host._sandbox_plan import cover_paths, mount_plan

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(params=["bwrap", "unshare"])
def backend(request) -> str:
    if request.param not in available_backends():
        if request.param == "bwrap":
            pytest.fail("bubblewrap does not work here (apt-get install bubblewrap; user namespaces allowed?)")
        pytest.skip("the unshare + setpriv fallback needs root or unprivileged user namespaces")
    return request.param


@pytest.fixture
def secret_home(tmp_path, monkeypatch) -> Path:
    """An AITBC home with a keystore, inside a data directory the sandbox gets read-only."""
    home = tmp_path / "data" / "aitbc-home"
    (home / "wallets").mkdir(parents=True)
    (home / "wallets" / "dev.json").write_text('{"crypto": "very secret keystore"}')
    (tmp_path / "data" / "dataset.csv").write_text("x,y\n1,2\n")
    monkeypatch.setenv("AITBC_HOME", str(home))
    monkeypatch.setenv("AITBC_WALLET_PASSWORD", "hunter2")
    return home


@pytest.fixture
def listener():
    """A TCP listener on the host's 127.0.0.1; from inside a network-isolated sandbox it is unreachable."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


ATTACK = r"""
import json, os, socket, subprocess, sys
home, port, marker, outside = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
result = {}
def attempt(name, fn):
    try:
        result[name] = ["ok", fn()]
    except Exception as exc:
        result[name] = ["failed", type(exc).__name__]
attempt("read_keystore", lambda: open(os.path.join(home, "wallets", "dev.json")).read())
attempt("list_home", lambda: os.listdir(home))
attempt("read_dataset", lambda: open(os.path.join(os.path.dirname(home), "dataset.csv")).read())
for n, d in enumerate(outside):
    attempt(f"write_outside_{n}", lambda d=d: open(os.path.join(d, marker), "w").write("x"))
attempt("write_work", lambda: open("inside.txt", "w").write("written in the sandbox"))
attempt("connect", lambda: socket.create_connection(("127.0.0.1", port), timeout=2).close())
result["password_in_env"] = any("hunter2" in v for v in os.environ.values()) or "AITBC_WALLET_PASSWORD" in os.environ
umount = subprocess.run(["umount", home], capture_output=True, text=True)
result["umount"] = [umount.returncode, umount.stderr.strip()]
attempt("read_keystore_after_umount", lambda: open(os.path.join(home, "wallets", "dev.json")).read())
print(json.dumps(result))
"""


def _marker(tmp_path: Path) -> str:
    return f"escaped-{tmp_path.name}.txt"  # unique per test, so a leftover elsewhere cannot pass or fail it


def _attack_spec(tmp_path: Path, home: Path, port: int, **kwargs) -> SandboxSpec:
    outside = [str(tmp_path), str(tmp_path / "data"), "/tmp", str(REPO)]
    return SandboxSpec(command=(sys.executable, "-c", ATTACK, str(home), str(port), _marker(tmp_path), *outside),
                       work_dir=tmp_path / "job", read_only_paths=(tmp_path / "data",), **kwargs)


async def test_the_sandbox_stops_each_escape(tmp_path, secret_home, listener, backend):
    result = await run_sandboxed(_attack_spec(tmp_path, secret_home, listener), timeout=60, backend=backend)
    assert result.returncode == 0, result.stderr.decode()
    seen = json.loads(result.stdout)

    assert seen["read_keystore"][0] == "failed"
    assert seen["list_home"][0] == "failed" or "wallets" not in seen["list_home"][1]
    assert seen["read_dataset"] == ["ok", "x,y\n1,2\n"]  # read-only data still reads
    for n in range(4):
        assert seen[f"write_outside_{n}"][0] == "failed", n
    marker = _marker(tmp_path)
    assert not list(tmp_path.glob(f"**/{marker}")) and not (REPO / marker).exists() and not (Path("/tmp") / marker).exists()
    assert seen["write_work"][0] == "ok"
    assert (tmp_path / "job" / "inside.txt").read_text() == "written in the sandbox"
    assert seen["connect"][0] == "failed"
    assert seen["password_in_env"] is False
    # The attack that needs capabilities: unmounting the tmpfs that hides the keystore.
    assert seen["umount"][0] != 0, seen["umount"]
    assert seen["read_keystore_after_umount"][0] == "failed"
    assert result.report.backend == backend and result.report.capabilities_dropped


def test_control_without_dropping_capabilities_the_umount_attack_works(tmp_path, secret_home, listener):
    """Shows the umount check above can fail: the same bwrap line minus ``--cap-drop ALL`` leaks the key."""
    spec = _attack_spec(tmp_path, secret_home, listener)
    spec.work_dir.mkdir()
    argv = build_command(spec, "bwrap")
    at = argv.index("--cap-drop")
    del argv[at:at + 2]
    done = subprocess.run(argv, capture_output=True, env=sandbox_env(spec), cwd=spec.work_dir, timeout=60)
    seen = json.loads(done.stdout)
    assert seen["read_keystore"][0] == "failed"  # hidden at first...
    assert seen["umount"][0] == 0 and seen["read_keystore_after_umount"] == ["ok", '{"crypto": "very secret keystore"}']


async def test_network_is_shared_only_when_asked(tmp_path, secret_home, listener):
    spec = _attack_spec(tmp_path, secret_home, listener, allow_network=True)
    seen = json.loads((await run_sandboxed(spec, timeout=60, backend="bwrap")).stdout)
    assert seen["connect"][0] == "ok" and seen["read_keystore"][0] == "failed"


async def test_verify_reports_what_is_in_effect(tmp_path, secret_home, backend):
    report = await verify_sandbox(SandboxSpec(command=("true",), work_dir=tmp_path / "job"), backend=backend)
    assert report.verified and report.backend == backend
    assert report.network_isolated and report.pid_isolated and report.capabilities_dropped and report.no_new_privs
    assert str(secret_home) in report.hidden_paths and str(Path.home()) in report.hidden_paths
    assert report.writable_paths == (str((tmp_path / "job").resolve()),)


def _path_with_only(tmp_path: Path, tools: tuple[str, ...]) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in tools:
        if found := shutil.which(tool):
            (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


async def test_the_best_working_runner_is_chosen_in_table_order(tmp_path, monkeypatch, backend):
    """bwrap when it works; without bwrap on PATH (a real condition) the unshare fallback, which says what it
    lacks; a runner asked for by name that does not work here is refused."""
    spec = SandboxSpec(command=(sys.executable, "-c", "print('inside')"), work_dir=tmp_path / "job")
    if backend == "unshare":
        monkeypatch.setenv("PATH", _path_with_only(tmp_path, ("unshare", "setpriv", "sh", "mount", "awk")))
    available_backends.cache_clear()
    try:
        result = await run_sandboxed(spec, timeout=60)
        assert result.returncode == 0 and result.stdout == b"inside\n", result.stderr
        assert result.report.backend == backend
        assert result.report.filesystem == {"bwrap": "private-root", "unshare": "host-read-only"}[backend]
        assert any("no private root" in n for n in result.report.notes) == (backend == "unshare")
        if backend == "unshare":
            with pytest.raises(SandboxError, match="'bwrap' is not usable here"):
                await run_sandboxed(spec, timeout=60, backend="bwrap")
    finally:
        available_backends.cache_clear()


# --- rlimits ----------------------------------------------------------------------------------------


async def test_memory_beyond_the_address_space_limit_fails(tmp_path, backend):
    spec = SandboxSpec(command=(sys.executable, "-c", "b = bytearray(1 << 30); print('allocated')"),
                       work_dir=tmp_path / "job", limits=SandboxLimits(address_space_bytes=512 << 20))
    result = await run_sandboxed(spec, timeout=60, backend=backend)
    assert result.returncode != 0 and b"MemoryError" in result.stderr and b"allocated" not in result.stdout


async def test_open_files_and_cpu_time_are_limited(tmp_path):
    many = "fs = [open('/dev/null') for _ in range(200)]; print('opened')"
    files = await run_sandboxed(SandboxSpec(command=(sys.executable, "-c", many), work_dir=tmp_path / "a",
                                            limits=SandboxLimits(open_files=64)), timeout=60)
    assert files.returncode != 0 and b"Too many open files" in files.stderr
    spin = await run_sandboxed(SandboxSpec(command=(sys.executable, "-c", "while True: pass"), work_dir=tmp_path / "b",
                                           limits=SandboxLimits(cpu_seconds=1)), timeout=60)
    assert spin.returncode != 0  # killed by the kernel (SIGXCPU/SIGKILL), not by the 60 s timeout


async def test_a_command_past_its_timeout_is_killed(tmp_path):
    with pytest.raises(SandboxError, match="killed"):
        await run_sandboxed(SandboxSpec(command=("sleep", "30"), work_dir=tmp_path / "job"), timeout=0.5)


# --- the plan, as data ------------------------------------------------------------------------------


def test_secrets_cannot_be_passed_in_through_env(tmp_path):
    for key in ("AITBC_WALLET_PASSWORD", "HF_TOKEN", "WANDB_API_KEY", "PRIVATE_KEY", "AWS_SECRET_ACCESS_KEY"):
        with pytest.raises(ValueError):
            SandboxSpec(command=("true",), work_dir=tmp_path, env={key: "x"})
    ok = SandboxSpec(command=("true",), work_dir=tmp_path, env={"MASTER_ADDR": "10.0.0.1", "TOKENIZERS_PARALLELISM": "0"})
    assert sandbox_env(ok)["MASTER_ADDR"] == "10.0.0.1" and "AITBC_WALLET_PASSWORD" not in sandbox_env(ok)


def test_mounts_go_parents_first_and_hiding_wins(tmp_path):
    home, work = Path("/root"), Path("/srv/aitbc/jobs/j1")
    spec = SandboxSpec(command=("true",), work_dir=work, read_only_paths=(Path("/srv"),))
    plan = mount_plan(spec, hidden=(home, Path("/srv/aitbc")), python_paths=(Path("/root/.pyenv/versions/3.11"),))
    order = [(m.kind, str(m.dest)) for m in plan if m.kind != "symlink" and not str(m.dest).startswith(("/usr", "/etc"))]
    # /srv before the tmpfs hiding /srv/aitbc; /root hidden before its interpreter is bound back;
    # the work directory, inside the hidden AITBC home, bound last.
    assert order == [("ro", "/srv"), ("hide", "/root"), ("hide", "/srv/aitbc"), ("ro", "/root/.pyenv/versions/3.11"),
                     ("rw", "/srv/aitbc/jobs/j1")]
    with pytest.raises(SandboxError):
        mount_plan(spec.model_copy(update={"work_dir": home}), hidden=(home,), python_paths=())


def test_the_fallback_covers_a_home_around_the_interpreter(tmp_path):
    home = tmp_path / "home"
    (home / ".pyenv" / "versions" / "3.11").mkdir(parents=True)
    (home / ".pyenv" / "versions" / "3.10").mkdir()
    (home / ".aitbc").mkdir()
    (home / "notes.txt").write_text("x")
    covers = cover_paths((home,), (home / ".pyenv" / "versions" / "3.11",))
    assert set(covers) == {home / ".aitbc", home / "notes.txt", home / ".pyenv" / "versions" / "3.10"}
    assert cover_paths((home / ".aitbc",), ()) == (home / ".aitbc",)
