"""The slurm.conf settings every Slurm cluster labkit starts shares (one node here, or the virtual nodes)."""

# What every labkit Slurm cluster sets: no cgroups, no accounting, CPUs as the consumable, root daemons, and
# finished jobs listed for 30 s (300 s by default): long enough for labkit.launching.slurm_wait to read their exit code.
SETTINGS = (
    "ProctrackType=proctrack/linuxproc",
    "TaskPlugin=task/none",
    "JobAcctGatherType=jobacct_gather/none",
    "AccountingStorageType=accounting_storage/none",
    "JobCompType=jobcomp/none",
    "SchedulerType=sched/builtin",
    "SelectType=select/cons_tres",
    "SelectTypeParameters=CR_CPU",
    "MpiDefault=none",
    "SlurmUser=root",
    "SlurmdUser=root",
    "ReturnToService=2",
    "KillWait=5",
    "MinJobAge=30",
)
