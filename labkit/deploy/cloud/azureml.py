"""Azure Machine Learning: a command job (``az ml job create --file FILE``, SDK v2 YAML).

Horovod: an MPI distribution; Azure ML starts ``process_count_per_instance`` ranks on each of
``instance_count`` machines itself, so the command is the script. MultiWorkerMirroredStrategy: a
TensorFlow distribution; Azure ML sets ``TF_CONFIG`` (workers only), which the script reads unchanged.
ParameterServerStrategy: a TensorFlow distribution with parameter servers; Azure ML's ``TF_CONFIG``
names no chief, so the bootstrap makes worker 0 the chief (the coordinator) before the script starts.
The machines are serverless compute of one instance type; lasting output goes to a folder of the
workspace's default datastore (or the datastore given as the bucket), mounted read-write.
"""

from __future__ import annotations

import io
from typing import Any

import yaml

from labkit.deploy.cloud import bootstrap
from labkit.deploy.cloud.jobs import COST_PLACEHOLDER, WORKDIR, Plan, SpecError, require

NAME = "Azure ML command job"
EXT = "yml"
SCHEMA = "https://azuremlschemas.azureedge.net/latest/commandJob.schema.json"
MACHINES = {"cpu": "Standard_D8s_v3", "gpu": "Standard_NC4as_T4_v3"}
DATASTORE = "workspaceblobstore"  # every workspace has it
PRICE_PAGE = "https://azure.microsoft.com/pricing/details/machine-learning/"
BOOTSTRAP = f"python -m {bootstrap.__name__}"


def _output_path(plan: Plan) -> str:
    bucket = plan.bucket or DATASTORE
    base = bucket.rstrip("/") if bucket.startswith("azureml://") else f"azureml://datastores/{bucket}"
    return f"{base}/paths/{plan.name}/{plan.kind.output_sub}"


def build(plan: Plan) -> dict[str, Any]:
    """The command job (as the YAML schema names its fields) for a resolved plan."""
    out = "${{outputs." + plan.kind.output_sub + "}}"
    script = " ".join(["python", f"{WORKDIR}/{plan.kind.script}", *plan.script_args(out)])
    instances = plan.nodes + (plan.ps if plan.solution == "ps" else 0)
    if plan.kind.launch == "mpi":
        distribution: dict[str, Any] = {"type": "mpi", "process_count_per_instance": plan.procs_per_node}
        command = script
    else:
        distribution = {"type": "tensorflow", "worker_count": plan.nodes}
        command = script
        if plan.solution == "ps":
            distribution["parameter_server_count"] = plan.ps
            command = f"{BOOTSTRAP} --service azureml --solution ps -- {script}"
    return {
        "$schema": SCHEMA, "type": "command", "display_name": plan.name, "experiment_name": "labkit",
        "command": command,
        "environment": {"image": plan.image},
        "resources": {"instance_count": instances,
                      "instance_type": plan.machine or MACHINES["gpu" if plan.gpus else "cpu"]},
        "distribution": distribution,
        "outputs": {plan.kind.output_sub: {"type": "uri_folder", "path": _output_path(plan), "mode": "rw_mount"}},
    }


def notes(plan: Plan) -> list[str]:
    obj = build(plan)
    kind = obj["distribution"]["type"]
    return [
        "Submit: az ml job create --file THIS_FILE --resource-group GROUP --workspace-name WORKSPACE",
        f"Serverless compute: {obj['resources']['instance_count']} x {obj['resources']['instance_type']}"
        + (" (the parameter servers too: one instance type per job)" if plan.solution == "ps" else ""),
        "Azure ML starts the MPI ranks itself." if kind == "mpi" else
        "Azure ML sets TF_CONFIG (workers" + (" and parameter servers; the bootstrap makes worker 0 the chief)"
                                              if plan.solution == "ps" else "); the script reads it unchanged)."),
        "Teardown: serverless machines are released when the job ends; stop a running job with "
        "`az ml job cancel --name JOB_NAME`; delete the output folder from the datastore when done.",
        COST_PLACEHOLDER.format(machines=obj["resources"]["instance_type"], page=PRICE_PAGE),
    ]


def render(plan: Plan, head: list[str]) -> tuple[dict[str, Any], str]:
    obj = build(plan)
    text = "".join(f"# {line}\n" for line in head + notes(plan))
    return obj, text + yaml.safe_dump(obj, sort_keys=False, width=1000)


def fields(obj: dict[str, Any]) -> list[str]:
    """What Azure ML reads for the distribution: counts that add up, who launches, TF_CONFIG's roles."""
    dist, command = obj.get("distribution") or {}, str(obj.get("command", ""))
    instances = require(obj, "resources.instance_count") or 1
    errors = [] if require(obj, "environment.image") else ["environment.image: the course image is needed"]
    if dist.get("type") == "mpi":
        per = dist.get("process_count_per_instance") or 1
        if command.split()[:1] in (["mpirun"], ["horovodrun"], ["mpiexec"]):
            errors.append(f"command: Azure ML starts the {instances} x {per} MPI ranks itself; give the script only")
    elif dist.get("type") == "tensorflow":
        workers, ps = dist.get("worker_count") or 0, dist.get("parameter_server_count") or 0
        if workers + ps != instances:
            errors.append(f"distribution: worker_count {workers} + parameter_server_count {ps} must equal "
                          f"resources.instance_count {instances} (one TF_CONFIG task per machine)")
        uses_ps = "fashion_mnist_ps_" in command
        if uses_ps and (ps < 1 or workers < 2):
            errors.append("distribution: ParameterServerStrategy needs parameter_server_count >= 1 and "
                          "worker_count >= 2 (worker 0 becomes the chief)")
        if uses_ps and not command.startswith(BOOTSTRAP):
            errors.append(f"command: Azure ML's TF_CONFIG has no chief; run the script through `{BOOTSTRAP}`")
        if not uses_ps and ps:
            errors.append("distribution.parameter_server_count: MultiWorkerMirroredStrategy takes no parameter servers")
    else:
        errors.append(f"distribution.type: mpi or tensorflow, got {dist.get('type')!r}")
    return errors


def validate(obj: dict[str, Any]) -> Any:
    """Load the file with the SDK's own loader (``azure.ai.ml.load_job``: its schema), then check the fields
    Azure ML reads; return the SDK's Command job or raise :class:`SpecError`."""
    from azure.ai.ml import load_job
    from azure.ai.ml.entities import Command

    try:
        job = load_job(source=io.StringIO(yaml.safe_dump(obj, sort_keys=False)))
    except Exception as e:  # noqa: BLE001 - the SDK raises several kinds, each with the field's message
        raise SpecError(NAME, [f"azure-ai-ml: {type(e).__name__}: {e}".replace("\n", " ")]) from None
    errors = [] if isinstance(job, Command) else [f"type: a command job is needed, got {type(job).__name__}"]
    errors += fields(obj)
    if errors:
        raise SpecError(NAME, errors)
    return job
