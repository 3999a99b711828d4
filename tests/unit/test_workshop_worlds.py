"""Each learner's world and disk, as command lines (nothing is started): who the server becomes, what root mounts,
the only routes a learner's network has, and a home's file system."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from labkit.workshop import disks, worlds


def test_the_server_becomes_the_learner_only_after_its_world_is_made() -> None:
    argv = worlds.argv(worlds.World(1001, 1002, "/home/learner01", "/run/netns/lkw-learner01"))
    assert argv[:2] == ["nsenter", "--net=/run/netns/lkw-learner01"]
    assert argv[2:8] == ["unshare", "--mount", "--ipc", "--propagation", "private", "--"]
    drop = argv.index("setpriv")
    assert argv[drop:drop + 5] == ["setpriv", "--reuid=1001", "--regid=1002", "--init-groups", "--no-new-privs"]
    assert argv[-2:] == ["env", "--chdir=/home/learner01"]
    script = argv[argv.index("-c") + 1]
    for folder in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
        assert folder in script
    assert "nosuid,nodev" in script and 'exec "$@"' in script
    assert worlds.argv(worlds.World(1001, 1002, "/home/x"))[0] == "unshare"  # a Slurm node's network


@pytest.mark.parametrize("bad", [dict(uid=0), dict(gid=0), dict(tmp_size="2g; id"), dict(home="relative"),
                                 dict(netns="/tmp/lkw-learner01"), dict(uid=True)])
def test_a_world_root_would_not_make_is_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        worlds.World(**{"uid": 1001, "gid": 1001, "home": "/home/a", **bad})


def test_each_account_has_its_own_address_and_names_the_kernel_accepts() -> None:
    plan = worlds.plan([f"learner{k:03d}" for k in range(1, 1000)])
    addresses = [ipaddress.ip_address(n.address) for n in plan]
    assert len(set(addresses)) == 999 and all(a in worlds.NETWORK for a in addresses)
    assert ipaddress.ip_address(worlds.HUB) not in addresses
    assert all(len(n.outer) <= 15 and len(n.inner) <= 15 and len(n.netns) <= 40 for n in plan)
    assert len({n.outer for n in plan}) == 999


def test_a_learner_s_network_routes_only_to_the_hub_and_what_it_is_told() -> None:
    n = worlds.plan(["learner01"])[0]
    commands = worlds.up_commands(n, also_reach=("198.18.0.1",))
    routes = [c for c in commands if c[:3] == ["ip", "-n", n.netns] and "route" in c]
    assert [c[5] for c in routes] == [f"{worlds.HUB}/32", "198.18.0.1/32"]  # no default route
    assert ["ip", "route", "add", f"{n.address}/32", "dev", n.outer, "src", worlds.HUB] in commands
    assert (f"net/ipv4/conf/{n.outer}/forwarding", "0", False) in worlds.sysctls(n)
    assert worlds.down_commands(n)[0] == ["ip", "netns", "delete", n.netns]


def test_a_home_s_disk_is_sparse_owned_by_the_account_and_mounted_without_setuid() -> None:
    img = Path("/state/disks/learner01.img")
    make = disks.make_commands(img, "5G", 1001, 1002)
    assert make[0] == ["truncate", "--size", "5G", str(img)]
    assert "root_owner=1001:1002" in make[1] and make[1][0] == "mkfs.ext4"
    assert disks.mount_command(img, Path("/home/learner01")) == [
        "mount", "-o", "loop,nosuid,nodev", str(img), "/home/learner01"]


@pytest.mark.parametrize("size", ["5", "0G", "100M", "5G; rm -rf /", "-5G", "5g"])
def test_a_disk_size_that_is_no_size_is_refused(size: str) -> None:
    with pytest.raises(disks.DiskError):
        disks.check_size(size)
