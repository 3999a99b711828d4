"""``labkit workshop up|status|down|password|reveal|k8s``: a JupyterHub for a class (the class view and its marks are
``labkit class``, :mod:`labkit.cli.classes`).

:func:`add_parser` (``add_cli`` in the command table) registers the command; its parser's ``func`` is :func:`run`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from labkit.core.cliargs import positive_int
from labkit.course import labs
from labkit.deploy import z2jh, z2jh_files
from labkit.records import classlog
from labkit.workshop import (
    accounts,
    disks,
    hub,
    hubconfig,
    lifecycle,
    limits,
    passwords,
    slurmlimits,
)
from labkit.workshop import reveal as reveals

HELP = """\
A JupyterHub on this machine for a class: N learner accounts (learner01 ...) and an instructor (the hub's
admin), each learner's JupyterLab running as that learner on their own copy of the released course (made at
first login, with no solutions), the project's environment shared read-only. Passwords are printed once and kept
only as hashes (`labkit workshop password NAME` gives a learner a new one); the accounts cannot log in by ssh or
su. Each learner is limited to --pids tasks, and to --cores and --memory when given; `up` refuses when a limit
cannot be enforced on this machine, unless --no-limits. The instructor sees the class at /services/class/ or with
`labkit class status`, and gives the class a step's solution with `labkit workshop reveal LAB STEP`. Needs root.
Stop with `labkit workshop down` (removes users, servers, processes, jobs and files; safe to repeat, also after
a reboot)."""
REVEAL_HELP = """\
Gives every learner of the workshop the solution after STEP of LAB: it is written, root's and read-only, into
the workshop's revealed/ folder, which each learner's `labkit solution LAB STEP` (and the notebook helper) reads;
steps not revealed stay hidden. Each reveal is recorded in the class view (what, by whom, when). Needs root."""


def _arg(check):  # noqa: ANN001, ANN202
    """An argparse type from a check that raises ValueError with a clear message."""
    def parse(text: str):  # noqa: ANN202
        try:
            return check(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e).split(": ", 1)[-1] if str(e).startswith("--") else str(e)) from None
    parse.__name__ = check.__name__
    return parse


def _cores(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"--cores {text!r}: a number of cores above 0, e.g. 1.5") from None
    return limits.check_cores(value)


def _pids(text: str) -> int:
    if not text.strip().isdigit():
        raise ValueError(f"--pids {text!r}: a whole number of tasks from 16 up")
    return limits.check_pids(int(text))


def _memory(text: str) -> str:
    limits.parse_memory(text)
    return text.strip()


K8S_HELP = f"""\
Writes a class's JupyterHub for Kubernetes into DIR: Helm values for Zero to JupyterHub's `jupyterhub` chart
{z2jh.CHART_VERSION} (KubeSpawner), with each learner's server running the course image, limited and guaranteed
--cores and --memory, the course released into the learner's home volume at the first start of their server (never
over what is there), the class folder on a ReadWriteMany claim you provide (--class-pvc), the check queue per pod,
--instructor as the hub's admin, and no configuration from the learners' homes; the passwords in secrets.yaml, a
claim to complete, a Containerfile adding JupyterHub to the course image, and a README with the steps to install
and tear down. Everything is checked offline against the chart's own values schema; nothing talks to a cluster.
--check FILE... checks edited values instead (merged in order, as `helm --values` does)."""


def _k8s_parser(acts) -> None:  # noqa: ANN001
    """``labkit workshop k8s``: Zero to JupyterHub values for the class (labkit.deploy.z2jh)."""
    d = z2jh.HubOptions()
    k = acts.add_parser("k8s", help=f"write a class's JupyterHub for Kubernetes (Zero to JupyterHub "
                        f"{z2jh.CHART_VERSION}), checked offline", description=K8S_HELP)
    k.add_argument("-o", "--output", metavar="DIR", help="the folder to write (refused when not empty, unless --force)")
    k.add_argument("--force", action="store_true", help="write into a folder that holds files (over them)")
    k.add_argument("--check", nargs="+", metavar="FILE", help="check values files instead of writing any")
    k.add_argument("--image", default=d.image, metavar="NAME:TAG",
                   help="the course image in a registry the cluster pulls from (default: %(default)s, as `labkit "
                   "image build` tags it)")
    k.add_argument("--cores", type=_arg(_cores), default=d.cores, help="cores per learner, limit and guarantee "
                   "(default: %(default)s)")
    k.add_argument("--memory", type=_arg(_memory), default=d.memory, metavar="SIZE",
                   help="memory per learner, limit and guarantee (default: %(default)s)")
    k.add_argument("--instructor", default=d.instructor, metavar="NAME", help="the hub's admin (default: %(default)s)")
    k.add_argument("--class-pvc", default=d.class_pvc, metavar="NAME",
                   help="the ReadWriteMany PersistentVolumeClaim of the class folder (default: %(default)s)")
    k.add_argument("--learners", type=positive_int, default=None, metavar="N",
                   help="only learner01 ... learnerNN may log in (default: any name with the class password)")
    k.add_argument("--subdomain-host", default="", metavar="URL",
                   help="e.g. https://hub.example.org: each learner's server on a name of its own (needs a wildcard "
                   "DNS name and certificate)")


def _k8s(a: argparse.Namespace) -> int:
    if bool(a.check) == bool(a.output):
        print("labkit workshop k8s: give -o DIR to write the hub's files, or --check FILE... to check values",
              file=sys.stderr)
        return 2
    if a.check:
        return _k8s_check(a.check)
    opts = z2jh.HubOptions(image=a.image, cores=a.cores, memory=a.memory, instructor=a.instructor,
                           class_pvc=a.class_pvc, learners=a.learners, subdomain_host=a.subdomain_host)
    try:
        done = z2jh_files.write(opts, Path(a.output), force=a.force)
    except (ValueError, OSError) as e:
        print(f"labkit workshop k8s: {e}", file=sys.stderr)
        return 2 if isinstance(e, (ValueError, FileExistsError)) else 1
    print(f"wrote {', '.join(p.name for p in done.files)} to {done.folder}: the chart {z2jh.CHART} "
          f"{z2jh.CHART_VERSION}'s values, checked offline against its schema (nothing deployed); steps in README.md")
    for note in done.notes:
        print(f"  note: {note}")
    return 0


def _k8s_check(names: list[str]) -> int:
    import yaml

    documents = []
    for name in names:
        try:
            documents.append(yaml.safe_load(Path(name).read_text()) or {})
        except (OSError, yaml.YAMLError) as e:
            print(f"labkit workshop k8s: {name}: {e}", file=sys.stderr)
            return 2
    try:
        z2jh.validate(*documents, what=" + ".join(names))
    except z2jh.ValuesError as e:
        print(f"labkit workshop k8s: {e}", file=sys.stderr)
        return 1
    print(f"{' + '.join(names)}: valid for the chart {z2jh.CHART} {z2jh.CHART_VERSION} (its schema, merged with its "
          "defaults as Helm does) and the course's rules")
    return 0


def add_parser(sub) -> None:
    """Register ``labkit workshop`` and ``labkit class``."""
    p = sub.add_parser("workshop", help="a JupyterHub for a class on this machine (root)", description=HELP)
    acts = p.add_subparsers(dest="action", required=True)
    u = acts.add_parser("up", help="create the accounts and start the hub", description=HELP)
    u.add_argument("--learners", type=positive_int, required=True, help="how many learner accounts")
    u.add_argument("--port", type=positive_int, default=8000, help="the hub's port (default: %(default)s)")
    u.add_argument("--ip", default="127.0.0.1", type=_arg(hubconfig.check_ip),
                   help="address to listen on (default: %(default)s; 0.0.0.0 for a class on the network, behind HTTPS)")
    u.add_argument("--subdomain-host", type=_arg(hubconfig.check_subdomain_host), default=None, metavar="URL",
                   help="e.g. https://hub.example.org: each learner's server on a name of its own "
                   "(https://learner07.hub.example.org; needs a wildcard DNS name and certificate)")
    u.add_argument("--slurm", action="store_true", help="learners' jobs go to Slurm on virtual nodes")
    u.add_argument("--spawner", choices=list(hubconfig.SPAWNERS), default="local",
                   help="where learners' servers run: local (this machine, in each learner's limits; default) or "
                   "slurm (each server a Slurm job on the virtual nodes, their jobs too; implies --slurm)")
    u.add_argument("--shared-password", action="store_true",
                   help="one password for all learners (JupyterHub's SharedPasswordAuthenticator) instead of one "
                   "each; anyone holding it can log in as any learner")
    u.add_argument("--cores", type=_arg(_cores), default=None, help="cores per learner (default: unlimited)")
    u.add_argument("--memory", type=_arg(_memory), default=None, metavar="SIZE",
                   help="memory per learner, e.g. 4G (default: 80%% of this machine's memory shared among the "
                   "learners and the instructor)")
    u.add_argument("--pids", type=_arg(_pids), default=None, metavar="N",
                   help=f"processes and threads per learner, against fork bombs (default: {limits.DEFAULT_PIDS})")
    u.add_argument("--no-limits", action="store_true",
                   help="hold the workshop without per-learner limits (where they cannot be enforced, e.g. a "
                   "systemd host); without it `up` refuses when a limit cannot be enforced")
    u.add_argument("--disk", default=disks.DEFAULT, metavar="SIZE",
                   help="each home's disk, a file system of its own (default: %(default)s; sparse: it takes on the "
                   "machine's disk only what is written)")
    u.add_argument("--no-disk-limit", action="store_true",
                   help="homes on the machine's disk, unlimited (where loop devices cannot be used)")
    u.add_argument("--job-minutes", type=positive_int, default=None, metavar="MIN",
                   help="with --slurm: the longest a learner's Slurm job may run (the partition's MaxTime; "
                   "default: 30)")
    u.add_argument("--jobs-per-learner", type=positive_int, default=None, metavar="N",
                   help="with --slurm and limits: Slurm jobs a learner may have running at once (default: "
                   f"{slurmlimits.DEFAULT_RUNNING}; {slurmlimits.QUEUED_PER_RUNNING} times as many in the queue)")
    u.add_argument("--nodes-per-learner", type=positive_int, default=None, metavar="N",
                   help="with --slurm and limits: nodes a learner's running jobs may hold at once (default: "
                   f"{slurmlimits.DEFAULT_NODES})")
    u.add_argument("--json", action="store_true", help="print the status and passwords as JSON")
    s = acts.add_parser("status", help="is the hub up; each learner's course and processes")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    acts.add_parser("down", help="stop everything and remove what `up` made (safe to repeat)")
    pw = acts.add_parser("password", help="give one learner (or the instructor) a new password, printed once")
    pw.add_argument("name", help="e.g. learner07")
    rv = acts.add_parser("reveal", help="give the class one step's solution (`labkit solution LAB STEP` then shows "
                         "it to every learner); recorded in the class view", description=REVEAL_HELP)
    rv.add_argument("lab", choices=list(labs.LABS), help="which lab")
    rv.add_argument("step", type=positive_int, help="the step whose solution (after it) the class may see")
    _k8s_parser(acts)
    p.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    name = f"workshop {a.action}"
    try:
        return {"up": _up, "status": _status, "down": _down, "password": _password, "reveal": _reveal,
                "k8s": _k8s}[a.action](a)
    except (lifecycle.WorkshopError, accounts.AccountsError, disks.DiskError, hub.HubError, reveals.RevealError) as e:
        print(f"labkit {name}: {e}", file=sys.stderr)
        return 1


def _up(a: argparse.Namespace) -> int:
    if a.no_limits and (a.cores or a.memory or a.pids):
        print("labkit workshop up: --no-limits and --cores/--memory/--pids: choose one", file=sys.stderr)
        return 2
    for given, flag in ((a.job_minutes, "--job-minutes"), (a.jobs_per_learner, "--jobs-per-learner"),
                        (a.nodes_per_learner, "--nodes-per-learner")):
        if given and not (a.slurm or a.spawner == "slurm"):
            print(f"labkit workshop up: {flag} limits Slurm jobs: give it with --slurm", file=sys.stderr)
            return 2
        if given and a.no_limits and flag != "--job-minutes":
            print(f"labkit workshop up: {flag} and --no-limits: choose one", file=sys.stderr)
            return 2
    pids = None if a.no_limits else (a.pids or limits.DEFAULT_PIDS)
    memory = a.memory
    if memory is None and not a.no_limits and a.spawner == "local":  # a safe default: no learner takes all memory
        memory = limits.default_memory(a.learners + 1)
        print(f"labkit workshop up: --memory {memory} per learner (80% of this machine's memory shared among the "
              f"{a.learners} learners and the instructor; give --memory to choose)", file=sys.stderr)
    plan = lifecycle.Plan(a.learners, port=a.port, ip=a.ip, slurm=a.slurm, spawner=a.spawner,
                          auth="shared" if a.shared_password else "hub", cores=a.cores, memory=memory, pids=pids,
                          no_limits=a.no_limits, subdomain_host=a.subdomain_host or "",
                          disk=None if a.no_disk_limit else a.disk,
                          **{k: v for k in ("job_minutes", "jobs_per_learner", "nodes_per_learner")
                             if (v := getattr(a, k))})
    st, pw = lifecycle.up(plan, say=lambda text: print(text, file=sys.stderr))
    status = lifecycle.status()
    if a.json:
        print(json.dumps({**status, "passwords": pw}, indent=1))
        return 0
    _show(status)
    print("\nPasswords (shown once and not kept: a lost one is replaced by `labkit workshop password NAME`):")
    for who, secret in pw.items():
        print(f"  {who:<12} {secret}{'   (admin: the class view)' if who == st.instructor else ''}")
    print(f"up in {st.seconds_up:.1f} s; stop with `labkit workshop down`")
    return 0


def _show(status: dict) -> None:
    if status["state"] == "down":
        print(f"workshop: down (state folder {status['folder']})")
        return
    print(f"workshop: {status['state']}, JupyterHub {status['jupyterhub'] or '(not answering)'} at {status['url']}")
    kind = "shared" if status["auth"] == "shared" else "one hub password each (no ssh or su)"
    print(f"  login:      {kind}; instructor {status['instructor']} (admin)")
    print(f"  class view: {status['class_page']} (instructor only), or `labkit class status`")
    for who in status["learners"]:
        course = "course ready" if who["course"] else "course at first login"
        print(f"  {who['name']:<12} {course}{', running' if who['processes'] else ''}")
    if status.get("spawner") == "slurm":
        print("  Slurm:      each learner's JupyterLab is a Slurm job on a virtual node; their jobs go there too")
    elif status["slurm"]:
        print("  Slurm:      learners' jobs go to the virtual nodes (`labkit run --launcher slurm ...`)")
    for problem in status["problems"]:
        print(f"  note: {problem}")


def _status(a: argparse.Namespace) -> int:
    st = lifecycle.status()
    print(json.dumps(st, indent=1)) if a.json else _show(st)
    return 0 if st["state"] in ("up", "down") else 1


def _password(a: argparse.Namespace) -> int:
    st = lifecycle.State.load()
    if st is None or st.auth != "hub":
        print("labkit workshop password: no workshop with one password per learner is up", file=sys.stderr)
        return 1
    secret = passwords.generate(32 if a.name == st.instructor else 12)
    try:
        passwords.replace(a.name, secret, st.logins)
    except KeyError:
        print(f"labkit workshop password: {a.name!r} is not a learner or the instructor of this workshop",
              file=sys.stderr)
        return 2
    except OSError as e:
        print(f"labkit workshop password: {e} (needs root)", file=sys.stderr)
        return 1
    print(f"{a.name} {secret}")
    return 0


def _reveal(a: argparse.Namespace) -> int:
    st = lifecycle.State.load()
    if st is None:
        print("labkit workshop reveal: no workshop is up (`labkit workshop up` first)", file=sys.stderr)
        return 1
    if os.geteuid() != 0:
        print("labkit workshop reveal: needs root, like `workshop up`: the revealed solutions are root's and read-only "
              "to the class (e.g. `sudo .venv/bin/labkit workshop reveal horovod 5`)", file=sys.stderr)
        return 1
    try:
        done = reveals.reveal(st, a.lab, a.step, os.environ.get("SUDO_USER") or classlog.learner_name())
    except (ValueError, OSError) as e:
        print(f"labkit workshop reveal: {e}", file=sys.stderr)
        return 2 if isinstance(e, ValueError) else 1
    print(f"revealed {done.lab} step {done.step} to the class: every learner's `labkit solution {done.lab} "
          f"{done.step}` now shows it; recorded in the class view (by {done.by})")
    return 0


def _down(a: argparse.Namespace) -> int:
    removed = lifecycle.down()
    print("removed: " + ", ".join(removed) if removed else "workshop: nothing was up")
    return 0


add_cli = add_parser  # the name labkit.cli.main's COMMANDS table calls
