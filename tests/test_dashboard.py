"""`aitbc dashboard` (issue #31): the pure cost figures, and the JSON API, the event stream, the pages and the
token rule against a home holding a real training run on the embedded stack."""

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
import uvicorn
from starlette.testclient import TestClient

from aitbc_cli.dashboard.app import create_app
from aitbc_cli.dashboard.command import bind, is_loopback
from aitbc_agent_sdk.records import TrainingCost
from aitbc_cli.common import wei_strings

ETH = 10**18


# -- cost: pure arithmetic (the snapshot's, so monitor, --json and the dashboard agree) ------------------

def receipt(worker: str, round_: int, cumulative: int) -> dict:
    return {"worker": worker, "round": round_, "cumulative_wei": cumulative}  # a receipt_sent's fields


def test_cost_during_a_run_counts_the_receipts_and_projects_the_rest():
    receipts = [receipt("a", 1, 10), receipt("b", 1, 12), receipt("a", 2, 20), receipt("b", 2, 24)]
    cost = TrainingCost.of(rounds_done=2, rounds=5, finished=False, deposit_wei=110, payments=[], receipts=receipts)
    assert cost.spent_wei == 44 and cost.paid_wei == 0
    assert [(r.round, r.wei) for r in cost.per_round_wei] == [(1, 22), (2, 22)]
    assert cost.per_worker_wei == {"a": 20, "b": 24}
    assert cost.mean_round_wei == 22 and cost.projected_wei == 110 and cost.deposit_left_wei == 66


def test_cost_after_settlement_is_what_was_paid_and_projects_nothing_more():
    receipts = [receipt("a", 1, 10), receipt("a", 1, 10), receipt("a", 2, 20)]  # a resent receipt adds nothing
    cost = TrainingCost.of(rounds_done=2, rounds=5, finished=True, deposit_wei=50,
                           payments=[("a", 20), ("b", 7)], receipts=receipts)
    assert [(r.round, r.wei) for r in cost.per_round_wei] == [(1, 10), (2, 10)]
    assert cost.per_worker_wei == {"a": 20, "b": 7}  # b was paid without receipts (an older training)
    assert cost.spent_wei == cost.paid_wei == 27 and cost.projected_wei == 27  # stopped early: no more to spend


def test_cost_before_the_first_round_has_no_rate_and_no_escrow_no_deposit():
    cost = TrainingCost.of(rounds_done=0, rounds=3, finished=False, deposit_wei=None, payments=[],
                           receipts=[receipt("a", "1", 5), {"worker": "b", "round": True, "cumulative_wei": 9}])
    assert (cost.spent_wei, cost.mean_round_wei, cost.projected_wei, cost.deposit_left_wei) == (0, None, None, None)
    as_json = wei_strings(cost.model_dump(mode="json"))  # a malformed receipt (round "1" or True) counts nothing
    assert as_json["spent_wei"] == "0" and as_json["deposit_wei"] is None and as_json["per_round_wei"] == []


def test_cost_json_keeps_large_amounts_exact():
    cost = TrainingCost.of(rounds_done=1, rounds=2, finished=False, deposit_wei=4 * ETH + 1,
                           payments=[], receipts=[receipt("a", 1, 2 * ETH + 1)])
    as_json = wei_strings(cost.model_dump(mode="json"))
    assert as_json["projected_wei"] == str(4 * ETH + 2) and as_json["deposit_left_wei"] == str(2 * ETH)
    assert as_json["per_round_wei"] == [{"round": 1, "wei": str(2 * ETH + 1)}]


# -- a home holding a real training ---------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, dict]:
    """One tiny digits run (2 workers, 2 rounds, 1 epoch) on the embedded stack, as a user starts it."""
    home = tmp_path_factory.mktemp("dashboard") / "home"
    env = {**os.environ, "AITBC_HOME": str(home)}
    done = subprocess.run([sys.executable, "-m", "aitbc_cli.app", "distributed-training", "run", "--workers", "2",
                           "--providers", "2", "--rounds", "2", "--epochs", "1", "--json"], env=env,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert done.returncode == 0, done.stderr
    return home, json.loads(done.stdout)


def client(home: Path, **kwargs) -> TestClient:
    return TestClient(create_app(home, network="embedded", **kwargs), base_url="http://127.0.0.1")


def files_of(home: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in home.rglob("*") if p.is_file()}


def test_the_api_lists_and_shows_the_training_and_writes_nothing(trained):
    home, report = trained
    before = files_of(home)
    api = client(home)
    rows = api.get("/api/trainings").json()["trainings"]
    assert [(r["training_id"], r["phase"], r["round"], r["rounds"], r["workers"]) for r in rows] == [
        (report["training_id"], "complete", 2, 2, 2)]
    assert rows[0]["deposit_wei"] == report["escrow"]["deposited_wei"]
    assert rows[0]["spent_wei"] == report["escrow"]["paid_wei"]

    view = api.get(f"/api/trainings/{report['training_id']}").json()
    assert [r["round"] for r in view["round_metrics"]] == [1, 2]
    assert [r["loss"] for r in view["round_metrics"]] == pytest.approx([r["loss"] for r in report["rounds"]])
    assert view["finished"] and view["phase"] == "complete"
    assert {w["worker_id"] for w in view["workers"]} == {w["address"] for w in report["workers"]}
    assert [r["round"] for r in view["worker_losses"]] == [1, 2]
    assert all(len(r["losses"]) == 2 for r in view["worker_losses"])
    assert {p["tx_hash"] for p in view["payments"]} == {w["tx_hash"] for w in report["workers"]}
    events = [a["event"] for a in view["audit"]]
    assert events[0] == "escrow_funded" and events[-1] == "refund" and events.count("payment") == 2
    cost = view["cost"]
    assert cost["spent_wei"] == cost["paid_wei"] == report["escrow"]["paid_wei"]
    assert cost["projected_wei"] == cost["spent_wei"] and cost["rounds_done"] == 2
    assert sum(int(r["wei"]) for r in cost["per_round_wei"]) == int(cost["spent_wei"])
    assert cost["per_worker_wei"] == {w["address"]: w["paid_wei"] for w in report["workers"]}
    assert files_of(home) == before  # read only: not one file of the home changed


def test_an_unknown_or_malformed_training_is_a_404_with_a_message(trained):
    home, _ = trained
    api = client(home)
    for bad in ("training_0000000000000000", "a.b", "..%2F..%2Fetc", "x" * 300):
        response = api.get(f"/api/trainings/{bad}")
        assert response.status_code == 404, bad
        assert response.json()["error"]
        assert api.get(f"/api/trainings/{bad}/events").status_code == 404
        assert api.get(f"/trainings/{bad}").status_code == 404


def test_an_empty_home_lists_nothing_and_creates_nothing(tmp_path):
    home = tmp_path / "empty"
    api = client(home)
    assert api.get("/api/trainings").json() == {"trainings": []}
    assert api.get("/api/trainings/training_0000000000000000").status_code == 404
    assert not home.exists()


def test_the_market_without_a_network_to_ask_is_a_503_with_a_message(tmp_path):
    response = client(tmp_path).get("/api/market")
    assert response.status_code == 503 and "embedded" in response.json()["error"]
    devnet = TestClient(create_app(tmp_path / "no-devnet", network="devnet"), base_url="http://127.0.0.1")
    response = devnet.get("/api/market")
    assert response.status_code == 503 and response.json()["error"]


def test_the_pages_are_served_with_their_script(trained):
    home, report = trained
    api = client(home)
    index = api.get("/")
    assert index.status_code == 200 and "text/html" in index.headers["content-type"]
    assert "/static/dashboard.js" in index.text and "default-src 'self'" in index.headers["content-security-policy"]
    for path in (f"/trainings/{report['training_id']}",
                 f"/trainings/{report['training_id']}/workers/{report['workers'][0]['address']}"):
        page = api.get(path)
        assert page.status_code == 200 and 'id="workers"' in page.text
    script = api.get("/static/dashboard.js")
    assert script.status_code == 200 and "EventSource" in script.text and ".innerHTML" not in script.text
    assert "http" not in api.get("/static/training.html").text.replace("http-equiv", "")  # nothing from a network


def test_a_token_is_required_when_the_app_is_given_one(trained):
    home, report = trained
    api = client(home, token="s3cret")
    for path in ("/", "/api/trainings", f"/api/trainings/{report['training_id']}"):
        assert api.get(path).status_code == 401, path
        assert api.get(path, params={"token": "wrong"}).status_code == 401, path
        assert api.get(path, params={"token": "s3cret"}).status_code == 200, path
        assert api.get(path, headers={"Authorization": "Bearer s3cret"}).status_code == 200, path
    assert api.get("/static/dashboard.js").status_code == 200  # the script holds no state


def test_on_loopback_only_loopback_host_names_are_answered(trained):
    home, _ = trained
    app = create_app(home, network="embedded", allowed_hosts=["127.0.0.1", "localhost"])
    assert TestClient(app, base_url="http://127.0.0.1:8765").get("/api/trainings").status_code == 200
    assert TestClient(app, base_url="http://rebound.example").get("/api/trainings").status_code == 400


def test_loopback_addresses_are_told_apart():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5") and not is_loopback("example.org")


# -- a real server: the event stream, and the port in use ------------------------------------------

def test_the_event_stream_sends_the_snapshot_and_ends_for_a_finished_training(trained):
    home, report = trained
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(create_app(home, network="embedded"), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/api/trainings/{report['training_id']}/events"
        events = []
        # The socket listens before the server runs: the request waits in its backlog, no retry or sleep needed.
        with httpx.stream("GET", url, timeout=30) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            event = None
            for line in response.iter_lines():  # ends when the server ends the stream
                if line.startswith("event:"):
                    event = line.split(":", 1)[1].strip()
                elif line.startswith("data:"):
                    events.append((event, json.loads(line.split(":", 1)[1])))
        assert [e for e, _ in events] == ["snapshot"]  # finished: one last snapshot, then the stream ends
        view = events[0][1]
        assert view["training_id"] == report["training_id"] and view["finished"]
        assert [r["round"] for r in view["round_metrics"]] == [1, 2]
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
    assert not thread.is_alive()


def test_a_port_in_use_exits_2_with_a_clear_message(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "aitbc_cli.app", "dashboard", "--home", str(tmp_path / "h"),
                               "--port", str(port)], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              timeout=120)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert f"127.0.0.1:{port}" in done.stderr and "--port" in done.stderr
    assert "Traceback" not in done.stderr


def test_without_the_dashboard_extra_it_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    from aitbc_cli.app import main
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if the extra were not installed
    with pytest.raises(SystemExit) as done:
        main(["dashboard", "--home", str(tmp_path / "h"), "--port", "0"])
    assert done.value.code == 2
    assert "pip install 'aitbc-agent-sdk[dashboard]'" in capsys.readouterr().err
    assert not (tmp_path / "h").exists()
