"""Attack: verification work (issue #29) sent to a provider by someone it has no contract with, for another
training than the contract's, or with a start state larger than the job allows. Each is dropped (counted),
or answered with a problem, before anything is fetched or trained; the hiring coordinator's real request,
which follows on the same subscription, is re-executed and reported, signed, with the committed end.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

from aitbc_agent_sdk.messaging import topics
from aitbc_agent_sdk.proof._trajectory import read_commitment
from aitbc_agent_sdk.records import TrajectoryChallenge, TrajectoryOpening, VerifyReport, VerifyRequest, new_id

from tests.security.provider_rig import TRAINING, WAIT_S, provider_rig, servers  # noqa: F401 (servers: a fixture)
from tests.security.test_borrowed_ids import delivered


async def test_verification_requests_from_strangers_or_out_of_bounds_do_no_work(servers):
    async with provider_rig(servers) as rig, AsyncExitStack() as exits:
        reports = await rig.watch("verified", f"{topics.PREFIX}/verified/#", VerifyReport, exits)
        openings = await rig.watch("openings", f"{topics.PREFIX}/openings/#", TrajectoryOpening, exits)
        provider = rig.provider
        contract = await rig.hire()
        job = await rig.job(contract)
        result = await delivered(rig, job)
        commitment = read_commitment(await rig.store.cat(result.message.checkpoint_cid))
        assert commitment is not None
        await rig.send(topics.challenge(provider.address), TrajectoryChallenge(
            job_id=job.job_id, training_id=TRAINING, round=1, segments=(0,), deadline_s=WAIT_S))
        opening = await openings.first(lambda v: v.message.job_id == job.job_id)
        start = next(s.cid for s in opening.message.states if s.boundary == 0)
        start_bytes = len(await rig.store.cat(start))

        def request(**job_fields) -> tuple[str, VerifyRequest]:
            request_id = new_id("v")
            fields = {"job_id": request_id, **job_fields}
            return request_id, VerifyRequest.model_construct(
                request_id=request_id, job=job.model_copy(update=fields), commitment=commitment, segment=0,
                start_cid=start, start_bytes=start_bytes, deadline_s=WAIT_S)

        verify = topics.verify(provider.address)
        _, unknown = request(contract_id=new_id("contract"))  # a contract it never agreed to
        _, elsewhere = request(training_id="training_00000000000other")  # its contract's, under another training
        await rig.send(verify, unknown)
        await rig.send(verify, elsewhere)
        too_big_id, too_big = request()
        await rig.send(verify, too_big.model_copy(update={"start_bytes": 1 << 39}))  # far above the job's bound
        real_id, real = request()
        await rig.send(verify, real)
        # a dispute's requests, on the worker's own job: trace every step of the segment, and stop after one
        first, last = commitment.segment_steps_of(0)
        points = tuple(range(1, last - first + 1))
        traced_id, traced = request()
        await rig.send(verify, traced.model_copy(update={"points": points}))
        stopped_id, stopped = request()
        await rig.send(verify, stopped.model_copy(update={"points": (1,), "stop": 1}))
        beyond_id, beyond = request()  # steps the segment does not have: refused as malformed, no work
        await rig.send(verify, beyond.model_copy(update={"points": (last - first + 1,)}))

        answered = await reports.first(lambda v: v.message.request_id == real_id)
        assert answered.sender == provider.address and answered.message.problem is None
        assert answered.message.state_hash == commitment.state_hashes[1]  # re-executed to the committed end
        assert answered.message.end_cid is not None and answered.message.signature is not None
        refused = await reports.first(lambda v: v.message.request_id == too_big_id)
        assert "exceed the job's bound" in (refused.message.problem or "")
        trace = (await reports.first(lambda v: v.message.request_id == traced_id)).message
        assert len(trace.trace) == len(points) and trace.trace[-1] == trace.state_hash == commitment.state_hashes[1]
        after_one = (await reports.first(lambda v: v.message.request_id == stopped_id)).message
        assert after_one.state_hash == after_one.trace[0] == trace.trace[0]
        assert {v.message.request_id for v in reports.items} == {real_id, too_big_id, traced_id, stopped_id}
        assert beyond_id not in {v.message.request_id for v in reports.items}
        assert provider.dropped["verifications: no contract of the sender for it"] == 2
        assert provider.verifications == 3
