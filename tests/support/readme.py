"""The README's runnable examples: a ```python block right under a `<!-- runnable ... -->` line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from support.server_live import child_env

README = Path(__file__).resolve().parents[2] / "README.md"
RUNNABLE = re.compile(r"^<!-- runnable\b[^\n]*-->\n```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
PRINTS = re.compile(r"\s*It prints `([^`]+)`\.")


def heading_before(text: str) -> str:
    """The last heading in `text`, not counting `#` lines inside code blocks."""
    heading, fenced = "", False
    for line in text.splitlines():
        fenced ^= line.startswith("```")
        if not fenced and line.startswith("#"):
            heading = line.lstrip("#").strip()
    return heading


def runnable_blocks() -> dict[str, str]:
    """Each runnable block by the heading it is under."""
    text = README.read_text()
    blocks = {}
    for found in RUNNABLE.finditer(text):
        heading = heading_before(text[: found.start()])
        assert heading not in blocks, f"two runnable blocks under {heading!r}"
        blocks[heading] = found.group(1)
    return blocks


def stated_outputs() -> dict[str, str]:
    """What the prose right after a runnable block says it prints ("It prints `…`."), by heading."""
    text = README.read_text()
    stated = {}
    for found in RUNNABLE.finditer(text):
        said = PRINTS.match(text, found.end() + 1)
        if said:
            stated[heading_before(text[: found.start()])] = said.group(1)
    return stated


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
