"""Offline validation of the Kubernetes manifests :mod:`labkit.deploy.k8s` writes.

Each manifest is checked against its CRD schema stored in the package, ``labkit/deploy/k8s_schemas``
(SOURCES.md there says where each came from; read through :mod:`importlib.resources`, so an installed
wheel carries them), unknown fields rejected as ``kubectl --validate=strict`` does, then against what the schemas
leave to the operators: names, replica counts, the TF_CONFIG worker list.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from functools import cache
from importlib import resources
from typing import Any

TF_PORT = 2222
TRAINER_API = "trainer.kubeflow.org/v1alpha1"
SCHEMA_DIR = resources.files("labkit.deploy") / "k8s_schemas"  # package data: in the wheel too
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # RFC 1035 label: pod and service names
Manifest = dict[str, Any]


class ManifestError(ValueError):
    """A manifest is not valid; ``errors`` holds one ``path: problem`` line each."""

    def __init__(self, what: str, errors: list[str]) -> None:
        super().__init__(f"{what} is not valid:\n" + "\n".join(f"  {e}" for e in errors))
        self.errors = errors


def _path(parts: Sequence[Any]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f'["{p}"]' if re.search(r"[./]", str(p)) else f".{p}"
    return out.lstrip(".") or "(root)"


def _closed(s: Any) -> Any:
    """The schema with unknown fields rejected wherever it lists the fields."""
    if not isinstance(s, dict):
        return s
    s = {k: [_closed(x) for x in v] if k in ("allOf", "anyOf", "oneOf") else v for k, v in s.items()}
    for key in ("items", "additionalProperties", "not"):
        if isinstance(s.get(key), dict):
            s[key] = _closed(s[key])
    if "properties" in s:
        s["properties"] = {k: _closed(v) for k, v in s["properties"].items()}
        if "additionalProperties" not in s and not s.get("x-kubernetes-preserve-unknown-fields"):
            s["additionalProperties"] = False
    return s


@cache
def schema(api_version: str, kind: str) -> dict[str, Any]:
    """The stored schema of ``kind`` (``k8s_schemas/<group>_<version>_<kind>.json``), unknown fields closed."""
    group, _, version = api_version.rpartition("/")
    path = SCHEMA_DIR / f"{group}_{version}_{kind.lower()}.json"
    if not path.is_file():
        raise ManifestError(f"{kind} ({api_version})", [f"apiVersion/kind: no stored schema {path}"])
    return _closed(json.loads(path.read_text()))


def _describe(e: Any) -> list[str]:
    where = list(e.absolute_path)
    if e.validator == "required":
        return [f"{_path([*where, k])}: required field is missing" for k in e.validator_value if k not in e.instance]
    if e.validator == "additionalProperties" and e.validator_value is False:
        known = e.schema.get("properties", {})
        return [f"{_path([*where, k])}: unknown field" for k in e.instance if k not in known]
    return [f"{_path(where)}: {e.message}"]


def _count(value: Any, path: str, low: int = 1, high: int | None = None) -> list[str]:
    if value is None or low <= value and (high is None or value <= high):
        return []
    return [f"{path}: must be {low if high == low else f'>= {low}'}, got {value}"]


def _name(obj: Manifest, longest: Callable[[str], str] = str) -> list[str]:
    name = (obj.get("metadata") or {}).get("name")
    if not isinstance(name, str):
        return ["metadata.name: required field is missing"]
    if not LABEL.match(name) or len(longest(name)) > 63:
        return [f"metadata.name: {name!r} (and pod name {longest(name)!r}) must be an RFC 1035 label: "
                "lower-case letters, digits and '-', starting with a letter, at most 63 characters"]
    return []


def _containers(template: Any, path: str) -> list[str]:
    containers = (((template or {}).get("spec") or {}).get("containers")) or []
    errors = [] if containers else [f"{path}.spec.containers: at least one container is needed"]
    return errors + [f"{path}.spec.containers[{i}].image: must not be empty"
                     for i, c in enumerate(containers) if not str(c.get("image", "")).strip()]


def _check_mpijob(obj: Manifest) -> list[str]:
    spec = obj.get("spec", {})
    specs = spec.get("mpiReplicaSpecs", {})
    workers = (specs.get("Worker") or {}).get("replicas") or 1
    errors = _name(obj, lambda n: f"{n}-worker-{workers - 1}")
    errors += [f"spec.mpiReplicaSpecs.{k}: unknown replica type (Launcher or Worker)" for k in specs
               if k not in ("Launcher", "Worker")]
    for role, high in (("Launcher", 1), ("Worker", None)):
        path, rs = f"spec.mpiReplicaSpecs.{role}", specs.get(role)
        if rs is None:
            errors.append(f"{path}: required replica spec is missing")
            continue
        errors += _count(rs.get("replicas"), f"{path}.replicas", 1, high)
        errors += _containers(rs.get("template"), f"{path}.template")
        if rs.get("restartPolicy", "Never") not in ("Never", "OnFailure"):
            errors.append(f"{path}.restartPolicy: must be Never or OnFailure, got {rs['restartPolicy']!r}")
    if spec.get("runPolicy", {}).get("cleanPodPolicy", "None") not in ("None", "Running", "All"):
        errors.append("spec.runPolicy.cleanPodPolicy: must be None, Running or All")
    return errors + _count(spec.get("slotsPerWorker"), "spec.slotsPerWorker")


def _check_trainjob(obj: Manifest) -> list[str]:
    trainer = obj.get("spec", {}).get("trainer") or {}
    nodes = trainer.get("numNodes")
    errors = _name(obj, lambda n: f"{n}-node-0-{max(1, nodes or 1) - 1}") + _count(nodes, "spec.trainer.numNodes")
    if "image" in trainer and not trainer["image"].strip():
        errors.append("spec.trainer.image: must not be empty")
    for i, var in enumerate(trainer.get("env") or []):
        if var.get("name") == "TF_CONFIG" and "value" in var:
            try:
                hosts = json.loads(re.sub(r"\$\(\w+\)", "0", var["value"]))["cluster"]["worker"]
            except (ValueError, KeyError, TypeError):
                errors.append(f"spec.trainer.env[{i}].value: TF_CONFIG is not JSON with cluster.worker")
                continue
            name = obj.get("metadata", {}).get("name")
            if nodes is not None and hosts != [f"{name}-node-0-{j}.{name}:{TF_PORT}" for j in range(nodes)]:
                errors.append(f"spec.trainer.env[{i}].value: TF_CONFIG lists {hosts}, not the {nodes} pods of {name}")
    return errors


def _check_runtime(obj: Manifest) -> list[str]:
    """Trainer's rules: a job labelled as the trainer step, one replica, with a container named ``node``."""
    spec, path = obj.get("spec", {}), "spec.template.spec.replicatedJobs"
    errors = _name(obj) + _count(spec.get("mlPolicy", {}).get("numNodes"), "spec.mlPolicy.numNodes")
    trainers = []
    for i, job in enumerate((spec.get("template", {}).get("spec") or {}).get("replicatedJobs") or []):
        step = ((job.get("template", {}).get("metadata") or {}).get("labels") or {}).get(ANCESTOR)
        errors += _count(job.get("replicas"), f"{path}[{i}].replicas", 1, 1 if step else None)
        if step == "trainer":
            trainers.append(i)
            pod = job["template"].get("spec", {}).get("template", {}).get("spec", {})
            if "node" not in [c.get("name") for c in pod.get("containers", [])]:
                errors.append(f"{path}[{i}].template.spec.template.spec.containers: the trainer needs one named 'node'")
    if len(trainers) != 1:
        errors.append(f"{path}: one job labelled {ANCESTOR}=trainer is needed, found {len(trainers)}")
    return errors


_CHECKS: dict[tuple[str, str], Callable[[Manifest], list[str]]] = {
    ("kubeflow.org/v2beta1", "MPIJob"): _check_mpijob,
    (TRAINER_API, "TrainJob"): _check_trainjob,
    (TRAINER_API, "ClusterTrainingRuntime"): _check_runtime,
}


def validate(obj: Manifest) -> None:
    """Raise :class:`ManifestError` (a ValueError naming each bad field's path) unless ``obj`` is valid."""
    import jsonschema

    if not isinstance(obj, dict):
        raise ManifestError("manifest", [f"(root): a mapping is needed, got {type(obj).__name__}"])
    key = (obj.get("apiVersion"), obj.get("kind"))
    what = f"{key[1]} {(obj.get('metadata') or {}).get('name')!r}"
    if key not in _CHECKS:
        raise ManifestError(what, [f"apiVersion/kind: {key[0]}/{key[1]} is none of "
                                   + ", ".join(f"{a}/{k}" for a, k in _CHECKS)])
    found = sorted(jsonschema.Draft4Validator(schema(*key)).iter_errors(obj), key=lambda e: _path(e.absolute_path))
    errors = [line for e in found for line in _describe(e)] or _CHECKS[key](obj)
    if errors:
        raise ManifestError(what, errors)
