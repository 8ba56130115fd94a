"""User settings: the config file, AITBC_* variables, ETH_RPC_URL, XDG dirs, networks by name, multiaddrs."""

from __future__ import annotations

from pathlib import Path

import pytest

from aitbc_agent_sdk.config import AgentConfig, default_home
from aitbc_agent_sdk.errors import ConfigError
from aitbc_agent_sdk.profile import network_profile
from aitbc_agent_sdk.settings import NetworkSettings, config_path, load_settings, parse_broker
from aitbc_agent_sdk._stack import stack_kind
from aitbc_agent_sdk.storage._address import parse_api_address
from aitbc_agent_sdk.storage._kubo import KuboClient

ESCROW = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
SEPOLIA = f"""
[networks.sepolia]
chain_id = 11155111
rpc_url = "https://rpc.file.example"
escrow = "{ESCROW.lower()}"
broker = "mqtts://broker.example:8883"
ipfs_api = "/dns4/ipfs.example/tcp/443/https"
"""


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No AITBC_*, ETH_RPC_URL or XDG variable from the caller's shell; HOME is an empty temp dir."""
    import os

    for name in list(os.environ):
        if name.startswith(("AITBC_", "XDG_")) or name == "ETH_RPC_URL":
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    return monkeypatch


def write_config(tmp_path: Path, env: pytest.MonkeyPatch, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    env.setenv("AITBC_CONFIG", str(path))
    return path


def test_builtin_networks_need_no_config_and_pick_their_stack(env: pytest.MonkeyPatch) -> None:
    assert AgentConfig().network == "embedded"
    assert stack_kind(AgentConfig(network="devnet").network) == "devnet"
    assert stack_kind(AgentConfig().network) == "embedded"


def test_the_seeds_blockchain_network_is_an_alias(env: pytest.MonkeyPatch) -> None:
    config = AgentConfig(name="distributed-training", blockchain_network="devnet", wallet_name="training-wallet")
    assert config.network == "devnet"
    assert "blockchain_network" not in config.model_dump()


def test_an_unconfigured_name_says_how_to_configure_it(tmp_path: Path, env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError) as caught:
        AgentConfig(name="distributed-training", blockchain_network="mainnet", wallet_name="training-wallet")
    text = str(caught.value)
    assert str(tmp_path / "user" / ".config" / "aitbc" / "config.toml") in text  # which file
    for needed in ("[networks.mainnet]", "chain_id =", "rpc_url =", "escrow =", "broker =", "ipfs_api =",
                   "AITBC_NETWORKS__MAINNET__RPC_URL", "known: embedded, devnet"):
        assert needed in text


def test_a_configured_name_resolves_to_its_endpoints(tmp_path: Path, env: pytest.MonkeyPatch) -> None:
    write_config(tmp_path, env, SEPOLIA)
    assert stack_kind(AgentConfig(network="sepolia").network) == "remote"
    network = load_settings().network_settings("sepolia")
    assert (network.chain_id, network.rpc_url, network.escrow) == (11155111, "https://rpc.file.example", ESCROW)
    assert network.ipfs_api == "https://ipfs.example:443"  # the multiaddr, read as a URL
    profile = network_profile("sepolia", network)
    assert (profile.bus.host, profile.bus.port, profile.bus.tls) == ("broker.example", 8883, True)
    assert (profile.store.kind, profile.store.api) == ("kubo", "https://ipfs.example:443")
    assert (profile.chain.chain_id, profile.chain.escrow, profile.name) == (11155111, ESCROW, "sepolia")


def test_env_beats_the_file_and_an_argument_beats_both(tmp_path: Path, env: pytest.MonkeyPatch) -> None:
    write_config(tmp_path, env, f'home = "{tmp_path / "file-home"}"\n' + SEPOLIA)
    assert default_home() == tmp_path / "file-home"
    env.setenv("AITBC_NETWORKS__SEPOLIA__RPC_URL", "https://rpc.env.example")
    env.setenv("AITBC_HOME", str(tmp_path / "env-home"))
    settings = load_settings()
    assert settings.network_settings("sepolia").rpc_url == "https://rpc.env.example"
    assert settings.network_settings("sepolia").chain_id == 11155111  # the rest still from the file
    assert default_home() == tmp_path / "env-home"
    assert AgentConfig(home=tmp_path / "arg-home").home == tmp_path / "arg-home"
    explicit = NetworkSettings(chain_id=5, rpc_url="https://rpc.arg.example", escrow=ESCROW,
                               broker="mqtt://127.0.0.1", ipfs_api="http://127.0.0.1:5001")
    assert AgentConfig(network=explicit).network == explicit


def test_eth_rpc_url_fills_the_chain_rpc(tmp_path: Path, env: pytest.MonkeyPatch) -> None:
    write_config(tmp_path, env, 'rpc_url = "http://file:8545"\n[networks.lab]\nchain_id = 31337\n'
                                f'escrow = "{ESCROW}"\nbroker = "lab:1883"\nipfs_api = "/ip4/10.0.0.2/tcp/5001"\n'
                                + SEPOLIA)
    assert load_settings().rpc_url == "http://file:8545"
    env.setenv("ETH_RPC_URL", "http://foundry:8545")
    settings = load_settings()
    assert settings.rpc_url == "http://foundry:8545"  # Foundry's variable over the file
    assert settings.network_settings("lab").rpc_url == "http://foundry:8545"  # a network naming none takes it
    assert settings.network_settings("sepolia").rpc_url == "https://rpc.file.example"  # one naming its own keeps it
    env.setenv("AITBC_RPC_URL", "http://aitbc:8545")
    assert load_settings().rpc_url == "http://aitbc:8545"  # our own variable over Foundry's


def test_xdg_data_home_moves_the_default_home_only_when_set(tmp_path: Path, env: pytest.MonkeyPatch) -> None:
    assert default_home() == tmp_path / "user" / ".aitbc"  # where existing users' state already is
    env.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_home() == tmp_path / "data" / "aitbc"
    assert AgentConfig().home == tmp_path / "data" / "aitbc"
    env.setenv("AITBC_HOME", str(tmp_path / "explicit"))
    assert default_home() == tmp_path / "explicit"


def test_xdg_config_home_is_where_the_file_is(tmp_path: Path, env: pytest.MonkeyPatch) -> None:
    env.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    (tmp_path / "cfg" / "aitbc").mkdir(parents=True)
    (tmp_path / "cfg" / "aitbc" / "config.toml").write_text('network = "sepolia"\n' + SEPOLIA)
    assert config_path() == tmp_path / "cfg" / "aitbc" / "config.toml"
    assert load_settings().network == "sepolia"
    env.setenv("AITBC_NETWORK", "devnet")
    assert load_settings().network == "devnet"


def test_reading_the_config_writes_nothing(tmp_path: Path, env: pytest.MonkeyPatch) -> None:
    env.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    env.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    load_settings()
    AgentConfig(network="devnet")
    default_home()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no config dir, no home, no user dir


@pytest.mark.parametrize(("text", "where"), [
    ("[networks.sepolia\nchain_id = 1", "not valid TOML"),
    (SEPOLIA.replace("chain_id = 11155111", 'chain_id = "eleven"'), "networks.sepolia.chain_id"),
    (SEPOLIA.replace("escrow =", "escrw ="), "networks.sepolia.escrw"),
    (SEPOLIA.replace("/dns4/ipfs.example/tcp/443/https", "ipfs.example"), "networks.sepolia.ipfs_api"),
    (SEPOLIA.replace("mqtts://broker.example:8883", "http://broker"), "networks.sepolia.broker"),
    ('rpc_url = "localhost"\n', "rpc_url"),
    ("[networks.devnet]\nchain_id = 1\n", "built in"),
])
def test_a_bad_config_file_names_the_file_and_key(tmp_path: Path, env: pytest.MonkeyPatch, text: str,
                                                  where: str) -> None:
    path = write_config(tmp_path, env, text)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert str(path) in str(caught.value) and where in str(caught.value)


def test_a_bad_environment_variable_is_named(tmp_path: Path, env: pytest.MonkeyPatch) -> None:
    write_config(tmp_path, env, SEPOLIA)
    env.setenv("AITBC_NETWORKS__SEPOLIA__CHAIN_ID", "eleven")
    with pytest.raises(ConfigError, match="AITBC_NETWORKS__SEPOLIA__CHAIN_ID"):
        load_settings()


def test_a_missing_aitbc_config_file_is_an_error(tmp_path: Path, env: pytest.MonkeyPatch) -> None:
    env.setenv("AITBC_CONFIG", str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match="nope.toml"):
        load_settings()


@pytest.mark.parametrize(("address", "url"), [
    ("/ip4/127.0.0.1/tcp/5001", "http://127.0.0.1:5001"),
    ("/dns4/ipfs.example/tcp/443/https", "https://ipfs.example:443"),
    ("/dns/ipfs.example/tcp/5001/http", "http://ipfs.example:5001"),
    ("/ip6/::1/tcp/5001", "http://[::1]:5001"),
    ("http://127.0.0.1:5001/", "http://127.0.0.1:5001"),
    ("https://ipfs.example", "https://ipfs.example"),
])
def test_kubo_multiaddrs_are_read_as_urls(address: str, url: str) -> None:
    assert parse_api_address(address) == url
    assert KuboClient(address).api_url == url


@pytest.mark.parametrize("address", ["/ip4/127.0.0.1/udp/5001", "/ip4/127.0.0.1/tcp/99999", "127.0.0.1:5001",
                                     "ftp://host:21", "/unix/tmp/api"])
def test_other_api_addresses_are_refused(address: str) -> None:
    with pytest.raises(ConfigError, match="multiaddr"):
        parse_api_address(address)


def test_broker_addresses() -> None:
    assert parse_broker("mqtts://b.example") == ("b.example", 8883, True)
    assert parse_broker("b.example:1884") == ("b.example", 1884, False)
    assert parse_broker("mqtt://127.0.0.1") == ("127.0.0.1", 1883, False)
    with pytest.raises(ConfigError):
        parse_broker("http://b.example")
