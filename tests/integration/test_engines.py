"""labkit.launching.engines: MPI engine config (no MPI needed) and a real 2-engine Horovod allreduce."""

from __future__ import annotations

import shutil

import pytest

from labkit.core import contract, proc
from labkit.launching import engines, hosts, launchers


def test_config_passes_thread_limits_and_mpirun_flags() -> None:
    cfg = engines.config(2, threads=1, job_id="abc")
    env = cfg.MPIEngineSetLauncher.environment
    assert env["TF_NUM_INTRAOP_THREADS"] == "1" and env[contract.JOB_ID] == "abc"
    args = cfg.MPILauncher.mpi_args
    assert "--bind-to" in args and ["-x", "TF_USE_LEGACY_KERAS"] == args[args.index("TF_USE_LEGACY_KERAS") - 1:][:2]


def test_config_for_other_hosts_names_them_and_start_refuses_a_bad_hostfile(tmp_path) -> None:
    cfg = engines.config(4, threads=1, job_id="abc", host_list=hosts.parse_hosts("hostA:2,hostB:2"))
    args = cfg.MPILauncher.mpi_args
    assert args[args.index("-H") + 1] == "hostA:2,hostB:2"
    bad = tmp_path / "hosts"
    bad.write_text("hostA slots=1\n")
    with pytest.raises(launchers.LaunchError, match="slot"):
        engines.start(4, hostfile=bad)  # 4 engines do not fit on 1 slot: said before anything starts
    with pytest.raises(launchers.LaunchError, match="Slurm chooses"):
        engines.start(2, launcher="slurm", hostfile=bad)
    assert "cluster" not in engines._CURRENT


@pytest.mark.slow
@pytest.mark.horovod
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
def test_engines_run_horovod_and_leave_nothing_behind() -> None:
    rc = engines.start(2, activate=False)
    job_id = engines._CURRENT["job_id"]
    try:
        # As a %%px cell would: code runs in each engine's namespace.
        rc[:].execute(
            "import os\nimport horovod.tensorflow as hvd\nimport tensorflow as tf\nhvd.init()\n"
            "result = (hvd.rank(), float(hvd.allreduce(tf.constant(float(hvd.rank() + 1)), op=hvd.Sum)),"
            " os.environ['TF_USE_LEGACY_KERAS'])",
            block=True,
        )
        results = sorted(rc[:].pull("result", block=True))
        assert results == [(0, 3.0, "1"), (1, 3.0, "1")]
    finally:
        engines.stop()
    assert proc.marked(job_id) == []
