"""A local js-ipfs daemon (the Kubo RPC API) for the devnet and the tests.

js-ipfs 0.66 comes from npm into ``tools/node`` (``make setup``). Two quirks it needs on
Node 20: ``Promise.withResolvers`` (``tools/node/polyfill.cjs``, loaded through
``NODE_OPTIONS=--require``) and a repo made with ``jsipfs init`` before ``daemon``.
The repo is configured to stay on 127.0.0.1 (or the one local address given as ``host``) with no peers: no bootstrap list, no
delegate routers, no mDNS or WebRTC-star discovery, and the daemon runs ``--offline``
without preload, so nothing ever leaves the machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from ._service import LOCALHOST, ServiceError, ServiceProcess, check_bind_host, spawn, stop, tail, wait_for_port

_REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout, for an editable install
_INIT_TIMEOUT = 120.0


def jsipfs_path(repo_root: Path | None = None) -> Path:
    """The ``jsipfs`` launcher that ``make setup`` installs under ``tools/node``."""
    root = Path(repo_root) if repo_root is not None else _REPO_ROOT
    path = root / "tools" / "node" / "node_modules" / ".bin" / "jsipfs"
    if not path.exists():
        raise ServiceError(f"js-ipfs is not installed ({path} is missing); run `make setup`"
                           " (it needs Node.js and npm)")
    return path


def _polyfill(jsipfs: Path) -> Path:
    # .bin/jsipfs -> tools/node/polyfill.cjs
    return jsipfs.parent.parent.parent / "polyfill.cjs"


def _env(ipfs_path: Path, jsipfs: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["IPFS_PATH"] = str(ipfs_path)
    polyfill = _polyfill(jsipfs)
    if polyfill.is_file():  # js-ipfs calls Promise.withResolvers, which Node 20 lacks
        env["NODE_OPTIONS"] = f"{env.get('NODE_OPTIONS', '')} --require {polyfill}".strip()
    return env


def _tcp(port: int, host: str = LOCALHOST) -> str:
    return f"/ip4/{host}/tcp/{port}"


def configure(config: dict[str, Any], *, api_port: int, gateway_port: int | None,
              swarm_port: int, rpc_port: int | None = None, host: str = LOCALHOST) -> dict[str, Any]:
    """Edit a js-ipfs config so the node listens on ``host`` only and has no peers. Pure."""
    host = check_bind_host(host)
    addresses = config.setdefault("Addresses", {})
    addresses["API"] = _tcp(api_port, host)
    addresses["Gateway"] = _tcp(gateway_port, host) if gateway_port is not None else []
    # js-ipfs' gRPC-over-websocket server starts for any truthy value (even []), so drop the key.
    addresses.pop("RPC", None)
    if rpc_port is not None:
        addresses["RPC"] = _tcp(rpc_port, host)
    addresses["Swarm"] = [_tcp(swarm_port, host)]  # the default also listens on 0.0.0.0 and a websocket
    addresses["Announce"] = []
    addresses["Delegates"] = []  # delegate routers are public HTTPS nodes
    config["Bootstrap"] = []
    discovery = config.setdefault("Discovery", {})
    discovery["MDNS"] = {"Enabled": False, "Interval": 10}
    discovery["webRTCStar"] = {"Enabled": False}
    return config


def init_repo(ipfs_path: Path, *, api_port: int, gateway_port: int | None = None, swarm_port: int,
              jsipfs: Path | None = None, host: str = LOCALHOST) -> None:
    """Create and configure a repo at ``ipfs_path`` (blocking; a few seconds of Node start-up)."""
    exe = jsipfs or jsipfs_path()
    ipfs_path = Path(ipfs_path)
    if not (ipfs_path / "config").is_file():
        ipfs_path.mkdir(parents=True, exist_ok=True)
        # --empty-repo: no help files added and pinned, so pin ls starts empty.
        try:
            done = subprocess.run([str(exe), "init", "--empty-repo"], env=_env(ipfs_path, exe),
                                  capture_output=True, text=True, timeout=_INIT_TIMEOUT, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ServiceError(f"jsipfs init failed for {ipfs_path}: {exc}") from exc
        if done.returncode != 0:
            raise ServiceError(f"jsipfs init failed for {ipfs_path} (exit {done.returncode}):\n"
                               f"{(done.stdout + done.stderr)[-2000:]}")
    config_file = ipfs_path / "config"
    try:
        config = json.loads(config_file.read_text())
        configure(config, api_port=api_port, gateway_port=gateway_port, swarm_port=swarm_port, host=host)
        config_file.write_text(json.dumps(config, indent=2))
    except (OSError, ValueError) as exc:
        raise ServiceError(f"cannot configure the js-ipfs repo {config_file}: {exc}") from exc


# Runs the daemon and stops it when process $1 is gone (a test run killed with SIGKILL
# never reaches its teardown, and a detached daemon would otherwise live on).
_WATCHDOG = ('parent=$1; shift; "$@" & child=$!; trap \'kill $child 2>/dev/null\' TERM INT; '
             'while kill -0 "$parent" 2>/dev/null && kill -0 $child 2>/dev/null; do sleep 1; done; '
             'kill $child 2>/dev/null; wait $child')


def start_ipfs(ipfs_path: Path, *, api_port: int, log: Path | None = None, jsipfs: Path | None = None,
               tied_to: int | None = None, host: str = LOCALHOST) -> ServiceProcess:
    """Spawn ``jsipfs daemon --offline`` on an initialised repo; returns at once.

    ``tied_to``: a pid (e.g. the test runner's) whose exit also stops the daemon.
    ``host``: the address the repo's API listens on (as given to :func:`init_repo`).
    """
    exe = jsipfs or jsipfs_path()
    ipfs_path = Path(ipfs_path)
    if not (ipfs_path / "config").is_file():
        raise ServiceError(f"{ipfs_path} is not an IPFS repo; call init_repo first")
    argv = [str(exe), "daemon", "--offline", "--enable-preload=false"]
    if tied_to is not None:
        argv = ["sh", "-c", _WATCHDOG, "ipfs-watchdog", str(tied_to), *argv]
    return spawn("ipfs", argv, port=api_port, host=check_bind_host(host), log=log or ipfs_path / "daemon.log",
                 env=_env(ipfs_path, exe))


async def wait_for_api(service: ServiceProcess, timeout: float = 60.0) -> str:
    """Wait until ``/api/v0/id`` answers (the TCP port opens before the node is ready)."""
    url = f"http://{service.host}:{service.port}"
    deadline = time.monotonic() + timeout
    await wait_for_port(service, timeout)
    last = "no answer"
    async with httpx.AsyncClient(base_url=url, timeout=5.0) as http:
        while time.monotonic() < deadline:
            if not service.alive():
                raise ServiceError(f"ipfs exited during start-up; last log lines:\n{tail(service.log)}")
            try:
                reply = await http.post("/api/v0/id")
                if reply.status_code == 200 and "ID" in reply.json():
                    return url
                last = f"HTTP {reply.status_code}: {reply.text[:200]}"
            except (httpx.HTTPError, ValueError) as exc:
                last = repr(exc)
            await asyncio.sleep(0.2)
    raise ServiceError(f"ipfs API {url} not ready within {timeout:.0f}s ({last}); last log lines:\n{tail(service.log)}")


async def start_ipfs_daemon(ipfs_path: Path, *, api_port: int, gateway_port: int | None = None,
                            swarm_port: int, log: Path | None = None, jsipfs: Path | None = None,
                            tied_to: int | None = None, timeout: float = 60.0,
                            host: str = LOCALHOST) -> tuple[ServiceProcess, str]:
    """Init (if needed), configure, start and wait for a daemon; returns it and its API URL."""
    await asyncio.to_thread(init_repo, ipfs_path, api_port=api_port, gateway_port=gateway_port,
                            swarm_port=swarm_port, jsipfs=jsipfs, host=host)
    service = start_ipfs(ipfs_path, api_port=api_port, log=log, jsipfs=jsipfs, tied_to=tied_to, host=host)
    try:
        url = await wait_for_api(service, timeout)
    except BaseException:
        await asyncio.to_thread(stop, service)
        raise
    return service, url
