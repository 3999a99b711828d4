"""Inside the course image on a managed service: turn the service's description of the job's machines
into what the course's scripts read, then run the script.

    python -m labkit.deploy.cloud.bootstrap --service sagemaker --solution horovod --per-host 1 -- python SCRIPT ARGS

* Horovod (MPI) on Vertex AI and SageMaker, which start the same container on every machine and run no
  MPI launcher: the first machine waits for the others' ssh servers and runs ``mpirun`` over all of them;
  the others run the image's ssh server (as the image's user, port 2222) until the ranks MPI started on
  them have ended. Azure ML runs MPI itself and needs no bootstrap.
* tf.distribute on SageMaker, which sets no ``TF_CONFIG``: it is built from the machines' list
  (``/opt/ml/input/config/resourceconfig.json``). On Azure ML, whose ``TF_CONFIG`` has workers and
  parameter servers but no chief, worker 0 becomes the chief for ParameterServerStrategy. On Vertex AI the
  scripts read the ``TF_CONFIG`` the service sets, unchanged, and the bootstrap is not used.
* ParameterServerStrategy's workers and parameter servers serve for ever: here they end when the chief
  (the coordinator) has gone, so that a service waiting for every machine ends the job.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

SSH_PORT = 2222  # the image's ssh server runs as the image's user (provision.sh)
TF_PORT = 2222
SAGEMAKER_CONFIG = Path("/opt/ml/input/config/resourceconfig.json")
SERVICES = ("vertex", "sagemaker", "azureml")
# Root or not, threads per rank from the launcher, TCP between machines, no CMA in containers.
MPIRUN_FLAGS = ("--bind-to", "none", "--map-by", "slot", "--mca", "pml", "ob1", "--mca", "btl", "self,vader,tcp",
                "-x", "TF_USE_LEGACY_KERAS", "-x", "PATH")


def machines(service: str, environ: Mapping[str, str],
             sagemaker_config: Path = SAGEMAKER_CONFIG) -> tuple[list[str], int]:
    """The job's machines (host names, the first one leads) and this machine's index among them."""
    if service == "sagemaker":
        config = json.loads(sagemaker_config.read_text())
        hosts = sorted(config["hosts"], key=lambda h: int(h.rsplit("-", 1)[-1]) if h[-1:].isdigit() else 0)
        return hosts, hosts.index(config["current_host"])
    if service == "vertex":  # CLUSTER_SPEC: {"cluster": {"workerpool0": ["host:port"], ...}, "task": {...}}
        spec = json.loads(environ["CLUSTER_SPEC"])
        pools = [spec["cluster"].get(f"workerpool{i}", []) for i in range(4)]
        hosts = [a.rsplit(":", 1)[0] for a in pools[0] + pools[1]]
        task = spec["task"]
        me = int(task["index"]) + (len(pools[0]) if task["type"] == "workerpool1" else 0)
        return hosts, me
    raise ValueError(f"machines of {service}: only vertex and sagemaker start MPI jobs this way")


def mpirun(hosts: Sequence[str], per_host: int, command: Sequence[str]) -> list[str]:
    """``mpirun`` across ``hosts`` with ``per_host`` ranks each (the first host is this one)."""
    slots = ",".join(f"{h}:{per_host}" for h in hosts)
    return ["mpirun", "-np", str(len(hosts) * per_host), "-H", slots, *MPIRUN_FLAGS, *command]


def tf_config(service: str, solution: str, environ: Mapping[str, str], ps: int = 1,
              sagemaker_config: Path = SAGEMAKER_CONFIG) -> dict:
    """TF_CONFIG for this machine: built from SageMaker's machines, or Azure ML's with a chief for PS."""
    if service == "sagemaker":
        hosts, me = machines(service, environ, sagemaker_config)
        addr = [f"{h}:{TF_PORT}" for h in hosts]
        if solution == "multiworker":
            return {"cluster": {"worker": addr}, "task": {"type": "worker", "index": me}}
        roles = [("chief", 0)] + [("worker", i) for i in range(len(hosts) - 1 - ps)] + [("ps", i) for i in range(ps)]
        cluster = {"chief": addr[:1], "worker": addr[1:len(hosts) - ps], "ps": addr[len(hosts) - ps:]}
        return {"cluster": cluster, "task": {"type": roles[me][0], "index": roles[me][1]}}
    config = json.loads(environ["TF_CONFIG"])
    if service == "azureml" and solution == "ps" and "chief" not in config["cluster"]:
        workers = config["cluster"]["worker"]
        config["cluster"] = {**config["cluster"], "chief": workers[:1], "worker": workers[1:]}
        task = config["task"]
        if task["type"] == "worker":
            task.update({"type": "chief", "index": 0} if task["index"] == 0 else {"index": task["index"] - 1})
    return config


def reachable(host: str, port: int, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for(hosts: Sequence[str], port: int, timeout: float) -> list[str]:
    """Wait until every host answers on ``port``; return those that never did."""
    deadline, left = time.monotonic() + timeout, list(hosts)
    while left and time.monotonic() < deadline:
        left = [h for h in left if not reachable(h, port)]
        time.sleep(1.0 if left else 0)
    return left


def serve_ssh(start_timeout: float = 1800.0) -> int:
    """Run the ssh server until MPI's daemon (``orted``) has come and gone; 1 if it never came."""
    sshd = subprocess.Popen(["labkit-sshd"])
    seen, deadline = False, time.monotonic() + start_timeout
    try:
        while sshd.poll() is None:
            running = any(p.info["name"] == "orted" for p in psutil.process_iter(["name"]))
            if seen and not running:
                return 0
            seen = seen or running
            if not seen and time.monotonic() > deadline:
                print(f"no MPI job reached this machine in {start_timeout:.0f} s", file=sys.stderr)
                return 1
            time.sleep(1.0)
        return sshd.returncode or 1
    finally:
        sshd.terminate()
        sshd.wait(10)


def chief_connected(pid: int, host: str) -> bool:
    """Whether the chief (``host``) holds a TCP connection to process ``pid`` or one of its children: the
    coordinator of ParameterServerStrategy keeps one to every worker and parameter server while it trains."""
    try:
        addresses = set(socket.gethostbyname_ex(host)[2])
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except (OSError, psutil.Error):
        return False
    for p in procs:
        try:
            connections = p.net_connections(kind="tcp") if hasattr(p, "net_connections") else p.connections("tcp")
        except psutil.Error:
            continue
        if any(c.raddr and c.raddr.ip in addresses and c.status == psutil.CONN_ESTABLISHED for c in connections):
            return True
    return False


def serve_until_chief_ends(command: Sequence[str], chief: str, misses: int = 3, every: float = 2.0) -> int:
    """Run a ParameterServerStrategy worker or ps until the chief, once seen (answering on its port, or connected
    to this task), has stopped answering and holds no connection to it: a chief whose whole run fell between two
    looks at its port is still seen through its connection."""
    child = subprocess.Popen(list(command))
    host, port = chief.rsplit(":", 1)
    seen, missed = False, 0
    try:
        while child.poll() is None:
            up = reachable(host, int(port)) or chief_connected(child.pid, host)
            seen, missed = seen or up, 0 if up else missed + 1
            if seen and missed >= misses:
                return 0
            time.sleep(every)
        return child.returncode
    finally:
        if child.poll() is None:
            child.terminate()
            child.wait(30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m labkit.deploy.cloud.bootstrap", description=__doc__.split("\n")[0])
    p.add_argument("--service", choices=SERVICES, required=True)
    p.add_argument("--solution", choices=("horovod", "multiworker", "ps"), required=True)
    p.add_argument("--per-host", type=int, default=1, help="MPI ranks per machine")
    p.add_argument("--ps", type=int, default=1, help="parameter servers (SageMaker: the last machines)")
    p.add_argument("--wait", type=float, default=600.0, help="seconds to wait for the other machines")
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        p.error("give the command after --")
    if a.solution == "horovod":
        hosts, me = machines(a.service, os.environ)
        if me != 0:
            return serve_ssh()
        missing = wait_for(hosts[1:], SSH_PORT, a.wait)
        if missing:
            print(f"bootstrap: no ssh server answered on {', '.join(missing)} within {a.wait:.0f} s", file=sys.stderr)
            return 1
        os.execvp("mpirun", mpirun(hosts, a.per_host, command))
    config = tf_config(a.service, a.solution, os.environ, a.ps)
    os.environ["TF_CONFIG"] = json.dumps(config)
    if a.solution == "ps" and config["task"]["type"] in ("worker", "ps"):
        return serve_until_chief_ends(command, config["cluster"]["chief"][0])
    os.execvp(command[0], command)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
