"""Where the `duragent` commands keep their store, as real processes (issue 37, items 1 and 4).

- Without --store or DURAGENT_STORE, the store is duragent.db in the user's data
  directory ($XDG_DATA_HOME/duragent), never in the folder a command runs in,
  which `duragent run`'s file tools may touch.
- DURAGENT_STORE names the store for every command that takes --store; the
  flag wins over it.
- A command that reads or acts on existing tasks never creates a store: it
  says, in one line, that none is there and where it looked, and exits 1.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from duragent import Agent, BuiltinTools, Runtime, ScriptedModel
from duragent.types import EntryKind, TaskStatus
from support.cli_run import KEY_ENV, MODEL, SECRET, Serve, serve, stored, task_id_in
from support.llm_servers import ToolCall
from support.server_live import child_env, run_script

__all__ = ["serve"]  # the fixture this module uses from support.cli_run

# Every command that reads a store or acts on tasks already in it.
READ_OR_ACT = [
    ["ls"],
    ["counts"],
    ["show", "t_x"],
    ["history", "t_x"],
    ["export", "t_x"],
    ["approvals", "t_x"],
    ["approve", "t_x"],
    ["deny", "t_x"],
    ["queue", "ls"],
    ["queue", "rm", "emails"],
    ["schedule", "ls"],
    ["schedule", "pause", "nightly"],
    ["schedule", "resume", "nightly"],
    ["schedule", "rm", "nightly"],
    ["pause", "t_x"],
    ["resume", "t_x"],
    ["abort", "t_x"],
    ["retry", "t_x"],
    ["send", "t_x", "hello"],
    ["fork", "t_x", "--at", "1"],
    ["purge", "--older-than", "1d"],
    ["erase-owner", "alice", "--yes"],
    ["continue", "t_x"],
]


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = child_env(XDG_DATA_HOME=str(tmp_path / "data"), COLUMNS="200", **extra)
    env.pop("DURAGENT_STORE", None)
    env.update(extra)
    return env


def run_all(
    commands: list[list[str]], cwd: Path, env: dict[str, str] | list[dict[str, str]]
) -> list[tuple[int, str, str]]:
    """Each command as its own process (with its environment, or all with `env`), all at
    once; (exit code, stdout, stderr) each."""
    envs = env if isinstance(env, list) else [env] * len(commands)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "duragent", *args],
            cwd=cwd,
            env=one_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args, one_env in zip(commands, envs, strict=True)
    ]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        out.append((proc.returncode, stdout, stderr))
    return out


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.slow
def test_commands_that_read_or_act_never_create_a_store(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    expected = tmp_path / "data" / "duragent" / "duragent.db"
    cases = [(args, env_for(tmp_path), str(expected)) for args in READ_OR_ACT]
    # The same for a store named by the flag or the environment, SQLite or JSONL.
    cases += [
        (["ls", "--store", "sqlite:///flag.db"], env_for(tmp_path), str(work / "flag.db")),
        (
            ["counts"],
            env_for(tmp_path, DURAGENT_STORE="sqlite:///env.db"),
            str(work / "env.db"),
        ),
        (["show", "t_x", "--store", "jsonl:///log"], env_for(tmp_path), str(work / "log")),
    ]
    got = run_all([a for a, _, _ in cases], work, [e for _, e, _ in cases])
    for (args, _, where), (code, stdout, stderr) in zip(cases, got, strict=True):
        lines = stderr.strip().splitlines()
        assert code == 1, (args, code, stdout, stderr)
        assert len(lines) == 1, (args, stderr)
        assert lines[0].startswith(f"error: no store at {where}: "), (args, stderr)
        assert "DURAGENT_STORE" in lines[0]
        assert "no tasks" not in stdout, args
    assert files_under(work) == []
    assert not (tmp_path / "data").exists()  # not even the default store's folder


@pytest.mark.slow
def test_duragent_store_names_the_store_and_the_flag_wins(tmp_path: Path) -> None:
    agent = Agent(name="a", model=ScriptedModel(["ok"]), builtin_tools=BuiltinTools(plan=False))

    async def one_task(url: str, text: str) -> str:
        async with Runtime(url, [agent], run_worker=False) as rt:
            return (await rt.submit("a", text)).task_id

    from_env = asyncio.run(one_task(f"sqlite:///{tmp_path}/env.db", "from env"))
    from_flag = asyncio.run(one_task(f"sqlite:///{tmp_path}/flag.db", "from flag"))
    env = env_for(tmp_path, DURAGENT_STORE=f"sqlite:///{tmp_path}/env.db")
    (by_env, by_flag, help_text) = run_all(
        [["ls"], ["ls", "--store", f"sqlite:///{tmp_path}/flag.db"], ["ls", "--help"]],
        tmp_path,
        env,
    )
    assert by_env[0] == 0 and from_env in by_env[1] and from_flag not in by_env[1], by_env
    assert by_flag[0] == 0 and from_flag in by_flag[1] and from_env not in by_flag[1], by_flag
    assert "DURAGENT_STORE" in help_text[1]


@pytest.mark.slow
def test_run_keeps_its_store_out_of_the_folder_its_tools_may_touch(
    serve: Serve, tmp_path: Path
) -> None:
    work = tmp_path / "project"
    work.mkdir()
    (work / "notes.txt").write_text("hello")
    server = serve([[ToolCall("list_dir", {"path": "."})], "Only your notes."])
    env = env_for(tmp_path, **{KEY_ENV: SECRET})
    # The defaults of docs/workers-server-cli.md's `duragent run "…" --model …`: --workdir is ".".
    args = ["run", "What is here?", "--model", MODEL, "--base-url", server.base_url]
    ((code, out, err),) = run_all([[*args, "--api-key-env", KEY_ENV, "--allow", "read"]], work, env)
    assert code == 0, out + err
    assert files_under(work) == ["notes.txt"]
    home = tmp_path / "data" / "duragent"
    assert (home / "duragent.db").is_file()
    assert os.stat(home).st_mode & 0o777 == 0o700
    task_id = task_id_in(out)
    # The continue hint needs no --store: the next command finds the same store.
    assert "--store" not in out
    ((code, listed, _),) = run_all([["ls"]], tmp_path, env)
    assert code == 0 and task_id in listed
    task, entries = asyncio.run(stored(f"sqlite:///{home}/duragent.db", task_id))
    assert task.status is TaskStatus.COMPLETED
    (listing,) = [e.payload["content"] for e in entries if e.kind is EntryKind.TOOL_RESULT]
    assert listing == "notes.txt  (5 bytes)"


@pytest.mark.slow
def test_run_with_its_store_in_the_workdir_cannot_overwrite_it(
    serve: Serve, tmp_path: Path
) -> None:
    """The reported case, as given: the store inside the root, every tool allowed."""
    work = tmp_path / "project"
    work.mkdir()
    url = f"sqlite:///{work}/duragent.db"
    server = serve(
        [
            [
                ToolCall("list_dir", {"path": "."}),
                ToolCall("write_file", {"path": "duragent.db", "content": "gone"}),
                ToolCall("write_file", {"path": str(work / "duragent.db-wal"), "content": "x"}),
            ],
            "I could not.",
        ]
    )
    env = env_for(tmp_path, **{KEY_ENV: SECRET})
    args = ["run", "Wreck it", "--model", MODEL, "--base-url", server.base_url, "--yes"]
    ((code, out, err),) = run_all(
        [[*args, "--api-key-env", KEY_ENV, "--store", url, "--workdir", str(work)]], work, env
    )
    assert code == 0, out + err
    task, entries = asyncio.run(stored(url, task_id_in(out)))  # opens: not destroyed
    assert task.status is TaskStatus.COMPLETED and task.output == "I could not."
    listing, *writes = sorted(
        (e.payload for e in entries if e.kind is EntryKind.TOOL_RESULT),
        key=lambda r: r["tool_call_id"],
    )
    assert listing["content"] == "(empty)"
    for w in writes:
        assert w["outcome"] == "error"
        assert "is duragent's task store: no tool may read, write or list it" in w["content"]
        assert str(work) not in w["content"]


@pytest.mark.slow
def test_a_missing_directory_is_one_line_not_a_corrupt_store(tmp_path: Path) -> None:
    listed = run_script("ls", "--store", "sqlite:///nodir/x.db", cwd=tmp_path)
    assert listed.returncode == 1
    (line,) = listed.stderr.strip().splitlines()  # one line, not a traceback
    assert line.startswith("error: "), line
    assert f"directory does not exist: {tmp_path}/nodir" in line and "sqlite:////nodir" in line
    assert "corrupt" not in line.lower() and not (tmp_path / "nodir").exists()
