"""ipyparallel MPI engines for ``%%px`` cells, started with the launcher's environment.

    from labkit import engines
    rc = engines.start(2)          # 2 MPI engines; %%px cells now run on both
    ...                            # %%px import horovod.tensorflow as hvd; hvd.init()
    engines.stop()                 # also runs at kernel exit

The engines stay warm between cells, so Horovod is initialised once and each
step of a lab can run on them without re-importing TensorFlow.
"""

from __future__ import annotations

import atexit
import logging
import uuid
from typing import Any

from labkit import launch

_CURRENT: dict[str, Any] = {}


def config(n: int, threads: int | None = None, job_id: str | None = None) -> Any:
    """The traitlets config for an MPI engine set of ``n`` engines."""
    from traitlets.config import Config

    env = launch.worker_env(n, threads)
    env[launch.JOB_VAR] = job_id or uuid.uuid4().hex
    cfg = Config()
    cfg.MPILauncher.mpi_args = launch.mpirun_flags(n) + [a for k in sorted(env) for a in ("-x", k)]
    cfg.MPIEngineSetLauncher.environment = env
    return cfg


def start(n: int = 2, threads: int | None = None, timeout: float = 120, activate: bool = True) -> Any:
    """Start ``n`` MPI engines (stopping any started before) and return a connected client."""
    import ipyparallel as ipp

    launch.preflight("mpirun")
    stop()
    job_id = uuid.uuid4().hex
    cluster = ipp.Cluster(engines="mpi", n=n, config=config(n, threads, job_id), log_level=logging.WARNING)
    _CURRENT.update(cluster=cluster, job_id=job_id)
    try:
        rc = cluster.start_and_connect_sync(activate=activate)
        rc.wait_for_engines(n, timeout=timeout)
        rc[:].apply_sync(_import_tensorflow_quietly)
    except BaseException:
        stop()
        raise
    _CURRENT["client"] = rc
    return rc


def _import_tensorflow_quietly() -> str:
    """On each engine: import TensorFlow with its native start-up logging silenced."""
    from labkit import env

    with env.quiet_native_stderr():
        import tensorflow as tf
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
    if cluster is not None:
        # Engines first: an engine that loses its controller first dies with a traceback.
        for stop_part in (cluster.stop_engines_sync, cluster.stop_controller_sync):
            try:
                stop_part()
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
    if job_id:
        launch.kill_job(None, job_id)


atexit.register(stop)
