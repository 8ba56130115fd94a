from aitbc_agent_sdk.coordinator import earned_wei, plan_payouts
from aitbc_agent_sdk.records import CheckpointRef, WorkerContract

A = "0x" + "a" * 40
B = "0x" + "b" * 40
C = "0x" + "c" * 40
CID = "QmbFMke1KXqnYyBBWxB74N4c5SBnJMVAiMNRcGu6x1AwQH"
CID2 = "QmT78zSuBmuS4z925WZfrqQ1qHaJ56DQaTfyMUF7F8ff5o"


def contract(worker: str, price: int, rounds: int = 3) -> WorkerContract:
    return WorkerContract(contract_id=f"c-{worker[-1]}", training_id="t", worker_id=worker, coordinator=C,
                          price_wei=price, rounds=rounds, accepted_at=0.0)


def ref(worker: str, round_: int, cid: str = CID) -> CheckpointRef:
    return CheckpointRef(checkpoint_id=cid, cid=cid, job_id=f"j-{worker[-1]}-{round_}", worker_id=worker,
                         training_id="t", round=round_, samples=10, loss=0.1)


def test_earned_is_capped_at_the_contract():
    assert earned_wei(contract(A, 7, rounds=3), 2) == 14
    assert earned_wei(contract(A, 7, rounds=3), 5) == 21


def test_payouts_follow_accepted_rounds_and_latest_result():
    accepted = [ref(A, 1), ref(A, 2, CID2), ref(A, 2, CID2), ref(B, 1)]
    payouts = plan_payouts([contract(A, 100), contract(B, 50), contract(C, 10)], accepted, {})
    assert [(p.worker_id, p.amount_wei, p.result_cid) for p in payouts] == [
        (contract(A, 1).worker_id, 200, CID2), (contract(B, 1).worker_id, 50, CID)]


def test_what_was_paid_on_chain_is_not_paid_again():
    accepted = [ref(A, 1), ref(A, 2)]
    assert plan_payouts([contract(A, 100)], accepted, {contract(A, 1).worker_id: 200}) == []
    [partial] = plan_payouts([contract(A, 100)], accepted, {contract(A, 1).worker_id: 150})
    assert partial.amount_wei == 50


def test_a_replacement_earns_its_own_price_but_never_more_than_the_slot_it_took_over():
    # B took over A's slot (3 rounds x 100 = 300 wei) and delivered rounds 2 and 3
    accepted = [ref(B, 2), ref(B, 3, CID2)]
    b = contract(B, 120)
    [cheap] = plan_payouts([b], accepted, {}, slot_amounts={b.worker_id: 300})
    assert (cheap.amount_wei, cheap.result_cid) == (240, CID2)
    [capped] = plan_payouts([b], accepted, {}, slot_amounts={b.worker_id: 200})
    assert capped.amount_wei == 200
    assert plan_payouts([b], accepted, {}, slot_amounts={}) == []  # no slot on chain: nothing to release
