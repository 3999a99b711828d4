"""The workshop's passwords: generated, printed once by ``labkit workshop up``, kept only as hashes.

Each learner and the instructor get a generated password for the hub (not for Unix: their accounts have a
locked password and no login shell). The hub keeps ``name scrypt$N$r$p$SALT$HASH`` lines in a file only root
reads (``STATE/hub/logins``); :func:`check` hashes what was typed with the stored salt and compares in
constant time, and spends the same work on a name it does not know. ``labkit workshop password NAME`` gives
one learner a new password (the old one stops working at once; the hub reads the file at every login).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from pathlib import Path

ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"  # no 0/o, 1/l: read aloud or off a slide
N, R, P = 2**14, 8, 1  # scrypt's cost: about 16 MiB and 50 ms per login on one core
SALT_BYTES = 16
_DUMMY = None  # a hash to spend the same work on for unknown names (made at first use)


def generate(length: int = 12) -> str:
    return "".join(secrets.choice(ALPHABET) for _ in range(length))


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=256 * n * r + 2**20, dklen=32)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def hash_password(password: str) -> str:
    """``scrypt$N$r$p$SALT$HASH`` (base64) with a fresh random salt."""
    salt = os.urandom(SALT_BYTES)
    return f"scrypt${N}${R}${P}${_b64(salt)}${_b64(_scrypt(password, salt, N, R, P))}"


def verify(password: str, stored: str) -> bool:
    """True when ``password`` hashes to ``stored`` (constant-time compare); False for a malformed ``stored``."""
    try:
        kind, n, r, p, salt, digest = stored.split("$")
        if kind != "scrypt" or not (2**10 <= int(n) <= 2**20 and 1 <= int(r) <= 32 and 1 <= int(p) <= 16):
            return False
        want = base64.b64decode(digest, validate=True)
        got = _scrypt(password, base64.b64decode(salt, validate=True), int(n), int(r), int(p))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got, want)


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` as a file only its owner reads, replacing it in one step."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def save_hashes(passwords: dict[str, str], path: Path) -> None:
    """Store the hashes of ``passwords`` (name -> password) in ``path`` (``rw-------``); never the passwords."""
    _write_private(path, "".join(f"{name} {hash_password(pw)}\n" for name, pw in passwords.items()))


def load_hashes(path: Path) -> dict[str, str]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    return dict(line.split(" ", 1) for line in lines if " " in line)


def replace(name: str, password: str, path: Path) -> None:
    """Give ``name`` (already in ``path``) a new password."""
    hashes = load_hashes(path)
    if name not in hashes:
        raise KeyError(name)
    hashes[name] = hash_password(password)
    _write_private(path, "".join(f"{n} {h}\n" for n, h in hashes.items()))


def check(path: Path, name: str, password: str) -> bool:
    """True when ``name`` logs in with ``password`` according to the hashes in ``path``."""
    global _DUMMY
    stored = load_hashes(path).get(name)
    if stored is None:
        _DUMMY = _DUMMY or hash_password(generate())
        verify(password, _DUMMY)  # the same work as for a known name
        return False
    return verify(password, stored)
