"""The files ``labkit workshop k8s -o DIR`` writes for a class's Zero to JupyterHub: the values and secrets
(:mod:`labkit.deploy.z2jh` builds and validates them), the class volume's claim, the hub image's Containerfile and
the instructor's README with the steps to install and tear it down."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.core import contract
from labkit.core import slots as check_slots
from labkit.deploy.image import recipe
from labkit.deploy.z2jh import (
    CHART,
    CHART_REPO,
    CHART_VERSION,
    CLASS_DIR,
    FS_GID,
    HOME,
    HUB_VERSION,
    NAMESPACE,
    RECORDS_NAMED,
    RELEASE,
    SOLUTIONS_IN_IMAGE,
    UID,
    HubOptions,
    image_parts,
    memory_bytes,
    quantity,
    secret_values,
    validate,
    values,
)


def to_yaml(obj: Any) -> str:
    """``obj`` as YAML in the order built; text of several lines (the first-start script) as a block."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    def text(dumper: yaml.SafeDumper, data: str) -> Any:
        style = "|" if "\n" in data else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    Dumper.add_representer(str, text)
    return yaml.dump(obj, Dumper=Dumper, sort_keys=False, width=1000, allow_unicode=True)


def notes(o: HubOptions) -> list[str]:
    """What the values leave to the instructor or leave open, said in the README and by the command."""
    out = [SOLUTIONS_IN_IMAGE, RECORDS_NAMED]
    if o.image.startswith("localhost/"):
        out.append(f"the image {o.image} is a local podman name: push the course image to a registry the cluster "
                   "pulls from and give --image REGISTRY/PATH/labkit:TAG")
    if not o.subdomain_host:
        out.append("every learner's server is served from the hub's own address: a page a learner serves, opened "
                   "by the instructor, can act as the instructor on the hub. Do not open learners' pages "
                   "(/user/NAME/...) while logged in as the instructor, or give the hub a wildcard DNS name and "
                   "certificate and --subdomain-host")
    if not o.learners:
        out.append("any name may log in with the class password (no --learners list)")
    return out


def readme(o: HubOptions, files: Sequence[str] = ("values.yaml", "secrets.yaml")) -> str:
    """The instructor's steps: what to provide, install, check, tear down."""
    name, tag = image_parts(o.image)
    memory = quantity(memory_bytes(o.memory))
    values_args = " ".join(f"--values {f}" for f in files)
    host = o.subdomain_host.split("://", 1)[-1]
    wildcard = (f"4. **A wildcard DNS name and certificate** for `*.{host}`: each learner's server at "
                f"`NAME.{host}`, the hub at `{o.subdomain_host}`.\n" if o.subdomain_host else "")
    note_lines = "".join(f"* {n}\n" for n in notes(o)) or "* none\n"
    return f"""\
# The class's JupyterHub on Kubernetes (Zero to JupyterHub {CHART_VERSION})

Written by `labkit workshop k8s`. `values.yaml` holds the class's hub for the `{CHART}` Helm chart, version
{CHART_VERSION} (JupyterHub {HUB_VERSION}); `secrets.yaml` the class's password and the instructor's
(keep it to yourself, never in a repository). Both were checked offline against the chart's own values
schema; nothing was deployed.

## What the class gets

* A server per learner running `{name}:{tag}`, limited and guaranteed {o.cores:g} cores and {memory}
  (a check runs 2 ranks of about 0.74 GB each).
* The course released into the learner's home volume (`{HOME}/course`) at the first start of their server, by the
  init container `labkit-course`, only when it is not there yet: a learner's files are never overwritten.
* The class folder: each learner's own folder of the ReadWriteMany claim `{o.class_pvc}`, at `{CLASS_DIR}`
  (`{contract.CLASS_DIR}`), where their checks append their records.
* Checks take a slot of a queue in the learner's own pod (`{check_slots.SLOTS_VAR}={o.slots}`): on Kubernetes each
  pod has its own cores, so the queue orders one learner's checks, not the class's.
* `{o.instructor}` is the hub's admin; users cannot load configuration or extensions from their home
  (`disable_user_config`, `PYTHONNOUSERSITE=1`).

## What you must provide

1. **The image in a registry the cluster pulls from**, with JupyterHub's single-user server in it: `labkit image
   build` makes the course image without JupyterHub; `Containerfile.hub` here adds it (the hub's version):

   ```bash
   podman build -t REGISTRY/PATH/labkit:TAG -f Containerfile.hub . && podman push REGISTRY/PATH/labkit:TAG
   labkit workshop k8s -o DIR --force --image REGISTRY/PATH/labkit:TAG ...   # these files again, for that image
   ```
2. **A ReadWriteMany claim for the class folder**, `{o.class_pvc}` in the namespace `{NAMESPACE}`:
   `class-pvc.yaml` here, with `storageClassName` set to a storage class of the cluster that offers
   ReadWriteMany (NFS, CephFS, Azure Files, Filestore, EFS ...), its root writable by uid {UID} or group {FS_GID}.
3. A default storage class for the learners' home volumes (ReadWriteOnce, 10Gi each), and HTTPS in front of the
   hub (the chart's `proxy.https`, or an ingress).
{wildcard}
## Install

```bash
labkit workshop k8s --check values.yaml secrets.yaml      # offline, against the chart {CHART_VERSION}'s schema
helm repo add jupyterhub {CHART_REPO}
helm repo update
kubectl create namespace {NAMESPACE}
kubectl apply -f class-pvc.yaml                              # the claim above
helm upgrade --install {RELEASE} {CHART}/{CHART} --namespace {NAMESPACE} --version {CHART_VERSION} {values_args}
kubectl --namespace {NAMESPACE} get service proxy-public      # the hub's address
```

Log in as `{o.instructor}` with the instructor's password of `secrets.yaml`; learners use the class password.
A learner's server that does not start: `kubectl --namespace {NAMESPACE} logs jupyter-NAME -c labkit-course` (the
first start) and `kubectl --namespace {NAMESPACE} describe pod jupyter-NAME`.

## Tear down

```bash
helm uninstall {RELEASE} --namespace {NAMESPACE}
kubectl --namespace {NAMESPACE} delete pvc -l component=singleuser-storage   # the learners' homes: their work
kubectl --namespace {NAMESPACE} delete pvc {o.class_pvc}                     # the class records (copy them first)
kubectl delete namespace {NAMESPACE}
```

`helm uninstall` keeps the learners' home volumes and the class claim: delete them only when their work and the
records are saved.

## Left open

{note_lines}"""


def class_pvc(o: HubOptions) -> dict[str, Any]:
    """The class folder's claim, as the README shows it, for the instructor to complete (its storage class)."""
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": o.class_pvc, "namespace": NAMESPACE},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "YOUR-RWX-CLASS",
                     "resources": {"requests": {"storage": "1Gi"}}}}


def containerfile(o: HubOptions) -> str:
    """The course image with JupyterHub's single-user server added (``labkit image build`` leaves it out)."""
    return (f"# The course image (`labkit image build`) with JupyterHub's single-user server, for the class's hub.\n"
            f"FROM {recipe.default_tag()}\n"
            f"RUN {recipe.ROOT}/.venv/bin/pip install --no-cache-dir jupyterhub=={HUB_VERSION}\n")


@dataclass(frozen=True)
class Written:
    """The files :func:`write` made, in the order the README names them."""

    folder: Path
    files: tuple[Path, ...]
    notes: tuple[str, ...]


def write(o: HubOptions, folder: Path, force: bool = False, passwords: tuple[str, str] | None = None) -> Written:
    """Write the class's hub into ``folder``: values.yaml, secrets.yaml (``rw-------``), class-pvc.yaml,
    Containerfile.hub and README.md, each checked first. A folder holding anything is refused unless ``force``."""
    import secrets as random

    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise FileExistsError(f"{folder} is not a folder")
    if folder.is_dir() and any(folder.iterdir()) and not force:
        raise FileExistsError(f"{folder} is not empty: give an empty folder, or --force to write over its files")
    user_pw, admin_pw = passwords or (random.token_urlsafe(9), random.token_urlsafe(32))
    hub, secret = values(o), secret_values(user_pw, admin_pw)
    validate(hub, secret, what="the written values")
    texts = {
        "values.yaml": f"# labkit workshop k8s: values of the `{CHART}` chart {CHART_VERSION} (README.md)\n"
                       + to_yaml(hub),
        "secrets.yaml": "# The class's password and the instructor's: keep this file to yourself.\n" + to_yaml(secret),
        "class-pvc.yaml": "# The class folder's claim: set storageClassName to a ReadWriteMany class.\n"
                          + to_yaml(class_pvc(o)),
        "Containerfile.hub": containerfile(o),
        "README.md": readme(o),
    }
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in texts.items():
        path = folder / name
        if name == "secrets.yaml":
            path.unlink(missing_ok=True)
            path.touch(mode=0o600)
        path.write_text(text)
        written.append(path)
    return Written(folder, tuple(written), tuple(notes(o)))
