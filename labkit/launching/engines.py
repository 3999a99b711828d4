"""ipyparallel MPI engines for ``%%px`` cells, started with the launcher's environment.

    from labkit.launching import engines
    rc = engines.start(2)          # 2 MPI engines; %%px cells now run on both
    ...                            # %%px import horovod.tensorflow as hvd; hvd.init()
    engines.stop()                 # also runs at kernel exit

    rc = engines.start(4, launcher="slurm")   # engines as one Slurm job (srun --mpi=pmix)
    rc = engines.start(4, hostfile="hosts")   # engines on other hosts (mpirun over ssh), reaching back here

:func:`run_on_engines` runs a tf.distribute script in fresh engines instead, one
engine per worker of a ``TF_CONFIG`` cluster, and records the run.

The engines stay warm between cells, so Horovod is initialised once and each
step of a lab can run on them without re-importing TensorFlow.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from labkit.core import contract, env, proc, tfconfig
from labkit.instrument import observe
from labkit.instrument.start import run as run_probed
from labkit.launching import hosts, launchers, reach
from labkit.launching.sbatch import SlurmOptions, directive_value, output_pattern
from labkit.launching.slurm import cancel
from labkit.records import jobrecord, runs

_CURRENT: dict[str, Any] = {}
IPYPARALLEL_ENV = ("IPP_CLUSTER_ID", "IPP_PROFILE_DIR", "IPP_CONNECTION_INFO")


def config(np: int, threads: int | None = None, job_id: str | None = None, launcher: str = "mpi",
           slurm: Any = None, host_list: Sequence[hosts.Host] | None = None) -> Any:
    """The traitlets config for ``np`` engines started by mpirun (``mpi``, on ``host_list`` when given) or as a
    Slurm job (``slurm``)."""
    from traitlets.config import Config

    env = launchers.worker_env(np, threads)
    env[contract.JOB_ID] = job_id or uuid.uuid4().hex
    cfg = Config()
    if launcher == "slurm":
        o = slurm or SlurmOptions(tasks_per_node=np)
        o.check()
        logs = proc.new_log_dir().resolve()  # the batch script and the job's output, not in the learner's folder
        cfg.SlurmEngineSetLauncher.environment = env
        cfg.SlurmEngineSetLauncher.batch_file_name = str(logs / "engines.sbatch")
        lines = ["#!/bin/sh", "#SBATCH --export=ALL", "#SBATCH --job-name=ipengine-{cluster_id}",
                 "#SBATCH --ntasks={n}",  # ipyparallel fills the {fields}: braces of the path are doubled
                 "#SBATCH --output=" + directive_value(output_pattern(logs)).replace("{", "{{").replace("}", "}}")]
        if o.nodes > 1:
            lines.append(f"#SBATCH --nodes={o.nodes}")
        for flag, value in (("partition", o.partition), ("account", o.account), ("time", o.time),
                            ("gpus-per-task", o.gpus_per_task), ("cpus-per-task", o.cpus_per_task)):
            if value:
                lines.append(f"#SBATCH --{flag}={value}")
        # One MPI world across the engines (mpi4py, Horovod): srun hands out ranks through PMIx.
        lines.append("srun --mpi=pmix {program_and_args}")  # the environment comes with --export=ALL
        cfg.SlurmEngineSetLauncher.batch_template = "\n".join(lines) + "\n"
        return cfg
    # mpirun forwards to other hosts only the variables it is told to: ours, and ipyparallel's own (the engines'
    # connection file and cluster; IPP_CONNECTION_INFO is set by ipyparallel when the engines start)
    forwarded = sorted(env) + list(IPYPARALLEL_ENV)
    cfg.MPILauncher.mpi_args = launchers.mpirun_flags(np, host_list) + [a for k in forwarded for a in ("-x", k)]
    cfg.MPIEngineSetLauncher.environment = env
    return cfg


def start(np: int = 2, threads: int | None = None, timeout: float = 120, activate: bool = True,
          launcher: str = "mpi", slurm: Any = None, hostfile: str | Path | None = None) -> Any:
    """Start ``np`` engines (stopping any started before) and return a connected client.

    ``launcher="mpi"``: mpirun on this machine, or on the hosts of ``hostfile`` (OpenMPI's
    format; ``labkit nodes status`` gives the virtual nodes' one). ``launcher="slurm"``: one
    Slurm job of ``np`` tasks (``slurm`` is a :class:`labkit.launching.sbatch.SlurmOptions` for
    partition, account, time ...). With engines on other hosts the controller listens on every
    interface and tells them the address of this machine on their route.
    """
    import ipyparallel as ipp

    if launcher not in ("mpi", "slurm"):
        raise launchers.LaunchError(f"unknown engine launcher {launcher!r}: choose mpi or slurm")
    if hostfile and launcher != "mpi":
        raise launchers.LaunchError("a hostfile is for engines started by mpirun: Slurm chooses its nodes")
    problem = launchers.mpi_missing() if launcher == "mpi" else None
    if launcher == "slurm":
        problem = None if shutil.which("sbatch") else "sbatch not found: engines on Slurm need a Slurm login node"
    if problem:
        raise launchers.LaunchError(problem)
    try:
        host_list = hosts.validate(hosts.parse_hostfile(hostfile), np, resolve=False) if hostfile else []
        remote = [h for h in host_list if not hosts.is_local(h.name)]
        reach.ssh_preflight(remote)  # each host that does not answer, named with the fix
    except hosts.HostError as e:
        raise launchers.LaunchError(str(e)) from None
    stop()
    job_id = uuid.uuid4().hex
    kw: dict[str, Any] = {"controller_ip": "*"} if launcher == "slurm" else {}
    if remote:
        kw = {"controller_ip": "*", "controller_location": reach.address_toward(remote[0].name)}
    cluster = ipp.Cluster(engines=launcher, n=np, config=config(np, threads, job_id, launcher, slurm, host_list),
                          log_level=logging.WARNING, **kw)
    _CURRENT.update(cluster=cluster, job_id=job_id)
    try:
        rc = cluster.start_and_connect_sync(activate=activate)
        rc.wait_for_engines(np, timeout=timeout)
        rc[:].apply_sync(_import_tensorflow_quietly)
    except BaseException:
        stop()
        raise
    _CURRENT["client"] = rc
    return rc


def _import_tensorflow_quietly() -> str:
    """On each engine: import TensorFlow and probe its devices with the native logging silenced.

    The start-up hook's ``TF_CPP_MIN_LOG_LEVEL=2`` keeps errors, and TensorFlow probes CUDA lazily, at its
    first device use (``hvd.init()``, the first tensor): on a machine with CUDA libraries but no usable
    GPU that logs ``failed call to cuInit`` as an error on every engine, in the learner's ``%%px`` cell.
    Probing here, once, inside the quiet block, leaves nothing for the cells to print."""
    with env.quiet_native_stderr():
        import tensorflow as tf

        tf.config.list_physical_devices()
    return tf.__version__


def stop() -> None:
    """Stop the engines and controller, then kill anything of theirs still alive."""
    cluster = _CURRENT.pop("cluster", None)
    job_id = _CURRENT.pop("job_id", None)
    client = _CURRENT.pop("client", None)
    if client is not None:
        try:
            client.close()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
    batch_ids = []
    if cluster is not None:
        batch_ids = [str(e.job_id) for e in cluster.engines.values() if getattr(e, "job_id", None)]
        # Stopping makes mpirun exit non-zero, which ipyparallel reports as a warning: expected here.
        cluster.log.setLevel(logging.ERROR)
        # Engines first: an engine that loses its controller first dies with a traceback.
        for stop_part in (cluster.stop_engines_sync, cluster.stop_controller_sync):
            try:
                stop_part()
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
    if batch_ids:
        for batch_id in batch_ids:
            cancel(batch_id)
    if job_id:
        proc.stop_marked(job_id)


atexit.register(stop)


# ----------------------------------------------------------------------------- a tf.distribute script on engines


def _engine_main(script: str, args: list[str], tf_config: str, env: dict[str, str], cwd: str | None,
                 observed: str) -> int:
    """Run ``script`` as ``__main__`` inside an ipyparallel engine with ``TF_CONFIG`` set (observed
    into ``observed`` for the run record); the script's exception reaches the engine's caller."""
    import os

    os.environ.update(env)
    os.environ["TF_CONFIG"] = tf_config

    if cwd:
        os.makedirs(cwd, exist_ok=True)
        os.chdir(cwd)
    # An engine looks interactive to TensorFlow, whose logger then shows INFO records (one per collective).
    _import_tensorflow_quietly()
    import tensorflow as tf

    tf.get_logger().setLevel(logging.WARNING)
    return run_probed(observe.RunProbe(), observed, script, args, reraise=True)


def run_on_engines(
    script: str | Path,
    args: Sequence[str] = (),
    workers: int = 2,
    timeout: float = 600,
    threads: int | None = None,
    cwd: str | Path | None = None,
) -> dict[str, object]:
    """Run ``script`` once per ipyparallel engine, each engine a worker of one cluster.

    Starts a controller and ``workers`` engines, gives engine i ``TF_CONFIG`` of
    worker i, runs the script in every engine at once, prints worker 0's output,
    and stops the engines and the controller. Returns exit codes and outputs.
    """
    import ipyparallel as ipp

    spec = tfconfig.cluster_spec(workers)
    job_id = uuid.uuid4().hex
    env = launchers.worker_env(workers, threads)
    script = str(Path(script).resolve())
    log_dir = proc.new_log_dir(Path(cwd or ".") / "runs" / "logs").resolve()
    records = (Path(cwd or ".") / (contract.current().runs_file or runs.runs_file())).resolve()
    run_id = runs.new_run_id()
    start, started = time.perf_counter(), time.time()
    codes: list[int | None] = [None] * workers
    saved = os.environ.get(contract.JOB_ID)
    os.environ[contract.JOB_ID] = job_id  # engines inherit it: the process layer finds them
    cluster = ipp.Cluster(n=workers, log_level=40)
    try:
        client = cluster.start_and_connect_sync(activate=False)
        client.wait_for_engines(workers, timeout=120)
        pending = [
            client[i].apply_async(_engine_main, script, list(args), tfconfig.tf_config(spec, "worker", i),
                                  {**env, contract.TASK: f"worker.{i}", contract.RUN_ID: run_id},
                                  str(cwd) if cwd else None, str(log_dir / "observed"))
            for i in range(workers)
        ]
        deadline = time.monotonic() + timeout
        for ar in pending:
            ar.wait(max(1.0, deadline - time.monotonic()))
        codes = [ar.get() if ar.ready() else None for ar in pending]
        out = {f"worker.{i}": ar.stdout for i, ar in enumerate(pending)}
        print(out["worker.0"], end="", flush=True)
        return {"returncodes": codes, "outputs": out, "ok": all(c == 0 for c in codes)}
    finally:
        try:
            cluster.stop_cluster_sync()
        except Exception:  # noqa: BLE001 - whatever happened, the processes must go
            pass
        proc.stop_marked(job_id)
        ok = all(c == 0 for c in codes)
        end = jobrecord.JobEnd(run_id, [sys.executable, script, *args], "ipyparallel", workers,
                               contract.JobEnv.from_env(env).threads, started, time.perf_counter() - start,
                               0 if ok else 1, "ok" if ok else "failed", log_dir=log_dir)
        jobrecord.finish(end, log_dir / "observed", records)
        if saved is None:
            os.environ.pop(contract.JOB_ID, None)
        else:
            os.environ[contract.JOB_ID] = saved
