"""BusSettings: where the broker account comes from, and what a session's client id looks like."""

from __future__ import annotations

import pytest

from aitbc_agent_sdk.errors import ConfigError
from aitbc_agent_sdk.messaging._settings import (
    ENV_PASSWORD, ENV_PASSWORD_FILE, ENV_USERNAME, BusSettings, Credentials, resolve_credentials, session_id,
)


def test_credentials_come_from_env_then_profile_then_the_wallets_account_then_observer(tmp_path):
    accounts = tmp_path / "accounts"
    accounts.mkdir()
    (accounts / "0xAbC").write_text("wallet-pw\n")
    (accounts / "observer").write_text("observer-pw\n")
    (tmp_path / "fixed").write_text("fixed-pw\n")
    settings = BusSettings(accounts_dir=accounts)

    assert resolve_credentials(settings, "0xAbC", env={}) == Credentials("0xAbC", "wallet-pw")
    assert resolve_credentials(settings, "0xOther", env={}) == Credentials("observer", "observer-pw")
    assert resolve_credentials(settings, None, env={ENV_USERNAME: "u", ENV_PASSWORD: "p"}) == Credentials("u", "p")
    assert resolve_credentials(settings, None, env={ENV_USERNAME: "u", ENV_PASSWORD_FILE: str(tmp_path / "fixed")}
                               ) == Credentials("u", "fixed-pw")
    fixed = BusSettings(username="svc", password_file=tmp_path / "fixed", accounts_dir=accounts)
    assert resolve_credentials(fixed, "0xAbC", env={}) == Credentials("svc", "fixed-pw")
    assert resolve_credentials(BusSettings(), "0xAbC", env={}) is None  # anonymous
    with pytest.raises(ConfigError):
        resolve_credentials(settings, None, env={ENV_USERNAME: "u"})
    assert "wallet-pw" not in repr(resolve_credentials(settings, "0xAbC", env={}))


def test_a_logged_in_sessions_id_is_stable_and_needs_the_password():
    one, other = Credentials("0xAbC", "pw-1"), Credentials("0xAbC", "pw-2")
    assert session_id("provider-0xAbC", one) == session_id("provider-0xAbC", one)
    assert session_id("provider-0xAbC", one) != session_id("provider-0xAbC", other)
    assert session_id("provider-0xAbC", one).startswith("provider-0xAbC-")
    assert session_id("provider-0xAbC", None) == "provider-0xAbC"  # an open test broker: unchanged


@pytest.mark.parametrize("bad", [{"username": "a/b"}, {"username": "#"}, {"cert_file": "c.pem"},
                                 {"ca_pem": "x"}, {"clock_skew_s": 0}, {"max_message_bytes": 10}])
def test_inconsistent_settings_are_refused(bad):
    with pytest.raises(ValueError):
        BusSettings(**bad)
