"""labkit.launching.launchers: every launcher's argument lists, built without starting anything."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from labkit.core import contract
from labkit.core.identity import rank_from_env
from labkit.launching import hosts, launch, launchers, table
from labkit.launching.jobspec import JobSpec


def test_default_threads_split_cores() -> None:
    assert launchers.default_threads(1, cores=8) == 8
    assert launchers.default_threads(2, cores=8) == 4
    assert launchers.default_threads(3, cores=2) == 1
    with pytest.raises(ValueError):
        launchers.default_threads(0)


def test_worker_env_limits_threads_and_keeps_legacy_keras() -> None:
    env = launchers.worker_env(2, threads=3, gpus=0)
    assert env["TF_USE_LEGACY_KERAS"] == "1"
    assert env["TF_NUM_INTRAOP_THREADS"] == env["OMP_NUM_THREADS"] == env[contract.THREADS] == "3"
    assert env["OMPI_MCA_mpi_yield_when_idle"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert "CUDA_VISIBLE_DEVICES" not in launchers.worker_env(2, threads=1, gpus=2)


def test_gpu_count_reads_nvidia_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: Tesla (UUID: a)'\necho 'GPU 1: Tesla (UUID: b)'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert launchers.gpu_count() == 2
    assert "CUDA_VISIBLE_DEVICES" not in launchers.worker_env(2)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert launchers.gpu_count() == 0


def _argv(launcher: launchers.Launcher, command: list[str], env: dict[str, str] | None = None) -> list[str]:
    (only,) = launcher.commands(command, env or {})
    return only[1]


def test_mpirun_arguments_are_a_list_exporting_env() -> None:
    cmd = _argv(launchers.MPIRun(2, cores=2, as_root=False), ["python", "t.py"], {"A": "1", "B": "2"})
    assert Path(cmd[0]).name == "mpirun" and cmd[1:3] == ["-np", "2"]
    assert "--allow-run-as-root" not in cmd and "--oversubscribe" not in cmd
    assert cmd[cmd.index("-x") + 1] == "A" and "B" in cmd
    assert cmd[-2:] == ["python", "t.py"]
    over = _argv(launchers.MPIRun(4, cores=2, as_root=True), ["x"])
    assert "--oversubscribe" in over and "--allow-run-as-root" in over
    two = _argv(launchers.MPIRun(4, hosts.parse_hosts("a:2,b:2"), cores=2, as_root=False), ["x"])
    assert two[two.index("-H") + 1] == "a:2,b:2" and "--oversubscribe" not in two
    with pytest.raises(launchers.LaunchError):
        launchers.MPIRun(0)


def test_horovodrun_and_gloo_arguments() -> None:
    cmd = _argv(launchers.HorovodRun(2), ["p"])
    assert Path(cmd[0]).name == "horovodrun" and cmd[1:] == ["-np", "2", "-H", "localhost:2", "--mpi", "p"]
    assert "--gloo" in _argv(launchers.Gloo(3), ["p"])
    two = _argv(launchers.HorovodRun(4, hosts.parse_hosts("n1:2,n2:2")), ["p"])
    assert two[two.index("-H") + 1] == "n1:2,n2:2"


def test_ssh_launcher_runs_local_slots_directly_and_remote_ones_over_ssh() -> None:
    here = launchers.SSH(3, hosts.parse_hosts("localhost:1,node7:2"), cwd="/work dir")
    cmds = here.commands(["python", "t.py", "--x", "a b"], {"TF_USE_LEGACY_KERAS": "1"})
    assert [c[0] for c in cmds] == ["rank.0", "rank.1", "rank.2"]
    assert cmds[0][1] == ["python", "t.py", "--x", "a b"] and cmds[0][2] == {contract.RANK: "0"}
    remote = cmds[2][1]
    assert remote[:2] == ["ssh", "-tt"] and "node7" in remote
    line = remote[-1]
    assert line.startswith("cd '/work dir' && exec env") and f"{contract.RANK}=2" in line and "'a b'" in line
    with pytest.raises(launchers.LaunchError, match="needs hosts"):
        launchers.SSH(2)


def test_registry_names_every_launcher_and_rejects_unknown() -> None:
    assert {"mpirun", "horovodrun", "gloo", "ssh", "slurm"} <= set(table.names())
    with pytest.raises(launchers.LaunchError, match="unknown launcher 'pbs'"):
        table.get("pbs")


def test_bad_host_lists_fail_before_launch_with_clear_messages(tmp_path: Path) -> None:
    with pytest.raises(launchers.LaunchError, match="not both"):
        launch.host_list("a:1", tmp_path / "f")
    with pytest.raises(launchers.LaunchError):
        launch.host_list("a:x")
    with pytest.raises(launchers.LaunchError, match="slot"):
        launch.run(["python", "t.py"], job=JobSpec(quiet=True), np=3, hosts="localhost:2")
    with pytest.raises(launchers.LaunchError, match="Slurm chooses the hosts"):
        launch.make_launcher("slurm", 2, hosts_spec="a:2")
    with pytest.raises(launchers.LaunchError, match="add --launcher slurm"):
        launch.make_launcher("mpirun", 2, slurm=launch.SlurmOptions(script_only="x.sbatch"))


def test_preflight_explains_missing_mpirun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launchers.shutil, "which", lambda name: None)
    with pytest.raises(launchers.LaunchError, match="apt-get install openmpi-bin"):
        launchers.MPIRun(2).preflight()


def test_preflight_explains_keras3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")
    with pytest.raises(launchers.LaunchError, match="Keras 3"):
        launchers.Gloo(2).preflight()


def test_nothing_to_run_is_refused() -> None:
    with pytest.raises(launchers.LaunchError, match="nothing to run"):
        launch.run([], job=JobSpec(quiet=True), np=2)


def test_python_means_this_interpreter() -> None:
    assert launchers.python_command(["python", "t.py"]) == [sys.executable, "t.py"]


def test_rank_from_env() -> None:
    assert rank_from_env({"OMPI_COMM_WORLD_RANK": "3"}) == 3
    assert rank_from_env({"HOROVOD_RANK": "1", "OMPI_COMM_WORLD_RANK": "3"}) == 1
    assert rank_from_env({"SLURM_PROCID": "2"}) == 2
    assert rank_from_env({}) == 0


def test_one_exit_status_for_the_job() -> None:
    assert launch.exit_code([0, 0]) == 0
    assert launch.exit_code([-15, 1], first_failure=1) == 1  # the rest were stopped because of rank 1
    assert launch.exit_code([-9]) == 137 and launch.exit_code([]) == 1


def test_a_command_is_shown_as_a_person_would_type_it() -> None:
    here = Path(sys.executable).parent
    argv = ["nsenter", "-t", "42", "-n", "--wd=/x", "--", str(here / "horovodrun"), "-np", "2", "-H", "node1:1",
            sys.executable, "/home/me/fashion_mnist.py", "--epochs", "1"]
    assert launchers.typed(argv) == ["horovodrun", "-np", "2", "-H", "node1:1", "python", "/home/me/fashion_mnist.py",
                                     "--epochs", "1"]
    assert launchers.typed(["/usr/bin/mpirun", "-np", "2", "/opt/x/python3", "/tmp/a.py"]) == [
        "mpirun", "-np", "2", "/opt/x/python3", "/tmp/a.py"]  # the launcher by name; other paths as they are


def test_transport_flags_follow_the_openmpi_version() -> None:
    four = launchers.mpirun_flags(2, cores=2, as_root=False, mpi_major=4)
    assert four[four.index("btl") + 1] == "self,vader,tcp" and "btl_vader_single_copy_mechanism" in four
    five = launchers.mpirun_flags(2, cores=2, as_root=False, mpi_major=5)
    assert five[five.index("btl") + 1] == "self,sm,tcp" and five[five.index("smsc") + 1] == "^cma"
    assert not any("vader" in a for a in five)
    for flags in (four, five):
        assert flags[:4] == ["--bind-to", "none", "--map-by", "slot"]
    assert "--allow-run-as-root" in launchers.mpirun_flags(2, cores=2, as_root=True, mpi_major=5)
    assert "--oversubscribe" in launchers.mpirun_flags(4, cores=2, as_root=False, mpi_major=5)


@pytest.mark.parametrize(("banner", "version"), [
    ("mpirun (Open MPI) 4.1.4\n\nReport bugs to https://www.open-mpi.org/community/help/\n", (4, 1, 4)),
    ("mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/\n", (5, 0, 11)),
    ("HYDRA build details:\n    Version: 4.0\n", None),
])
def test_mpi_version_is_read_from_the_mpirun_beside_python(banner: str, version: tuple[int, ...] | None,
                                                            monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "mpirun"
    fake.write_text(f"#!/bin/sh\nprintf '%s' '{banner}'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(launchers, "tool", lambda name: str(tmp_path / name))
    launchers._mpirun_version.cache_clear()
    try:
        assert launchers.mpi_version() == version
        flags = launchers.mpirun_flags(2, cores=2, as_root=False)
        assert ("sm" if version and version[0] >= 5 else "vader") in flags[flags.index("btl") + 1]
    finally:
        launchers._mpirun_version.cache_clear()
