"""Every private TensorFlow, tf-keras, Horovod and CPython name the observers inside the ranks depend on, in one
table, and :func:`moved`, which says which of them the installed versions no longer have.

No public API gives what these names give (fake GPUs, the data set and the convolutions the checks shrink, the
parameter servers' variable placement, the coordinator's per-worker steps, the dtype Horovod all-reduces, a
fast exit). A new release that renames or moves one would make an observer see nothing, and a check fail a
correct script for a reason the learner cannot fix: ``tests/unit/test_private_names.py`` fails first, and
``labkit doctor`` names what moved.

Each entry: the module, the attribute path in it (``Class.attr``), whether that is an attribute an instance
gets from the class's code (then the source of the class, or of one it derives from, must set it), and the
observer that uses it.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class Private:
    module: str
    path: str  # attribute path in the module: "name" or "Class.name"
    user: str  # the labkit module that depends on it
    instance: bool = False  # set on instances (self.name = ...) by the class's own code

    def __str__(self) -> str:
        return f"{self.module}.{self.path} (used by labkit.instrument.{self.user})"


NAMES: tuple[Private, ...] = (
    Private("atexit", "_run_exitfuncs", "leave"),
    Private("tensorflow.python.eager.context", "PhysicalDevice", "probe_patches"),
    Private("tensorflow.python.distribute.distribute_lib", "StrategyBase.__init__", "dprobe"),
    Private("tensorflow.python.distribute.parameter_server_strategy_v2",
            "ParameterServerStrategyV2Extended._create_variable", "dprobe"),
    Private("tensorflow.python.distribute.coordinator.cluster_coordinator", "Worker._process_closure",
            "hooks.coordinator"),
    Private("tf_keras.src.engine.training", "Model.fit", "hooks.fit"),
    Private("tf_keras.src.engine.training", "Model._steps_per_execution", "dprobe_record", instance=True),
    Private("tf_keras.src.engine.data_adapter", "get_data_handler", "dprobe_record"),
    Private("tf_keras.src.engine.data_adapter", "DataHandler._dataset", "dprobe_record", instance=True),
    Private("tf_keras.src.optimizers.optimizer", "Optimizer._learning_rate", "keras_reads", instance=True),
    Private("tf_keras.src.optimizers.legacy.optimizer_v2", "OptimizerV2._decayed_lr", "keras_reads"),
    Private("tf_keras.src.datasets.fashion_mnist", "load_data", "hooks.dataset"),
    Private("tf_keras.src.layers.convolutional.conv2d", "Conv2D", "hooks.conv"),
    Private("horovod.tensorflow", "_allreduce", "probe_allreduce"),
    Private("horovod.tensorflow", "_grouped_allreduce", "probe_allreduce"),
    Private("horovod.tensorflow", "_allreduce_cond", "probe_allreduce"),
    Private("horovod.tensorflow", "_grouped_allreduce_cond", "probe_allreduce"),
)


def _has(module: ModuleType, entry: Private) -> bool:
    owner: Any = module
    parts = entry.path.split(".")
    for part in parts[:-1] if entry.instance else parts:
        owner = getattr(owner, part, None)
        if owner is None:
            return False
    if not entry.instance:
        return True
    for cls in getattr(owner, "__mro__", ()):  # set by the class or one it derives from
        try:
            if f"self.{parts[-1]} =" in inspect.getsource(cls):
                return True
        except (OSError, TypeError):
            continue
    return False


def moved(names: tuple[Private, ...] = NAMES,
          load: Callable[[str], ModuleType] = importlib.import_module) -> list[str]:
    """The entries of ``names`` the installed packages no longer have, each said with the observer it breaks."""
    out = []
    for entry in names:
        try:
            module = load(entry.module)
        except ImportError as e:
            out.append(f"{entry}: module not importable ({e})")
            continue
        if not _has(module, entry):
            out.append(f"{entry}: not found")
    return out
