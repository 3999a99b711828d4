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


def test_the_firewall_lets_learners_reach_only_the_hub_and_only_root_reach_them() -> None:
    rules = [" ".join(c) for c in worlds.firewall_commands(8081, (("198.18.0.1", 6817),))]
    inbound = [r for r in rules if f"-A {worlds.CHAIN}-in" in r]
    assert inbound[-1].endswith("-j DROP") and len(inbound) == 4  # answers, the hub, the controller, nothing else
    assert any(f"-d {worlds.HUB} --dport 8081 -j ACCEPT" in r for r in inbound)
    assert any("-d 198.18.0.1 --dport 6817 -j ACCEPT" in r for r in inbound)
    outbound = [r for r in rules if f"-A {worlds.CHAIN}-out" in r]
    assert "--uid-owner 0 -j ACCEPT" in outbound[1] and outbound[-1].endswith("-j REJECT")
    jumps = [r for r in rules if " -I " in r]
    assert len(jumps) == 4 and all("lkw+" in r for r in jumps)
    removal = [" ".join(c) for c in worlds.firewall_remove_commands()]
    assert len(removal) == 10 and removal[-1].endswith(f"-X {worlds.CHAIN}-fwd")


def test_without_memory_asked_each_server_gets_a_share_of_the_machine() -> None:
    from labkit.workshop import limits

    assert limits.default_memory(21, total=24 * 2**30) == "936M"  # 20 learners and the instructor on 24 GiB
    assert limits.default_memory(1000, total=2**30) == "64M"  # never below what starts a JupyterLab


def test_a_shared_environment_in_a_temporary_folder_is_kept_in_the_world() -> None:
    assert worlds.kept("/tmp/ci/.venv", "/var/lib/labkit-workshop/release", None) == ("/tmp/ci/.venv",)
    argv = worlds.argv(worlds.World(1001, 1001, "/home/a", keep=worlds.kept("/tmp/ci/.venv")))
    size = argv.index(worlds.TMP_SIZE)
    assert argv[size + 1:size + 4] == ["/tmp/ci/.venv", "--", "setpriv"]
    with pytest.raises(ValueError):
        worlds.World(1001, 1001, "/home/a", keep=("/etc",))  # only what the private folders would hide
