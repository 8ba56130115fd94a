"""``aitbc cluster mount``: shared datasets checked on every host (access, hash manifest, speed).

What runs where:

* **s3fs**: really mounted over FUSE in two host namespaces, against ``moto_server`` (S3) in a
  third, through each host's ``aitbc cluster serve`` agent and the CLI in a control namespace.
* **NFS**: this kernel has no NFS client, so no NFS mount can be made here. nfs-ganesha (user
  space) serves an export in one namespace; the agents in two others check it through libnfs
  (``nfs-ls``/``nfs-cat``/``nfs-cp``): read and write access, the hash manifest (compared with
  the export's files on disk) and read speed. The report says the mount itself was not made.
* **IPFS**: a CID fetched by two in-process agents from the test session's js-ipfs daemon,
  every block verified, and the same manifest on both.

Missing tools (s3fs, moto_server, nfs-ganesha, libnfs-utils, js-ipfs) fail the tests that need
them, with the package to install.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import get_args

import pytest
from eth_account import Account

from aitbc_agent_sdk.cluster import ClusterSpec, HostSpec
from aitbc_agent_sdk.cluster._host_agent import ClusterAgent, HostAgentConfig
from aitbc_agent_sdk.cluster._launcher import TrainingCoordinator
from aitbc_agent_sdk.cluster.mounts import (
    MOUNT_BACKENDS, PROBE_PREFIX, MountCommand, MountReport, MountSettings, MountSource, check_access,
    compare_manifests, ensure_client, hash_manifest, make_manifest, measure_io, perform_mount, summarize_mounts,
)
from aitbc_agent_sdk.audit import AuditLog
from aitbc_agent_sdk.messaging import InMemoryBus, SignedChannel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from netns_hosts import ClusterHarness, NetnsHosts, can_make_namespaces  # noqa: E402

# --- pure checks ------------------------------------------------------------------------------


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def test_manifests_name_missing_extra_and_changed_files(tmp_path):
    base = {"train/a.bin": b"a" * 100, "train/b.bin": b"b" * 50, "labels.csv": b"x,y\n1,2\n"}
    same = [hash_manifest(_tree(tmp_path / n, base)) for n in ("h0", "h1")]
    odd = dict(base)
    odd.pop("train/b.bin")
    odd["labels.csv"] = b"x,y\n1,3\n"
    odd["stray.tmp"] = b""
    different = hash_manifest(_tree(tmp_path / "h2", odd))
    (tmp_path / "h1" / f"{PROBE_PREFIX}h1-123").write_bytes(b"probe")  # probes never count
    assert hash_manifest(tmp_path / "h1") == same[1]
    assert same[0].digest == same[1].digest and same[0].count == 3 and same[0].bytes_total == 158
    cmp = compare_manifests({"h0": same[0], "h1": same[1], "h2": different})
    assert not cmp.ok and cmp.agreeing == ("h0", "h1") and cmp.digest == same[0].digest
    assert cmp.differences == {"h2": {"missing": ["train/b.bin"], "extra": ["stray.tmp"], "changed": ["labels.csv"]}}
    assert compare_manifests({"h0": same[0], "h1": same[1]}).ok
    assert not compare_manifests({}).ok


def test_summary_is_not_ok_when_a_host_sent_no_report_or_lacks_a_manifest():
    manifest = make_manifest({"a": (1, "00" * 32)})
    command = MountCommand(source="s3", target="bucket", mountpoint="/mnt/data")
    good = MountReport(host="h0", source="s3", target="bucket", mountpoint="/mnt/data", mounted=True,
                       method="s3fs-fuse", manifest=manifest)
    assert summarize_mounts(command, {"h0": good}).ok
    assert not summarize_mounts(command, {"h0": good}, {"h1": "no reply within 600s"}).ok
    bare = good.model_copy(update={"host": "h1", "manifest": None})
    assert not summarize_mounts(command, {"h0": good, "h1": bare}).ok


def test_access_and_speed_checks_on_a_local_directory(tmp_path):
    _tree(tmp_path, {"data.bin": os.urandom(300_000)})
    access = check_access(tmp_path, write=True, tag="t")
    assert access.readable and access.writable and not access.errors
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(PROBE_PREFIX)]  # the probe is removed
    io = measure_io(tmp_path, size=1 << 20, write=True, tag="t")
    assert io.write_mb_s and io.read_mb_s and io.latency_ms is not None and io.probe_bytes == 1 << 20
    readonly = measure_io(tmp_path, size=1 << 20, write=False, tag="t")
    assert readonly.write_mb_s is None and readonly.read_mb_s  # the largest existing file is read
    denied = check_access(Path("/proc/1"), write=True, tag="t")  # procfs: no new files, even for root
    assert denied.readable and denied.writable is False and denied.errors


def test_a_missing_client_is_installed_with_apt_or_the_failure_is_reported(tmp_path, monkeypatch):
    """The apt-get here is a stand-in script (a test must not install packages): it 'installs' by
    creating the binary, or fails the way apt-get does offline."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    log = tmp_path / "apt.log"
    apt = tmp_path / "apt-get"
    apt.write_text(f'#!/bin/sh\necho "$@" >> {log}\nprintf "#!/bin/sh\\n" > {bindir}/aitbc-fake-fs\n'
                   f'chmod +x {bindir}/aitbc-fake-fs\n')
    apt.chmod(0o755)
    found, installed, error = ensure_client("aitbc-fake-fs", install=True, apt_get=[str(apt)], package="fake-pkg")
    assert error is None and installed == "fake-pkg" and found == str(bindir / "aitbc-fake-fs")
    assert log.read_text().split() == ["install", "-y", "--no-install-recommends", "fake-pkg"]
    again = ensure_client("aitbc-fake-fs", install=True, apt_get=[str(apt)], package="fake-pkg")
    assert again == (str(bindir / "aitbc-fake-fs"), None, None)  # present: apt is not run again
    assert len(log.read_text().splitlines()) == 1

    offline = tmp_path / "apt-offline"
    offline.write_text("#!/bin/sh\necho 'E: Unable to locate package other-pkg' >&2\nexit 100\n")
    offline.chmod(0o755)
    found, installed, error = ensure_client("aitbc-other-fs", install=True, apt_get=[str(offline)], package="other-pkg")
    assert found is None and installed is None
    assert "apt-get install other-pkg" in error and "exit 100" in error and "Unable to locate package" in error
    _, _, error = ensure_client("aitbc-other-fs", install=False, package="other-pkg")
    assert "not installed" in error and "other-pkg" in error


async def test_each_source_kind_goes_to_its_own_backend(tmp_path):
    """One table entry per source kind; two refusals no backend but the right one gives (no I/O needed)."""
    assert set(MOUNT_BACKENDS) == set(get_args(MountSource))
    handle, no_api = await perform_mount(MountCommand(source="ipfs", target="bafy", mountpoint=str(tmp_path / "i")),
                                         host="h0")
    assert handle is None and no_api.method == "ipfs-fetch" and not no_api.ok and "no IPFS API" in no_api.problems[0]
    handle, bad = await perform_mount(MountCommand(source="nfs", target="no-colon", mountpoint=str(tmp_path / "n")),
                                      host="h0")
    assert handle is None and bad.source == "nfs" and bad.method == "none" and "SERVER:/path" in bad.problems[0]


# --- IPFS: two agents fetch and verify the same CID -------------------------------------------

async def test_ipfs_source_is_fetched_verified_and_identical_on_every_host(ipfs_daemon, tmp_path):
    from aitbc_agent_sdk.storage._kubo import KuboClient

    payload = os.urandom(700_000)  # several blocks: the tree is walked and every block checked
    async with KuboClient(ipfs_daemon, timeout=60.0) as client:
        cid = await client.add(payload)
    bus = InMemoryBus()
    coord = SignedChannel(bus, Account.create())
    hosts = {n: SignedChannel(bus, Account.create()) for n in ("h0", "h1")}
    spec = ClusterSpec(name="lab", hosts=tuple(HostSpec(name=n, address=c.address) for n, c in hosts.items()),
                       coordinators=(coord.address,))
    settings = MountSettings(ipfs_api=ipfs_daemon)
    agents = [ClusterAgent(c, spec, config=HostAgentConfig(work_root=tmp_path / n, mounts=settings))
              for n, c in hosts.items()]
    coordinator = TrainingCoordinator(coord, spec, audit=AuditLog(tmp_path / "audit.jsonl"))
    try:
        for agent in agents:
            await agent.__aenter__()
        reports = {}
        for h in spec.hosts:  # one filesystem here, so each "host" gets its own directory
            command = MountCommand(source="ipfs", target=cid, mountpoint=str(tmp_path / "mnt" / h.name),
                                   measure_bytes=1 << 20)
            reply = await coordinator.request(h, command, timeout=120)
            assert reply.ok, reply.error
            reports[h.name] = MountReport.model_validate(reply.data)
        missing = await coordinator.request(spec.hosts[0], MountCommand(
            source="ipfs", target="bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy",
            mountpoint=str(tmp_path / "mnt" / "missing")), timeout=120)
    finally:
        for agent in agents:
            await agent.__aexit__(None, None, None)
        await bus.close()
    for name, report in reports.items():
        assert report.mounted and report.method == "ipfs-fetch" and report.ok, report
        assert (tmp_path / "mnt" / name / cid).read_bytes() == payload
        assert report.manifest.files == {cid: (len(payload), __import__("hashlib").sha256(payload).hexdigest())}
        assert report.access.readable and report.access.writable and report.io.read_mb_s
    summary = summarize_mounts(MountCommand(source="ipfs", target=cid, mountpoint="/mnt"), reports)
    assert summary.ok and summary.comparison.agreeing == ("h0", "h1")
    assert not missing.ok and "fetching" in missing.error  # a CID the daemon cannot find is reported


# --- s3fs across namespaces -------------------------------------------------------------------

def _moto_server() -> str:
    venv = Path(sys.executable).parent / "moto_server"
    found = str(venv) if venv.exists() else shutil.which("moto_server")
    if not found:
        pytest.fail("moto_server is needed for the s3fs test: pip install 'moto[server]'", pytrace=False)
    return found


def _need(binary: str, package: str) -> None:
    if not shutil.which(binary) and not any(Path(d, binary).exists() for d in ("/usr/sbin", "/usr/bin")):
        pytest.fail(f"{binary} is needed: apt-get install {package}", pytrace=False)


@pytest.fixture
def netns_ok():
    why = can_make_namespaces()
    if why:
        pytest.fail(f"multi-host tests need network namespaces: {why}", pytrace=False)


S3_PUT = """
import sys, urllib.request
base = sys.argv[1]
def put(path, data=b""):
    request = urllib.request.Request(base + path, data=data, method="PUT",
                                     headers={"Content-Type": "application/octet-stream"})
    urllib.request.urlopen(request, timeout=90).read()
put("/dataset")  # moto takes unsigned requests: the bucket, then each object
for pair in sys.argv[2:]:
    rel, local = pair.split("=", 1)
    put("/dataset/" + rel, open(local, "rb").read())
"""


@pytest.mark.slow
def test_s3fs_mounts_on_every_host_with_the_same_manifest(netns_ok, tmp_path):
    _need("s3fs", "s3fs")
    moto = _moto_server()
    members = ["h0", "h1"]
    files = {"train/part-0.bin": os.urandom(200_000), "train/part-1.bin": os.urandom(50_000), "meta.json": b"{}"}
    local = _tree(tmp_path / "upload", files)
    expected = hash_manifest(local)
    creds = tmp_path / "s3.passwd"
    creds.write_text("testing:testing\n")
    creds.chmod(0o600)
    mountpoint = tmp_path / "mnt" / "dataset"
    started = time.monotonic()
    with NetnsHosts([*members, "ctl", "s3"]) as hosts:
        harness = ClusterHarness(hosts, tmp_path, members).setup()
        endpoint = f"http://{hosts.addr['s3']}:5000"
        hosts.spawn("s3", [moto, "-H", hosts.addr["s3"], "-p", "5000"], log=tmp_path / "moto.log")
        harness.wait_port("ctl", hosts.addr["s3"], 5000)
        put = hosts.run("ctl", [sys.executable, "-c", S3_PUT, endpoint,
                                *(f"{rel}={local / rel}" for rel in files)])
        assert put.returncode == 0, put.stderr
        for name in members:
            harness.start_agent(name, "--s3-credentials", str(creds), "--no-install")
        harness.wait_agents()
        done = harness.cli("cluster", "mount", "--cluster", "lab", "--wallet", "coord", "--s3", "dataset",
                           "--endpoint", endpoint, "--mountpoint", str(mountpoint), "--measure-bytes", str(1 << 20),
                           "--home", str(harness.home), "--json", timeout=120)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        # The mounts live in each host's agent (its own mount namespace), not here.
        assert not os.path.ismount(mountpoint)
        again = harness.cli("cluster", "mount", "--cluster", "lab", "--wallet", "coord", "--s3", "dataset",
                            "--endpoint", endpoint, "--mountpoint", str(mountpoint), "--home", str(harness.home),
                            "--json", timeout=120)
    report = json.loads(done.stdout)
    assert report["ok"] and sorted(report["hosts"]) == members
    for name in members:
        host = report["hosts"][name]
        assert host["mounted"] and host["method"] == "s3fs-fuse" and host["ok"], host
        assert host["access"] == {"readable": True, "writable": True, "errors": []}
        assert host["manifest"]["digest"] == expected.digest and host["manifest"]["count"] == 3
        assert host["io"]["write_mb_s"] > 0 and host["io"]["read_mb_s"] > 0 and host["io"]["latency_ms"] >= 0
    assert report["comparison"] == {"ok": True, "digest": expected.digest, "agreeing": members, "differences": {}}
    # Mounting over a live mount is refused on every host, and the CLI says so with exit 1.
    assert again.returncode == 1
    assert all("already a mount point" in " ".join(h["problems"]) for h in json.loads(again.stdout)["hosts"].values())
    print(f"s3fs on 2 hosts: {time.monotonic() - started:.1f}s")


# --- NFS: as far as this kernel allows --------------------------------------------------------

GANESHA_CONF = """
NFS_CORE_PARAM {{ Protocols = 4; NFS_Port = 2049; Bind_addr = {addr}; Enable_NLM = false; Enable_RQUOTA = false; }}
NFSV4 {{ Graceless = true; Lease_Lifetime = 10; Grace_Period = 10; Allow_Numeric_Owners = true;
         Only_Numeric_Owners = true; RecoveryBackend = fs; }}
NFS_KRB5 {{ Active_krb5 = false; }}
EXPORT {{ Export_Id = 1; Path = {export}; Pseudo = /data; Access_Type = RW; Squash = None; Protocols = 4;
          Transports = TCP; SecType = sys; FSAL {{ Name = VFS; }} }}
LOG {{ Default_Log_Level = WARN; }}
"""


@pytest.mark.slow
def test_nfs_export_is_checked_through_libnfs_and_the_missing_kernel_mount_is_reported(netns_ok, tmp_path):
    _need("ganesha.nfsd", "nfs-ganesha nfs-ganesha-vfs")
    _need("nfs-cp", "libnfs-utils")
    members = ["h0", "h1"]
    export = _tree(tmp_path / "export", {"images/0001.bin": os.urandom(1_500_000), "images/0002.bin": b"two",
                                         "labels.txt": b"cat\ndog\n"})
    expected = hash_manifest(export)
    with NetnsHosts([*members, "ctl", "nfs"]) as hosts:
        harness = ClusterHarness(hosts, tmp_path, members).setup()
        conf = tmp_path / "ganesha.conf"
        conf.write_text(GANESHA_CONF.format(addr=hosts.addr["nfs"], export=export))
        hosts.spawn("nfs", ["ganesha.nfsd", "-F", "-L", str(tmp_path / "ganesha.log"), "-f", str(conf),
                            "-p", str(tmp_path / "ganesha.pid")], log=tmp_path / "ganesha.out")
        harness.wait_port("ctl", hosts.addr["nfs"], 2049)
        for name in members:
            harness.start_agent(name, "--no-install")
        harness.wait_agents()
        done = harness.cli("cluster", "mount", "--cluster", "lab", "--wallet", "coord", "--nfs",
                           f"{hosts.addr['nfs']}:/data", "--mountpoint", str(tmp_path / "mnt"),
                           "--home", str(harness.home), "--json", timeout=120)
    report = json.loads(done.stdout or "{}")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]  # no mount was made: not ok
    assert not report["ok"] and report["comparison"]["ok"]
    assert report["comparison"]["digest"] == expected.digest and report["comparison"]["agreeing"] == members
    for name in members:
        host = report["hosts"][name]
        assert host["method"] == "libnfs-userspace" and not host["mounted"]
        assert host["problems"] == [f"{tmp_path / 'mnt'} not mounted: no kernel NFS client"], host["problems"]
        assert host["access"]["readable"] and host["access"]["writable"], host["access"]
        assert host["manifest"]["files"] == {k: list(v) for k, v in expected.files.items()}
        assert host["io"]["read_mb_s"] > 0 and host["io"]["latency_ms"] > 0 and host["io"]["write_mb_s"] is None
    assert any("not exercised: kernel NFS mount" in n for n in report["not_exercised"])
    # the write probes went to the server (libnfs has no delete), and manifests skip them
    assert len([p for p in export.iterdir() if p.name.startswith(PROBE_PREFIX)]) == 2
