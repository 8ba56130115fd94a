"""Coordinator steps on real ports (SQLite, the local content store): checking and averaging checkpoints."""

from types import SimpleNamespace

import pytest
import torch
from eth_account import Account

from aitbc_agent_sdk.chain import EvidenceDomain, sign_result, training_key
from aitbc_agent_sdk.coordinator import Coordinator, EscrowAccount, TrainingDatabase
from aitbc_agent_sdk.errors import TrainingError
from aitbc_agent_sdk.market import WeightedScore
from aitbc_agent_sdk.records import CheckpointRef, TrainingRecord, TrainingSpec
from aitbc_agent_sdk.storage import LocalContentStore
from aitbc_agent_sdk.wire._checkpoint import decode_state, encode_state

WORKER_KEY = Account.from_key("0x" + "11" * 32)
WORKER = WORKER_KEY.address
OTHER = "0x" + "2" * 40
COORD = "0x" + "9" * 40
# Where result evidence counts; these steps read it, and send nothing to a chain.
DOMAIN = EvidenceDomain(31337, "0x" + "5" * 40)


@pytest.fixture
async def coordinator(tmp_path):
    async with TrainingDatabase(tmp_path / "db.sqlite") as db:
        store = LocalContentStore(tmp_path / "store")
        # The channel is not used by these steps; of the escrow only the evidence domain and the key.
        escrow = EscrowAccount(SimpleNamespace(address=COORD), None, DOMAIN)  # type: ignore[arg-type]
        yield Coordinator(channel=None, store=store, db=db, escrow=escrow, scoring=WeightedScore())  # type: ignore[arg-type]


async def stored(coordinator, state) -> str:
    return await coordinator.store.add(encode_state(state))


def ref(cid: str, worker: str, samples: int, loss: float = 0.5, job: str = "job-1",
        signer=WORKER_KEY) -> CheckpointRef:
    signature = "0x" + sign_result(signer, DOMAIN, training_key(COORD, "t"), 1, cid).hex()
    return CheckpointRef(checkpoint_id=cid, cid=cid, job_id=job, worker_id=worker, training_id="t", round=1,
                         samples=samples, loss=loss, signature=signature)


async def test_federated_average_weights_by_samples_by_default(coordinator):
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.0])}
    b = {"w": torch.tensor([5.0, 6.0]), "b": torch.tensor([4.0])}
    refs = [ref(await stored(coordinator, a), WORKER, samples=1, loss=1.0),
            ref(await stored(coordinator, b), OTHER, samples=3, loss=0.2)]
    result = await coordinator.federated_average(refs)
    averaged = decode_state(await coordinator.store.cat(result.model_id))
    assert averaged["w"].tolist() == pytest.approx([(1 + 3 * 5) / 4, (2 + 3 * 6) / 4])
    assert averaged["b"].tolist() == pytest.approx([3.0])
    assert result.samples == 4 and result.loss == pytest.approx((1.0 + 3 * 0.2) / 4)
    # the seed re-uploads the returned bytes: same content, same CID
    assert await coordinator.store.add(result.model) == result.model_id
    # explicit weights still win (the seed passes 1/K each)
    equal = await coordinator.federated_average(refs, weights=[0.5, 0.5])
    assert decode_state(await coordinator.store.cat(equal.model_id))["w"].tolist() == pytest.approx([3.0, 4.0])


async def save_training_with_model(coordinator, model_state) -> None:
    model_cid = await stored(coordinator, model_state)
    spec = TrainingSpec(model_type="mlp", target_workers=1, rounds=1)
    await coordinator.db.save_training(TrainingRecord(training_id="t", spec=spec, coordinator=COORD,
                                                      model_cid=model_cid))


@pytest.mark.parametrize("bad,problem", [
    ({"w": torch.tensor([float("nan"), 1.0])}, "non-finite"),
    ({"w": torch.tensor([1.0, 2.0, 3.0])}, "shape"),
    ({"v": torch.tensor([1.0, 2.0])}, "names differ"),
])
async def test_collect_checkpoint_rejects_results_that_do_not_fit_the_model(coordinator, bad, problem):
    await save_training_with_model(coordinator, {"w": torch.zeros(2)})
    checkpoint = ref(await stored(coordinator, bad), WORKER, samples=5)
    await coordinator.db.save_checkpoint(checkpoint, "received")
    with pytest.raises(TrainingError, match=problem):
        await coordinator.collect_checkpoint(WORKER, "job-1")
    assert (await coordinator.db.checkpoint("job-1"))[1] == "rejected"
    assert await coordinator.db.worker_history(WORKER) == (0, 1)


async def test_collect_checkpoint_accepts_a_good_result_once_and_only_from_its_worker(coordinator):
    await save_training_with_model(coordinator, {"w": torch.zeros(2)})
    checkpoint = ref(await stored(coordinator, {"w": torch.ones(2)}), WORKER, samples=5)
    await coordinator.db.save_checkpoint(checkpoint, "received")
    with pytest.raises(Exception, match="no result from"):
        await coordinator.collect_checkpoint(OTHER, "job-1")
    assert await coordinator.collect_checkpoint(WORKER, "job-1") == checkpoint
    assert await coordinator.db.checkpoints("t", "accepted") == [checkpoint]
    assert await coordinator.db.worker_history(WORKER) == (1, 0)


async def test_collect_checkpoint_rejects_a_result_signed_by_someone_else(coordinator):
    await save_training_with_model(coordinator, {"w": torch.zeros(2)})
    checkpoint = ref(await stored(coordinator, {"w": torch.ones(2)}), WORKER, samples=5, signer=Account.create())
    await coordinator.db.save_checkpoint(checkpoint, "received")
    with pytest.raises(TrainingError, match="not signed by the worker"):
        await coordinator.collect_checkpoint(WORKER, "job-1")
    assert (await coordinator.db.checkpoint("job-1"))[1] == "rejected"
