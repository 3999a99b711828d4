"""``labkit doctor``: is this machine ready for the labs, and if not, how to fix it."""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
from typing import Any

from labkit.core import env
from labkit.instrument import data, private_names
from labkit.launching import launchers
from labkit.nodes import net
from labkit.nodes import virtual as nodes

SETUP_HINT = "run `make setup` in the lab's folder"


def _horovod() -> tuple[dict[str, Any] | None, str | None]:
    try:
        with env.quiet_native_stderr():
            import horovod
            import horovod.tensorflow as hvd_tf
    except Exception as e:  # noqa: BLE001 - any import failure means "not usable"
        return None, f"Horovod cannot be imported ({type(e).__name__}: {e}); {SETUP_HINT} to build it"
    info = {
        "version": getattr(horovod, "__version__", None),
        "mpi": bool(hvd_tf.mpi_built()),
        "gloo": bool(hvd_tf.gloo_built()),
        "nccl": bool(hvd_tf.nccl_built()),
    }
    return info, None


def collect() -> dict[str, Any]:
    """Everything the report shows, as plain data; ``problems`` says how to fix each."""
    env.apply_defaults()
    problems: list[str] = []
    report: dict[str, Any] = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "cpus": os.cpu_count(),
        "tensorflow": None,
        "keras": None,
        "horovod": None,
        "mpirun": shutil.which(launchers.tool("mpirun")),
        "mpi": None,
        "horovodrun": shutil.which("horovodrun") or _venv_bin("horovodrun"),
        "gpus": 0,
        "dataset": None,
        "startup_hook": None,
    }

    hook = os.path.join(env.site_packages(), env.PTH_NAME)
    report["startup_hook"] = hook if os.path.exists(hook) else None
    if report["startup_hook"] is None:
        problems.append(f"the start-up hook that sets TF_USE_LEGACY_KERAS=1 is not installed: {SETUP_HINT}")

    keras_issue = env.keras_problem()
    try:
        with env.quiet_native_stderr():
            import tensorflow as tf

        report["tensorflow"] = tf.__version__
        name = getattr(tf.keras, "__name__", "")
        version = getattr(tf.keras, "__version__", None)
        if name.startswith("tf_keras"):
            import tf_keras

            report["keras"] = f"tf-keras {tf_keras.__version__} (Keras 2)"
        else:
            report["keras"] = f"Keras {version or '3'} (Keras 3)"
            keras_issue = keras_issue or env.keras_problem() or "tf.keras is Keras 3: set TF_USE_LEGACY_KERAS=1"
        from tensorflow.python.framework import config as tf_config

        with env.quiet_native_stderr():
            report["gpus"] = len(tf_config.list_physical_devices("GPU"))
    except Exception as e:  # noqa: BLE001
        problems.append(f"TensorFlow cannot be imported ({type(e).__name__}: {e}); {SETUP_HINT}")
    if keras_issue:
        problems.append(keras_issue)

    hvd, issue = _horovod()
    report["horovod"] = hvd
    if issue:
        problems.append(issue)
    elif hvd is not None:
        if not hvd["mpi"] and not hvd["gloo"]:
            problems.append(f"Horovod was built without MPI and Gloo, so it cannot run several workers; {SETUP_HINT}")
        if report["gpus"] and not hvd["nccl"]:
            problems.append(
                "GPUs are visible but Horovod was built without NCCL: "
                "rebuild with `LABKIT_HOROVOD_GPU=1 make setup` for fast GPU allreduce"
            )
    if hvd is not None and not issue and not keras_issue:  # what the checks' observers need, where all is there
        moved = private_names.moved()
        if moved:
            problems.append("this TensorFlow, tf-keras or Horovod no longer has names the checks observe with, so "
                            "the checks may fail correct scripts: " + "; ".join(moved) + ". Use the versions "
                            "`make setup` pins")
    if report["mpirun"]:
        version = launchers.mpi_version()
        report["mpi"] = f"Open MPI {'.'.join(map(str, version))}" if version else "unknown MPI"
    gloo_only = hvd is not None and hvd["gloo"] and not hvd["mpi"]
    if report["mpirun"] is None and not gloo_only:
        problems.append("mpirun not found: sudo apt-get install openmpi-bin libopenmpi-dev (or `make setup`)")
    is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    report["missing_capabilities"] = net.missing_capabilities() if is_root else []
    report["cannot_run"] = cannot_run(report, is_root=is_root)


    try:
        found = data.find()
        report["dataset"] = str(found) if found else None
        if found is None:
            problems.append("Fashion-MNIST not found. " + data.HOW_TO_GET.replace("\n", " "))
    except data.DataError as e:
        problems.append(str(e).replace("\n", " "))

    report["problems"] = problems
    report["ready"] = not problems
    return report


def cannot_run(report: dict[str, Any], is_root: bool) -> list[str]:
    """What the course has that this machine cannot run, and why (pure, from the report)."""
    out = []
    hvd = report.get("horovod")
    if report.get("mpirun") is None or (hvd and not hvd["mpi"]):
        out.append("launches with mpirun (launcher='mpirun', horovodrun --mpi, ipyparallel MPI engines): "
                   + ("Horovod was built without MPI" if hvd and not hvd["mpi"] else "no mpirun")
                   + "; launcher='gloo' runs the Horovod labs")
    if not is_root:
        out.append("virtual nodes, Slurm jobs and the multi-node cells of labs 7 and 8 (`labkit nodes`): need root")
        out.append("`labkit workshop` (JupyterHub for a class) and `labkit image build`: need root")
    else:
        if report.get("missing_capabilities"):
            out.append("virtual nodes, Slurm jobs and the multi-node cells of labs 7 and 8 (`labkit nodes`): "
                       + nodes.needs_capabilities(report["missing_capabilities"]))
        for tool, what in (("sshd", "virtual nodes (labs 7 and 8)"), ("slurmctld", "Slurm jobs (lab 7)")):
            if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
                out.append(f"{what}: {tool} not found ({SETUP_HINT} as root)")
    return out


def _venv_bin(name: str) -> str | None:
    path = os.path.join(os.path.dirname(sys.executable), name)
    return path if os.path.exists(path) else None


def format_report(r: dict[str, Any]) -> str:
    """A human-readable report."""
    hvd = r.get("horovod")
    hvd_text = (
        f"{hvd['version']}  MPI {'yes' if hvd['mpi'] else 'no'} | Gloo {'yes' if hvd['gloo'] else 'no'}"
        f" | NCCL {'yes' if hvd['nccl'] else 'no'}"
        if hvd
        else "not usable"
    )
    rows = [
        ("Python", f"{r['python']}  ({r['executable']})"),
        ("CPU cores", str(r["cpus"])),
        ("TensorFlow", r["tensorflow"] or "not usable"),
        ("tf.keras is", r["keras"] or "-"),
        ("Horovod", hvd_text),
        ("mpirun", f"{r['mpirun']}  ({r.get('mpi') or '?'})" if r["mpirun"] else "not found"),
        ("GPUs", str(r["gpus"]) + ("" if r["gpus"] else "  (the labs run in small mode on the CPU)")),
        ("Fashion-MNIST", r["dataset"] or "not found"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = ["labkit doctor", ""] + [f"  {k.ljust(width)}  {v}" for k, v in rows] + [""]
    cannot = r.get("cannot_run") or []
    if cannot:
        lines.append("Not on this machine:")
        lines += [f"  - {c}" for c in cannot]
        lines.append("")
    if r["ready"]:
        lines.append("Ready: " + ("the labs can run here, except the above." if cannot else "every lab can run here."))
    else:
        lines.append("Not ready. To fix:")
        lines += [f"  - {p}" for p in r["problems"]]
    return "\n".join(lines)


def main(as_json: bool = False) -> int:
    """Print the report; exit code 0 only when ready."""
    report = collect()
    print(json.dumps(report) if as_json else format_report(report))
    return 0 if report["ready"] else 1
