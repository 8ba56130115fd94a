"""Result verification rules: each check rejects what it should and nothing honest."""

import math

import pytest
import torch
from eth_account import Account

from aitbc_agent_sdk.chain import EvidenceDomain, sign_result, training_key
from aitbc_agent_sdk.coordinator.checks._verification import (
    Inspection, inspect_result, judge_norms, loss_limit, norm_problem, result_signer, round_median, update_norm,
    validation_loss,
)
from aitbc_agent_sdk.records import FaultPolicy, JobConfig, TaskRef
from aitbc_agent_sdk.tasks._networks import build_model, model_spec_for
from aitbc_agent_sdk.data._datasets import load_dataset, train_test_split
from aitbc_agent_sdk.tasks._bound_task import bind_task
from aitbc_agent_sdk.tasks._task_loop import train_task

TID = "training-verify"
DOMAIN = EvidenceDomain(31337, "0x" + "5" * 40)
KEY = training_key("0x" + "9" * 40, TID)  # the coordinator's on-chain id of TID
CID = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
POLICY = FaultPolicy()


@pytest.fixture(scope="module")
def setting():
    data = load_dataset("digits")
    train, test = train_test_split(data, 0.2, 0)
    spec = model_spec_for("mlp", train)
    start = build_model(spec, seed=0)
    reference = {k: v.detach().clone() for k, v in start.state_dict().items()}
    trained = build_model(spec)
    trained.load_state_dict(reference)
    mlp = bind_task(TaskRef(name="mlp"))
    train_task(mlp.task, trained, train.subset(torch.arange(300).numpy()), mlp.params,
               JobConfig(learning_rate=1e-2, epochs=1), seed=1)
    honest = {k: v.detach().clone() for k, v in trained.state_dict().items()}
    validation = test.subset(torch.arange(200).numpy())
    return spec, reference, honest, validation, validation_loss(spec, reference, validation)


def inspect(setting, state, *, account=None, signature=None, seen_before=False):
    spec, reference, _, validation, start_loss = setting
    account = account or Account.create()
    if signature is None:
        signature = "0x" + sign_result(account, DOMAIN, KEY, 1, CID).hex()
    return inspect_result(job_id="job-1", worker_id=account.address, domain=DOMAIN, key=KEY, round=1, cid=CID,
                          signature=signature,
                          state=state, reference=reference, seen_before=seen_before, spec=spec,
                          validation=validation, start_loss=start_loss, policy=POLICY)


def test_an_honest_signed_result_passes_with_its_norm_and_loss(setting):
    found = inspect(setting, setting[2])
    assert found.problem is None and found.norm > 0 and found.val_loss < setting[4]


def test_a_signature_must_recover_to_the_worker(setting):
    worker, other = Account.create(), Account.create()
    forged = "0x" + sign_result(other, DOMAIN, KEY, 1, CID).hex()
    assert result_signer(DOMAIN, KEY, 1, CID, forged) == other.address
    found = inspect(setting, setting[2], account=worker, signature=forged)
    assert found.problem.startswith("result is not signed by the worker") and not found.slashable
    assert result_signer(DOMAIN, KEY, 1, CID, "0x" + "00" * 65) is None
    assert result_signer(DOMAIN, KEY, 1, CID, None) is None
    # a signature for another training, round, chain, registry or CID names someone else
    signed = "0x" + sign_result(worker, DOMAIN, KEY, 1, CID).hex()
    assert result_signer(DOMAIN, training_key("0x" + "9" * 40, "training-other"), 1, CID, signed) != worker.address
    assert result_signer(DOMAIN, KEY, 2, CID, signed) != worker.address
    assert result_signer(EvidenceDomain(1, DOMAIN.registry), KEY, 1, CID, signed) != worker.address
    assert result_signer(EvidenceDomain(31337, "0x" + "6" * 40), KEY, 1, CID, signed) != worker.address


def test_non_finite_and_wrongly_shaped_results_are_slashable_and_a_replay_is_not(setting):
    honest = setting[2]
    nan = {k: torch.full_like(v, math.nan) if v.is_floating_point() else v for k, v in honest.items()}
    assert "non-finite" in inspect(setting, nan).problem
    key = next(k for k, v in honest.items() if v.is_floating_point() and v.dim() == 2)
    shaped = dict(honest) | {key: honest[key][:, :-1].contiguous()}
    assert "shape" in inspect(setting, shaped).problem
    missing = {k: v for k, v in honest.items() if k != key}
    assert "names" in inspect(setting, missing).problem
    replay = inspect(setting, honest, seen_before=True)
    assert "replay" in replay.problem
    # Provable from the signed checkpoint alone; a replay is judged against other rounds' results.
    assert all(inspect(setting, s).slashable for s in (nan, shaped, missing))
    assert not replay.slashable


def test_a_result_that_makes_validation_loss_worse_is_rejected(setting):
    spec, reference, honest, _, start_loss = setting
    random = {k: torch.randn_like(v) * 3 if v.is_floating_point() else v for k, v in reference.items()}
    found = inspect(setting, random)
    # Non-IID data can do this to an honest worker: it loses the round's pay, never its bond.
    assert "validation loss" in found.problem and not found.slashable
    assert found.val_loss > loss_limit(start_loss, POLICY)
    assert loss_limit(0.1, POLICY) == pytest.approx(0.6)  # the absolute margin dominates when loss is low
    assert loss_limit(2.3, POLICY) == pytest.approx(3.45)  # the relative one when it is high


def test_update_norms_are_judged_against_the_rounds_median():
    def found(norm):
        return Inspection("j", "w", "c", None, norm=norm, val_loss=0.1)
    passed = {0: found(4.0), 1: found(4.5), 2: found(5.0), 3: found(450.0)}
    median = round_median([f.norm for f in passed.values()])
    assert median == 4.75  # the boosted update cannot move the median
    judged = judge_norms(passed, median, POLICY)
    assert [i for i, f in judged.items() if f.problem] == [3]
    assert not judged[3].slashable and "median" in judged[3].problem
    assert norm_problem(23.0, 4.75, POLICY) is None and norm_problem(24.0, 4.75, POLICY) is not None
    assert norm_problem(1e9, 0.0, POLICY) is None  # nobody moved: nothing to compare with


def test_a_number_that_is_no_number_fails_the_checks_closed(setting):
    """Issue #25: every comparison with a NaN is False, so "above the limit?" passed a NaN (fails closed now)."""
    assert norm_problem(math.inf, math.inf, POLICY) is not None  # huge float64 weights: an infinite norm
    spec, reference, honest, validation, _ = setting
    found = inspect((spec, reference, honest, validation, math.nan), honest)  # a round model with a NaN loss
    assert found.problem is not None and "validation loss" in found.problem


def test_update_norm_is_the_l2_norm_over_floating_tensors():
    ref = {"w": torch.zeros(2, 2), "steps": torch.tensor(3)}
    state = {"w": torch.tensor([[3.0, 0.0], [0.0, 4.0]]), "steps": torch.tensor(9)}
    assert update_norm(state, ref) == 5.0
