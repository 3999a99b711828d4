"""Host lists: parsing, validation, placement, TF_CONFIG clusters; no MPI, no network beyond the resolver."""

from __future__ import annotations

import os
import socket
import stat
import sys
from pathlib import Path

import pytest

from labkit.core import tfconfig
from labkit.launching import hosts as hl
from labkit.launching import reach
from labkit.launching.hosts import Host, HostError

CORES = len(os.sched_getaffinity(0))
NOWHERE = "no-such-host.invalid"  # .invalid never resolves (RFC 6761)


# -- parse_hosts ---------------------------------------------------------------------------------


def test_parse_hosts_slots_and_default_of_one() -> None:
    assert hl.parse_hosts("h1:4, h2:2,h3") == [Host("h1", 4), Host("h2", 2), Host("h3", 1)]


def test_parse_hosts_ipv6_in_brackets() -> None:
    assert hl.parse_hosts("[fe80::1]:2,[::1]") == [Host("fe80::1", 2), Host("::1", 1)]


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("", "no hosts given"),
        ("   ", "no hosts given"),
        ("h1:4,,h2:4", "empty entry 2.*stray comma"),
        ("h1:4,", "empty entry 2.*stray comma"),
        (",h1", "empty entry 1"),
        (":4", "':4'.*no host name"),
        ("h1:four", "'h1:four'.*whole number >= 1"),
        ("h1:0", "'h1:0'.*whole number >= 1"),
        ("h1:-2", "'h1:-2'.*whole number >= 1"),
        ("h1:", "'h1:'.*whole number"),
        ("h1:2.5", "'h1:2.5'"),
        ("fe80::1:2", "IPv6 address in brackets"),
        ("[fe80::1", "IPv6 host as \\[address\\]:slots"),
        ("-oProxyCommand=x:1", "not a host name"),
        ("h 1:2", "not a host name"),
    ],
)
def test_parse_hosts_rejects(spec: str, match: str) -> None:
    with pytest.raises(HostError, match=match):
        hl.parse_hosts(spec)


def test_host_rejects_bad_slots() -> None:
    with pytest.raises(HostError, match="h1: slots must be a whole number >= 1, got 0"):
        Host("h1", 0)
    with pytest.raises(HostError, match="got True"):
        Host("h1", True)
    with pytest.raises(HostError, match="not a host name"):
        Host("")


# -- hostfiles -----------------------------------------------------------------------------------

HOSTFILE = """\
# the lab cluster
node1 slots=4 max_slots=8
node2 slots = 2   # trailing comment

node3
  node4 max-slots=3
"""


def test_parse_hostfile_text() -> None:
    assert hl.parse_hostfile_text(HOSTFILE) == [Host("node1", 4), Host("node2", 2), Host("node3"), Host("node4")]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("node1 slots=4\nnode2 slots=x\n", "hf, line 2: 'slots=x': slots must be a whole number >= 1"),
        ("node1 slots=0\n", "hf, line 1: 'slots=0'"),
        ("\n# c\nnode1 cores=4\n", "hf, line 3: 'cores=4' is not understood"),
        ("node1 4\n", "hf, line 1: '4' is not understood"),
        ("slots=4\n", "hf, line 1: 'slots=4' must start with a host name"),
        ("node1 slots=4 max_slots=2\n", "hf, line 1: max_slots=2 is less than slots=4"),
        ("bad/name slots=2\n", "hf, line 1: 'bad/name' is not a host name"),
        ("# only comments\n\n", "hf names no hosts"),
    ],
)
def test_parse_hostfile_text_rejects(text: str, match: str) -> None:
    with pytest.raises(HostError, match=match):
        hl.parse_hostfile_text(text, "hf")


def test_parse_hostfile_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "hosts.txt"
    f.write_text("node1 slots=2\nnode2 slots=two\n")
    with pytest.raises(HostError) as e:
        hl.parse_hostfile(f)
    assert str(e.value).startswith(f"{f}, line 2: ")


def test_parse_hostfile_missing(tmp_path: Path) -> None:
    with pytest.raises(HostError, match=r"hostfile .*nope does not exist: check the path"):
        hl.parse_hostfile(tmp_path / "nope")


def test_hostfile_round_trip(tmp_path: Path) -> None:
    hosts = [Host("node1", 4), Host("node2"), Host("10.0.0.3", 1)]
    path = hl.write_hostfile(hosts, tmp_path / "hf")
    text = path.read_text()
    assert text.splitlines()[0].startswith("#") and "labkit" in text.splitlines()[0]
    assert text.splitlines()[1:] == ["node1 slots=4", "node2", "10.0.0.3 slots=1"]
    assert hl.parse_hostfile(path) == hosts


# -- locality, validate --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["localhost", "LOCALHOST", "127.0.0.1", "127.1.2.3", "::1", socket.gethostname()])
def test_is_local(name: str) -> None:
    assert hl.is_local(name)


@pytest.mark.parametrize("name", ["node1", "10.255.255.1", NOWHERE])
def test_is_not_local(name: str) -> None:
    assert not hl.is_local(name)


def test_slots_of_unstated_hosts() -> None:
    assert hl.slots(Host("localhost")) == CORES
    assert hl.slots(Host("node1")) == 1
    assert hl.slots(Host("node1", 6)) == 6


@pytest.mark.parametrize("name", ["localhost", socket.gethostname()])
def test_hostfile_naming_this_host_validates(tmp_path: Path, name: str) -> None:
    f = hl.write_hostfile([Host(name, 2)], tmp_path / "hf")
    assert hl.validate(hl.parse_hostfile(f), np=2) == [Host(name, 2)]
    unstated = hl.write_hostfile([Host(name)], tmp_path / "hf2")
    assert hl.validate(hl.parse_hostfile(unstated), np=CORES) == [Host(name)]


def test_validate_duplicates_ignore_case() -> None:
    with pytest.raises(
        HostError, match="'node1' and 'Node1\\.' are the same host: list it once and merge the slots, like node1:5"
    ):
        hl.validate([Host("node1", 2), Host("Node1.", 3)], np=2, resolve=False)


def test_validate_two_names_for_this_machine() -> None:
    match = f"'localhost' and '{socket.gethostname()}' both name this machine: .* like localhost:2"
    with pytest.raises(HostError, match=match):
        hl.validate([Host("localhost", 1), Host(socket.gethostname(), 1)], np=2)


def test_validate_unresolvable() -> None:
    with pytest.raises(HostError, match=f"cannot resolve {NOWHERE}: check the name.*/etc/hosts"):
        hl.validate([Host("localhost", 2), Host(NOWHERE, 2)], np=2)
    assert hl.validate([Host(NOWHERE, 2)], np=2, resolve=False) == [Host(NOWHERE, 2)]


@pytest.mark.parametrize("np", [0, -1, True, 1.5])
def test_validate_np(np: int) -> None:
    with pytest.raises(HostError, match="need at least one worker"):
        hl.validate([Host("localhost", 2)], np=np)


def test_validate_too_few_slots() -> None:
    with pytest.raises(HostError, match="--np 5 needs 5 slots but the hosts have 4: add hosts or slots, or lower --np"):
        hl.validate([Host("a", 2), Host("b", 2)], np=5, resolve=False)
    with pytest.raises(HostError, match=r"have 3 \(b state no slots and count as 1: add slots=N\)"):
        hl.validate([Host("a", 2), Host("b")], np=4, resolve=False)


def test_validate_empty() -> None:
    with pytest.raises(HostError, match="no hosts given"):
        hl.validate([], np=1)


# -- builders ------------------------------------------------------------------------------------


def test_hosts_arg() -> None:
    assert hl.hosts_arg([Host("h1", 4), Host("h2", 2), Host("h3"), Host("::1", 1)]) == "h1:4,h2:2,h3:1,[::1]:1"
    assert hl.hosts_arg([Host("localhost")]) == f"localhost:{CORES}"


def test_place_fills_slots_in_order() -> None:
    hosts = [Host("a", 2), Host("b", 1), Host("c", 3)]
    assert hl.place(hosts, 4) == ["a", "a", "b", "c"]
    assert hl.place(hosts, 6) == ["a", "a", "b", "c", "c", "c"]
    with pytest.raises(HostError, match="7 processes need 7 slots but the hosts have 6"):
        hl.place(hosts, 7)
    with pytest.raises(HostError, match="at least one"):
        hl.place(hosts, 0)


def test_tf_cluster_ports_per_host() -> None:
    spec = hl.tf_cluster([Host("h1", 2), Host("h2", 2)], workers=3)
    assert spec == {"worker": ["h1:2222", "h1:2223", "h2:2222"]}
    assert tfconfig.validate(spec) is spec


def test_tf_cluster_chief_and_ps() -> None:
    spec = hl.tf_cluster([Host("h1", 2), Host("h2", 3)], workers=2, ps=1, chief=True, base_port=3000)
    assert spec == {"chief": ["h1:3000"], "worker": ["h1:3001", "h2:3000"], "ps": ["h2:3001"]}
    assert tfconfig.tasks(spec) == [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)]
    assert '"task": {"type": "ps", "index": 0}' in tfconfig.tf_config(spec, "ps", 0)


def test_tf_cluster_names_of_this_machine_share_ports() -> None:
    spec = hl.tf_cluster([Host("localhost", 1), Host("127.0.0.1", 1)], workers=2)
    assert spec == {"worker": ["localhost:2222", "127.0.0.1:2223"]}


def test_tf_cluster_ipv6() -> None:
    assert hl.tf_cluster([Host("fe80::1", 2)], workers=2) == {"worker": ["[fe80::1]:2222", "[fe80::1]:2223"]}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"workers": 0}, "at least one worker or a chief"),
        ({"workers": -1}, "workers must be a whole number >= 0"),
        ({"workers": 1, "ps": -1}, "ps must be a whole number"),
        ({"workers": 5}, "5 processes need 5 slots but the hosts have 4"),
        ({"workers": 2, "base_port": 0}, "base_port must be in 1..65535"),
        ({"workers": 2, "base_port": 65535}, "too many tasks on h1 for ports from 65535"),
    ],
)
def test_tf_cluster_rejects(kwargs: dict, match: str) -> None:
    with pytest.raises(HostError, match=match):
        hl.tf_cluster([Host("h1", 2), Host("h2", 2)], **kwargs)


# -- ssh preflight without a daemon --------------------------------------------------------------


def _fake_ssh(tmp_path: Path, code: int, stderr: str = "", sleep: float = 0) -> Path:
    """An executable that logs its arguments, prints ``stderr`` and exits with ``code``."""
    script = tmp_path / "fake-ssh"
    script.write_text(
        f"#!{sys.executable}\nimport sys, time\n"
        f"open({str(tmp_path / 'argv.log')!r}, 'a').write(repr(sys.argv[1:]) + '\\n')\n"
        f"time.sleep({sleep})\nsys.stderr.write({stderr!r})\nsys.exit({code})\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_ssh_command_is_an_argument_list() -> None:
    assert reach.ssh_command("node1", timeout=5, ssh_args=["-p", "2200"]) == [
        "ssh",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=5",
        "-p",
        "2200",
        "node1",
        "true",
    ]


def test_preflight_skips_local_hosts() -> None:
    reach.ssh_preflight([Host("localhost", 2), Host(socket.gethostname())], ssh="/nonexistent/ssh")


def test_preflight_runs_ssh_per_remote_host(tmp_path: Path) -> None:
    ssh = _fake_ssh(tmp_path, 0)
    reach.ssh_preflight(
        [Host("localhost"), Host("n1", 2), Host("n2"), Host("n1", 1)], timeout=3, ssh=str(ssh), ssh_args=["-F", "cfg"]
    )
    logged = sorted((tmp_path / "argv.log").read_text().splitlines())
    assert logged == [
        repr(["-o", "BatchMode=yes", "-o", "ConnectTimeout=3", "-F", "cfg", n, "true"]) for n in ("n1", "n2")
    ]


def test_preflight_failure_explains_setup(tmp_path: Path) -> None:
    ssh = _fake_ssh(tmp_path, 255, "root@n1: Permission denied (publickey).\n")
    with pytest.raises(HostError) as e:
        reach.ssh_preflight([Host("n1", 2)], ssh=str(ssh))
    msg = str(e.value)
    assert "n1: root@n1: Permission denied (publickey)." in msg
    for advice in ("ssh-keygen -t ed25519", "ssh-copy-id HOST", "ssh HOST true", "same user", ".venv"):
        assert advice in msg


def test_preflight_timeout(tmp_path: Path) -> None:
    ssh = _fake_ssh(tmp_path, 0, sleep=30)
    with pytest.raises(HostError, match="n1: no answer within 0.6 s"):
        reach.ssh_preflight([Host("n1")], timeout=0.2, ssh=str(ssh))


def test_preflight_without_ssh() -> None:
    with pytest.raises(
        HostError, match="'/nonexistent/ssh' is not installed: apt-get install openssh-client to launch on n1"
    ):
        reach.ssh_preflight([Host("n1")], ssh="/nonexistent/ssh")
