"""What a running workshop is made of, kept in its state folder (``$LABKIT_WORKSHOP_STATE``, default
``/var/lib/labkit-workshop``, which outlives a reboot) so that ``labkit workshop down`` removes exactly what
``up`` made, also after the machine restarted (accounts, homes, permission changes).

The folder (root's, ``rwx--x--x``) holds ``state.json`` (no secret in it) and ``hub/`` (``rwx------``: the
hub's configuration, database, cookie secret, log and the learners' password hashes), plus four folders learners
reach: ``release/`` (the released course and its ``labkit``, root's and read-only, which each learner's own child
copies into their home and their server imports; it holds no solutions), ``revealed/`` (the step solutions the
instructor revealed to the class, ``labkit workshop reveal``, root's and read-only), ``data/`` (the read-only data
set) and ``class/`` (the class records and the record of reveals, ``rwxr-x--x``, root's and the instructors'
group's).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from labkit.core import contract, files
from labkit.workshop.started import Started

DEFAULT_STATE = Path("/var/lib/labkit-workshop")


def state_folder(folder: str | os.PathLike[str] | None = None) -> Path:
    return Path(folder or os.environ.get(contract.WORKSHOP_STATE) or DEFAULT_STATE)


@dataclass
class State:
    folder: Path
    learners: list[str] = field(default_factory=list)
    instructor: str = "instructor"
    port: int = 0
    ip: str = "127.0.0.1"
    auth: str = "hub"  # the hub's own password store (hubauth), or "shared"
    slurm: bool = False  # learners' jobs go to Slurm on the virtual nodes
    spawner: str = "local"  # "slurm": the learners' servers themselves are Slurm jobs (hubconfig.SPAWNERS)
    job_id: str = ""
    hub: Started | None = None  # the hub process: signalled only while it is still this one
    phase: str = "starting"  # starting, up
    seconds_up: float | None = None
    problems: list[str] = field(default_factory=list)  # what works less than asked (e.g. no limits)
    made: dict = field(default_factory=dict)  # folder: bool, users: [...], groups: [...], cgroups: [...], nodes: bool

    private = property(lambda self: self.folder / "hub")
    config = property(lambda self: self.private / "jupyterhub_config.py")
    log = property(lambda self: self.private / "jupyterhub.log")
    class_dir = property(lambda self: self.folder / "class")
    revealed_dir = property(lambda self: self.folder / "revealed")  # labkit workshop reveal
    data_dir = property(lambda self: self.folder / "data" / "fashion-mnist")
    logins = property(lambda self: self.private / "logins")  # name and scrypt hash per line, root's only
    file = property(lambda self: self.folder / "state.json")

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.ip in ("", "0.0.0.0") else self.ip
        return f"http://{host}:{self.port}/"

    def save(self) -> None:
        data = {k: v for k, v in asdict(self).items() if k not in ("folder", "hub")}
        files.write_json_atomic(self.file, {**data, "hub": self.hub.to_dict() if self.hub else None})

    @classmethod
    def load(cls, folder: str | os.PathLike[str] | None = None) -> State | None:
        """The workshop whose state is in ``folder``, or None when there is none."""
        path = state_folder(folder)
        try:
            data = json.loads((path / "state.json").read_text())
            return cls(folder=path, **{**data, "hub": Started.from_dict(data.get("hub"))})
        except (OSError, ValueError, TypeError):
            return None
