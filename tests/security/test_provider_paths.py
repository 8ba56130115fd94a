"""Attack: a job id that is a path. The provider builds its job directory from the id and removes it
when the job ends, so ``../../../wallets`` once deleted ``$AITBC_HOME/wallets`` and an absolute id
deleted whatever it named. Now the id is refused before anything touches the disk, and the daemon
keeps serving.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aitbc_agent_sdk.errors import UnsafeNameError
from aitbc_agent_sdk.messaging import topics
from aitbc_agent_sdk.records import id_path

from tests.security.provider_rig import provider_rig, servers  # noqa: F401 (servers: a fixture)


async def test_a_job_id_that_is_a_path_neither_deletes_the_keystore_nor_stops_the_daemon(servers, tmp_path):
    victim = tmp_path / "someone-elses-directory"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    async with provider_rig(servers) as rig:
        keys = sorted(rig.keystore.iterdir())
        assert keys, "the provider's keystore should hold its wallet"
        contract = await rig.hire()
        for bad in ("../../../wallets", str(victim)):
            await rig.send(topics.jobs(rig.provider.address), await rig.job(contract, job_id=bad))
        valid = await rig.job(contract)
        await rig.send(topics.jobs(rig.provider.address), valid)
        # Jobs on one topic are taken in order: once the valid one is done, the bad ones were handled.
        done = await rig.feeds["results"].first(lambda v: v.message.job_id == valid.job_id)
        assert done.sender == rig.provider.address
        assert sorted(rig.keystore.iterdir()) == keys
        assert (victim / "precious").read_text() == "keep me"
        assert rig.provider.channel.verifier.dropped["invalid"] >= 2
        # nothing was ever reported for the bad ids
        assert {v.message.job_id for v in rig.feeds["progress"].items} == {valid.job_id}


@pytest.mark.parametrize("name", ["../x", "/etc", "a/b", "..", ".", "", "x" * 65, "a\x00b", "a b"])
def test_a_path_from_an_id_stays_inside_its_parent(tmp_path: Path, name: str) -> None:
    with pytest.raises(UnsafeNameError):
        id_path(tmp_path / "jobs", name)


def test_a_symlinked_id_that_leaves_its_parent_is_refused(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "job_1").symlink_to(tmp_path)
    with pytest.raises(UnsafeNameError):
        id_path(jobs, "job_1")
    assert id_path(jobs, "job_2") == jobs / "job_2"
