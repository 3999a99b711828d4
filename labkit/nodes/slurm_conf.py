"""The slurm.conf settings every Slurm cluster labkit starts shares (one node here, or the virtual nodes).

A cluster's jobs are either *unconfined* (the labs': a job's processes tracked by their parent, no control
groups, so Slurm runs wherever labkit does, containers included) or *confined* (a workshop's: each job step in
control groups of its own that hold it to its CPUs and memory, ``cgroup.conf`` next to ``slurm.conf``).
"""

import re

SLURMD_PORT = 6818  # where each node's slurmd listens, in the node
# A path written into a script or configuration file root's daemons read: absolute, nothing that splits a line or
# an argument.
SAFE_PATH = re.compile(r"/[A-Za-z0-9_./+-]{1,1000}")

# What every labkit Slurm cluster sets: root daemons, and finished jobs
# listed for 30 s (300 s by default): long enough for labkit.launching.slurm_wait to read their exit code.
SETTINGS = (
    "JobAcctGatherType=jobacct_gather/none",
    "JobCompType=jobcomp/none",
    "SchedulerType=sched/builtin",
    "SelectType=select/cons_tres",
    "MpiDefault=none",
    "SlurmUser=root",
    "SlurmdUser=root",
    "ReturnToService=2",
    "KillWait=5",
    "MinJobAge=30",
)

# Unconfined: CPUs are the only consumable. Confined: memory too, so that each job is given (and held to) its
# share: the default share is set per CPU where the nodes are described (DefMemPerCPU).
# A confined cluster (a workshop's, with strangers as users) also takes at most JOBS_PER_USER_PER_HOUR jobs of each
# user an hour (job_submit/throttle), so that one learner cannot fill the queue for the others; its caps on each
# user's running jobs, nodes and CPUs are a QOS in Slurm's accounting (labkit.nodes.slurm_accounting).
JOBS_PER_USER_PER_HOUR = 60
UNCONFINED = ("AccountingStorageType=accounting_storage/none", "ProctrackType=proctrack/linuxproc",
              "TaskPlugin=task/none", "SelectTypeParameters=CR_CPU")
CONFINED = ("ProctrackType=proctrack/cgroup", "TaskPlugin=task/cgroup", "SelectTypeParameters=CR_CPU_Memory",
            "JobSubmitPlugins=throttle", f"SchedulerParameters=jobs_per_user_per_hour={JOBS_PER_USER_PER_HOUR}")

# cgroup.conf of a confined cluster: a step may use only the CPUs and the memory (no swap) Slurm gave its job.
CGROUP_CONF = """# Written by labkit: each job step held to the CPUs and memory of its job
CgroupPlugin=autodetect
ConstrainCores=yes
ConstrainRAMSpace=yes
AllowedRAMSpace=100
ConstrainSwapSpace=yes
AllowedSwapSpace=0
"""


def tracking(confined: bool) -> tuple[str, ...]:
    """The process-tracking and task settings of a confined or an unconfined cluster."""
    return CONFINED if confined else UNCONFINED


# A confined cluster's jobs each get temporary folders of their own: ``STATE/slurm/NODE/jobs/JOBID`` (root's,
# ``rwx--x--x``) holds ``tmp`` (TMPDIR) and ``shm``, each the job user's, ``rwx------``; made by root's Prolog
# before the job's first task on a node, named by its TaskProlog, removed by root's Epilog. For a workshop
# account the plug-in of :mod:`labkit.nodes.slurm_seats` also mounts them on the job's ``/tmp``, ``/var/tmp``
# and ``/dev/shm``; the learner cannot rename or replace them (the folder above is root's). OpenMPI's session
# folder, Python's and TensorFlow's temporary files follow TMPDIR, so that a job of a user without that plug-in's
# world still cannot be broken by a name another user took in /tmp first (``/tmp/ompi.NODE.UID``). Job ids and
# uids are Slurm's, checked to be numbers.
GUARD = """case "$SLURMD_NODENAME" in ''|*[!a-z0-9_-]*) exit 0;; esac
case "$SLURM_JOB_ID" in ''|*[!0-9]*) exit 0;; esac
"""
PROLOG = """#!/bin/sh
# Written by labkit: the job's own temporary folder on this node (root's Prolog)
{guard}case "$SLURM_JOB_UID" in ''|*[!0-9]*) exit 0;; esac
mkdir -m 711 -- "{base}/$SLURM_JOB_ID" 2>/dev/null || [ -d "{base}/$SLURM_JOB_ID" ] || exit 1
for sub in tmp shm; do
  mkdir -m 700 -- "{base}/$SLURM_JOB_ID/$sub" 2>/dev/null || [ -d "{base}/$SLURM_JOB_ID/$sub" ] || exit 1
  chown -h -- "$SLURM_JOB_UID" "{base}/$SLURM_JOB_ID/$sub" || exit 1
done
"""
TASK_PROLOG = """#!/bin/sh
# Written by labkit: each task's TMPDIR is its job's own folder (run as the job's user)
{guard}[ -d "{base}/$SLURM_JOB_ID/tmp" ] && echo "export TMPDIR={base}/$SLURM_JOB_ID/tmp"
exit 0
"""
EPILOG = """#!/bin/sh
# Written by labkit: the job's temporary folder goes with it (root's Epilog)
{guard}rm -rf --one-file-system -- "{base}/$SLURM_JOB_ID"
exit 0
"""


def job_folders(folder: str) -> dict[str, str]:
    """The Prolog, TaskProlog and Epilog scripts (name: text) of a confined cluster whose nodes' folders are
    ``folder/NODE``; each node's jobs' folders are ``folder/NODE/jobs`` (the scripts read the node's name from
    ``SLURMD_NODENAME``, Slurm's)."""
    if not SAFE_PATH.fullmatch(folder):
        raise ValueError(f"the nodes' folder {folder!r} must be an absolute path of letters, digits and _./+-")
    return {name: text.format(base=f"{folder}/$SLURMD_NODENAME/jobs", guard=GUARD)
            for name, text in (("prolog.sh", PROLOG), ("task_prolog.sh", TASK_PROLOG), ("epilog.sh", EPILOG))}
