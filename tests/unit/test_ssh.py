"""ssh_preflight against a real OpenSSH server on 127.0.0.1 (skipped where none can run)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers.sshd import ALIAS, Loopback, Unavailable, loopback_sshd

from labkit.launching import hosts as hl
from labkit.launching import reach
from labkit.launching.hosts import Host, HostError


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loopback]:
    try:
        with loopback_sshd(tmp_path_factory.mktemp("sshd")) as lb:
            yield lb
    except Unavailable as e:
        pytest.skip(f"no loopback sshd: {e}")


def test_preflight_passes_with_an_authorised_key(server: Loopback) -> None:
    # An ssh-config alias is not in DNS or /etc/hosts: validate without resolving, ssh proves reachability.
    hosts = hl.validate([Host("localhost", 1), Host(ALIAS, 2)], np=3, resolve=False)
    assert not hl.is_local(ALIAS)
    reach.ssh_preflight(hosts, timeout=5, ssh_args=["-F", str(server.config)])
    assert (server.config.parent / "known_hosts").read_text().startswith("[127.0.0.1]:")


def test_preflight_explains_an_unauthorised_key(server: Loopback) -> None:
    with pytest.raises(HostError) as e:
        reach.ssh_preflight([Host(ALIAS, 2)], timeout=5, ssh_args=["-F", str(server.unauthorised_config)])
    msg = str(e.value)
    assert f"{ALIAS}: " in msg and "Permission denied" in msg
    assert "ssh-copy-id HOST" in msg and "ssh-keygen -t ed25519" in msg
