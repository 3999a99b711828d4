"""The hub's own login for a workshop: per-learner passwords checked against scrypt hashes.

Loaded by JupyterHub (``c.JupyterHub.authenticator_class``), never at labkit's import. Learners' Unix
accounts have no usable password, so this is the only way in: ``ssh`` and ``su`` with the printed password
fail. Which names may log in is the hub's ``allowed_users`` (the learners) and ``admin_users`` (the
instructor); the hashes are in :attr:`WorkshopAuthenticator.password_file` (:mod:`labkit.workshop.passwords`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from jupyterhub.auth import Authenticator
from traitlets import Unicode

from labkit.workshop import passwords

MAX_PASSWORD = 256  # characters: longer input is refused before it is hashed


class WorkshopAuthenticator(Authenticator):
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
