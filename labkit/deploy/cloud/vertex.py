"""Vertex AI: a CustomJob specification (``gcloud ai custom-jobs create --config FILE``).

Worker pools by position: 0 the chief (one replica), 1 the workers, 2 the parameter servers. Vertex AI
sets ``TF_CONFIG`` on every replica from the pools (task types ``chief``, ``worker``, ``ps``), which the
tf.distribute solutions read unchanged: their containers run the script itself. Horovod has no launcher
on Vertex AI: both pools run the bootstrap, which runs ``mpirun`` over the pools' hosts (``CLUSTER_SPEC``)
on pool 0 and the image's ssh server on pool 1 until the ranks have ended. Cloud Storage buckets are
mounted at ``/gcs/BUCKET``, so the scripts write checkpoints there with plain file I/O.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from labkit.deploy.cloud import bootstrap
from labkit.deploy.cloud.jobs import BUCKET_PLACEHOLDER, COST_PLACEHOLDER, SOLUTIONS, WORKDIR, Plan, SpecError, require
from labkit.deploy.cloud.jobs import tf_roles_errors as _roles

NAME = "Vertex AI CustomJob"
EXT = "yaml"
MACHINES = {"cpu": "n1-standard-8", "gpu": "n1-standard-8", "ps": "n1-standard-4"}
ACCELERATOR = "NVIDIA_TESLA_T4"
PRICE_PAGE = "https://cloud.google.com/vertex-ai/pricing (custom-trained models, training)"
ROLES = ("chief", "worker", "ps", "evaluator")  # what Vertex AI's TF_CONFIG calls pools 0..3
BOOTSTRAP = ["python", "-m", bootstrap.__name__]


def _machine(plan: Plan, ps: bool = False) -> dict[str, Any]:
    if ps:
        return {"machineType": plan.ps_machine or MACHINES["ps"]}
    spec: dict[str, Any] = {"machineType": plan.machine or MACHINES["gpu" if plan.gpus else "cpu"]}
    return {**spec, "acceleratorType": ACCELERATOR, "acceleratorCount": plan.gpus} if plan.gpus else spec


def _pool(plan: Plan, replicas: int, command: list[str], args: list[str], ps: bool = False) -> dict[str, Any]:
    return {"machineSpec": _machine(plan, ps), "replicaCount": replicas,
            "diskSpec": {"bootDiskType": "pd-ssd", "bootDiskSizeGb": 100},
            "containerSpec": {"imageUri": plan.image, "command": command, "args": args}}


def build(plan: Plan) -> dict[str, Any]:
    """The CustomJobSpec (camelCase, as ``gcloud --config`` reads it) for a resolved plan."""
    bucket = (plan.bucket or BUCKET_PLACEHOLDER).removeprefix("gs://").rstrip("/")
    out = f"/gcs/{bucket}/{plan.name}/{plan.kind.output_sub}"
    script = ["python", f"{WORKDIR}/{plan.kind.script}", *plan.script_args(out)]
    if plan.kind.launch == "mpi":
        lead = [*BOOTSTRAP, "--service", "vertex", "--solution", plan.solution,
                "--per-host", str(plan.procs_per_node), "--", *script]
        pools = [_pool(plan, 1, lead[:1], lead[1:])]  # the bootstrap: pool 0 runs mpirun, pool 1 serves ssh
        pools += [_pool(plan, plan.nodes - 1, lead[:1], lead[1:])] if plan.nodes > 1 else []
    else:
        workers = plan.nodes - 1
        pools = [_pool(plan, 1, script[:1], script[1:])]
        pools += [_pool(plan, workers, script[:1], script[1:])] if workers or plan.ps else []
        if plan.solution == "ps":
            pools.append(_pool(plan, plan.ps, script[:1], script[1:], ps=True))
    return {"workerPoolSpecs": pools, "baseOutputDirectory": {"outputUriPrefix": f"gs://{bucket}/{plan.name}"}}


def notes(plan: Plan) -> list[str]:
    machines = sorted({p["machineSpec"]["machineType"] for p in build(plan)["workerPoolSpecs"] if p})
    return [
        f"Submit: gcloud ai custom-jobs create --region=REGION --display-name={plan.name} --config=THIS_FILE",
        "Vertex AI sets TF_CONFIG from the pools (0 chief, 1 workers, 2 parameter servers); the script reads "
        "it unchanged." if plan.kind.launch == "tf" else
        f"Pool 0 runs mpirun over all {plan.nodes} machines x {plan.procs_per_node} rank(s); "
        "pool 1 serves ssh until the ranks end.",
        "Teardown: the job's machines are deleted when the job ends; stop a running job with "
        "`gcloud ai custom-jobs cancel JOB_ID --region=REGION`, and delete the bucket's folder when done.",
        COST_PLACEHOLDER.format(machines=", ".join(machines) + (f" + {ACCELERATOR}" if plan.gpus else ""),
                                page=PRICE_PAGE),
    ]


def render(plan: Plan, head: list[str]) -> tuple[dict[str, Any], str]:
    obj = build(plan)
    text = "".join(f"# {line}\n" for line in head + notes(plan))
    return obj, text + yaml.safe_dump(obj, sort_keys=False, width=1000)


def fields(obj: dict[str, Any]) -> list[str]:
    """What Vertex AI reads beyond the message's types: pool order and counts, the TF_CONFIG roles."""
    pools = obj.get("workerPoolSpecs") or []
    errors = [] if pools else ["workerPoolSpecs: at least the chief's pool (pool 0) is needed"]
    if len(pools) > 4:
        errors.append("workerPoolSpecs: at most 4 pools (chief, workers, parameter servers, evaluators)")
    if pools and require(pools, "0.replicaCount") != 1:
        errors.append(f"workerPoolSpecs[0].replicaCount: the chief's pool has exactly 1 replica, "
                      f"got {require(pools, '0.replicaCount')}")
    for i, pool in enumerate(pools):
        if pool and not require(pool, "containerSpec.imageUri"):
            errors.append(f"workerPoolSpecs[{i}].containerSpec.imageUri: the course image is needed")
        env = [e.get("name") for e in require(pool, "containerSpec.env") or []]
        if "TF_CONFIG" in env:
            errors.append(f"workerPoolSpecs[{i}].containerSpec.env: TF_CONFIG is set by Vertex AI from the pools")
    commands = [(require(p, "containerSpec.command") or []) + (require(p, "containerSpec.args") or []) for p in pools]
    counts = {ROLES[i]: (p or {}).get("replicaCount", 0) for i, p in enumerate(pools)}
    scripts = {c[1].rsplit("/", 1)[-1] for c in commands if len(c) > 1 and c[0] == "python" and c[1].endswith(".py")}
    for solution in SOLUTIONS.values():
        if solution.script in scripts and solution.launch == "tf":
            errors += _roles(solution, counts, "workerPoolSpecs")
    if commands and commands[0][:3] == BOOTSTRAP:
        args = commands[0]
        per_host = int(args[args.index("--per-host") + 1]) if "--per-host" in args else 1
        workers = counts.get("worker", 0)
        if any(c != commands[0] for c in commands[1:2]):
            errors.append("workerPoolSpecs[1].containerSpec: MPI workers run the same bootstrap as pool 0 "
                          "(it serves ssh on them)")
        if len(pools) > 2:
            errors.append("workerPoolSpecs: an MPI job has a chief pool and a worker pool only")
        gpus = {require(p, "machineSpec.acceleratorCount") or 0 for p in pools[:2]}
        if len(gpus) > 1:
            errors.append("workerPoolSpecs: the chief and the workers need the same GPUs (one rank per GPU)")
        elif gpus != {0} and gpus != {per_host}:
            errors.append(f"workerPoolSpecs[0].containerSpec.args: --per-host {per_host} ranks per machine, but "
                          f"each machine has {gpus.pop()} GPU(s): one rank per GPU")
        if "mpirun" in args:
            errors.append(f"workerPoolSpecs[0].containerSpec: the bootstrap runs mpirun itself "
                          f"({1 + workers} machines x {per_host} ranks)")
    return errors


def validate(obj: dict[str, Any]) -> Any:
    """Build the SDK's CustomJobSpec from ``obj`` (unknown fields and bad enums rejected), then check the
    fields Vertex AI reads; return the SDK object or raise :class:`SpecError`."""
    from google.cloud.aiplatform_v1.types import CustomJobSpec
    from google.protobuf.json_format import ParseError

    try:
        spec = CustomJobSpec.from_json(json.dumps(obj))
    except ParseError as e:
        raise SpecError(NAME, [f"google-cloud-aiplatform: {e}".replace("\n", " ")]) from None
    errors = fields(obj)
    if errors:
        raise SpecError(NAME, errors)
    return spec
