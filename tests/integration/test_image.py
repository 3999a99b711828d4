"""`labkit image build`: the commands it runs (fast), and the image itself (slow, root): built once for the
file, it runs `labkit doctor`, the Horovod solution on 2 ranks with mpirun in one container, and one job
across two containers on a podman network; everything the tests made is removed afterwards."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from helpers import paths
from packaging.specifiers import SpecifierSet

import labkit
from labkit.cli import image as cli
from labkit.deploy.cloud import PROVIDERS
from labkit.deploy.cloud.jobs import Plan
from labkit.deploy.image import build, recipe

REPO = paths.ROOT
SUBNET = "198.18.7.0/24"  # a benchmarking range, on a network with no way out (--internal)


# ----------------------------------------------------------------------------- fast: the commands


def test_default_tag_follows_the_version():
    assert recipe.default_tag() == f"localhost/labkit:{labkit.__version__}"
    assert recipe.default_tag(gpu=True) == f"localhost/labkit:{labkit.__version__}-gpu"


def test_mmdebstrap_command(tmp_path):
    argv = recipe.mmdebstrap(tmp_path / "ctx", tmp_path / "root.tar", "bookworm", Path("/etc/apt/sources.list"))
    assert argv[:3] == ["mmdebstrap", "--mode=root", "--variant=minbase"]
    assert "--include=" + ",".join(recipe.PACKAGES) in argv
    assert argv[-3:] == ["bookworm", str(tmp_path / "root.tar"), "/etc/apt/sources.list"]
    hooks = [a.split("=", 1)[1] for a in argv if a.startswith("--customize-hook=")]
    assert hooks[1] == f"sync-in {tmp_path / 'ctx' / 'repo'} {recipe.ROOT}"
    assert hooks[3] == f'chroot "$1" sh {recipe.ROOT}/{recipe.PROVISION_PATH} {recipe.STAGE}'
    assert hooks[-1] == f'rm -rf "$1{recipe.STAGE}"'  # nothing of the build context stays in the image
    for p in ("openmpi-bin", "openssh-server", "openssh-client", "python3-venv", "dataset-fashion-mnist"):
        assert p in recipe.PACKAGES


def test_podman_commands_use_runc_and_the_image_settings(tmp_path):
    argv = recipe.podman_import(tmp_path / "root.tar", "localhost/x:1")
    assert argv[:3] == ["podman", "--runtime", "/usr/sbin/runc"] and argv[3] == "import"
    changes = [argv[i + 1] for i, a in enumerate(argv) if a == "--change"]
    assert "USER labkit" in changes and f"WORKDIR {recipe.ROOT}" in changes
    assert "ENV TF_USE_LEGACY_KERAS=1" in changes and "ENV CUDA_VISIBLE_DEVICES=" in changes
    assert "ENV CUDA_VISIBLE_DEVICES=" not in recipe.image_config(gpu=True)
    run = recipe.podman_run("localhost/x:1", ["labkit", "doctor"], name="a", network="none")
    assert run[3:] == ["run", "--rm", "--network=none", "--name=a", "localhost/x:1", "labkit", "doctor"]
    assert "nvidia.com/gpu=all" in recipe.podman_run("t", ["true"], gpus=True)
    conf = recipe.write_containers_conf(tmp_path)
    assert conf.read_text() == "[containers]\ndefault_ulimits = []\n"


def test_requirements_are_the_environment_s_versions_without_extras():
    import importlib.metadata as md

    lines = recipe.requirements()
    names = {re.split(r"[=<\[]", line)[0].lower().replace("_", "-") for line in lines}
    assert f"tensorflow=={md.version('tensorflow')}" in lines
    assert f"tf_keras=={md.version('tf-keras')}" in lines or f"tf-keras=={md.version('tf-keras')}" in lines
    assert {"mpi4py", "jupyterlab", "cloudpickle"} <= names  # labkit's and Horovod's needs
    assert not names & {"labkit", "horovod", "pip", "setuptools", "pytest", "ruff", "playwright", "sagemaker",
                        "azure-ai-ml", "google-cloud-aiplatform"}  # the roots, build tools, extras
    relaxed = [line for line in recipe.requirements(python="3.11.2") if "<" in line]
    for line in relaxed:  # only releases whose Requires-Python excludes the image's Python
        name, version = line.split("<")
        assert "3.11.2" not in SpecifierSet(md.metadata(name)["Requires-Python"])
        assert md.version(name) == version
    gpu = recipe.requirements(gpu=True)
    assert f"tensorflow[and-cuda]=={md.version('tensorflow')}" in gpu


def test_pip_download_is_binary_only_for_the_image_python(tmp_path):
    argv = recipe.pip_download("/py", tmp_path / "r.txt", tmp_path, "3.11.2")
    assert argv[:4] == ["/py", "-m", "pip", "download"]
    assert argv[argv.index("--only-binary") + 1] == ":all:" and argv[argv.index("--python-version") + 1] == "3.11.2"
    assert "setuptools>=68" in argv


def test_containerfile_matches_the_recipe():
    text = (REPO / "Containerfile").read_text()
    final = text.rsplit("\nFROM ", 1)[1]
    apt = re.search(r"--no-install-recommends \\\n\s+([^\n]+)", final).group(1).split()
    assert tuple(apt) == recipe.PACKAGES
    assert f"sh /opt/labkit/{recipe.PROVISION_PATH} " in final and "USER labkit" in final
    assert (REPO / recipe.PROVISION_PATH).is_file()
    env = dict(re.findall(r"(\w+)=(\S*)", final.split("ENV ", 1)[1].split("\nUSER")[0]))
    wanted = dict(c.split(" ", 1)[1].split("=", 1) for c in recipe.image_config()[1::2] if c.startswith("ENV "))
    assert env == wanted
    assert "horovod-0.28.1-tf2.21.patch" in text
    cmd = next(c for c in recipe.image_config()[1::2] if c.startswith("CMD "))
    assert f"\n{cmd}\n" in final + "\n" and f"EXPOSE {recipe.PORT}" in final  # the same default: JupyterLab
    ignored = (REPO / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


def test_missing_tools_are_named():
    lacking = build.missing_tools()
    assert all(isinstance(t, str) for t in lacking)
    if os.geteuid() != 0:
        assert any("root" in t for t in lacking)


def test_cli_reports_what_is_missing(capsys, monkeypatch):
    monkeypatch.setattr(build, "missing_tools", lambda: ["mmdebstrap"])
    assert cli.main(["build"]) == 1
    assert "labkit image: needs mmdebstrap" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["build", "--tag"])
    assert e.value.code == 2


# ----------------------------------------------------------------------------- slow: the image itself


def _podman(*args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, **build.podman_env()}
    out = subprocess.run([*recipe.podman(), *args], capture_output=True, text=True, timeout=timeout, env=env)
    if check and out.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {out.returncode}:\n"
                             f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


def _temp_dirs() -> set[str]:
    return {p.name for p in Path("/tmp").glob("labkit-image-*")} | {p.name for p in Path("/tmp").glob("mmdebstrap.*")}


@pytest.fixture(scope="module")
def image():
    missing = build.missing_tools()
    if missing:
        pytest.skip("needs " + ", ".join(missing))
    try:
        build.horovod_wheel(build.cache_dir())
    except build.BuildError as e:
        pytest.skip(str(e))
    tag = f"localhost/labkit-test:{uuid.uuid4().hex[:8]}"
    before = _temp_dirs()
    start = time.monotonic()
    try:
        done = build.build(tag=tag, say=lambda line: print(line, flush=True))
        print(f"built {tag} in {time.monotonic() - start:.0f} s, {done.size_bytes / 1e9:.2f} GB, {done.steps}")
        assert _temp_dirs() == before, "the build left temporary folders"
        mounts = Path("/proc/mounts").read_text()
        assert "labkit-image-" not in mounts and "mmdebstrap." not in mounts
        yield tag
    finally:
        for name in _podman("ps", "-a", "--format", "{{.Names}}", check=False).stdout.split():
            if name.startswith("labkit-test-"):
                _podman("rm", "-f", name, check=False)
        _podman("rmi", "-f", tag, check=False)
        assert tag not in _podman("images", "--format", "{{.Repository}}:{{.Tag}}").stdout
        assert not [n for n in _podman("ps", "-a", "--format", "{{.Names}}").stdout.split()
                    if n.startswith("labkit-test-")]


@pytest.mark.slow
@pytest.mark.heavy  # builds the course image: make test-heavy
def test_image_runs_doctor(image):
    out = _podman(*recipe.podman_run(image, ["labkit", "doctor"])[3:], timeout=300)
    # the image's user is not root: doctor says the labs run, and which cells (virtual nodes, Slurm) need root
    assert "Ready: the labs can run here, except the above." in out.stdout, out.stdout
    assert "Not on this machine:" in out.stdout and "root" in out.stdout.split("Not on this machine:")[1]
    assert "Horovod        0.28.1  MPI yes | Gloo yes" in out.stdout
    assert "Fashion-MNIST  /home/labkit/.keras/datasets/fashion-mnist" in out.stdout
    who = _podman(*recipe.podman_run(image, ["id", "-un"])[3:], timeout=120).stdout.strip()
    assert who == recipe.USER


@pytest.mark.slow
@pytest.mark.heavy  # builds the course image: make test-heavy
def test_horovod_solution_on_two_ranks_in_one_container(image):
    size = ["mpirun", "-np", "2", "python", "-c",
            "import horovod.tensorflow as hvd; hvd.init(); print('rank', hvd.rank(), 'of', hvd.size(), flush=True)"]
    out = _podman(*recipe.podman_run(image, size, name=f"labkit-test-{uuid.uuid4().hex[:6]}")[3:], timeout=600)
    assert sorted(re.findall(r"rank (\d) of (\d)", out.stdout)) == [("0", "2"), ("1", "2")], out.stdout
    job = ["mpirun", "-np", "2", "python", "solutions/fashion_mnist_solution.py", "--epochs", "1",
           "--train-size", "256", "--test-size", "128", "--log-dir", "/tmp/logs"]
    start = time.monotonic()
    out = _podman(*recipe.podman_run(image, job, name=f"labkit-test-{uuid.uuid4().hex[:6]}")[3:], timeout=1500)
    print(f"Horovod solution, 2 ranks, 1 epoch of 256 images: {time.monotonic() - start:.0f} s")
    assert "Test accuracy:" in out.stdout, out.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.heavy  # builds the course image: make test-heavy
def test_one_job_across_two_containers(image):
    """Two containers on an internal podman network: the second runs the image's ssh server, the first runs
    mpirun over both (one rank each), as the cloud bootstrap does on a service's machines."""
    if not shutil.which("iptables") and not shutil.which("nft"):
        pytest.skip("podman's bridge network needs iptables or nft")
    net = f"labkit-test-{uuid.uuid4().hex[:6]}"
    ips = {"node1": "198.18.7.11", "node2": "198.18.7.12"}
    hosts = [f"--add-host={n}:{ip}" for n, ip in ips.items()]
    made = _podman("network", "create", "--internal", "--subnet", SUBNET, net, check=False)
    if made.returncode != 0:
        pytest.skip(f"podman cannot make a network here: {made.stderr.strip()[-300:]}")
    try:
        _podman("run", "--rm", "--detach", f"--network={net}", f"--ip={ips['node2']}", "--hostname=node2",
                f"--name={net}-node2", *hosts, image, "labkit-sshd", timeout=120)
        job = ["mpirun", "-np", "2", "-H", "node1:1,node2:1", "--mca", "btl_tcp_if_include", SUBNET,
               "--mca", "oob_tcp_if_include", SUBNET, "python", "-c",
               "import socket, horovod.tensorflow as hvd; hvd.init(); "
               "print('rank', hvd.rank(), 'of', hvd.size(), 'on', socket.gethostname(), flush=True)"]
        out = _podman("run", "--rm", f"--network={net}", f"--ip={ips['node1']}", "--hostname=node1",
                      f"--name={net}-node1", *hosts, image, *job, timeout=600)
        found = sorted(re.findall(r"rank (\d) of (\d) on (\w+)", out.stdout))
        assert found == [("0", "2", "node1"), ("1", "2", "node2")], out.stdout + out.stderr
    finally:
        _podman("rm", "-f", f"{net}-node1", f"{net}-node2", check=False)
        _podman("network", "rm", "-f", net, check=False)
        assert net not in _podman("network", "ls", "--format", "{{.Name}}").stdout


def _service_env(service: str, hosts: list[str], me: int, ps: int) -> dict[str, str]:
    """What the service gives machine ``me``: Vertex AI's CLUSTER_SPEC (pool 0 the chief, pool 1 the others) or
    Azure ML's TF_CONFIG (workers, then parameter servers, no chief); SageMaker's is a file (the caller's)."""
    if service == "vertex":
        pools = {"workerpool0": [f"{hosts[0]}:2222"], "workerpool1": [f"{h}:2222" for h in hosts[1:]]}
        task = {"type": "workerpool0", "index": 0} if me == 0 else {"type": "workerpool1", "index": me - 1}
        return {"CLUSTER_SPEC": json.dumps({"cluster": pools, "task": task})}
    workers, servers = hosts[:len(hosts) - ps], hosts[len(hosts) - ps:]
    task = {"type": "worker", "index": me} if me < len(workers) else {"type": "ps", "index": me - len(workers)}
    cluster = {"worker": [f"{h}:2222" for h in workers], "ps": [f"{h}:2222" for h in servers]}
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": task})}


@pytest.mark.slow
@pytest.mark.heavy  # builds the course image: make test-heavy
# One per service and one per solution: each trains for a minute or more (all five ran when this was written).
@pytest.mark.parametrize("service,solution", [("sagemaker", "multiworker"), ("vertex", "horovod"), ("azureml", "ps")])
def test_cloud_bootstrap_runs_the_job_on_containers(image, tmp_path, service, solution):
    """The written files' commands, as the service starts them: the same image on every machine, with what the
    service tells each one (SageMaker's resourceconfig.json, Vertex AI's CLUSTER_SPEC, Azure ML's TF_CONFIG).
    Horovod: the first machine runs mpirun over all, the others serve ssh until the ranks end; tf.distribute:
    TF_CONFIG from the machines (SageMaker) or with a chief (Azure ML, ps), and the parameter server and
    worker end when the chief has."""
    if not shutil.which("iptables") and not shutil.which("nft"):
        pytest.skip("podman's bridge network needs iptables or nft")
    small = ("--epochs", "1", "--train-size", "256", "--test-size", "128")
    plan = Plan(solution=solution, nodes=2, ps=1, gpus=0, image=image, args=small).resolved()
    obj = PROVIDERS[service].build(plan)
    if service == "sagemaker":
        algo = obj["AlgorithmSpecification"]
        commands = [algo["ContainerEntrypoint"] + algo["ContainerArguments"]] * obj["ResourceConfig"]["InstanceCount"]
    elif service == "vertex":
        pools = obj["workerPoolSpecs"]
        commands = [p["containerSpec"]["command"] + p["containerSpec"]["args"]
                    for p in pools for _ in range(p["replicaCount"])]
    else:
        command = ["sh", "-c", obj["command"].replace("${{outputs.logs}}", "/tmp/out")]
        commands = [command] * obj["resources"]["instance_count"]
    commands = [[c.replace("/opt/ml/checkpoints", "/tmp/ckpt").replace("/gcs/", "/tmp/gcs/") for c in cmd]
                for cmd in commands]
    net = f"labkit-test-{uuid.uuid4().hex[:6]}"
    hosts = [f"algo-{i + 1}" for i in range(len(commands))]
    ips = {h: f"198.18.7.{31 + i}" for i, h in enumerate(hosts)}
    made = _podman("network", "create", "--internal", "--subnet", SUBNET, net, check=False)
    if made.returncode != 0:
        pytest.skip(f"podman cannot make a network here: {made.stderr.strip()[-300:]}")
    names = [f"{net}-{h}" for h in hosts]
    try:
        for me in reversed(range(len(hosts))):
            host = hosts[me]
            extra = []
            if service == "sagemaker":
                conf = tmp_path / f"{host}.json"
                conf.write_text(json.dumps({"current_host": host, "hosts": hosts}))
                conf.chmod(0o644)
                extra = ["-v", f"{conf}:/opt/ml/input/config/resourceconfig.json:ro"]
            else:
                env = _service_env(service, hosts, me, plan.ps)
                extra = [w for k, v in env.items() for w in ("--env", f"{k}={v}")]
            _podman("run", "--detach", f"--network={net}", f"--ip={ips[host]}", f"--hostname={host}",
                    f"--name={names[me]}", *[f"--add-host={h}:{a}" for h, a in ips.items()], *extra,
                    image, *commands[me], timeout=120)
        # One wait for all: podman forgets an exit code some minutes after the container ended.
        codes = _podman("wait", *names, timeout=1500).stdout.split()
        logs = {name: _podman("logs", name, check=False).stdout + _podman("logs", name, check=False).stderr
                for name in names}
        assert codes == ["0"] * len(names), f"exit codes {codes}:\n" + "\n".join(v[-2500:] for v in logs.values())
        assert any("Test accuracy:" in text for text in logs.values())
    finally:
        _podman("rm", "-f", *names, check=False)
        _podman("network", "rm", "-f", net, check=False)
        assert net not in _podman("network", "ls", "--format", "{{.Name}}").stdout


@pytest.mark.slow
@pytest.mark.heavy  # builds the course image: make test-heavy
def test_the_image_serves_jupyterlab_on_a_folder_that_outlives_it(image, tmp_path):
    """`podman run -p PORT:8888 -v WORK:/home/labkit/work IMAGE` with no command: JupyterLab answers on the
    host with the token it printed, the course is in WORK; a learner's edit there survives a second container."""
    from labkit.core import tfconfig

    uid = int(_podman(*recipe.podman_run(image, ["id", "-u"])[3:], timeout=120).stdout.strip())
    work = tmp_path / "work"
    work.mkdir()
    os.chown(work, uid, uid)  # the image's user writes the mounted folder (Docker Desktop needs no such step)

    def serve() -> tuple[str, str]:
        port = tfconfig.free_ports(1)[0]
        name = f"labkit-test-{uuid.uuid4().hex[:6]}"
        run = [*recipe.podman(), "run", "--rm", "--detach", f"--name={name}", "-p", f"127.0.0.1:{port}:8888",
               "-v", f"{work}:{recipe.WORK}", image]
        _podman(*run[3:], timeout=120)
        deadline, logs = time.monotonic() + 120, ""
        while time.monotonic() < deadline and "token=" not in logs:
            time.sleep(1)
            out = _podman("logs", name, check=False)
            logs = out.stdout + out.stderr
        token = re.search(r"token=(\w+)", logs)
        assert token, logs[-2000:]
        for _ in range(30):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents/labs?token={token[1]}",
                                            timeout=10) as r:
                    names = {item["name"] for item in json.load(r)["content"]}
                break
            except OSError:
                time.sleep(1)
        else:
            raise AssertionError(f"JupyterLab did not answer on port {port}:\n{logs[-2000:]}")
        assert "02_horovod.ipynb" in names and "fashion_mnist.py" in names
        return name, logs

    name, logs = serve()
    assert "the course written into /home/labkit/work" in logs
    mine = work / "labs" / "fashion_mnist.py"
    mine.write_text(mine.read_text() + "# my change\n")
    _podman("stop", "-t", "5", name, timeout=60)
    name, logs = serve()  # a new container on the same folder
    assert "your files are left as they are" in logs and mine.read_text().endswith("# my change\n")
    _podman("stop", "-t", "5", name, timeout=60)
