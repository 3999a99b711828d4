"""scripts/apply_patch.py: the unified-diff applier make setup uses where neither patch nor git is installed."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("apply_patch", ROOT / "scripts" / "apply_patch.py")
assert _spec and _spec.loader
apply_patch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(apply_patch)

DIFF = """\
diff -ru a/pkg/m.py b/pkg/m.py
--- a/pkg/m.py
+++ b/pkg/m.py
@@ -2,3 +2,4 @@
 two
-three
+THREE
+three and a half
 four
@@ -8,2 +9,2 @@
 eight
-nine
+NINE
"""


def _tree(tmp_path: Path, lines: list[str]) -> Path:
    (tmp_path / "pkg").mkdir(parents=True)
    (tmp_path / "pkg" / "m.py").write_text("".join(f"{x}\n" for x in lines))
    return tmp_path


def test_hunks_apply_at_their_line_and_at_an_offset(tmp_path: Path) -> None:
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    patch = tmp_path / "d.patch"
    patch.write_text(DIFF)
    root = _tree(tmp_path / "a", ["zero", "zero", *words])  # two lines more than the diff expects
    assert apply_patch.main([str(patch), str(root)]) == 0
    assert (root / "pkg" / "m.py").read_text().split() == [
        "zero", "zero", "one", "two", "THREE", "three", "and", "a", "half", "four", "five", "six", "seven",
        "eight", "NINE"]


def test_nothing_is_written_when_a_hunk_does_not_fit(tmp_path: Path) -> None:
    patch = tmp_path / "d.patch"
    patch.write_text(DIFF)
    root = _tree(tmp_path / "a", ["one", "two", "three", "four", "five", "six", "seven", "eight", "ten"])
    before = (root / "pkg" / "m.py").read_text()
    assert apply_patch.main([str(patch), str(root)]) == 1
    assert (root / "pkg" / "m.py").read_text() == before


@pytest.mark.slow  # 2 s or more: make test, not the 90 s of make test-fast
def test_the_horovod_patch_gives_what_patch_gives(tmp_path: Path) -> None:
    sdist = Path.home() / ".cache" / "labkit" / "sdist" / "horovod-0.28.1.tar.gz"
    if not sdist.exists() or not shutil.which("patch"):
        pytest.skip("needs the cached Horovod source release and the patch program")
    diff = ROOT / "patches" / "horovod-0.28.1-tf2.21.patch"
    for name in ("ours", "theirs"):
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp_path / name, filter="data")
    ours, theirs = tmp_path / "ours" / "horovod-0.28.1", tmp_path / "theirs" / "horovod-0.28.1"
    subprocess.run(["patch", "-p1", "--forward", "-s", "-i", str(diff)], cwd=theirs, check=True)
    assert len(apply_patch.apply(diff, ours)) == 3
    assert subprocess.run(["diff", "-r", str(ours), str(theirs)], capture_output=True).returncode == 0
    assert apply_patch.main([str(diff), str(ours)]) == 1  # already applied: refused, like patch --forward
