"""Kubernetes manifests (Kubeflow) that run the lab's scripts on a cluster, validated offline.

Horovod: an ``MPIJob`` (``kubeflow.org/v2beta1``, mpi-operator v0.8). The launcher's ``mpirun`` starts
the ranks on the workers over SSH (each worker runs ``sshd``); such ranks do not see the worker
container's environment, so each variable they need is also passed with ``-x``.

MultiWorkerMirroredStrategy: a Kubeflow Trainer v2 ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``) on
the ``ClusterTrainingRuntime`` :func:`runtime` writes. Trainer v2 has no TensorFlow runtime
(kubeflow/trainer#2699 deprioritized it and advises a plain runtime with TF_CONFIG set by hand). A
runtime without framework policy ("plain ML") gets the TrainJob's node count and env. Its pods are
``<job>-node-0-<i>.<job>`` (one indexed Job of a JobSet with DNS hostnames), so the TrainJob's env
lists them in TF_CONFIG, and each pod's index comes from its job-completion-index annotation
(downward API) into ``LABKIT_WORKER_INDEX``, which TF_CONFIG refers to as ``$(LABKIT_WORKER_INDEX)``:
Kubernetes expands it in each pod. The Training Operator v1 ``TFJob`` sets TF_CONFIG itself but is
the legacy, maintenance-only line, and its v1 ``mpijobs.kubeflow.org`` CRD collides with the
mpi-operator's (kubeflow/trainer#1930, #1972).

Every manifest written is validated offline first (:mod:`labkit.deploy.k8s_validate`; ``k8s.validate``).
"""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from labkit.core import contract
from labkit.core import env as lkenv
from labkit.deploy.image import recipe
from labkit.deploy.k8s_validate import ANCESTOR, LABEL, TF_PORT, TRAINER_API, Manifest
from labkit.deploy.k8s_validate import ManifestError as ManifestError  # re-exported: k8s.ManifestError
from labkit.deploy.k8s_validate import validate as validate  # re-exported: k8s.validate

# Placeholder: an image built from this repository (its requirements, Horovod with TensorFlow and
# OpenMPI, openssh-server and -client, Fashion-MNIST in the Keras cache), the repository at /opt/labkit.
IMAGE = recipe.default_tag()  # what `labkit image build` tags; push it to your registry and give --image
WORKDIR = "/opt/labkit/solutions"
HOROVOD_SCRIPT = "fashion_mnist_solution.py"
MWMS_SCRIPT = "fashion_mnist_multiworker_after_step_05.py"
RUNTIME = "labkit-tensorflow"
# Root in the container; threads are set per rank; shared memory without ptrace (CMA), TCP between pods.
MPIRUN_FLAGS = ("--allow-run-as-root", "--bind-to", "none", "--map-by", "slot", "--mca", "pml", "ob1",
                "--mca", "btl", "self,vader,tcp", "--mca", "btl_vader_single_copy_mechanism", "none")
GPU = "nvidia.com/gpu"
INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def _check(name: str, image: str, script: str = "-", **counts: tuple[int, int]) -> None:
    if not isinstance(name, str) or not LABEL.match(name) or len(name) > 63:
        raise ValueError(f"bad name {name!r}: lower-case letters, digits and '-', starting with a letter, at most 63")
    if not isinstance(image, str) or not image.strip():
        raise ValueError(f"image is empty: give the lab's image (the default is {IMAGE}, as `labkit image build` tags "
                         "it; push it to a registry your cluster reads, docs/cloud.md)")
    if not script:
        raise ValueError("no script given")
    for key, (value, low) in counts.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{key} must be a whole number >= {low}, got {value!r}")


def _env(cpu: str, procs: int, gpus: int) -> list[dict[str, Any]]:
    """TF_USE_LEGACY_KERAS=1 and friends, threads for the CPU request, no GPU for CPU-only pods."""
    try:
        cores = float(cpu[:-1]) / 1000 if str(cpu).endswith("m") else float(cpu)
    except (TypeError, ValueError):
        cores = -1.0
    if not cores > 0:
        raise ValueError(f"cpu must be a positive Kubernetes quantity such as '2' or '500m', got {cpu!r}")
    env = {**lkenv.DEFAULTS, **lkenv.thread_env(max(1, int(cores // procs)))}
    env.update({} if gpus else {"CUDA_VISIBLE_DEVICES": ""})  # a CPU pod never grabs a GPU the node shows
    return [{"name": k, "value": v} for k, v in env.items()]


def _resources(cpu: str, memory: str, gpus: int) -> dict[str, Any]:
    return {"requests": {"cpu": str(cpu), "memory": str(memory)}, **({"limits": {GPU: gpus}} if gpus else {})}


def _metadata(name: str, namespace: str | None, **labels: str) -> dict[str, Any]:
    ns = {"namespace": namespace} if namespace else {}
    return {"name": name, **ns, "labels": {"app.kubernetes.io/part-of": "labkit", **labels}}


@dataclass(frozen=True)
class Pods:
    """The worker pods of a job: how many, ranks (slots) and GPUs each, and what each requests."""

    workers: int = 2
    slots_per_worker: int = 1  # ranks per pod (MPIJob); a TrainJob runs one worker per pod
    gpus_per_worker: int = 0
    cpu: str = "2"  # a Kubernetes quantity: "2", "500m"
    memory: str = "8Gi"


def mpijob(name: str = "labkit-horovod", image: str = IMAGE, script: str = HOROVOD_SCRIPT, args: Sequence[str] = (),
           pods: Pods = Pods(), namespace: str | None = None) -> Manifest:
    """A Kubeflow MPIJob running ``mpirun -np workers*slots python script args`` (Horovod)."""
    _check(name, image, script, workers=(pods.workers, 1), slots_per_worker=(pods.slots_per_worker, 1),
           gpus_per_worker=(pods.gpus_per_worker, 0))
    workers, slots_per_worker, gpus_per_worker = pods.workers, pods.slots_per_worker, pods.gpus_per_worker
    np = workers * slots_per_worker
    env = _env(pods.cpu, slots_per_worker, gpus_per_worker)
    exports = [w for e in env for w in ("-x", f"{e['name']}={e['value']}")]  # ssh-started ranks see only these
    command = ["mpirun", "-np", str(np), *MPIRUN_FLAGS, *exports, "python", script, *args]

    def role(container: str, cmd: list[str], resources: dict[str, Any]) -> dict[str, Any]:
        return {"spec": {"containers": [{"name": container, "image": image, "workingDir": WORKDIR, "env": env,
                                         "command": cmd, "resources": resources}]}}

    job = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": _metadata(name, namespace), "spec": {
        "slotsPerWorker": slots_per_worker,
        "sshAuthMountPath": "/home/labkit/.ssh",  # the image runs as user labkit, its sshd on port 2222
        "runPolicy": {"cleanPodPolicy": "Running"},
        "mpiImplementation": "OpenMPI",
        "launcherCreationPolicy": "WaitForWorkersReady",
        "mpiReplicaSpecs": {
            "Launcher": {"replicas": 1, "restartPolicy": "OnFailure",
                         "template": role("launcher", command, _resources("500m", "1Gi", 0))},
            "Worker": {"replicas": workers, "template": role(
                "worker", ["labkit-sshd"], _resources(pods.cpu, pods.memory, gpus_per_worker))},
        },
    }}
    validate(job)
    return job


def tf_config(name: str, workers: int) -> str:
    """TF_CONFIG for the workers of TrainJob ``name``; Kubernetes expands the index in each pod."""
    hosts = [f"{name}-node-0-{i}.{name}:{TF_PORT}" for i in range(workers)]
    workers_json = json.dumps(hosts, separators=(",", ":"))
    index = f"$({contract.K8S_WORKER_INDEX})"  # filled in per pod by Kubernetes
    return f'{{"cluster":{{"worker":{workers_json}}},"task":{{"type":"worker","index":{index}}}}}'


def trainjob(name: str = "labkit-multiworker", image: str = IMAGE, script: str = MWMS_SCRIPT,
             args: Sequence[str] = (), pods: Pods = Pods(), namespace: str | None = None,
             runtime: str = RUNTIME) -> Manifest:
    """A Kubeflow Trainer TrainJob running ``python script args`` on ``pods.workers`` MWMS workers (one per pod;
    ``pods.slots_per_worker`` is not used)."""
    workers, gpus_per_worker = pods.workers, pods.gpus_per_worker
    _check(name, image, script, workers=(workers, 1), gpus_per_worker=(gpus_per_worker, 0))
    env = _env(pods.cpu, 1, gpus_per_worker) + [
        {"name": contract.K8S_WORKER_INDEX, "valueFrom": {"fieldRef": {"fieldPath": INDEX_FIELD}}},
        {"name": "TF_CONFIG", "value": tf_config(name, workers)},  # after the index it refers to
    ]
    job = {"apiVersion": TRAINER_API, "kind": "TrainJob", "metadata": _metadata(name, namespace), "spec": {
        "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime", "name": runtime},
        "trainer": {"image": image, "command": ["python", script, *args], "numNodes": workers,
                    "resourcesPerNode": _resources(pods.cpu, pods.memory, gpus_per_worker), "env": env},
    }}
    validate(job)
    return job


def runtime(name: str = RUNTIME, image: str = IMAGE) -> Manifest:
    """The ClusterTrainingRuntime :func:`trainjob` refers to: one indexed Job of TensorFlow workers."""
    _check(name, image)
    env = [{"name": k, "value": v} for k, v in lkenv.DEFAULTS.items()]
    node = {"name": "node", "image": image, "workingDir": WORKDIR, "env": env,
            "ports": [{"name": "tf", "containerPort": TF_PORT}]}
    obj = {"apiVersion": TRAINER_API, "kind": "ClusterTrainingRuntime",
           "metadata": _metadata(name, None, **{"trainer.kubeflow.org/framework": "tensorflow"}), "spec": {
               "mlPolicy": {"numNodes": 1},  # no framework policy: plain ML, TF_CONFIG comes from the TrainJob
               "template": {"spec": {"network": {"enableDNSHostnames": True}, "replicatedJobs": [{
                   "name": "node", "replicas": 1, "template": {
                       "metadata": {"labels": {ANCESTOR: "trainer"}},
                       "spec": {"template": {"spec": {"containers": [node]}}}}}]}}}}
    validate(obj)
    return obj


def to_yaml(obj: Manifest) -> str:
    """The manifest as YAML, keys in the order they were built."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:  # a list used twice is written twice, not as &id001
            return True

    return yaml.dump(obj, Dumper=Dumper, sort_keys=False, width=1000, allow_unicode=True)


# ----------------------------------------------------------------------------- command line

_BUILDERS: dict[str, Callable[..., Manifest]] = {"mpijob": mpijob, "trainjob": trainjob, "runtime": runtime}
_NOTES = {
    "mpijob": "Needs the Kubeflow mpi-operator v0.8 (MPIJob kubeflow.org/v2beta1). The image is `labkit image "
    "build`'s: push it to a registry the cluster reads (docs/cloud.md).",
    "trainjob": f"Needs Kubeflow Trainer v2 and the runtime `labkit k8s runtime` writes ({RUNTIME}). The image is "
    "`labkit image build`'s: push it to a registry the cluster reads (docs/cloud.md).",
    "runtime": "Cluster-scoped, applied once by the administrator (Kubeflow Trainer v2 with JobSet).",
}
_OPTIONS = ("name", "namespace", "image", "workers", "slots_per_worker", "gpus_per_worker", "cpu", "memory", "runtime")


def render(a: argparse.Namespace) -> str:
    """The YAML ``labkit k8s`` prints for parsed arguments ``a``, headed by the command that makes it."""
    kw = {k: getattr(a, k) for k in _OPTIONS if getattr(a, k, None) is not None}
    command = list(getattr(a, "script_args", None) or [])
    command = command[1:] if command[:1] == ["--"] else command
    command = command[1:] if command[:1] in (["python"], ["python3"]) else command  # the script is enough
    if command:
        kw["script"], kw["args"] = command[0], tuple(command[1:])
    sized = {k: kw.pop(k) for k in [f.name for f in fields(Pods)] if k in kw}
    obj = _BUILDERS[a.k8s_kind](**kw, **({"pods": Pods(**sized)} if a.k8s_kind != "runtime" else {}))
    kw.update(sized)
    words = ["labkit", "k8s", a.k8s_kind]
    words += [w for k in _OPTIONS if k in kw for w in ("--" + k.replace("_", "-"), str(kw[k]))]
    words += ["-o", a.output] if a.output else []
    words += ["--", *command] if command else []
    header = f"# Generated by `{shlex.join(words)}`: regenerate it, do not edit it.\n# {_NOTES[a.k8s_kind]}\n"
    return header + to_yaml(obj)
