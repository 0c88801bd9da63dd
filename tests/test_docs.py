"""docs/architecture.md names every module of the library, and only modules that exist;
the links between the README and docs/ lead somewhere.

Re-run after moving or renaming a module: the list of modules comes from the
files under src/duragent, so a module that is new, renamed or gone fails here
naming it.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "duragent"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
# A path ending in .py, as the map writes them: relative to src/duragent
# (`store/_sqlite.py`), or to the repository for these top-level directories.
PY_PATH = re.compile(r"(?<![\w./-])((?:[A-Za-z_][\w-]*/)*[A-Za-z_]\w*\.py)\b")
FROM_THE_ROOT = ("tests/", "bench/", "scripts/", "src/", "docs/")


def modules() -> list[str]:
    """Every module of the library by its path under src/duragent (not `__init__`, `__main__`)."""
    return sorted(
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
    )


def named_paths(text: str) -> set[str]:
    return set(PY_PATH.findall(text))


def test_the_module_list_is_read_from_the_files() -> None:
    assert {"store/_tx.py", "runtime/_worker.py", "types.py"} <= set(modules())
    assert not any(m.endswith(("__init__.py", "__main__.py")) for m in modules())


def test_every_module_has_its_line_in_the_architecture_map() -> None:
    text = ARCHITECTURE.read_text()
    lines = {found.group(1) for found in re.finditer(r"^- `([^`]+\.py)` — \S", text, re.MULTILINE)}
    missing = [m for m in modules() if m not in lines]
    assert missing == [], (
        "give each of these its line in docs/architecture.md §1, under its layer: "
        "- `path` — what it holds"
    )


def test_every_path_the_architecture_names_exists() -> None:
    gone = sorted(
        path
        for path in named_paths(ARCHITECTURE.read_text())
        if not (ROOT / path if path.startswith(FROM_THE_ROOT) else PACKAGE / path).is_file()
    )
    assert gone == [], "docs/architecture.md names files that do not exist"


LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    found, fenced = set(), False
    for line in doc.read_text().splitlines():
        fenced ^= line.startswith("```")
        if not fenced and line.startswith("#"):
            found.add(anchor(line.lstrip("#")))
    return found


def test_every_link_between_the_docs_leads_to_a_file_and_a_heading() -> None:
    broken = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in LINK.findall(doc.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, fragment = target.partition("#")
            linked = (doc.parent / path).resolve() if path else doc
            if not linked.is_file():
                broken.append(f"{doc.name}: {target} (no such file)")
            elif fragment and fragment not in anchors(linked):
                broken.append(f"{doc.name}: {target} (no such heading)")
    assert broken == []
