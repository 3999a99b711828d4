"""The hub's own login for a workshop: per-learner passwords checked against scrypt hashes, and a throttle.

Loaded by JupyterHub (``c.JupyterHub.authenticator_class``), never at labkit's import. Learners' Unix
accounts have no usable password, so this is the only way in: ``ssh`` and ``su`` with the printed password
fail. Which names may log in is the hub's ``allowed_users`` (the learners) and ``admin_users`` (the
instructor); the hashes are in :attr:`WorkshopAuthenticator.password_file` (:mod:`labkit.workshop.passwords`).

Both of the workshop's logins (its own, and the shared password's) go through :class:`Throttle`: after
:data:`FAILURES` failed attempts from one address within :data:`WINDOW` seconds (for one name, or in all),
further attempts from that address are refused without checking the password until the window has passed. A
guesser gets a handful of tries per window, and the hub's cores are not spent hashing their guesses. The address
is the connection's, or, behind the hub's own proxy on loopback, the last hop the proxy added to
``X-Forwarded-For`` (never a header the client chose, such as ``X-Real-Ip``). Nobody is refused by name alone, so
failing logins for someone else's name from one's own address locks out only oneself.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from jupyterhub.auth import Authenticator
from jupyterhub.authenticators.shared import SharedPasswordAuthenticator
from traitlets import Unicode

from labkit.workshop import passwords

MAX_PASSWORD = 256  # characters: longer input is refused before it is hashed
FAILURES = 5  # failed logins for one name from one address within WINDOW (an address: 4 times as many in all)
WINDOW = 300.0  # seconds
KEYS = 10_000  # names and addresses remembered at most (the oldest forgotten first)


class Throttle:
    """Failed attempts per key (a name, an address) within a sliding window; bounded in memory."""

    def __init__(self, failures: int = FAILURES, window: float = WINDOW,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.failures, self.window, self.clock = failures, window, clock
        self._seen: dict[str, deque[float]] = {}

    def _recent(self, key: str) -> deque[float]:
        now = self.clock()
        times = self._seen.get(key)
        if times is None:
            return deque()
        while times and now - times[0] >= self.window:
            times.popleft()
        if not times:
            del self._seen[key]
        return times

    def blocked(self, *keys: str, limit: int | None = None) -> float:
        """Seconds until any of ``keys`` may try again (0: it may now): a key is blocked at ``limit`` failures
        within the window (default: :attr:`failures`)."""
        limit = self.failures if limit is None else limit
        waits = [self.window - (self.clock() - t[-limit]) for t in map(self._recent, keys) if len(t) >= limit]
        return max(waits, default=0.0)

    def failed(self, *keys: str) -> None:
        for key in keys:
            times = self._recent(key)
            if key not in self._seen:
                if len(self._seen) >= KEYS:  # forget the oldest key that blocks nothing now
                    old = next((k for k, v in self._seen.items() if len(v) < self.failures), None)
                    del self._seen[old if old is not None else next(iter(self._seen))]
                self._seen[key] = times
            times.append(self.clock())
            while len(times) > self.failures * 4:
                times.popleft()


LOOPBACK = ("127.", "::1", "::ffff:127.")


def client_address(request) -> str:  # noqa: ANN001 (tornado's request)
    """The address that sent ``request``: the TCP peer, or behind the proxy on loopback, the last address the proxy
    appended to ``X-Forwarded-For``. Headers a client sets itself (``X-Real-Ip``, earlier hops) are not read."""
    context = getattr(getattr(request, "connection", None), "context", None)
    peer = getattr(context, "address", None)
    peer = str(peer[0]) if isinstance(peer, tuple) and peer else str(getattr(request, "remote_ip", "") or "unknown")
    if peer.startswith(LOOPBACK):
        hops = ",".join(request.headers.get_list("X-Forwarded-For")) if hasattr(request, "headers") else ""
        last = hops.split(",")[-1].strip()
        if last:
            return last[:64]
    return peer[:64]


def _keys(handler, data) -> tuple[str, str]:  # noqa: ANN001 (JupyterHub's objects)
    name = str((data or {}).get("username", ""))[:64]
    request = getattr(handler, "request", None)
    address = client_address(request) if request is not None else "unknown"
    return f"address:{address}", f"name:{name}@{address}"


class Throttled:
    """A mix-in before a JupyterHub authenticator: attempts over the throttle are refused unchecked."""

    _throttle: Throttle | None = None

    async def authenticate(self, handler, data):  # JupyterHub's signature
        if self._throttle is None:
            self._throttle = Throttle()
        address, name = _keys(handler, data)
        wait = max(self._throttle.blocked(name), self._throttle.blocked(address, limit=FAILURES * 4))
        if wait:
            self.log.warning("login refused from %r: too many failed attempts within %d s (again in %.0f s)",
                             address[8:], WINDOW, wait)
            return None
        user = await super().authenticate(handler, data)
        if user is None:
            self._throttle.failed(address, name)
        return user


class PasswordFile(Authenticator):
    """Username and password from the hub's form, checked against ``password_file``."""

    password_file = Unicode("", help="lines `name scrypt$...` written by labkit workshop up").tag(config=True)

    async def authenticate(self, handler, data):  # JupyterHub's signature
        name = str((data or {}).get("username", ""))
        password = str((data or {}).get("password", ""))
        if not name or not password or len(password) > MAX_PASSWORD or not self.password_file:
            return None
        ok = await asyncio.to_thread(passwords.check, Path(self.password_file), name, password)
        if not ok:
            self.log.warning("failed login for %r", name[:40])
            return None
        return name


class WorkshopAuthenticator(Throttled, PasswordFile):
    """The workshop's own login (``--auth hub``, the default), throttled."""


class SharedAuthenticator(Throttled, SharedPasswordAuthenticator):
    """JupyterHub's shared password (``--shared-password``), throttled."""
