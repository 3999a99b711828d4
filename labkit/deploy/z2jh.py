"""A class's JupyterHub on Kubernetes: Helm values for Zero to JupyterHub's ``jupyterhub`` chart, checked offline.

Where there is no big machine for ``labkit workshop up``, a class runs on a Kubernetes cluster with the
``jupyterhub`` Helm chart (Zero to JupyterHub, KubeSpawner). :func:`values` builds the chart's values from
:class:`HubOptions` and reads nothing else: each learner's server is a pod running the course image, limited
and guaranteed ``cores`` and ``memory``, with a home volume of its own into which an init container releases
the course at the first start (:data:`FIRST_START`: never over what is there), the class folder on a
ReadWriteMany volume the instructor provides (each learner sees only their own folder of it), the check queue
per pod, the instructor as the hub's admin, and JupyterHub's settings that keep a learner from changing what
their server loads.

:func:`validate` checks a values file as Helm would, offline: the chart's default values merged with it, then
the chart's own ``values.schema.json`` of the pinned version (:data:`CHART_VERSION`, stored in
``k8s_schemas/jupyterhub/``; SOURCES.md there says where it came from), then the course's rules (:func:`rule_problems`),
which the schema cannot express. Nothing here talks to a cluster.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from labkit.core import contract
from labkit.core import slots as check_slots
from labkit.deploy.image import recipe

CHART = "jupyterhub"
CHART_REPO = "https://hub.jupyter.org/helm-chart/"
CHART_VERSION = "4.4.0"  # JupyterHub 5.5.0; Kubernetes >= 1.28
HUB_VERSION = "5.5.0"  # the hub's JupyterHub: the course image's jupyterhub-singleuser should match its major
# Package data (a wheel needs "k8s_schemas/jupyterhub/*.json" in pyproject's package-data to carry it)
SCHEMAS = resources.files("labkit.deploy") / "k8s_schemas" / "jupyterhub"
RELEASE = "labkit-hub"  # the Helm release's name in the instructor's commands
NAMESPACE = "labkit"

HOME = "/home/labkit"  # the course image's user (uid 1000) and home: the learner's volume is mounted there
UID = 1000
FS_GID = 100  # the chart's default: the volumes' group, so the image's user can write them
HOME_VOLUME = "volume-{user_server}"  # KubeSpawner's name of the learner's home volume (expanded per server)
CLASS_VOLUME = "labkit-class"
CLASS_DIR = "/srv/labkit-class"  # where a learner's server sees their own folder of the class volume
CLASS_ROOT = "/mnt/labkit-class"  # where the first-start container sees the whole class volume
QUEUE_DIR = "/tmp/labkit-check-queue"  # in the pod: the queue orders this learner's own checks
DEFAULT_URL = "/lab/tree/labs/00_start_here.ipynb"
USER_ENV_FORBIDDEN = ("PYTHONPATH", "PYTHONUSERBASE", "PYTHONSTARTUP", "JUPYTER_CONFIG_DIR", "JUPYTER_PATH")

USERNAME = re.compile(r"[a-z][a-z0-9._-]{0,31}")  # fullmatch: no trailing newline
SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT])i?B?\s*$", re.IGNORECASE)
MIN_MEMORY = 64 * 2**20
# A wildcard DNS name for per-learner subdomains (https://learner07.hub.example.org)
SUBDOMAIN_HOST = re.compile(r"https?://[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+(:[0-9]{1,5})?")

# Run with sh by the init container, as the learner's uid, before their server starts. KubeSpawner formats every
# string of an init container with the user's name ({username}), so this text holds no brace (a test checks).
FIRST_START = """\
set -eu
# The course, released at the first start of the learner's server into their home volume, and only when
# it is not there yet: whatever the learner has in ~/course (edited, moved, emptied) is never touched.
course="$HOME_DIR/course"
if [ -n "$CLASS_ROOT" ]; then
  mkdir -p "$CLASS_ROOT/$LEARNER_NAME"
fi
if [ -e "$course" ] || [ -L "$course" ]; then
  echo "labkit: $course is there already: left as it is"
  exit 0
fi
work=""
trap '[ -z "$work" ] || rm -rf "$work"' EXIT
work="$(mktemp -d "$HOME_DIR/.labkit-course.XXXXXX")"
labkit release --solutions graded "$work/course" >/dev/null
# A rename: a course cut short by a failure is never taken for the learner's.
mv -T "$work/course" "$course"
echo "labkit: the course released into $course"
"""

# Said in every README and by the command: what this way of holding a class does not close.
SOLUTIONS_IN_IMAGE = ("the course image holds the course source with its solutions (/opt/labkit/solutions): a "
                      "learner can read them in their own pod. `labkit workshop reveal` has no counterpart here; "
                      "for a graded class the image would need the release alone")
RECORDS_NAMED = ("every learner's pod runs as the image's user (labkit), so the class records in each learner's "
                 "folder of the class volume name `labkit`, not the learner: the folder's name (the hub's user name) "
                 "says whose they are; `labkit class status --from` does not read this layout yet")


class ValuesError(ValueError):
    """Values the chart or the course would not accept; ``errors`` holds one ``path: problem`` line each."""

    def __init__(self, what: str, errors: list[str]) -> None:
        super().__init__(f"{what} is not valid:\n" + "\n".join(f"  {e}" for e in errors))
        self.errors = errors


@dataclass(frozen=True)
class HubOptions:
    """What the instructor chooses for the class's hub (``labkit workshop k8s``'s options)."""

    image: str = recipe.default_tag()  # NAME:TAG in a registry the cluster pulls from
    cores: float = 2.0  # limit and guarantee per learner: a check's 2 ranks of 1 thread each have a core each
    memory: str = "4G"  # limit and guarantee per learner (K, M, G, T: powers of 1024, as KubeSpawner reads them)
    instructor: str = "instructor"  # the hub's admin
    class_pvc: str = "labkit-class"  # the ReadWriteMany PersistentVolumeClaim the instructor made for the class
    learners: int | None = None  # learner01 ... learnerNN may log in; None: any name with the class password
    subdomain_host: str = ""  # e.g. https://hub.example.org: each learner's server on a name of its own

    def check(self) -> None:
        """Raise ValueError naming the first option that is not valid."""
        image_parts(self.image)
        memory_bytes(self.memory)
        if isinstance(self.cores, bool) or not isinstance(self.cores, (int, float)) or not 0.01 <= self.cores <= 1024:
            raise ValueError(f"--cores {self.cores!r}: a number of cores from 0.01 to 1024, e.g. 2")
        if not isinstance(self.instructor, str) or not USERNAME.fullmatch(self.instructor):
            raise ValueError(f"--instructor {self.instructor!r}: a JupyterHub user name (lower-case letters, digits, "
                             "'.', '_' or '-', starting with a letter, at most 32)")
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", self.class_pvc):
            raise ValueError(f"--class-pvc {self.class_pvc!r}: the name of a PersistentVolumeClaim (lower-case "
                             "letters, digits, '-' and '.')")
        if self.learners is not None and not (isinstance(self.learners, int) and 1 <= self.learners <= 999):
            raise ValueError(f"--learners {self.learners!r}: a whole number from 1 to 999")
        if self.subdomain_host and not SUBDOMAIN_HOST.fullmatch(self.subdomain_host):
            raise ValueError(f"--subdomain-host {self.subdomain_host!r}: https://NAME with NAME a wildcard DNS name "
                             "(e.g. https://hub.example.org for https://learner07.hub.example.org)")

    @property
    def slots(self) -> int:
        """Check slots per pod: one per two cores, as ``workshop up`` gives a machine (at least one)."""
        return max(1, int(self.cores // 2))

    def learner_names(self) -> list[str]:
        """learner01 ... learnerNN (as ``workshop up`` names its accounts); empty without ``learners``."""
        width = max(2, len(str(self.learners or 0)))
        return [f"learner{i:0{width}d}" for i in range(1, (self.learners or 0) + 1)]


def image_parts(image: str) -> tuple[str, str]:
    """``(name, tag)`` of ``NAME:TAG`` (a registry's port is part of the name); ValueError without a tag."""
    name, colon, tag = str(image).strip().rpartition(":")
    if not colon or not name or not tag or "/" in tag or not re.fullmatch(r"[\w][\w.-]{0,127}", tag):
        raise ValueError(f"--image {image!r}: NAME:TAG, e.g. registry.example.org/course/labkit:"
                         f"{recipe.default_tag().rpartition(':')[2]} (the course image, pushed where the cluster "
                         "pulls from)")
    return name, tag


def memory_bytes(text: str) -> int:
    """Bytes of ``4G``, ``512M``, ``1.5G`` (K, M, G, T: powers of 1024); ValueError otherwise."""
    m = SIZE.match(str(text))
    if not m:
        raise ValueError(f"--memory {text!r}: a number with K, M, G or T, e.g. 4G")
    size = int(float(m.group(1)) * 1024 ** ("KMGT".index(m.group(2).upper()) + 1))
    if size < MIN_MEMORY:
        raise ValueError(f"--memory {text!r}: at least {MIN_MEMORY // 2**20}M")
    return size


def quantity(size: int) -> str:
    """``size`` bytes as KubeSpawner reads a memory size: the largest of K, M, G, T that divides it (``4G``)."""
    for power, unit in ((4, "T"), (3, "G"), (2, "M"), (1, "K")):
        if size % 1024**power == 0:
            return f"{size // 1024**power}{unit}"
    return str(size)


def _init_container(o: HubOptions) -> dict[str, Any]:
    """The first start: the course released into the home volume, the learner's class folder made."""
    env = {"HOME_DIR": HOME, "CLASS_ROOT": CLASS_ROOT, "LEARNER_NAME": "{username}"}  # expanded by KubeSpawner
    return {
        "name": "labkit-course",
        "image": o.image,
        "command": ["sh", "-c", FIRST_START],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "securityContext": {"runAsUser": UID, "allowPrivilegeEscalation": False},
        "volumeMounts": [{"name": HOME_VOLUME, "mountPath": HOME}, {"name": CLASS_VOLUME, "mountPath": CLASS_ROOT}],
    }


def _hub_config(o: HubOptions) -> dict[str, Any]:
    auth: dict[str, Any] = {"admin_users": [o.instructor]}
    if o.learners:
        auth["allowed_users"] = o.learner_names()
    else:
        auth["allow_all"] = True  # anyone holding the class password, under any name
    hub = {"authenticator_class": "shared-password", **({"subdomain_host": o.subdomain_host}
                                                         if o.subdomain_host else {})}
    spawner = {"disable_user_config": True,  # no configuration, extensions or kernels from the learner's home
               "notebook_dir": f"{HOME}/course"}
    return {"JupyterHub": hub, "Authenticator": auth, "KubeSpawner": spawner}


def values(o: HubOptions) -> dict[str, Any]:
    """The chart's values for the class (no secret: the passwords go in :func:`secret_values`)."""
    o.check()
    name, tag = image_parts(o.image)
    memory = quantity(memory_bytes(o.memory))
    env = {
        check_slots.SLOTS_VAR: str(o.slots),
        check_slots.QUEUE_VAR: QUEUE_DIR,  # per pod: each learner's pod has its own cores
        contract.CLASS_DIR: CLASS_DIR,
        "PYTHONNOUSERSITE": "1",  # no ~/.local site-packages or usercustomize in the learner's server
    }
    return {
        "hub": {"config": _hub_config(o)},
        "singleuser": {
            "image": {"name": name, "tag": tag},
            "uid": UID,
            "fsGid": FS_GID,
            "cmd": "jupyterhub-singleuser",
            "defaultUrl": DEFAULT_URL,
            "cpu": {"limit": float(o.cores), "guarantee": float(o.cores)},
            "memory": {"limit": memory, "guarantee": memory},
            "extraEnv": env,
            "initContainers": [_init_container(o)],
            "storage": {
                "type": "dynamic",
                "homeMountPath": HOME,
                "dynamic": {"volumeNameTemplate": HOME_VOLUME},  # the name the init container mounts
                "extraVolumes": [{"name": CLASS_VOLUME, "persistentVolumeClaim": {"claimName": o.class_pvc}}],
                # each learner sees their own folder of the class volume (the first start makes it)
                "extraVolumeMounts": [{"name": CLASS_VOLUME, "mountPath": CLASS_DIR, "subPath": "{username}"}],
            },
        },
    }


def secret_values(user_password: str, admin_password: str) -> dict[str, Any]:
    """The class's password and the instructor's (JupyterHub's SharedPasswordAuthenticator), for a separate file
    that stays with the instructor: 8+ characters for the class, 32+ for the instructor, not the same."""
    if len(user_password) < 8 or len(admin_password) < 32 or user_password == admin_password:
        raise ValueError("the class password needs 8+ characters, the instructor's 32+, and they must differ")
    return {"hub": {"config": {"SharedPasswordAuthenticator": {"user_password": user_password,
                                                               "admin_password": admin_password}}}}


# ----------------------------------------------------------------------------- validation


@cache
def schema() -> dict[str, Any]:
    """The chart's ``values.schema.json`` of :data:`CHART_VERSION`."""
    return json.loads((SCHEMAS / f"values.schema-{CHART_VERSION}.json").read_text())


@cache
def _defaults() -> str:
    return (SCHEMAS / f"values-{CHART_VERSION}.json").read_text()


def defaults() -> dict[str, Any]:
    """The chart's default values of :data:`CHART_VERSION` (a fresh copy each call)."""
    return json.loads(_defaults())


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on ``base`` as Helm merges values files: maps key by key, anything else replaced, None removes."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _path(parts: Iterable[Any]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f'["{p}"]' if re.search(r"[./]", str(p)) else f".{p}"
    return out.lstrip(".") or "(root)"


def _json_type(value: Any) -> str:
    """What YAML made of a value, in the schema's words (a quoted "2" is a string, 0.1 a number)."""
    kinds = ((bool, "a boolean"), (int, "a number"), (float, "a number"), (str, "a string"), (list, "an array"),
             (dict, "an object"))
    return "null" if value is None else next((k for t, k in kinds if isinstance(value, t)), type(value).__name__)


def _describe(e: Any) -> list[str]:
    where = list(e.absolute_path)
    if e.validator == "additionalProperties" and e.validator_value is False:
        known = set(e.schema.get("properties", {}))
        patterns = list(e.schema.get("patternProperties", {}))
        return [f"{_path([*where, k])}: unknown key (the chart {CHART_VERSION} has no such setting here)"
                for k in e.instance if k not in known and not any(re.search(p, k) for p in patterns)]
    if e.validator == "type":
        wanted = e.validator_value if isinstance(e.validator_value, list) else [e.validator_value]
        return [f"{_path(where)}: {e.instance!r} is {_json_type(e.instance)}; the chart wants "
                + " or ".join(str(w) for w in wanted)]
    return [f"{_path(where)}: {e.message}"]


def schema_problems(merged: dict[str, Any]) -> list[str]:
    """What the chart's schema says of values already merged with the chart's defaults (empty: valid)."""
    import jsonschema

    found = jsonschema.Draft7Validator(schema()).iter_errors(merged)
    return [line for e in sorted(found, key=lambda e: _path(e.absolute_path)) for line in _describe(e)]


def _env_names(env: Any) -> dict[str, Any]:
    if isinstance(env, dict):
        return {k: v.get("value") if isinstance(v, dict) else v for k, v in env.items()}
    return {e.get("name"): e.get("value") for e in env or [] if isinstance(e, dict)}


def rule_problems(merged: dict[str, Any]) -> list[str]:
    """The course's rules for a class's hub, on merged values: what the schema accepts but the class must not have."""
    problems = []
    config = (merged.get("hub") or {}).get("config") or {}
    user_config = [(config.get(c) or {}).get("disable_user_config") for c in ("KubeSpawner", "Spawner")]
    if True not in user_config or False in user_config:
        problems.append("hub.config.KubeSpawner.disable_user_config: must be true (learners must not change what "
                        "their server loads from their home)")
    if (config.get("JupyterHub") or {}).get("authenticator_class", "dummy") == "dummy":
        problems.append("hub.config.JupyterHub.authenticator_class: the chart's default (dummy) lets anyone log in "
                        "as anyone, the instructor included; use shared-password or a real login")
    if (config.get("JupyterHub") or {}).get("authenticator_class") == "shared-password":
        given = config.get("SharedPasswordAuthenticator") or {}
        problems += [f"hub.config.SharedPasswordAuthenticator.{k}: missing (give secrets.yaml too)"
                     for k in ("user_password", "admin_password") if not given.get(k)]
    if not (config.get("Authenticator") or {}).get("admin_users"):
        problems.append("hub.config.Authenticator.admin_users: name the instructor (the hub's admin)")
    single = merged.get("singleuser") or {}
    env = _env_names(single.get("extraEnv"))
    problems += [f"singleuser.extraEnv.{k}: must not be set (it changes what the learner's server loads)"
                 for k in USER_ENV_FORBIDDEN if k in env]
    if str(env.get("PYTHONNOUSERSITE", "")) != "1":
        problems.append("singleuser.extraEnv.PYTHONNOUSERSITE: must be \"1\" (no site-packages from the learner's "
                        "home in their server)")
    for what in ("cpu", "memory"):
        if (single.get(what) or {}).get("limit") is None:
            problems.append(f"singleuser.{what}.limit: set a limit per learner (one learner's job must not take "
                            "the node)")
    return problems


def validate(*documents: dict[str, Any], what: str = "the values") -> dict[str, Any]:
    """The chart's defaults merged with ``documents`` in order (``helm --values A --values B``), checked against
    the chart's schema, then the course's rules; returns the merged values, raises :class:`ValuesError`."""
    merged = defaults()
    for i, doc in enumerate(documents):
        if not isinstance(doc, dict):
            raise ValuesError(what, [f"(root): a mapping is needed, got {type(doc).__name__} (document {i + 1})"])
        merged = merge(merged, doc)
    problems = schema_problems(merged)
    if problems:
        raise ValuesError(f"{what} (against the chart {CHART} {CHART_VERSION}'s schema)", problems)
    problems = rule_problems(merged)
    if problems:
        raise ValuesError(f"{what} (against the course's rules for a class's hub)", problems)
    return merged


# ----------------------------------------------------------------------------- text
