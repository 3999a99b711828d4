"""Learners' servers as Slurm jobs: the hub's configuration, the job batchspawner submits, the port a server may
say, and batchspawner's own handler (which sets any attribute a server posts) kept out of the hub."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import aio, hubconf

pytest.importorskip("batchspawner")

from batchspawner import api as batch_api  # noqa: E402
from jupyterhub import apihandlers  # noqa: E402
from tornado import web  # noqa: E402

from labkit.workshop import hubconfig, lifecycle, onnodes, slurmservers, slurmspawner  # noqa: E402

NODES = {"node1": {"root": "198.18.1.2", "nobody": "198.18.1.3"},
         "node2": {"root": "198.18.2.2", "nobody": "198.18.2.3"}}


def _spawner(**kw: object) -> slurmspawner.WorkshopSlurmSpawner:
    user = SimpleNamespace(name="root", url="/user/root/")
    return slurmspawner.WorkshopSlurmSpawner(user=user, release_dir="/rel", server_addresses=NODES,
                                             req_log_dir="/state/hub/servers", **kw)


def test_the_hub_runs_servers_as_jobs_and_replaces_batchspawner_s_handler(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    handlers = [("/api/batchspawner", batch_api.BatchSpawnerAPIHandler), ("/api/users", object)]
    monkeypatch.setattr(apihandlers, "default_handlers", handlers)
    c = hubconf.load(hubconfig.config_text(hubconf.settings(tmp_path, spawner="slurm", hub_ip="198.18.0.1",
                                                            server_addresses=NODES, cores=1.0, pids=64,
                                                            extra_env={"SLURM_CONF": "/n/slurm.conf"})))
    assert c.JupyterHub.spawner_class == "labkit.workshop.slurmspawner.WorkshopSlurmSpawner"
    assert c.JupyterHub.hub_ip == "198.18.0.1" and c.WorkshopSlurmSpawner.server_addresses == NODES
    assert c.WorkshopSlurmSpawner.release_dir == str(tmp_path / "release") and c.Spawner.disable_user_config
    assert c.WorkshopSlurmSpawner.req_log_dir == str(tmp_path / "servers")  # root's, in the hub's private folder
    assert c.WorkshopSlurmSpawner.slurm_conf == "/n/slurm.conf"
    assert "pids_limit" not in c.WorkshopSlurmSpawner  # the nodes' task cap holds Slurm's jobs
    assert handlers == [("/api/users", object), ("/api/batchspawner", slurmspawner.ServerPortHandler)]


@pytest.mark.parametrize("bad", [dict(spawner="slurm"), dict(spawner="kubernetes"),
                                 dict(spawner="slurm", server_addresses={"node1": {"learner01": "1.2.3.4; rm"}}),
                                 dict(spawner="slurm", server_addresses={"node1; rm": {"learner01": "1.2.3.4"}}),
                                 dict(spawner="slurm", server_addresses={"node1": {"x y": "1.2.3.4"}})])
def test_settings_a_slurm_hub_cannot_run_with_are_refused(tmp_path: Path, bad: dict) -> None:
    with pytest.raises(ValueError):
        hubconfig.config_text(hubconf.settings(tmp_path, **bad))


def test_the_hub_refuses_to_start_when_batchspawner_s_handler_has_moved() -> None:
    with pytest.raises(slurmspawner.HandlerMoved, match="set the commands the hub runs as root"):
        slurmspawner.install([("/api/users", object)])


@pytest.mark.parametrize("body", [{"port": 80}, {"port": "40000"}, {"port": True}, {"port": 70000}, [40000],
                                  {"port": 40000, "batch_cancel_cmd": "touch /canary"}, {"exec_prefix": "sh -c"}])
def test_a_server_says_its_port_and_nothing_else(body: object) -> None:
    with pytest.raises(web.HTTPError) as e:
        slurmspawner.check_port(body)
    assert e.value.status_code == 400


def test_a_good_port_is_taken() -> None:
    assert slurmspawner.check_port({"port": 40000}) == 40000


def _learner_spawner(**kw: object) -> slurmspawner.WorkshopSlurmSpawner:
    """A spawner for ``nobody`` (a user every Debian has, not root), as for a learner."""
    user = SimpleNamespace(name="nobody", url="/user/nobody/")
    return slurmspawner.WorkshopSlurmSpawner(user=user, release_dir="/rel", server_addresses=NODES,
                                             **{"req_keepvars": "PATH", "req_log_dir": "/state/hub/servers", **kw})


def _submitted(s: slurmspawner.WorkshopSlurmSpawner, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """The command root runs and the script it hands sbatch, as batchspawner submits them."""
    seen: dict[str, str] = {}

    async def run_command(cmd: str, input: str | None = None, env: object = None) -> str:  # noqa: A002
        seen.update(cmd=cmd, script=input or "")
        return "4242"

    monkeypatch.setattr(s, "run_command", run_command)
    monkeypatch.setattr(s, "get_env", lambda: {"PATH": "/usr/bin"})  # the hub's environment (no hub here)
    assert aio.run(s.submit_batch_script()) == "4242"
    return seen["cmd"], seen["script"]


def test_root_s_job_becomes_the_learner_in_a_world_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _learner_spawner(cpu_limit=1.5, mem_limit=3 * 2**30, cmd=["jupyterhub-singleuser"], req_keepvars="PATH,HOME",
                         args=['--ServerApp.terminado_settings={"shell_command": ["/bin/bash", "-l"]}'])
    cmd, script = _submitted(s, monkeypatch)
    assert s.exec_prefix == "" and cmd.strip() == "sbatch --parsable"
    assert "#SBATCH --partition=labkit-servers" in script and "#SBATCH --mem=3072M" in script
    assert "#SBATCH --cpus-per-task=2" in script and "#SBATCH --export=PATH,HOME" in script
    assert "#SBATCH --chdir=/\n" in script and "#SBATCH --output=/dev/null\n" in script
    line = script.rstrip().splitlines()[-1]
    server_part, sink = line.split(" < /dev/null 2>&1 | ")
    assert shlex.split(sink)[1:] == ["-I", "-m", "labkit.workshop.serverlog", "/state/hub/servers/nobody.log"]
    argv = shlex.split(server_part)
    # the learner's network on the job's node, then the world, as root, then the learner
    assert argv[:2] == ["nsenter", "--net=/run/netns/lkn-$node-nobody"] and argv[2:4] == ["unshare", "--mount"]
    drop = argv.index("setpriv")
    assert argv[drop:drop + 5] == ["setpriv", "--reuid=65534", "--regid=65534", "--init-groups", "--no-new-privs"]
    server = argv[argv.index("--chdir=/nonexistent") + 1:]
    assert server[:2] == ["batchspawner-singleuser", "jupyterhub-singleuser"]
    settings = [a for a in server if a.startswith("--ServerApp.terminado_settings=")]
    assert json.loads(settings[0].split("=", 1)[1]) == {"shell_command": ["/bin/bash", "-l"]}


HOSTILE_OPTIONS = [
    {"memory": "1G\nid > /tmp/canary"}, {"uid": "0", "gid": "0"}, {"cmd": "sh -c 'id > /tmp/canary'"},
    {"partition": "debug\n#SBATCH --uid=0"}, {"homedir": "/root"}, {"keepvars": "ALL"}, {"nprocs": "1$(id)"},
    {"log_dir": "/etc"}, {"username": "root"},
]


@pytest.mark.parametrize("options", HOSTILE_OPTIONS)
def test_a_learner_s_server_options_never_reach_root_s_job(options: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = _submitted(_learner_spawner(cmd=["jupyterhub-singleuser"]), monkeypatch)
    s = _learner_spawner(cmd=["jupyterhub-singleuser"])
    s.user_options = dict(options)  # as JupyterHub sets them from the REST API's body or the spawn page's query
    assert _submitted(s, monkeypatch) == plain
    s.drop_user_options()
    assert s.user_options == {}


def test_no_form_or_query_makes_server_options() -> None:
    s = _learner_spawner()
    assert s.options_from_query({"memory": ["1G\nid"], "uid": ["0"]}) == {}
    assert s.options_from_form({"memory": ["1G"]}) == {}


@pytest.mark.parametrize("trait", [dict(req_memory="1G; id"), dict(req_log_dir="/x y"), dict(req_uid="0"),
                                   dict(req_keepvars="PATH,A B"), dict(req_homedir="/h\nid")])
def test_a_value_the_hub_does_not_make_stops_the_script(trait: dict) -> None:
    with pytest.raises(ValueError, match="not one the hub makes"):
        slurmspawner.script_values(_learner_spawner(cmd=["jupyterhub-singleuser"], **trait))


def test_the_proxy_reaches_the_server_in_the_learner_s_network_on_its_node() -> None:
    s = _spawner()
    s.job_status = "RUNNING node2"
    assert s.state_gethost() == "198.18.2.2"
    s.job_status = "RUNNING elsewhere"
    with pytest.raises(RuntimeError, match="made no network for them"):
        s.state_gethost()


def test_the_servers_partition_is_root_only_and_spreads_servers() -> None:
    args = slurmservers.partition_args(["node1", "node2"], 3072)
    assert args[:3] == ["create", "PartitionName=labkit-servers", "Nodes=node1,node2"]
    assert {"RootOnly=YES", "LLN=YES", "Default=NO", "MaxMemPerNode=3072"} <= set(args)
    with pytest.raises(ValueError):
        slurmservers.partition_args(["node1 Default=YES"], None)


def test_a_memory_limit_the_nodes_cannot_hold_twice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lifecycle.nodes_slurm, "node_memory_mib", lambda count: 6000)
    onnodes.fits_on_nodes(onnodes.limits.Limits(memory=2 * 2**30), 2)
    with pytest.raises(lifecycle.WorkshopError, match="at most --memory 2G"):
        onnodes.fits_on_nodes(onnodes.limits.Limits(memory=3 * 2**30), 2)


def test_nodes_for_a_class_whose_servers_are_jobs() -> None:
    assert [onnodes.node_count(n, "slurm") for n in (1, 2, 5, 40)] == [2, 2, 5, 8]
    assert onnodes.node_count(40, "local") == 2
