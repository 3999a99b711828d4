"""docs/architecture.md names every module of the package, and only modules that exist."""

import re

from helpers import paths

PACKAGE = paths.ROOT / "labkit"
DOC = paths.ROOT / "docs" / "architecture.md"


def modules() -> set[str]:
    return {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
            if p.name != "__init__.py" and "__pycache__" not in p.parts}


def every_module_section() -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index("\n## Every module\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end == -1 else text[start:end]


def test_every_module_is_named():
    text = DOC.read_text(encoding="utf-8")
    missing = sorted(m for m in modules() if f"`{m}`" not in text)
    assert not missing, (f"add these modules to docs/architecture.md's \"Every module\" section: "
                         f"{', '.join(missing)}")


def test_no_stale_module_is_named():
    named = set(re.findall(r"^- `([\w/]+\.py)` - ", every_module_section(), re.MULTILINE))
    stale = sorted(named - modules())
    assert not stale, f"docs/architecture.md's \"Every module\" section names modules that do not exist: {stale}"
