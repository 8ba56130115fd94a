"""Hosts for multi-host tests: Linux network namespaces joined by a bridge, made and always removed.

``NetnsHosts(["h0", "h1", "ctl"])`` makes one namespace per name, each with ``eth0`` (a veth
pair whose other end is in a bridge namespace, so nothing appears in the root namespace) and
an address ``SUBNET.(i+1)/24``; the bridge namespace gets no address. Namespace names carry
the test run's pid and a random suffix, so parallel runs never clash, and since every address
lives inside these namespaces the same subnet can be used by every run.

Everything started with :meth:`NetnsHosts.spawn` is killed on :meth:`close`, and so is every
other process still inside one of the namespaces (only this object's namespaces: nothing else
can be in them), before the namespaces are deleted. Needs root (``ip netns``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SUBNET = "10.231.77"
PREFIX_LEN = 24


class NetnsError(RuntimeError):
    pass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


def can_make_namespaces() -> str | None:
    """None when this process can make network namespaces, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"aitbc-probe-{os.getpid()}-{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", probe)
    except (OSError, NetnsError) as exc:
        return f"'ip netns add' failed: {exc}"
    _ip("netns", "del", probe, check=False)
    return None


class NetnsHosts:
    """``with NetnsHosts(names) as hosts:`` namespaces up; all gone (processes too) after the block."""

    def __init__(self, names: Sequence[str], *, subnet: str = SUBNET) -> None:
        if len(names) > 250 or len(set(names)) != len(names):
            raise ValueError("names must be unique, at most 250")
        self.tag = f"at{os.getpid()}{secrets.token_hex(2)}"
        self.names = list(names)
        self.ns = {name: f"{self.tag}-{name}" for name in names}
        self.bridge = f"{self.tag}-br"
        self.addr = {name: f"{subnet}.{i + 1}" for i, name in enumerate(names)}
        self.procs: list[subprocess.Popen[Any]] = []
        self._made: list[str] = []

    def __enter__(self) -> NetnsHosts:
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _add(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._made.append(ns)

    def _make(self) -> None:
        self._add(self.bridge)
        _ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.bridge, "link", "set", "br0", "up")
        for i, name in enumerate(self.names):
            ns = self.ns[name]
            self._add(ns)
            # Both ends are created straight into their namespaces.
            _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"v{i}", "netns", self.bridge)
            _ip("-n", self.bridge, "link", "set", f"v{i}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.addr[name]}/{PREFIX_LEN}", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    # -- running things in a host --------------------------------------------------------------

    def argv(self, name: str, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns[name], *map(str, argv)]

    def spawn(self, name: str, argv: Sequence[str], *, log: Path | None = None, **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` in host ``name`` (own session); output to ``log`` when given."""
        handle = None
        if log is not None:
            handle = open(log, "ab")  # noqa: SIM115 - closed once the child has its copy
            kwargs.setdefault("stdout", handle)
            kwargs.setdefault("stderr", subprocess.STDOUT)
        try:
            proc = subprocess.Popen(self.argv(name, argv), start_new_session=True, **kwargs)
        finally:
            if handle is not None:
                handle.close()
        self.procs.append(proc)
        return proc

    def run(self, name: str, argv: Sequence[str], *, timeout: float = 60,
            **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.argv(name, argv), timeout=timeout, **kwargs)

    def pids(self, name: str) -> list[int]:
        done = _ip("netns", "pids", self.ns[name], check=False)
        return [int(p) for p in done.stdout.split()]

    def find(self, name: str, *needles: str) -> list[int]:
        """Pids in host ``name`` whose command line holds every needle."""
        found = []
        for pid in self.pids(name):
            with contextlib.suppress(OSError):
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if all(n in cmdline for n in needles):
                    found.append(pid)
        return found

    # -- teardown ----------------------------------------------------------------------------

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for _ in range(3):  # whatever is left inside the namespaces (daemonised s3fs, orphans)
            left = [pid for ns_name in self.names for pid in self.pids(ns_name) if ns_name in self.ns]
            left += self.pids_of(self.bridge)
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.3)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2)
        for ns in reversed(self._made):
            _ip("netns", "del", ns, check=False)
        self._made.clear()

    @staticmethod
    def pids_of(ns: str) -> list[int]:
        done = _ip("netns", "pids", ns, check=False)
        return [int(p) for p in done.stdout.split()]


# --- a cluster on those hosts: broker, wallets, cluster spec, one agent per host --------------

REPO = Path(__file__).resolve().parents[1]


class ClusterHarness:
    """A trusted cluster on :class:`NetnsHosts`: mosquitto in host ``ctl``, a coordinator wallet
    ``coord`` (the only allowed coordinator) and one wallet and ``aitbc cluster serve`` agent per
    training host. The CLI runs in ``ctl`` too, so every message crosses the namespaces' network.
    """

    def __init__(self, hosts: NetnsHosts, tmp: Path, members: Sequence[str], *, ctl: str = "ctl",
                 cluster: str = "lab", python: str | None = None) -> None:
        import sys

        self.hosts = hosts
        self.tmp = tmp
        self.members = list(members)
        self.ctl = ctl
        self.cluster = cluster
        self.python = python or sys.executable
        self.home = tmp / "home"
        self.port = 1883
        self.addresses: dict[str, str] = {}
        self.agents: dict[str, subprocess.Popen[Any]] = {}

    @property
    def broker(self) -> str:
        return self.hosts.addr[self.ctl]

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("AITBC_WALLET_PASSWORD", "AITBC_HOME", "AITBC_RPC_URL", "AITBC_IPFS_API")}
        env["PYTHONUNBUFFERED"] = "1"
        env["COLUMNS"] = "300"  # rich wraps messages at the terminal width, 80 without a terminal
        return env

    def setup(self) -> ClusterHarness:
        import asyncio

        from aitbc_agent_sdk.cluster._spec import ClusterSpec, HostSpec, save_cluster
        from aitbc_agent_sdk.devnet._mosquitto import mosquitto_config, mosquitto_path
        from aitbc_agent_sdk.devnet._network import wallet_store
        from aitbc_agent_sdk.profile import BusSettings, devnet_password

        password = devnet_password(self.home, create=True)
        assert password is not None
        store = wallet_store(self.home)

        async def wallets() -> dict[str, str]:
            made = {}
            for name in ["coord", *self.members]:
                made[name] = (await store.create(name, password)).address
            return made

        self.addresses = asyncio.run(wallets())
        spec = ClusterSpec(name=self.cluster,
                           hosts=tuple(HostSpec(name=m, address=self.addresses[m]) for m in self.members),
                           coordinators=(self.addresses["coord"],), bus=BusSettings(host=self.broker, port=self.port))
        save_cluster(self.home, spec)
        data = self.tmp / "broker"
        (data / "persistence").mkdir(parents=True, exist_ok=True)
        (data / "mosquitto.conf").write_text(mosquitto_config(data, host=self.broker, port=self.port))
        self.hosts.spawn(self.ctl, [str(mosquitto_path()), "-c", str(data / "mosquitto.conf")],
                         log=data / "mosquitto.log", cwd=data)
        self.wait_port(self.ctl, self.broker, self.port)
        return self

    def wait_port(self, where: str, host: str, port: int, timeout: float = 30) -> None:
        code = ("import socket,sys,time\nend=time.time()+float(sys.argv[3])\n"
                "while time.time()<end:\n"
                "    try:\n"
                "        socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=1).close(); sys.exit(0)\n"
                "    except OSError: time.sleep(0.1)\nsys.exit(1)")
        done = self.hosts.run(where, [self.python, "-c", code, host, str(port), str(timeout)], timeout=timeout + 10)
        if done.returncode != 0:
            raise NetnsError(f"{host}:{port} not reachable from {where} within {timeout}s")

    def agent_log(self, name: str) -> Path:
        return self.tmp / f"agent-{name}.log"

    def start_agent(self, name: str, *extra: str) -> subprocess.Popen[Any]:
        argv = [self.python, "-m", "aitbc_cli.app", "cluster", "serve", "--cluster", self.cluster, "--wallet", name,
                "--home", str(self.home), "--work-dir", str(self.tmp / "agents" / name), *extra]
        proc = self.hosts.spawn(name, argv, log=self.agent_log(name), env=self.env(), cwd=REPO)
        self.agents[name] = proc
        return proc

    def wait_agents(self, names: Sequence[str] | None = None, timeout: float = 90) -> None:
        """Until each agent's log says it serves (it has subscribed by then)."""
        deadline = time.monotonic() + timeout
        for name in names or self.members:
            while True:
                text = self.agent_log(name).read_text(errors="replace") if self.agent_log(name).exists() else ""
                if "serving cluster" in text:
                    break
                proc = self.agents.get(name)
                if proc is not None and proc.poll() is not None:
                    raise NetnsError(f"agent {name} exited with {proc.returncode}:\n{text[-3000:]}")
                if time.monotonic() > deadline:
                    raise NetnsError(f"agent {name} not serving after {timeout}s:\n{text[-3000:]}")
                time.sleep(0.2)

    def cli_argv(self, *args: str) -> list[str]:
        return [self.python, "-m", "aitbc_cli.app", *args]

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``aitbc ARGS --home HOME`` in the control host; ``--home`` goes after the sub-command."""
        return self.hosts.run(self.ctl, self.cli_argv(*args), timeout=timeout, env=self.env(), cwd=REPO)

    def spawn_cli(self, *args: str, stdout: Path, stderr: Path) -> subprocess.Popen[Any]:
        """``aitbc ARGS`` in the control host, in the background; stdout and stderr to files."""
        out, err = open(stdout, "wb"), open(stderr, "wb")  # noqa: SIM115 - closed below, the child keeps its copies
        try:
            return self.hosts.spawn(self.ctl, self.cli_argv(*args), stdout=out, stderr=err, env=self.env(), cwd=REPO)
        finally:
            out.close()
            err.close()
