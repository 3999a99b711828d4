"""The hub's login throttle: a guesser gets a few tries per window, per name and per address, in both logins."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import aio

from labkit.workshop import passwords

hubauth = pytest.importorskip("labkit.workshop.hubauth", exc_type=ImportError)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Headers(dict):
    def get_list(self, name: str) -> list[str]:
        return [self[name]] if name in self else []


def _handler(ip: str, headers: dict[str, str] | None = None) -> SimpleNamespace:
    """A login request from ``ip`` (the TCP peer), with ``headers``."""
    context = SimpleNamespace(address=(ip, 40000))
    return SimpleNamespace(request=SimpleNamespace(remote_ip=ip, connection=SimpleNamespace(context=context),
                                                   headers=Headers(headers or {})))


def test_the_throttle_blocks_a_key_after_its_failures_and_forgets_them_after_the_window() -> None:
    clock = Clock()
    t = hubauth.Throttle(failures=3, window=60, clock=clock)
    for _ in range(3):
        assert t.blocked("name:a") == 0
        t.failed("name:a")
        clock.now += 1
    assert t.blocked("name:a") == pytest.approx(57) and t.blocked("name:b") == 0
    assert t.blocked("name:b", "name:a") > 0  # any key blocked blocks the attempt
    clock.now += 57
    assert t.blocked("name:a") == 0


def test_the_throttle_remembers_a_bounded_number_of_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hubauth, "KEYS", 100)
    t = hubauth.Throttle(failures=2, window=60, clock=Clock())
    for k in range(1000):
        t.failed(f"address:{k}")
    assert len(t._seen) <= 100


def test_a_guesser_is_refused_from_their_address_and_locks_out_no_one_else(tmp_path: Path) -> None:
    passwords.save_hashes({"learner01": "right-one", "learner02": "other-one"}, tmp_path / "logins")
    auth = hubauth.WorkshopAuthenticator(password_file=str(tmp_path / "logins"))
    clock = Clock()
    auth._throttle = hubauth.Throttle(clock=clock)

    def login(name: str, password: str, ip: str = "10.0.0.9") -> object:
        return aio.run(auth.authenticate(_handler(ip), {"username": name, "password": password}))

    for k in range(hubauth.FAILURES):
        assert login("learner01", f"guess{k}") is None
    assert login("learner01", "right-one") is None  # the guesser's address, for that name, even the right password
    assert login("learner01", "right-one", ip="10.0.0.7") == "learner01"  # the learner, elsewhere, is not locked out
    assert login("learner02", "other-one") == "learner02"  # another name from that address, until it fails in all
    for k in range(hubauth.FAILURES * 4):
        login(f"learner{k:02d}x", "guess")
    assert login("learner02", "other-one") is None  # an address spraying names is refused in all
    clock.now += hubauth.WINDOW
    assert login("learner01", "right-one") == "learner01"


def test_behind_the_proxy_the_address_is_the_one_it_appended_never_the_client_s_own_header() -> None:
    forwarded = _handler("127.0.0.1", {"X-Forwarded-For": "6.6.6.6, 203.0.113.5", "X-Real-Ip": "10.0.0.7"})
    assert hubauth.client_address(forwarded.request) == "203.0.113.5"
    direct = _handler("198.19.0.3", {"X-Forwarded-For": "10.0.0.7", "X-Real-Ip": "10.0.0.7"})
    assert hubauth.client_address(direct.request) == "198.19.0.3"  # not behind the proxy: the peer


def test_the_shared_password_login_is_throttled_too() -> None:
    auth = hubauth.SharedAuthenticator(user_password="class-pass-1", admin_password="a" * 32,
                                       allowed_users={"learner01"}, admin_users={"instructor"})
    auth._throttle = hubauth.Throttle(clock=Clock())
    handler = _handler("10.0.0.9")
    for k in range(hubauth.FAILURES):
        assert aio.run(auth.authenticate(handler, {"username": "learner01", "password": f"g{k}"})) is None
    assert aio.run(auth.authenticate(handler, {"username": "learner01", "password": "class-pass-1"})) is None
    ok = aio.run(auth.authenticate(_handler("10.0.0.1"), {"username": "instructor", "password": "a" * 32}))
    assert ok is not None
