"""Cluster hardware inventory: NVML reading, the CPU-only fallback, the signed request/answer
path with its allow-list, and the ``aitbc cluster`` CLI (JSON, HTML, a real MQTT broker)."""

from __future__ import annotations

import asyncio
import json
import sys
from types import SimpleNamespace

import pytest
from eth_account import Account
from typer.testing import CliRunner

from aitbc_agent_sdk.cluster import (
    ClusterSpec, HostInventory, HostSpec, InventoryRequest, InventoryResponder, collect_inventory,
    inventory_html, load_cluster, local_inventory, read_gpus, read_local_inventory, save_cluster,
)
from aitbc_agent_sdk.cluster._transport import inventory_reply_topic, inventory_topic
from aitbc_agent_sdk.messaging import InMemoryBus, SignedChannel
from aitbc_agent_sdk.profile import BusSettings
from aitbc_cli.app import app

# --- reading the local host -------------------------------------------------------------------


def test_no_nvml_library_means_a_cpu_only_host(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` now raises ImportError
    host = read_local_inventory("h")
    assert host.cpu_only and host.gpus == () and host.gpu_probe == "nvml-missing"
    assert host.cpu_cores >= 1 and 0 < host.ram_available_bytes <= host.ram_total_bytes


def test_real_nvml_reports_gpus_or_says_why_not():
    """The real nvidia-ml-py on this machine: GPUs with sane numbers, or a CPU-only host and the reason."""
    gpus, probe = read_gpus()
    host = read_local_inventory("h")
    if probe == "nvml":
        assert gpus and not host.cpu_only
        assert all(0 <= g.memory_free_bytes <= g.memory_total_bytes and g.driver_version for g in gpus)
    else:
        assert not gpus and host.cpu_only
        assert probe in ("nvml-missing", "no-gpu") or probe.startswith("nvml-error: ")


class _FakeNvmlError(Exception):
    pass


def _fake_nvml(count: int = 2, fail_count: bool = False) -> SimpleNamespace:
    handles = [object() for _ in range(count)]

    def utilization(handle):
        if handle is handles[-1]:
            raise _FakeNvmlError("Not Supported")  # as NVML answers for a MIG slice
        return SimpleNamespace(gpu=37)

    def device_count():
        if fail_count:
            raise _FakeNvmlError("GPU is lost")
        return count

    return SimpleNamespace(
        NVMLError=_FakeNvmlError, nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: b"550.54.15", nvmlSystemGetCudaDriverVersion_v2=lambda: 12040,
        nvmlDeviceGetCount=device_count, nvmlDeviceGetHandleByIndex=lambda i: handles[i],
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3", nvmlDeviceGetUUID=lambda h: f"GPU-{handles.index(h)}",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=80 * 2**30, free=(70 + handles.index(h)) * 2**30),
        nvmlDeviceGetUtilizationRates=utilization)


def test_nvml_numbers_are_parsed_into_the_inventory():
    """Fault injection of NVML data: a fake NVML module returning fixed numbers tests the parsing
    only (bytes names, CUDA version encoding, a part without utilization). No real GPU is claimed."""
    host = read_local_inventory("h", nvml=_fake_nvml())
    assert not host.cpu_only and host.gpu_probe == "nvml"
    first, second = host.gpus
    assert (first.index, first.model, first.uuid) == (0, "NVIDIA H100 80GB HBM3", "GPU-0")
    assert first.driver_version == "550.54.15" and first.cuda_version == "12.4"
    assert first.memory_total_bytes == 80 * 2**30 and first.memory_free_bytes == 70 * 2**30
    assert first.utilization_percent == 37.0 and second.utilization_percent is None


def test_an_nvml_failure_mid_read_is_a_cpu_only_host_with_the_reason():
    """Fault injection: NVML initialises, then fails while counting devices."""
    host = read_local_inventory("h", nvml=_fake_nvml(fail_count=True))
    assert host.cpu_only and host.gpu_probe == "nvml-error: GPU is lost"


def test_cpu_only_is_derived_not_taken_from_the_wire():
    claimed = HostInventory.model_validate({"name": "h", "gpus": [], "cpu_only": False})
    assert claimed.cpu_only
    silent = HostInventory.unreachable("h", None, "no reply")
    assert not silent.cpu_only and not silent.reachable


# --- the signed request/answer path -------------------------------------------------------------


async def _impostor(channel: SignedChannel, cluster: str, victim: str, answered: asyncio.Event) -> None:
    """Answers requests meant for ``victim`` with its own (valid, but not allow-listed) signature."""
    async with channel.subscribe(inventory_topic(cluster, victim), InventoryRequest) as requests:
        async for request in requests:
            await channel.publish(inventory_reply_topic(cluster, request.sender, request.message.nonce),
                                  read_local_inventory("gpu-b", channel.address))
            answered.set()


async def test_silent_hosts_are_unreachable_and_strangers_are_ignored():
    bus = InMemoryBus()
    a, b, stranger, impostor = (SignedChannel(bus, Account.create()) for _ in range(4))
    coordinator = SignedChannel(bus, Account.create())
    spec = ClusterSpec(name="lab", hosts=(HostSpec(name="gpu-a", address=a.address),
                                          HostSpec(name="gpu-b", address=b.address)))
    faked = asyncio.Event()
    fake = asyncio.create_task(_impostor(impostor, "lab", b.address, faked))
    try:
        # gpu-b runs nothing; a stranger not in the spec runs a responder of its own.
        async with InventoryResponder.for_spec(a, spec) as responder_a, \
                InventoryResponder(stranger, "lab", name="stranger") as responder_s:
            inventory = await collect_inventory(coordinator, spec, timeout=1.0)
    finally:
        fake.cancel()
        await bus.close()

    assert faked.is_set(), "the impostor did answer, so ignoring it was really exercised"
    assert [h.name for h in inventory.hosts] == ["gpu-a", "gpu-b"]
    assert inventory.reachable_hosts == ["gpu-a"] and inventory.unreachable_hosts == ["gpu-b"]
    assert inventory.host("gpu-a").address == a.address
    assert "no reply" in (inventory.host("gpu-b").error or "")
    assert responder_a.answered == 1 and responder_s.answered == 0
    assert inventory.cpu_only_hosts == (["gpu-a"] if inventory.host("gpu-a").cpu_only else [])


async def test_a_host_answers_only_the_coordinators_its_spec_lists():
    bus = InMemoryBus()
    host, boss, outsider = (SignedChannel(bus, Account.create()) for _ in range(3))
    spec = ClusterSpec(name="lab", hosts=(HostSpec(name="h", address=host.address),), coordinators=(boss.address,))
    try:
        async with InventoryResponder.for_spec(host, spec):
            refused = await collect_inventory(outsider, spec, timeout=0.5)
            allowed = await collect_inventory(boss, spec, timeout=2.0)
    finally:
        await bus.close()
    assert refused.unreachable_hosts == ["h"] and allowed.reachable_hosts == ["h"]


async def test_local_inventory_goes_through_the_same_path():
    inventory = await local_inventory("box")
    (host,) = inventory.hosts
    assert host.name == "box" and host.reachable and host.address is not None
    assert inventory.cpu_only_hosts == (["box"] if not host.gpus else [])


def test_cluster_spec_round_trips_and_rejects_duplicates(tmp_path):
    spec = ClusterSpec(name="lab", hosts=(HostSpec(name="a", address=Account.create().address),))
    save_cluster(tmp_path, spec)
    assert load_cluster(tmp_path, "lab") == spec
    address = Account.create().address
    with pytest.raises(ValueError, match="unique"):
        ClusterSpec(name="lab", hosts=(HostSpec(name="a", address=address), HostSpec(name="b", address=address)))
    with pytest.raises(ValueError):
        ClusterSpec(name="a/b", hosts=spec.hosts)  # would reach into another topic level


# --- the CLI ------------------------------------------------------------------------------------


def test_cli_inventory_json_and_html(tmp_path):
    report = tmp_path / "inventory.html"
    result = CliRunner().invoke(app, ["cluster", "inventory", "--json", "--html", str(report),
                                      "--home", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    (host,) = data["hosts"]
    assert host["reachable"] and data["unreachable_hosts"] == []
    assert host["cpu_only"] == (data["gpu_count"] == 0) and data["cpu_only_hosts"] == ([host["name"]] if host["cpu_only"] else [])
    page = report.read_text()
    assert page.startswith("<!DOCTYPE html>") and host["name"] in page and "Summary" in page
    assert "<script" not in page and "http" not in page  # self-contained: nothing to fetch
    if host["cpu_only"]:
        assert "CPU-only (fallback)" in page


def test_html_lists_unreachable_hosts_and_escapes_names():
    from aitbc_agent_sdk.cluster import ClusterInventory

    inventory = ClusterInventory(cluster="lab", hosts=(HostInventory.unreachable("b", None, "<no reply>"),))
    page = inventory_html(inventory)
    assert "unreachable" in page and "&lt;no reply&gt;" in page and "<no reply>" not in page


async def test_cli_inventory_of_a_configured_cluster_over_mosquitto(tmp_path, mosquitto):
    """The CLI in its own process asks two hosts through a real broker: one answers, one is silent."""
    from aitbc_agent_sdk.messaging._mqtt import MqttBus

    host_account, silent = Account.create(), Account.create()
    spec = ClusterSpec(name="lab", bus=BusSettings(port=mosquitto.port),
                       hosts=(HostSpec(name="gpu-a", address=host_account.address),
                              HostSpec(name="gpu-b", address=silent.address)))
    save_cluster(tmp_path, spec)
    async with MqttBus("127.0.0.1", mosquitto.port, client_id=f"cluster-host-{id(spec)}", persistent=False) as bus:
        async with InventoryResponder.for_spec(SignedChannel(bus, host_account), spec):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "aitbc_cli.app", "cluster", "inventory", "--cluster", "lab", "--json",
                "--timeout", "3", "--home", str(tmp_path), stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    data = json.loads(out)
    assert data["reachable_hosts"] == ["gpu-a"] and data["unreachable_hosts"] == ["gpu-b"]
    assert data["hosts"][0]["address"] == host_account.address


def test_cli_create_and_list(tmp_path):
    runner = CliRunner()
    a, b = Account.create().address, Account.create().address
    created = runner.invoke(app, ["cluster", "create", "lab", "--host", f"gpu-a={a}", "--host", f"gpu-b={b}",
                                  "--home", str(tmp_path)])
    assert created.exit_code == 0, created.output
    assert [h.address for h in load_cluster(tmp_path, "lab").hosts] == [a, b]
    listed = runner.invoke(app, ["cluster", "list", "--json", "--home", str(tmp_path)])
    assert json.loads(listed.stdout) == {"clusters": ["lab"]}
    bad = runner.invoke(app, ["cluster", "create", "x", "--host", "no-address", "--home", str(tmp_path)])
    assert bad.exit_code != 0


@pytest.mark.parametrize("argv", [
    ["cluster", "inventory", "--timeout", "-1"],
    ["cluster", "inventory", "--timeout", "0"],
    ["cluster", "monitor", "--cluster", "lab", "--wait", "0"],
    ["cluster", "train", "--cluster", "lab", "--wallet", "w", "--script", "/t.py", "--hosts", "0"],
    ["cluster", "train", "--cluster", "lab", "--wallet", "w", "--script", "/t.py", "--hosts", "2", "--min-hosts", "3"],
    ["cluster", "train", "--cluster", "lab", "--wallet", "w", "--script", "/t.py", "--nproc-per-node", "0"],
    ["cluster", "train", "--cluster", "lab", "--wallet", "w", "--script", "/t.py", "--host-timeout", "-5"],
    ["cluster", "mount", "--cluster", "lab", "--wallet", "w", "--mountpoint", "/m", "--s3", "b", "--timeout", "0"],
])
def test_out_of_range_numbers_are_usage_errors_and_json_errors_are_objects(argv, tmp_path, capsys):
    from aitbc_cli.app import main

    with pytest.raises(SystemExit) as ended:
        main([*argv, "--home", str(tmp_path), "--json"])
    assert ended.value.code == 2
    error = json.loads(capsys.readouterr().out)
    assert error["code"] == 2 and error["error"]
    assert not (tmp_path / "clusters").exists()  # nothing ran


def test_every_cluster_command_documents_its_parameters_and_shows_an_example():
    import typer.main

    group = typer.main.get_command(app).commands["cluster"]
    for name, command in group.commands.items():
        assert "Example: aitbc cluster " + name in (command.help or ""), name
        for param in command.params:
            assert getattr(param, "help", None) or param.name == "help", f"cluster {name}: {param.name} has no help"
