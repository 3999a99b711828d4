"""The workshop's passwords: generated, set as Unix passwords (PAM login) or given to the hub (shared mode),
and kept for root only in the state folder. They are printed once, by ``labkit workshop up``."""

from __future__ import annotations

import secrets
from pathlib import Path

from labkit.workshop import accounts

ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"  # no 0/o, 1/l: read aloud or off a slide


def generate(length: int = 12) -> str:
    return "".join(secrets.choice(ALPHABET) for _ in range(length))


def hash_argv(password_file: Path) -> list[str]:
    """``openssl passwd -6`` reading the passwords from a file (never from the command line)."""
    return ["openssl", "passwd", "-6", "-in", str(password_file)]


def set_unix(passwords: dict[str, str], scratch: Path, runner=accounts.run) -> None:
    """Give each user their password (SHA-512 crypt through ``usermod --password``)."""
    names = list(passwords)
    scratch.touch(mode=0o600)
    scratch.chmod(0o600)
    try:
        scratch.write_text("".join(passwords[n] + "\n" for n in names))
        hashes = runner(hash_argv(scratch)).split()
    finally:
        scratch.unlink(missing_ok=True)
    if len(hashes) != len(names):
        raise accounts.AccountsError(f"openssl gave {len(hashes)} hashes for {len(names)} passwords")
    for name, hashed in zip(names, hashes, strict=True):
        runner(["usermod", "--password", hashed, name])


def save(passwords: dict[str, str], path: Path) -> None:
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text("".join(f"{name} {pw}\n" for name, pw in passwords.items()))


def load(path: Path) -> dict[str, str]:
    try:
        return dict(line.split(" ", 1) for line in path.read_text().splitlines() if " " in line)
    except OSError:
        return {}
