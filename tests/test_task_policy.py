"""Which tasks a provider runs: TaskPolicy, the contract-time refusal (policy, package, requirements), discovery.

Real parts: the local content store holds the packed tasks, ProviderTasks fetches and checks
them as a provider does when a contract is proposed, and the coordinator discovers signed
offers on the in-memory bus.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from eth_account import Account

from aitbc_agent_sdk.coordinator import Coordinator, CoordinatorSettings, EscrowAccount, TrainingDatabase
from aitbc_agent_sdk.market import WeightedScore
from aitbc_agent_sdk.messaging import InMemoryBus, SignedChannel, topics
from aitbc_agent_sdk.records import Hardware, Offer, TaskPolicy, TaskRef
from aitbc_agent_sdk.provider._tasks import ProviderTasks
from aitbc_agent_sdk.storage import LocalContentStore
from aitbc_agent_sdk.tasks._task_package import encode_package, pack_task

CID_A = "QmT78zSuBmuS4z925WZfrqQ1qHaJ56DQaTfyMUF7F8ff5o"
CID_B = "QmbFMke1KXqnYyBBWxB74N4c5SBnJMVAiMNRcGu6x1AwQH"
TASK_SOURCE = '''
from torch import nn
from aitbc_agent_sdk import TrainingTask

class Needy(TrainingTask):
    name = "needy"
    requires = REQUIRES

    def build_model(self, info, params):
        return nn.Linear(info.feature_shape[0], info.num_classes)
'''


def user_task(cid: str = CID_A, name: str = "mine") -> TaskRef:
    return TaskRef(name=name, cid=cid)


# --- TaskPolicy: pure ---------------------------------------------------------------------------

def test_every_policy_runs_the_built_ins():
    for policy in (TaskPolicy(), TaskPolicy(accepts="allow-list"), TaskPolicy(accepts="any")):
        assert policy.permits(None) and policy.permits(TaskRef(name="cnn"))
        assert policy.refusal(TaskRef(name="mlp")) is None


def test_builtin_only_refuses_user_code_and_says_so():
    policy = TaskPolicy()
    assert policy.accepts == "builtin"  # the default: a stranger's code is opt-in
    assert not policy.permits(user_task())
    reason = policy.refusal(user_task())
    assert reason is not None and "built-in tasks only" in reason and CID_A in reason and "'mine'" in reason


def test_allow_list_takes_listed_cids_only():
    policy = TaskPolicy(accepts="allow-list", allowed=(CID_A,))
    assert policy.permits(user_task(CID_A)) and policy.refusal(user_task(CID_A)) is None
    assert not policy.permits(user_task(CID_B))
    reason = policy.refusal(user_task(CID_B))
    assert reason is not None and "allow-listed tasks only" in reason and CID_B in reason


def test_any_takes_every_task():
    assert TaskPolicy(accepts="any").permits(user_task(CID_B))


def test_a_policy_is_validated():
    with pytest.raises(ValueError):
        TaskPolicy(accepts="everything")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        TaskPolicy(accepts="allow-list", allowed=("not a cid",))


# --- the provider at contract time: real ProviderTasks on the local store ------------------------

def provider_tasks(policy: TaskPolicy, store: LocalContentStore, tmp_path: Path) -> ProviderTasks:
    """As the provider builds it; kept task states are not used by the contract-time checks."""
    return ProviderTasks(policy, store, tmp_path / "task-state")


@pytest.fixture
def store(tmp_path: Path) -> LocalContentStore:
    return LocalContentStore(tmp_path / "store")


async def stored_task(store: LocalContentStore, tmp_path: Path, requires: dict[str, str], name: str) -> TaskRef:
    source = tmp_path / f"{name}.py"
    source.write_text(TASK_SOURCE.replace("REQUIRES", repr(requires)).replace('"needy"', repr(name)))
    package = pack_task(source)
    assert dict(package.manifest.requires) == requires  # the class attribute lands in the manifest
    return TaskRef(name=package.manifest.name, cid=await store.add(encode_package(package)))


async def test_a_builtin_only_provider_refuses_a_user_task_at_the_contract(store, tmp_path):
    ref = await stored_task(store, tmp_path, {}, "plain")
    reason = await provider_tasks(TaskPolicy(), store, tmp_path).refusal(ref)
    assert reason is not None and "built-in tasks only" in reason and ref.cid in reason
    assert await provider_tasks(TaskPolicy(), store, tmp_path).refusal(TaskRef(name="mlp")) is None


async def test_an_allow_list_provider_takes_the_allowed_cid_and_refuses_another(store, tmp_path):
    allowed = await stored_task(store, tmp_path, {}, "allowed")
    other = await stored_task(store, tmp_path, {}, "other")
    assert allowed.cid != other.cid
    tasks = provider_tasks(TaskPolicy(accepts="allow-list", allowed=(allowed.cid,)), store, tmp_path)
    assert await tasks.refusal(allowed) is None
    reason = await tasks.refusal(other)
    assert reason is not None and "allow-listed" in reason and other.cid in reason


@pytest.mark.parametrize("requires, named", [
    ({"surely-not-installed-pkg": ">=1"}, "surely-not-installed-pkg>=1 (not installed)"),
    ({"torch": "<1"}, "torch<1 (have "),
])
async def test_a_task_needing_what_the_environment_lacks_is_refused_with_the_package_named(
        store, tmp_path, requires, named):
    ref = await stored_task(store, tmp_path, requires, "needy")
    reason = await provider_tasks(TaskPolicy(accepts="any"), store, tmp_path).refusal(ref)
    assert reason is not None and named in reason and "lacks" in reason


async def test_a_task_whose_requirements_are_met_is_taken(store, tmp_path):
    ref = await stored_task(store, tmp_path, {"torch": ">=1", "pydantic": ""}, "satisfied")
    assert await provider_tasks(TaskPolicy(accepts="any"), store, tmp_path).refusal(ref) is None


async def test_a_cid_that_holds_no_task_package_is_refused(store, tmp_path):
    cid = await store.add(json.dumps({"format": "something else"}).encode())
    reason = await provider_tasks(TaskPolicy(accepts="any"), store, tmp_path).refusal(TaskRef(name="bogus", cid=cid))
    assert reason is not None and "cannot be read" in reason and "not a task package" in reason


# --- discovery -----------------------------------------------------------------------------------

async def test_discovery_skips_offers_whose_policy_does_not_permit_the_task(tmp_path):
    bus = InMemoryBus()
    ref = user_task(CID_A)
    policies = {"builtin": TaskPolicy(), "listed": TaskPolicy(accepts="allow-list", allowed=(CID_A,)),
                "other-list": TaskPolicy(accepts="allow-list", allowed=(CID_B,)), "any": TaskPolicy(accepts="any")}
    providers = {}
    for name, policy in policies.items():
        channel = SignedChannel(bus, Account.create())
        offer = Offer(provider=channel.address, price_wei=1, hardware=Hardware(cpu_model="c", cpu_cores=1,
                                                                              ram_bytes=1 << 30), tasks=policy)
        await channel.publish(topics.offer(channel.address), offer, retain=True)
        providers[channel.address] = name
    settings = CoordinatorSettings(discovery_timeout_s=1.0, min_stake_wei=0)  # no registry: no bonds to require
    try:
        async with TrainingDatabase(tmp_path / "db.sqlite") as db:
            account = Account.create()
            # Discovery reads offers and the local history; the escrow is not used.
            escrow = EscrowAccount(SimpleNamespace(address=account.address), None, None)  # type: ignore[arg-type]
            coordinator = Coordinator(channel=SignedChannel(bus, account), store=LocalContentStore(tmp_path / "s"),
                                      db=db, escrow=escrow, scoring=WeightedScore(), settings=settings)
            for_user_task = {providers[w.worker_id] for w in await coordinator.discover(task=ref)}
            for_builtin = {providers[w.worker_id] for w in await coordinator.discover(task=TaskRef(name="mlp"))}
            unfiltered = {providers[w.worker_id] for w in await coordinator.discover()}
    finally:
        await bus.close()
    assert for_user_task == {"listed", "any"}
    assert for_builtin == unfiltered == set(policies)
