"""The slurm.conf settings every Slurm cluster labkit starts shares (one node here, or the virtual nodes).

A cluster's jobs are either *unconfined* (the labs': a job's processes tracked by their parent, no control
groups, so Slurm runs wherever labkit does, containers included) or *confined* (a workshop's: each job step in
control groups of its own that hold it to its CPUs and memory, ``cgroup.conf`` next to ``slurm.conf``).
"""

# What every labkit Slurm cluster sets: no accounting, root daemons, and finished jobs
# listed for 30 s (300 s by default): long enough for labkit.launching.slurm_wait to read their exit code.
SETTINGS = (
    "JobAcctGatherType=jobacct_gather/none",
    "AccountingStorageType=accounting_storage/none",
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
# user an hour (job_submit/throttle: Slurm's per-user limits on jobs and nodes need accounting, slurmdbd, which
# labkit's clusters do not run), so that one learner cannot fill the queue for the others.
JOBS_PER_USER_PER_HOUR = 60
UNCONFINED = ("ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectTypeParameters=CR_CPU")
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
