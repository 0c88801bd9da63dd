"""The runnable examples of the README and of docs/*.md.

A runnable example is a ```python block right under a `<!-- runnable ... -->` line.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from support.server_live import child_env

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MARKER = re.compile(r"^<!-- runnable\b[^\n]*-->$", re.MULTILINE)
RUNNABLE = re.compile(r"^<!-- runnable\b[^\n]*-->\n```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
PRINTS = re.compile(r"\s*It prints `([^`]+)`\.")
PYTHON = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def documents() -> list[Path]:
    """The README, then the guides under docs/."""
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def heading_before(text: str) -> str:
    """The last heading in `text`, not counting `#` lines inside code blocks."""
    heading, fenced = "", False
    for line in text.splitlines():
        fenced ^= line.startswith("```")
        if not fenced and line.startswith("#"):
            heading = line.lstrip("#").strip()
    return heading


def runnable_blocks() -> dict[str, str]:
    """Each runnable block of every document by the heading it is under (unique across them)."""
    blocks: dict[str, str] = {}
    for doc in documents():
        text = doc.read_text()
        for found in RUNNABLE.finditer(text):
            heading = heading_before(text[: found.start()])
            assert heading not in blocks, f"two runnable blocks under {heading!r} ({doc.name})"
            blocks[heading] = found.group(1)
    return blocks


def runnable_markers() -> int:
    """How many `<!-- runnable ... -->` lines the documents hold, whatever follows them."""
    return sum(len(MARKER.findall(doc.read_text())) for doc in documents())


def stated_outputs() -> dict[str, str]:
    """What the prose right after a runnable block says it prints ("It prints `…`."), by heading."""
    stated = {}
    for doc in documents():
        text = doc.read_text()
        for found in RUNNABLE.finditer(text):
            said = PRINTS.match(text, found.end() + 1)
            if said:
                stated[heading_before(text[: found.start()])] = said.group(1)
    return stated


def first_block_under(heading: str) -> str:
    """The first ```python block after the heading `heading` in whichever document has it."""
    line = re.compile(rf"^#+ {re.escape(heading)}$", re.MULTILINE)
    for doc in documents():
        text = doc.read_text()
        found = line.search(text)
        if found:
            block = PYTHON.search(text, found.end())
            assert block is not None, f"no python block under {heading!r} in {doc.name}"
            return block.group(1)
    raise AssertionError(f"no document has the heading {heading!r}")


def run(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    script = cwd / "example.py"
    script.write_text(code)
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )
