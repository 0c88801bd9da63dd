"""No tool of ours touches a store this process has open (issue 37, item 1).

The store is often inside the file tools' root (`duragent run --workdir .`
beside `./duragent.db`, an agent given its data directory): every spelling of
any of its files (relative, absolute, `..`, a symlink, a hard link, another
case) is refused by read_file and write_file and left out by list_dir, while
the store is open; once it closes, the path is a file like any other.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from duragent import Agent, BuiltinTools, Runtime, ScriptedModel, ToolCall
from duragent.runtime._tools import Tool
from duragent.store import open_store
from duragent.toolsets import toolset
from duragent.types import EntryKind, TaskStatus

REFUSED = "is duragent's task store: no tool may read, write or list it"


def file_tools(root: Path) -> dict[str, Tool]:
    return {t.name: t for t in toolset("default", root=root, allow={"read", "write"})}


async def call(tools: dict[str, Tool], name: str, **args: Any) -> str:
    return str(await tools[name].invoke(args, None))  # type: ignore[arg-type]


async def a_task(url: str) -> str:
    """A store at `url` holding one task; its id."""
    agent = Agent(name="a", model=ScriptedModel(["ok"]), builtin_tools=BuiltinTools(plan=False))
    async with Runtime(url, [agent], run_worker=False) as rt:
        return (await rt.submit("a", "keep me")).task_id


async def still_there(url: str, task_id: str) -> None:
    store = open_store(url)
    await store.open()
    try:
        assert (await store.get_task(task_id)).input == "keep me"
    finally:
        await store.close()


def spellings(work: Path) -> dict[str, str]:
    """Every way to name ./duragent.db (or a file of its) from the root `work`."""
    (work / "sub").mkdir()
    (work / "link.db").symlink_to("duragent.db")
    (work / "linkdir").symlink_to(".")
    os.link(work / "duragent.db", work / "hard.db")
    return {
        "relative": "duragent.db",
        "dot": "./duragent.db",
        "absolute": str(work / "duragent.db"),
        "dotdot": "sub/../duragent.db",
        "symlink": "link.db",
        "through a linked directory": "linkdir/duragent.db",
        "hard link": "hard.db",
        "case": "DURAGENT.DB",
        "wal": "duragent.db-wal",
        "shm": "duragent.db-shm",
        "journal": "duragent.db-journal",
        "wake directory": ".duragent.db.wake",
        "in the wake directory": ".duragent.db.wake/x.c",
        "under the file": "duragent.db/x",
    }


@pytest.mark.parametrize("tool", ["read_file", "write_file", "list_dir"])
async def test_every_spelling_of_an_open_sqlite_store_is_refused(tmp_path: Path, tool: str) -> None:
    url = f"sqlite:///{tmp_path}/duragent.db"
    task_id = await a_task(url)
    names = spellings(tmp_path)
    before = (tmp_path / "duragent.db").read_bytes()
    tools = file_tools(tmp_path)
    store = open_store(url)  # open, as a worker's is while its tools run
    await store.open()
    try:
        for how, path in names.items():
            args: dict[str, Any] = {"path": path}
            if tool == "write_file":
                args["content"] = "not a database"
            with pytest.raises(PermissionError) as refused:
                await call(tools, tool, **args)
            said = str(refused.value)
            assert "\n" not in said, how
            if how == "dotdot":
                assert "'..' is not allowed" in said
            else:  # named relative to the root, as the model may see it
                shown = "duragent.db" if how == "absolute" else path
                assert said == f"{shown!r} {REFUSED}", how
            assert str(tmp_path) not in said, how
    finally:
        await store.close()
    assert (tmp_path / "duragent.db").read_bytes() == before
    assert not (tmp_path / ".duragent.db.wake" / "x.c").exists()
    await still_there(url, task_id)


async def test_list_dir_leaves_an_open_stores_files_out(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/duragent.db"
    await a_task(url)
    spellings(tmp_path)
    (tmp_path / "notes.txt").write_text("hi")
    tools = file_tools(tmp_path)
    store = open_store(url)
    await store.open()
    try:
        await store.wait_for_change(0.01)  # listening: its wake-up directory exists
        assert (tmp_path / ".duragent.db.wake").is_dir()
        assert (tmp_path / "duragent.db-wal").exists()
        shown = (await call(tools, "list_dir")).splitlines()
        # The file, its journals, the wake-ups, the hard link and the link to it are gone.
        assert shown == ["linkdir  (link)", "notes.txt  (2 bytes)", "sub/"]
    finally:
        await store.close()
    # Closed, it is no one's store: a file like any other.
    shown = (await call(tools, "list_dir")).splitlines()
    assert "duragent.db" in " ".join(shown) and "hard.db" in " ".join(shown)
    from duragent.store._open_files import is_store_path

    assert not is_store_path(tmp_path / "duragent.db")


async def test_an_open_jsonl_store_is_refused_whole(tmp_path: Path) -> None:
    url = f"jsonl:///{tmp_path}/log"
    task_id = await a_task(url)
    (tmp_path / "log-link").symlink_to("log")
    tools = file_tools(tmp_path)
    store = open_store(url)
    await store.open()
    try:
        for path in ("log", "log/log.jsonl", "log/lock", "log/log.jsonl.compact", "log-link/lock"):
            for tool, extra in (("read_file", {}), ("write_file", {"content": "x"})):
                with pytest.raises(PermissionError, match=REFUSED):
                    await call(tools, tool, path=path, **extra)
        with pytest.raises(PermissionError, match=REFUSED):
            await call(tools, "list_dir", path="log")
        assert await call(tools, "list_dir") == "(empty)"  # a link to it is left out too
    finally:
        await store.close()
    await still_there(url, task_id)


async def test_a_hard_link_made_after_the_check_is_refused_at_the_open(tmp_path: Path) -> None:
    """The path is checked, then opened: what was opened is checked again by inode."""
    from duragent.toolsets import _open_regular

    url = f"sqlite:///{tmp_path}/duragent.db"
    await a_task(url)
    store = open_store(url)
    await store.open()
    try:
        os.link(tmp_path / "duragent.db", tmp_path / "late.db")
        for flags in (os.O_RDONLY, os.O_WRONLY | os.O_CREAT):
            with pytest.raises(PermissionError, match=REFUSED):
                _open_regular(tmp_path / "late.db", flags)
    finally:
        await store.close()


async def test_a_model_cannot_destroy_the_store_its_run_is_kept_in(tmp_path: Path) -> None:
    """The reported case: a run whose root holds its own store, every tool allowed."""
    url = f"sqlite:///{tmp_path}/duragent.db"
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.db").symlink_to("duragent.db")
    (tmp_path / "notes.txt").write_text("hello")
    calls = [
        ToolCall("list_dir", {"path": "."}),
        ToolCall("write_file", {"path": "duragent.db", "content": "not a database"}),
        ToolCall("write_file", {"path": str(tmp_path / "duragent.db-wal"), "content": "x"}),
        ToolCall("read_file", {"path": "link.db"}),
        ToolCall("write_file", {"path": "sub/../duragent.db", "content": "x"}),
        ToolCall("read_file", {"path": "notes.txt"}),
    ]
    agent = Agent(
        name="wrecker",
        model=ScriptedModel([calls, "done"]),
        tools=toolset("default", root=tmp_path, allow={"read", "write"}),
        builtin_tools=BuiltinTools(plan=False),
    )
    async with Runtime(url, [agent], poll_interval=0.05) as rt:
        os.link(tmp_path / "duragent.db", tmp_path / "hard.db")
        sub = await rt.submit("wrecker", "wreck it")
        task = await sub.wait(timeout=30)
        assert task.status is TaskStatus.COMPLETED, task.error
        entries = await rt.store.entries(task.id)
    out = sorted(
        (e.payload for e in entries if e.kind is EntryKind.TOOL_RESULT),
        key=lambda r: int(r["tool_call_id"].rsplit("_", 1)[1]),
    )
    assert [r["outcome"] for r in out] == ["ok", "error", "error", "error", "error", "ok"]
    assert out[0]["content"].splitlines() == ["notes.txt  (5 bytes)", "sub/"]
    for r in out[1:4]:
        assert REFUSED in r["content"] and str(tmp_path) not in r["content"]
    assert out[5]["content"] == "hello"
    await still_there_by_status(url, task.id)


async def still_there_by_status(url: str, task_id: str) -> None:
    store = open_store(url)
    await store.open()
    try:
        assert (await store.get_task(task_id)).status is TaskStatus.COMPLETED
    finally:
        await store.close()
