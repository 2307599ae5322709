"""API keys, the bind policy and per-key token buckets, on their own (a fake clock drives
the buckets; everything else is the real code)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shoal.api.admission import Admission
from shoal.api.keys import (
    AuthenticationError,
    KeyRing,
    check_exposure,
    hash_key,
    new_key,
)
from shoal.api.ratelimit import RateLimiter
from shoal.config import ApiKey, AuthSettings, Settings, load_settings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def headers(verdict) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in verdict.headers}


def test_requests_refill_continuously_and_say_when() -> None:
    clock = Clock()
    limiter = RateLimiter(clock)
    assert [limiter.admit("k", 2, 0).allowed for _ in range(3)] == [True, True, False]
    refused = limiter.admit("k", 2, 0)
    assert refused.limit == "requests"
    assert refused.retry_after == pytest.approx(30.0)  # 2 per minute: one every 30 s
    assert headers(refused)["x-ratelimit-remaining-requests"] == "0"
    assert headers(refused)["x-ratelimit-reset-requests"] == "1m0s"
    clock.now += 30
    assert limiter.admit("k", 2, 0).allowed
    assert limiter.admit("other", 2, 0).allowed  # keys do not share buckets


def test_tokens_are_charged_after_the_request_and_may_go_negative() -> None:
    clock = Clock()
    limiter = RateLimiter(clock)
    assert limiter.admit("k", 0, 600).allowed
    limiter.charge("k", 600, 1200)  # used two minutes' worth
    refused = limiter.admit("k", 0, 600)
    assert (refused.allowed, refused.limit) == (False, "tokens")
    assert refused.retry_after == pytest.approx(60.1)  # back to +1 token: 601 at 10/s
    clock.now += 61
    assert limiter.admit("k", 0, 600).allowed


def test_a_batch_line_asks_for_tokens_without_taking_a_request() -> None:
    clock = Clock()
    limiter = RateLimiter(clock)
    assert limiter.tokens_wait("k", 600) == 0.0 and limiter.tokens_wait("k", 0) == 0.0
    limiter.charge("k", 600, 1200)
    assert limiter.tokens_wait("k", 600) == pytest.approx(60.1)
    clock.now += 61
    assert limiter.tokens_wait("k", 600) == 0.0
    assert [limiter.admit("k", 1, 0).allowed for _ in range(2)] == [True, False]


def test_a_changed_limit_starts_a_fresh_bucket() -> None:
    limiter = RateLimiter(Clock())
    assert limiter.admit("k", 1, 0).allowed
    assert not limiter.admit("k", 1, 0).allowed
    assert limiter.admit("k", 5, 0).allowed


def test_keys_are_found_by_digest_and_carry_their_grants() -> None:
    key = new_key()
    assert key.startswith("sk-shoal-") and len(key) > 40
    ring = KeyRing(
        AuthSettings(
            keys=[ApiKey(name="a", sha256=hash_key(key).upper(), models=["m"], routes=["chat"])],
            default_rpm=7,
        )
    )
    who = ring.authenticate(f"Bearer {key}")
    assert (who.name, who.rpm, who.tpm) == ("a", 7, 0)
    assert who.may_call("chat") and not who.may_call("embeddings") and not who.may_call("admin")
    assert who.may_use("alias", "m") and not who.may_use("n")
    for header in (None, "", key, f"Basic {key}", "Bearer ", f"Bearer {key}x"):
        with pytest.raises(AuthenticationError):
            ring.authenticate(header)


def test_a_key_is_found_by_name_and_a_removed_one_may_use_nothing() -> None:
    """Batches keep their creator's name; lines run later with what that key may do now."""
    ring = KeyRing(AuthSettings(keys=[ApiKey(name="a", sha256="0" * 64, models=["m"])]))
    kept = ring.named("a")
    assert kept.may_use("m") and not kept.may_use("n")
    removed = ring.named("gone")
    assert removed.name == "gone"
    assert not removed.may_use("m") and not removed.may_call("batches")


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"sha256": "abc"}, "64 hex digits"),
        ({"sha256": "0" * 64, "routes": ["everything"]}, "unknown routes"),
    ],
)
def test_a_malformed_key_entry_is_refused(entry: dict, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        KeyRing(AuthSettings(keys=[ApiKey(name="bad", **entry)]))


def test_without_keys_only_loopback_binds_unless_allowed() -> None:
    settings = Settings()
    assert "loopback" in check_exposure(settings)
    for host in ("::1", "localhost", "127.0.0.2"):
        settings.gateway.host = host
        assert "loopback" in check_exposure(settings)
    for host in ("0.0.0.0", "10.0.0.5", "shoal.internal"):
        settings.gateway.host = host
        with pytest.raises(ValueError, match="without API keys"):
            check_exposure(settings)
    settings.auth.allow_unauthenticated = True
    assert "allowed by settings" in check_exposure(settings)
    settings.auth.allow_unauthenticated = False
    settings.auth.keys = [ApiKey(name="k", sha256="0" * 64)]
    assert "1 API key(s)" in check_exposure(settings)


def test_keys_come_from_env_json_and_a_keys_file(tmp_path: Path) -> None:
    toml_file = tmp_path / "keys.toml"
    toml_file.write_text(f'[[keys]]\nname = "t"\nsha256 = "{"1" * 64}"\nrpm = 5\n')
    env = {
        "SHOAL_AUTH__KEYS": json.dumps([{"name": "e", "sha256": "2" * 64, "admin": True}]),
        "SHOAL_AUTH__KEYS_FILE": str(toml_file),
    }
    ring = KeyRing(load_settings(env=env).auth)
    assert len(ring) == 2
    assert (ring.named("e").admin, ring.named("t").rpm) == (True, 5)
    json_file = tmp_path / "keys.json"
    json_file.write_text(json.dumps([{"name": "j", "sha256": "3" * 64, "bogus": 1}]))
    with pytest.raises(ValueError, match="invalid keys file"):
        KeyRing(load_settings(env={"SHOAL_AUTH__KEYS_FILE": str(json_file)}).auth)
    with pytest.raises(ValueError, match="keys file"):
        KeyRing(AuthSettings(keys_file=str(tmp_path / "missing.json")))


@pytest.mark.parametrize(
    ("second", "problem"),
    [
        ({"name": "a", "sha256": "2" * 64}, "given twice"),
        ({"name": "b", "sha256": "1" * 64}, "same key"),
    ],
)
def test_a_name_or_key_given_twice_is_refused(second: dict, problem: str) -> None:
    """Owners and logs go by name: two entries of one name would share files and limits."""
    keys = [ApiKey(name="a", sha256="1" * 64), ApiKey(**second)]
    with pytest.raises(ValueError, match=problem):
        KeyRing(AuthSettings(keys=keys))


def _entry(name: str, key: str) -> dict:
    return {"name": name, "sha256": hash_key(key)}


def test_the_keys_file_is_reloaded_when_it_changes(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps([_entry("a", "key-a"), _entry("b", "key-b")]))
    settings = Settings()
    settings.auth.keys_file = str(keys_file)
    admission = Admission(settings)
    assert admission.keys.authenticate("Bearer key-b").name == "b"
    assert not admission.reload_keys()  # unchanged
    keys_file.write_text(json.dumps([_entry("a", "key-a2")]))  # b revoked, a rotated
    assert admission.reload_keys()
    for revoked in ("key-b", "key-a"):
        with pytest.raises(AuthenticationError):
            admission.keys.authenticate(f"Bearer {revoked}")
    assert admission.keys.authenticate("Bearer key-a2").name == "a"
    assert not admission.keys.named("b").active  # its queued batch lines stop
    keys_file.write_text("[{not json")  # a bad edit keeps the keys in use
    assert not admission.reload_keys()
    assert admission.keys.authenticate("Bearer key-a2").name == "a"
    keys_file.write_text("[]")  # every key revoked: nothing is open
    assert admission.reload_keys()
    assert admission.keys.enabled and len(admission.keys) == 0
    with pytest.raises(AuthenticationError):
        admission.keys.authenticate("Bearer key-a2")
