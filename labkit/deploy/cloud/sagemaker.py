"""Amazon SageMaker: a training job request (``aws sagemaker create-training-job --cli-input-yaml file://FILE``).

The custom-image path: AWS's TensorFlow training containers no longer ship Horovod, and their
``distribution=`` settings (``mpi``, ``multi_worker_mirrored_strategy``, ``parameter_server``) are read
by the toolkit inside those containers only. SageMaker starts the course image on every machine
(``ResourceConfig.InstanceCount``) with ``ContainerEntrypoint`` and ``ContainerArguments``: the bootstrap
reads the machines' list (``/opt/ml/input/config/resourceconfig.json``), then runs ``mpirun`` from the
first machine (Horovod) or sets ``TF_CONFIG`` (tf.distribute), so the distribution setting is in the
bootstrap's arguments. ``/opt/ml/checkpoints`` is copied to the bucket (``CheckpointConfig``).
"""

from __future__ import annotations

from typing import Any

import yaml

from labkit.deploy.cloud import bootstrap
from labkit.deploy.cloud.jobs import BUCKET_PLACEHOLDER, COST_PLACEHOLDER, WORKDIR, Plan, SpecError, require

NAME = "SageMaker training job"
EXT = "yaml"
MACHINES = {0: "ml.m5.2xlarge", 1: "ml.g4dn.xlarge", 4: "ml.g4dn.12xlarge", 8: "ml.p3.16xlarge"}
CHECKPOINTS = "/opt/ml/checkpoints"
ROLE = "arn:aws:iam::ACCOUNT_ID:role/REPLACE-WITH-YOUR-SAGEMAKER-ROLE"
PRICE_PAGE = "https://aws.amazon.com/sagemaker/pricing/ (training, on-demand)"
ENTRYPOINT = ["python", "-m", bootstrap.__name__]
SHAPES = ("AlgorithmSpecification", "ResourceConfig", "OutputDataConfig", "CheckpointConfig", "StoppingCondition")


def machine(plan: Plan) -> str:
    if plan.machine:
        return plan.machine
    if plan.gpus not in MACHINES:
        raise SpecError(NAME, [f"gpus: no default instance type with {plan.gpus} GPUs; give --machine"])
    return MACHINES[plan.gpus]


def gpus_of(instance_type: str | None) -> int:
    """GPUs of an instance type, from the SDK's table (0 when unknown or the SDK is not installed)."""
    try:
        from sagemaker.core import instance_types_gpu_info
    except ImportError:
        return 0
    return (instance_types_gpu_info.retrieve("us-east-1").get(instance_type or "") or {}).get("Count", 0)


def build(plan: Plan) -> dict[str, Any]:
    """The CreateTrainingJob request (PascalCase, as the API and ``--cli-input-yaml`` read it)."""
    bucket = f"s3://{(plan.bucket or BUCKET_PLACEHOLDER).removeprefix('s3://').rstrip('/')}/{plan.name}"
    script = ["python", f"{WORKDIR}/{plan.kind.script}", *plan.script_args(f"{CHECKPOINTS}/{plan.kind.output_sub}")]
    args = ["--service", "sagemaker", "--solution", plan.solution]
    args += ["--per-host", str(plan.procs_per_node)] if plan.kind.launch == "mpi" else []
    args += ["--ps", str(plan.ps)] if plan.solution == "ps" else []
    instances = plan.nodes + (plan.ps if plan.solution == "ps" else 0)
    return {
        "TrainingJobName": plan.name,
        "RoleArn": ROLE,
        "AlgorithmSpecification": {"TrainingImage": plan.image, "TrainingInputMode": "File",
                                   "ContainerEntrypoint": ENTRYPOINT, "ContainerArguments": [*args, "--", *script]},
        "ResourceConfig": {"InstanceType": machine(plan), "InstanceCount": instances, "VolumeSizeInGB": 50},
        "OutputDataConfig": {"S3OutputPath": f"{bucket}/output"},
        "CheckpointConfig": {"S3Uri": f"{bucket}/{plan.kind.output_sub}", "LocalPath": CHECKPOINTS},
        "StoppingCondition": {"MaxRuntimeInSeconds": 4 * 3600},
        "EnableInterContainerTrafficEncryption": False,
        "Tags": [{"Key": "labkit-solution", "Value": plan.solution}],
    }


def notes(plan: Plan) -> list[str]:
    obj = build(plan)
    rc = obj["ResourceConfig"]
    return [
        "Submit: aws sagemaker create-training-job --cli-input-yaml file://THIS_FILE (AWS CLI v2; replace RoleArn's "
        "account and role, push the image to ECR; TrainingJobName must be new in the account and region).",
        f"{rc['InstanceCount']} x {rc['InstanceType']}; the bootstrap runs the distribution: "
        + ("mpirun from the first machine." if plan.kind.launch == "mpi" else "TF_CONFIG from the machines' list."),
        "AWS's TensorFlow training containers ship no Horovod: this job uses the course image (custom-image path).",
        "Teardown: the machines are released when the job ends or hits StoppingCondition; stop it with "
        "`aws sagemaker stop-training-job --training-job-name NAME`; delete the S3 prefix when done.",
        COST_PLACEHOLDER.format(machines=rc["InstanceType"], page=PRICE_PAGE),
    ]


def render(plan: Plan, head: list[str]) -> tuple[dict[str, Any], str]:
    obj = build(plan)
    text = "".join(f"# {line}\n" for line in head + notes(plan))
    return obj, text + yaml.safe_dump(obj, sort_keys=False, width=1000)


def _snake(obj: Any) -> Any:
    from sagemaker.core.utils.utils import pascal_to_snake

    if isinstance(obj, dict):
        return {pascal_to_snake(k): _snake(v) for k, v in obj.items()}
    return [_snake(v) for v in obj] if isinstance(obj, list) else obj


def fields(obj: dict[str, Any]) -> list[str]:
    """What the job needs beyond the API's types: the bootstrap, ranks per GPU, roles that add up."""
    algo = obj.get("AlgorithmSpecification") or {}
    args = algo.get("ContainerArguments") or []
    instances = require(obj, "ResourceConfig.InstanceCount") or 1
    errors = [] if algo.get("TrainingImage") else ["AlgorithmSpecification.TrainingImage: the course image is needed"]
    if algo.get("ContainerEntrypoint") != ENTRYPOINT or args[:2] != ["--service", "sagemaker"]:
        errors.append(f"AlgorithmSpecification: SageMaker sets no TF_CONFIG and runs no MPI launcher; the entrypoint "
                      f"must be {' '.join(ENTRYPOINT)} with --service sagemaker")
        return errors

    own = args[:args.index("--")] if "--" in args else args  # the bootstrap's options, not the script's

    def opt(name: str, default: int) -> int:
        return int(own[own.index(name) + 1]) if name in own else default

    gpus = gpus_of(require(obj, "ResourceConfig.InstanceType"))
    solution = own[own.index("--solution") + 1] if "--solution" in own else ""
    if solution == "horovod" and gpus and opt("--per-host", 1) != gpus:
        errors.append(f"AlgorithmSpecification.ContainerArguments: --per-host {opt('--per-host', 1)} ranks per "
                      f"machine, but {require(obj, 'ResourceConfig.InstanceType')} has {gpus} GPU(s): one rank per GPU")
    if solution == "ps" and instances - opt("--ps", 1) < 2:
        errors.append(f"ResourceConfig.InstanceCount: {instances} machines leave no worker beside the chief and "
                      f"{opt('--ps', 1)} parameter server(s)")
    if obj.get("EnableInterContainerTrafficEncryption"):
        errors.append("EnableInterContainerTrafficEncryption: slows MPI and gRPC traffic between the machines; "
                      "keep it off")
    local = require(obj, "CheckpointConfig.LocalPath")
    if local and not any(str(a).startswith(local) for a in args):
        errors.append(f"CheckpointConfig.LocalPath: {local} is copied to S3, but the script writes nowhere under it")
    return errors


def validate(obj: dict[str, Any]) -> Any:
    """Check the request against the SageMaker API's model (botocore's CreateTrainingJob shape), build the SDK's
    shapes (``sagemaker.core.shapes``) from it, then check the fields the job reads; return the shapes."""
    import botocore.session
    import botocore.validate
    import pydantic
    from sagemaker.core import shapes

    model = botocore.session.get_session().get_service_model("sagemaker").operation_model("CreateTrainingJob")
    report = botocore.validate.ParamValidator().validate(obj, model.input_shape)
    if report.has_errors():
        raise SpecError(NAME, [f"botocore: {line}" for line in report.generate_report().splitlines()])
    built = {}
    try:
        for key in SHAPES:
            if key in obj:
                built[key] = getattr(shapes, key)(**_snake(obj[key]))
    except pydantic.ValidationError as e:
        raise SpecError(NAME, [f"sagemaker: {key}: {err['loc']}: {err['msg']}" for err in e.errors()]) from None
    errors = fields(obj)
    if errors:
        raise SpecError(NAME, errors)
    return built

