"""OpenMPI's own mapper as a dry run: where ``mpirun`` would put each rank, without starting anything.

``mpirun --do-not-launch --display-map`` reads the hosts (a hostfile, ``-H``, or a Slurm allocation from the
``SLURM_*`` variables), maps the ranks and prints the job map, then stops before any host is reached; the hosts
need not exist. Measured with OpenMPI 4.1.4::

     Data for node: gpu01   Num slots: 4   Max slots: 0   Num procs: 4
        Process OMPI jobid: [16866,1] App: 0 Process rank: 0 Bound: N/A

After the map it prints an ORTE "internal error" (FORCE-TERMINATE) and exits 0; :func:`parse_map` reads the map
and ignores that. Without a map, OpenMPI's own message (not enough slots, a hostfile it cannot parse, ...) is the
answer: :func:`error_text` keeps it, and the exit status says nothing either way.

:func:`map_command` builds the argument list and reads no state (the caller says whether it runs as root, which
OpenMPI refuses without ``--allow-run-as-root``). Where there is no ``mpirun``, :func:`place_by_slot` places the
ranks from labkit's own reading of the hosts (:mod:`labkit.launching.hosts`) as ``--map-by slot`` does.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from labkit.launching import hosts

NODE = re.compile(r"^\s*Data for node:\s*(\S+)\s+Num slots:\s*(\d+)\s+Max slots:\s*(\d+)\s+Num procs:\s*(\d+)")
RANK = re.compile(r"Process OMPI jobid:.*?App:\s*(\d+)\s+Process rank:\s*(\d+)")
# OpenMPI 5 (PRRTE) spreads the same facts over several lines per node and per rank.
NODE5 = re.compile(r"^\s*Data for node:\s*(\S+)\s+State:")
SLOTS5 = re.compile(r"^\s*Num slots:\s*(\d+)\s+Slots in use:")
MAX5 = re.compile(r"^\s*Num slots allocated:\s*\d+\s+Max slots:\s*(\d+)")
RANK5 = re.compile(r"^\s*Data for proc:\s*\[[^,\]]*,(\d+)\]")  # the job's rank (App rank: within its app)
APP5 = re.compile(r"^\s*State:.*\bApp_context:\s*(\d+)")
TOTAL = re.compile(r"Total slots allocated\s+(\d+)")
RULE = re.compile(r"^-{20,}\s*$")
NOISE = ("An internal error has occurred in ORTE", "FORCE-TERMINATE", "should be reported to the developers",
         "LAUNCH MSG RAW SIZE", "ORTE_ERROR_LOG")


@dataclass(frozen=True)
class NodeMap:
    """One node of a job map: its name as OpenMPI shows it, its slots, and the ranks (with their app) it runs."""

    name: str
    slots: int
    max_slots: int
    ranks: tuple[int, ...]
    apps: tuple[int, ...]  # the app (of an MPMD line) of each rank, in the order of ``ranks``


@dataclass(frozen=True)
class JobMap:
    """Where each rank goes (``nodes``), or why OpenMPI mapped nothing (``error``)."""

    nodes: tuple[NodeMap, ...] = ()
    total_slots: int | None = None
    error: str = ""
    mapper: str = "mpirun"  # "mpirun": OpenMPI's own; "labkit": labkit's reading, where there is no mpirun

    @property
    def np(self) -> int:
        return sum(len(n.ranks) for n in self.nodes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def placement(self) -> list[tuple[str, int, int]]:
        """``(node, local rank, app)`` of each rank, in rank order."""
        where = {r: (n.name, local, n.apps[local] if local < len(n.apps) else 0)
                 for n in self.nodes for local, r in enumerate(n.ranks)}
        return [where[r] for r in sorted(where)]


def map_command(mpirun: str, options: Sequence[str], app: Sequence[str], as_root: bool) -> list[str]:
    """``mpirun --do-not-launch --display-map OPTIONS APP``: the mapper's dry run of the line ``mpirun OPTIONS APP``
    (``--allow-run-as-root`` first when it runs as root), binding out of the way (:func:`without_binding`)."""
    return [mpirun, *(["--allow-run-as-root"] if as_root else []), "--do-not-launch", "--display-map",
            *without_binding(options), *app]


def without_binding(options: Sequence[str]) -> list[str]:
    """``options`` with process binding out of the way. Without launching, the mapper checks a binding against
    *this* machine's cores, as if every node had them (``--map-by slot`` on a 2-core machine: "binding more
    processes than cpus"); on the nodes it would fit. ``--bind-to X`` becomes ``X:overload-allowed``, and
    ``--bind-to none`` comes first when no binding is given. Where each rank goes does not change."""
    out: list[str] = []
    given, after = False, False
    for word in options:
        flag, eq, value = word.partition("=")
        if after:
            word, after = _overload(word), False
        elif flag.lstrip("-") == "bind-to" and word.startswith("-"):
            given = True
            if eq:
                word = f"{flag}={_overload(value)}"
            else:
                after = True
        out.append(word)
    return out if given else ["--bind-to", "none", *out]


def _overload(policy: str) -> str:
    return policy if policy == "none" or "overload-allowed" in policy else f"{policy}{',' if ':' in policy else ':'}" \
        "overload-allowed"


def hostfile_command(mpirun: str, hostfile: str, np: int, as_root: bool, oversubscribe: bool = False) -> list[str]:
    """The dry run of ``mpirun --hostfile FILE -np N hostname``; ``oversubscribe`` maps even past the slots, to see
    every node and its slots."""
    options = ["--hostfile", hostfile, "-np", str(np), *(["--oversubscribe"] if oversubscribe else [])]
    return map_command(mpirun, options, ["hostname"], as_root)


def parse_map(text: str) -> JobMap:
    """The job map in mpirun's output (OpenMPI 4 or 5), or OpenMPI's message when it printed none."""
    nodes: list[NodeMap] = []
    current: dict | None = None
    total = None
    prrte = False
    for line in text.splitlines():
        if m := TOTAL.search(line):
            total = int(m.group(1))
        if m := NODE.match(line):
            current = {"name": m.group(1), "slots": int(m.group(2)), "max": int(m.group(3)), "ranks": [], "apps": []}
            nodes.append(current)  # type: ignore[arg-type]
        elif m := NODE5.match(line):
            prrte = True
            current = {"name": m.group(1), "slots": 0, "max": 0, "ranks": [], "apps": []}
            nodes.append(current)  # type: ignore[arg-type]
        elif current is None:
            continue
        elif m := RANK.search(line):
            current["ranks"].append(int(m.group(2)))
            current["apps"].append(int(m.group(1)))
        elif m := SLOTS5.match(line):
            current["slots"] = int(m.group(1))
        elif m := MAX5.match(line):
            current["max"] = int(m.group(1))
        elif m := RANK5.match(line):
            current["ranks"].append(int(m.group(1)))
            current["apps"].append(0)
        elif (m := APP5.match(line)) and current["apps"]:
            current["apps"][-1] = int(m.group(1))
    if prrte:  # PRRTE's total counts this machine's slots too, although the hostfile does not name it
        total = sum(n["slots"] for n in nodes)
    if nodes:
        return JobMap(tuple(NodeMap(n["name"], n["slots"], n["max"], tuple(n["ranks"]), tuple(n["apps"]))
                            for n in nodes), total)
    return JobMap(error=error_text(text) or "mpirun printed no job map")


def error_text(text: str) -> str:
    """OpenMPI's message in ``text``, its boxes and the ORTE "internal error" that follows every dry run left out."""
    blocks: list[list[str]] = []
    inside = False
    for line in text.splitlines():
        if RULE.match(line):
            inside = not inside
            if inside:
                blocks.append([])
            continue
        if inside:
            blocks[-1].append(line.strip())
    kept = [" ".join(w for w in block if w).strip() for block in blocks]
    kept = [k for k in kept if k and not any(n in k for n in NOISE)]
    if not kept:
        kept = [line.strip() for line in text.splitlines()
                if line.strip() and not any(n in line for n in NOISE)][:6]
    return re.sub(r"\s+", " ", " ".join(kept)).strip()


def place_by_slot(host_list: Sequence[hosts.Host], np: int) -> JobMap:
    """labkit's placement of ``np`` ranks on ``host_list`` (``--map-by slot``), as a job map; where it does not fit,
    an error as OpenMPI words it."""
    slots: dict[str, int] = {}
    for h in host_list:
        slots[h.name] = slots.get(h.name, 0) + (h.slots if h.slots is not None else 1)
    order = [name for name, n in slots.items() for _ in range(n)]
    total = len(order)
    if np > total:
        return JobMap(total_slots=total, mapper="labkit",
                      error=f"There are not enough slots available in the system to satisfy the {np} slots that "
                            f"were requested by the application (the hosts have {total}).")
    ranks: dict[str, list[int]] = {}
    for r, name in enumerate(order[:np]):
        ranks.setdefault(name, []).append(r)
    nodes = tuple(NodeMap(name, slots[name], 0, tuple(rs), (0,) * len(rs)) for name, rs in ranks.items())
    return JobMap(nodes, total, mapper="labkit")
