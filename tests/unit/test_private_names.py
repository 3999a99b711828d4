"""The private names the observers depend on are all there in the installed TensorFlow, tf-keras and Horovod, and
the table lists every private module the observers import: a release that moves one fails here first."""

from __future__ import annotations

import re
import types
from pathlib import Path

from labkit.instrument import private_names
from labkit.instrument.private_names import Private

INSTRUMENT = Path(private_names.__file__).parent
PRIVATE = r"(?:tensorflow\.python|tf_keras\.src|keras\.src)(?:\.\w+)+"
FROM_IMPORT = re.compile(rf"from ({PRIVATE}) import (\w+)")  # from tensorflow.python.eager import context
QUOTED = re.compile(rf"[\"']({PRIVATE})[\"']")  # a module named for an import hook


def private_modules(source: str) -> set[str]:
    return {f"{m}.{name}" for m, name in FROM_IMPORT.findall(source)} | set(QUOTED.findall(source))


def test_every_private_name_is_where_the_observers_look() -> None:
    assert private_names.moved() == []


def test_every_private_module_an_observer_names_is_in_the_table() -> None:
    listed = {entry.module for entry in private_names.NAMES}
    used = {m for path in INSTRUMENT.rglob("*.py") if path.name != "private_names.py"
            for m in private_modules(path.read_text())}
    assert {"tensorflow.python.eager.context", "tf_keras.src.engine.training"} <= used  # the scan sees them
    assert used <= listed, f"add to labkit.instrument.private_names.NAMES: {sorted(used - listed)}"


def test_every_entry_is_still_used_by_the_module_it_names() -> None:
    for entry in private_names.NAMES:
        source = (INSTRUMENT / f"{entry.user.replace('.', '/')}.py").read_text()
        assert entry.path.split(".")[-1] in source, f"{entry}: no longer used there; remove it from the table"


def test_a_moved_name_is_reported_with_the_observer_it_breaks() -> None:
    class Handler:
        def __init__(self) -> None:
            self.other = 1

    fake = types.SimpleNamespace(present=1, Handler=Handler)

    def load(name: str) -> object:
        if name == "gone":
            raise ImportError("No module named 'gone'")
        return fake

    names = (Private("m", "present", "shrink"), Private("m", "absent", "shrink"),
             Private("m", "Handler._dataset", "dprobe_record", instance=True),
             Private("m", "Handler.other", "dprobe_record", instance=True), Private("gone", "x", "observe"))
    assert private_names.moved(names, load) == [
        "m.absent (used by labkit.instrument.shrink): not found",
        "m.Handler._dataset (used by labkit.instrument.dprobe_record): not found",
        "gone.x (used by labkit.instrument.observe): module not importable (No module named 'gone')",
    ]
