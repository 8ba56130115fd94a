"""What checking a training's results cost (issue #29, item 1): from the audit log's spot checks."""

from aitbc_agent_sdk.records import VerificationSpend

verification_spend = VerificationSpend.of_checks


def test_no_check_is_no_spend():
    assert verification_spend([], {"j1": 3.0}) is None


def test_spend_sums_the_coordinators_seconds_against_the_checked_jobs_training():
    checks = [{"job_id": "j1", "passed": True, "seconds": 0.5},
              {"job_id": "j2", "passed": False, "seconds": 1.5},
              {"job_id": "j2", "passed": True, "seconds": 1.0}]  # a held copy checked twice counts its job once
    spend = verification_spend(checks, {"j1": 4.0, "j2": 6.0, "j3": 100.0})
    assert (spend.checks, spend.failed) == (3, 1)
    assert spend.coordinator_seconds == 3.0 and spend.checked_training_seconds == 10.0
    assert spend.ratio == 0.3 and spend.verifier_wei == 0


def test_checks_the_market_took_count_apart_with_their_verifiers_reports():
    checks = [{"job_id": "j1", "passed": True, "seconds": 0.0, "verified_on": "market", "verifiers": 6},
              {"job_id": "j2", "passed": True, "seconds": 0.2, "verified_on": "market", "verifiers": 9},
              {"job_id": "j3", "passed": True, "seconds": 2.0, "verified_on": "coordinator", "verifiers": 0},
              {"job_id": "j4", "passed": True, "seconds": 0.0, "verified_on": "market", "verifiers": "lots"}]
    spend = verification_spend(checks, {})
    assert (spend.on_market, spend.verifier_reports, spend.coordinator_seconds) == (3, 15, 2.2)


def test_a_check_with_odd_fields_counts_as_failed_and_costs_nothing_negative():
    spend = verification_spend([{"job_id": "j1", "seconds": -4.0}], {})
    assert (spend.failed, spend.coordinator_seconds, spend.ratio) == (1, 0.0, None)


def test_the_cost_preview_says_what_share_of_each_job_this_machine_re_executes():
    from aitbc_agent_sdk.flow import preview

    notes = preview([10, 10], [], 3, spot_checks=5, segments=64).notes()
    assert any("5 of its 64 segments" in n and "about 8 %" in n for n in notes)
    assert any("spot checks off" in n for n in preview([10], [], 1, spot_checks=0).notes())
    assert any("2 of its 2 segments" in n and "100 %" in n for n in preview([1], [], 1, spot_checks=5,
                                                                             segments=2).notes())
    assert not any("spot" in n for n in preview([10], [], 1).notes())  # not part of every preview


def test_the_cost_preview_prices_the_verifiers_when_checks_go_to_the_market():
    from aitbc_agent_sdk.flow import preview

    here = preview([64 * 10**15] * 2, [], 3, spot_checks=5, segments=64)
    assert here.verification_wei == 0 and len(here.items()) == 1
    market = preview([64 * 10**15] * 2, [], 3, spot_checks=5, segments=64, verify_on="market", canary_rate=0.2)
    # 5 segments and 0.2 x 5 canaries of 64, at each verifier's price: 6/64 of the deposit
    assert market.verification_wei == market.deposit_wei * 6 // 64
    assert market.items()[-1] == ("verifiers, paid per check through the escrow as it falls due (about)",
                                  market.verification_wei)
    assert market.as_json()["verification_wei"] == str(market.verification_wei)
    auto = preview([64 * 10**15] * 2, [], 3, spot_checks=5, segments=64, verify_on="auto", canary_rate=0.0)
    assert len(auto.items()) == 1 and auto.verification_wei == auto.deposit_wei * 5 // 64
    assert any("up to about" in n for n in auto.notes())
