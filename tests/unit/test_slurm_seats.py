"""The Slurm plug-in that keeps each workshop account's jobs in their own world: its command and configuration
built without starting anything; the plug-in itself compiled where the compiler and Slurm's header are (it runs
in tests/integration/test_workshop_slurm.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from labkit.nodes import slurm_conf, slurm_seats


def test_plugstack_names_the_plugin_and_its_folders() -> None:
    text = slurm_seats.plugstack_text(Path("/run/labkit-nodes/slurm"))
    line = text.splitlines()[-1].split()
    assert line == ["required", "/run/labkit-nodes/slurm/labkit_seats.so", "netns=/run/netns", "prefix=lkn-",
                    "hosts=/run/labkit-nodes/slurm/hosts", "nodes=/run/labkit-nodes/slurm"]


@pytest.mark.parametrize("folder", ["/state with space/slurm", "relative/slurm", "/x\nrequired /evil.so"])
def test_a_folder_that_would_change_the_configuration_is_refused(folder: str) -> None:
    with pytest.raises(ValueError, match="absolute"):
        slurm_seats.plugstack_text(Path(folder))


def test_the_compiler_command_is_an_argument_list_that_fails_on_warnings() -> None:
    argv = slurm_seats.compile_argv(Path("/src/p.c"), Path("/out/p.so"))
    assert argv[0] == "gcc" and "-Werror" in argv and argv[-3:] == ["-o", "/out/p.so", "/src/p.c"]


@pytest.mark.skipif(slurm_seats.missing() is not None, reason="needs gcc and libslurm-dev")
def test_the_plugin_compiles_and_exports_what_slurm_calls(tmp_path: Path) -> None:
    out = tmp_path / slurm_seats.PLUGIN
    built = subprocess.run(slurm_seats.compile_argv(slurm_seats.SOURCE, out), capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(out)], capture_output=True, text=True).stdout
    for name in ("slurm_spank_init", "slurm_spank_task_init_privileged", "slurm_spank_task_init", "plugin_name"):
        assert name in symbols, symbols


def test_the_prolog_makes_the_jobs_folders_root_s_above_the_users() -> None:
    scripts = slurm_conf.job_folders("/run/labkit-nodes/slurm")
    prolog = scripts["prolog.sh"]
    assert 'mkdir -m 711 -- "/run/labkit-nodes/slurm/$SLURMD_NODENAME/jobs/$SLURM_JOB_ID"' in prolog
    assert "for sub in tmp shm" in prolog and 'chown -h -- "$SLURM_JOB_UID"' in prolog
    assert "TMPDIR=/run/labkit-nodes/slurm/$SLURMD_NODENAME/jobs/$SLURM_JOB_ID/tmp" in scripts["task_prolog.sh"]
