"""Apply a unified diff (``patch -p1 --forward``'s job) where neither ``patch`` nor ``git`` is installed.

Usage: python3 scripts/apply_patch.py PATCH [DIR]   (paths in the diff lose their first component, as with -p1)

Only what the project's patches use: changes to existing text files, hunks found by their context lines at
the stated line or the nearest offset. All hunks are checked before any file is written; a diff that is
already applied, or does not fit, leaves every file untouched and exits 1 with the hunk that failed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def parse(text: str) -> list[tuple[str, list[tuple[int, list[str], list[str]]]]]:
    """``[(path, [(old_start, old_lines, new_lines), ...]), ...]`` from a unified diff (paths as written)."""
    files: list[tuple[str, list[tuple[int, list[str], list[str]]]]] = []
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            path = lines[i + 1][4:].split("\t")[0].strip()
            files.append((path, []))
            i += 2
            continue
        found = HUNK.match(line)
        if found and files:
            start = int(found.group(1))
            old_count = int(found.group(2) or 1)
            new_count = int(found.group(4) or 1)
            old: list[str] = []
            new: list[str] = []
            i += 1
            while i < len(lines) and (len(old) < old_count or len(new) < new_count):
                body = lines[i]
                tag, rest = body[:1], body[1:]
                if body.startswith("\\"):  # "\ No newline at end of file"
                    for side in (old, new):
                        if side:
                            side[-1] = side[-1].rstrip("\n")
                elif tag == " " or body in ("\n", ""):
                    old.append(rest if tag == " " else "\n")
                    new.append(rest if tag == " " else "\n")
                elif tag == "-":
                    old.append(rest)
                elif tag == "+":
                    new.append(rest)
                else:
                    raise ValueError(f"line {i + 1} of the diff is not part of a hunk: {body!r}")
                i += 1
            files[-1][1].append((start, old, new))
            continue
        i += 1
    return files


def apply_hunks(text: list[str], hunks: list[tuple[int, list[str], list[str]]]) -> list[str]:
    """``text`` with every hunk applied; ValueError naming the first hunk whose context is not there."""
    out = list(text)
    shift = 0
    for n, (start, old, new) in enumerate(hunks, 1):
        want = max(start - 1 + shift, 0)
        for offset in sorted(range(-len(out) - 1, len(out) + 1), key=abs):
            at = want + offset
            if 0 <= at <= len(out) - len(old) and out[at:at + len(old)] == old:
                out[at:at + len(old)] = new
                shift += len(new) - len(old)
                break
        else:
            raise ValueError(f"hunk {n} (at line {start}) does not match")
    return out


def apply(patch: Path, root: Path, strip: int = 1) -> list[Path]:
    """Apply ``patch`` under ``root``; the files changed. Nothing is written unless every hunk fits."""
    results: dict[Path, str] = {}
    for path, hunks in parse(patch.read_text()):
        target = root.joinpath(*Path(path).parts[strip:])
        try:
            changed = apply_hunks(target.read_text().splitlines(keepends=True), hunks)
        except ValueError as e:
            raise ValueError(f"{target}: {e}") from None
        results[target] = "".join(changed)
    for target, text in results.items():
        target.write_text(text)
    return list(results)


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        changed = apply(Path(argv[0]), Path(argv[1] if len(argv) > 1 else "."))
    except (OSError, ValueError) as e:
        print(f"patch did not apply: {e}", file=sys.stderr)
        return 1
    for path in changed:
        print(f"patched {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
