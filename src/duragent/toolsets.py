"""Small built-in toolsets, for `duragent run`.

File tools only touch paths inside the task's working directory (the
`workdir` key of the task context, fixed when the task starts, so a resumed
task works where it began). Reading, listing and fetching are replay-safe;
writing a file asks the user first and is never re-run after a crash.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from duragent.errors import UsageError
from duragent.runtime.context import ToolContext
from duragent.runtime.tools import Tool, tool

WORKDIR_KEY = "workdir"
MAX_CHARS = 20_000
MAX_ENTRIES = 500


def _root(ctx: ToolContext) -> Path:
    return Path(ctx.context.get(WORKDIR_KEY) or os.getcwd()).resolve()


def _inside(ctx: ToolContext, path: str) -> Path:
    root = _root(ctx)
    target = (root / path).resolve()  # resolves `..` and symlinks before the check
    if not target.is_relative_to(root):
        raise PermissionError(f"{path!r} is outside the working directory {root}")
    return target


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters not shown]"


@tool(name="read_file", replay="safe")
async def read_file(path: str, ctx: ToolContext, max_chars: int = MAX_CHARS) -> str:
    """Read a text file in the working directory.

    Args:
        path: the file, relative to the working directory
        max_chars: show at most this many characters
    """
    target = _inside(ctx, path)
    data = await asyncio.to_thread(target.read_bytes)
    return _clip(data.decode("utf-8", errors="replace"), max_chars)


@tool(name="list_dir", replay="safe")
async def list_dir(ctx: ToolContext, path: str = ".") -> str:
    """List a directory in the working directory: sub-directories end with '/'.

    Args:
        path: the directory, relative to the working directory
    """
    target = _inside(ctx, path)

    def listing() -> str:
        lines = []
        for entry in sorted(target.iterdir(), key=lambda p: p.name)[:MAX_ENTRIES]:
            if entry.is_dir():
                lines.append(f"{entry.name}/")
            else:
                lines.append(f"{entry.name}  ({entry.stat().st_size} bytes)")
        return "\n".join(lines) or "(empty)"

    return await asyncio.to_thread(listing)


@tool(name="write_file", requires_approval=True)
async def write_file(path: str, content: str, ctx: ToolContext) -> str:
    """Write a text file in the working directory (replacing it). The user must approve.

    Args:
        path: the file, relative to the working directory
        content: the whole new text of the file
    """
    target = _inside(ctx, path)

    def write() -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")

    await asyncio.to_thread(write)
    return f"wrote {len(content)} characters to {path}"


@tool(name="http_get", replay="safe", timeout=60.0)
async def http_get(url: str, max_chars: int = MAX_CHARS) -> str:
    """Fetch a web page or API response with HTTP GET.

    Args:
        url: an http:// or https:// address
        max_chars: show at most this many characters of the body
    """
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"only http:// and https:// addresses can be fetched, not {url!r}")
    try:
        import httpx
    except ImportError:  # pragma: no cover - httpx comes with the openai/anthropic SDKs
        raise UsageError("http_get needs httpx: pip install httpx") from None
    async with httpx.AsyncClient(timeout=30.0, follow_redirects=True) as client:
        response = await client.get(url)
    kind = response.headers.get("content-type", "")
    head = f"HTTP {response.status_code} {kind}".strip()
    return head + "\n\n" + _clip(response.text, max_chars)


TOOLSETS: dict[str, tuple[Tool, ...]] = {
    "default": (read_file, list_dir, write_file, http_get),
    "readonly": (read_file, list_dir, http_get),
    "none": (),
}


def toolset(name: str) -> list[Tool]:
    """The tools of a named toolset."""
    try:
        return list(TOOLSETS[name])
    except KeyError:
        known = ", ".join(TOOLSETS)
        raise UsageError(f"no toolset named {name!r}; choose one of: {known}") from None
