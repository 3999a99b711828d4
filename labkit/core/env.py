"""Process environment every lab process needs, set before TensorFlow is imported.

Horovod's Keras API needs Keras 2, which TensorFlow 2.16+ only provides through
the ``tf-keras`` package when ``TF_USE_LEGACY_KERAS=1`` is set before the first
``import tensorflow``. ``make setup`` installs a ``.pth`` start-up hook into the
virtual environment that applies :data:`DEFAULTS` in every interpreter (scripts,
kernels, ipyparallel engines, mpirun children), and importing :mod:`labkit`
applies them too.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, MutableMapping

DEFAULTS: dict[str, str] = {
    "TF_USE_LEGACY_KERAS": "1",  # tf.keras is Keras 2 (tf-keras), as Horovod needs
    "TF_CPP_MIN_LOG_LEVEL": "2",  # only errors from TensorFlow's C++ side
}

PTH_NAME = "labkit_env.pth"
# One line, executed by site.py at interpreter start-up: the defaults, nothing else (a rank is observed only when
# its launcher starts it so, :mod:`labkit.instrument.start`).
PTH_LINE = "import os; [os.environ.setdefault(k, v) for k, v in " + repr(sorted(DEFAULTS.items())) + "]\n"

# Lines TensorFlow and friends print at start-up that say nothing to a learner.
NOISE_MARKERS = (
    "All log messages before absl::InitializeLog()",
    "oneDNN custom operations are on",
    "cudart_stub.cc",
    "cuda_platform.cc",
    "cuda_executor.cc",
    "cuda_diagnostics",
    "Unable to register cu",
    "computation placer already registered",
    "This TensorFlow binary is optimized to use available CPU instructions",
    "To enable the following instructions",
    "rebuild TensorFlow with the appropriate compiler flags",
    "TF-TRT Warning",
    "absl::InitializeLog",
)


def apply_defaults(environ: MutableMapping[str, str] | None = None) -> MutableMapping[str, str]:
    """Set each default that is not already set; return the mapping."""
    env = os.environ if environ is None else environ
    for key, value in DEFAULTS.items():
        env.setdefault(key, value)
    return env


def is_noise(line: str) -> bool:
    """True for a start-up log line that should not be shown to a learner."""
    return any(marker in line for marker in NOISE_MARKERS)


def thread_env(threads: int) -> dict[str, str]:
    """Variables that keep TensorFlow, OpenMP and BLAS to ``threads`` threads."""
    n = str(max(1, int(threads)))
    return {
        "TF_NUM_INTRAOP_THREADS": n,
        "TF_NUM_INTEROP_THREADS": n,
        "OMP_NUM_THREADS": n,
        "OPENBLAS_NUM_THREADS": n,
        "MKL_NUM_THREADS": n,
    }


def keras_problem() -> str | None:
    """A message when this interpreter's tf.keras is not Keras 2, else None."""
    if os.environ.get("TF_USE_LEGACY_KERAS") not in ("1", "true", "True"):
        return (
            "TF_USE_LEGACY_KERAS is not 1, so tf.keras is Keras 3, which Horovod cannot use. "
            "Run `make setup` (it installs a start-up hook in .venv), or `export TF_USE_LEGACY_KERAS=1` "
            "before starting Python/Jupyter, and restart the kernel."
        )
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        name = getattr(tf.keras, "__name__", "")
        if not name.startswith("tf_keras"):
            return (
                "TensorFlow was imported before TF_USE_LEGACY_KERAS=1 was set, so tf.keras is Keras 3. "
                "Restart the kernel/process; `import labkit` (or the .venv start-up hook) sets it in time."
            )
    return None


def site_packages() -> str:
    """The site-packages folder of the running interpreter's environment."""
    import sysconfig

    return sysconfig.get_paths()["purelib"]


def install_pth(target_dir: str | None = None) -> str:
    """Write the start-up hook into site-packages; return its path."""
    path = os.path.join(target_dir or site_packages(), PTH_NAME)
    with open(path, "w") as f:
        f.write(PTH_LINE)
    return path


@contextlib.contextmanager
def setting(name: str, value: str) -> Iterator[None]:
    """``os.environ[name] = value`` inside the block (for this process and what it starts); the value before,
    or its absence, afterwards."""
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


@contextlib.contextmanager
def quiet_native_stderr() -> Iterator[None]:
    """Silence C++ start-up logging (written straight to fd 2) inside the block.

    Python-level errors still surface: they are raised, not printed, inside the block.
    """
    try:
        saved = os.dup(2)
    except OSError:  # no usable fd 2
        yield
        return
    try:
        with open(os.devnull, "wb") as devnull:
            sys.stderr.flush()
            os.dup2(devnull.fileno(), 2)
            try:
                yield
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
    finally:
        os.close(saved)
