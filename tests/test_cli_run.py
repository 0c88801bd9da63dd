"""`duragent run` and `duragent continue` as real processes, against a local server
that speaks the OpenAI streaming wire format: tools, Ctrl-C to pause and to abort,
approvals typed at the terminal, and the API key kept out of every output."""

from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path

import pytest

from duragent.cli._run import Grants, Options
from duragent.store import open_store
from duragent.store._commits import Commit, TaskPatch
from duragent.toolsets import WORKDIR_KEY
from duragent.types import EntryKind, Task, TaskStatus
from support.cli_run import (
    KEY_ENV,
    MODEL,
    SECRET,
    Cli,
    Serve,
    continue_hint,
    run_args,
    serve,
    store_bytes,
    stored,
    task_id_in,
    workdir,
)
from support.llm_servers import Answer, ToolCall
from support.server_live import child_env, run_script

__all__ = ["serve", "workdir"]  # the fixtures this module uses from support.cli_run

# --- a task from start to end ------------------------------------------------------------


@pytest.mark.slow
async def test_run_streams_a_task_with_tools_to_completion(
    serve: Serve, workdir: Path, tmp_path: Path
) -> None:
    server = serve(
        [
            Answer(
                "Let me look at your files.",
                [ToolCall("list_dir", {"path": "."}), ToolCall("read_file", {"path": "notes.txt"})],
                input_tokens=40,
                output_tokens=12,
            ),
            Answer("Your notes say hello.", input_tokens=90, output_tokens=6),
        ]
    )
    store = f"sqlite:///{tmp_path}/cli.db"

    code, out, err = Cli(*run_args(server, store, workdir, "Summarise my notes")).finish()

    assert code == 0, out + err
    task_id = task_id_in(out)
    assert "Let me look at your files." in out
    assert "⚙ list_dir(path='.')" in out and "⚙ read_file(path='notes.txt')" in out
    assert "✓ read_file ok: hello from the notes" in out
    assert "Your notes say hello." in out
    assert f"✓ completed task {task_id} (2 rounds; 130 in, 18 out tokens)" in out
    task, entries = await stored(store, task_id)
    assert task.status is TaskStatus.COMPLETED and task.output == "Your notes say hello."
    results = {
        e.payload["tool_call_id"]: e.payload["content"]
        for e in entries
        if e.kind is EntryKind.TOOL_RESULT
    }
    assert results["call_0_1"] == "hello from the notes\n"  # the tool really read the file
    assert "notes.txt" in results["call_0_0"]
    # The key went to the server, and nowhere else.
    assert server.requests[0].headers["authorization"] == f"Bearer {SECRET}"
    assert SECRET not in out + err
    assert SECRET.encode() not in store_bytes(tmp_path)


@pytest.mark.slow
async def test_file_tools_stay_inside_the_working_directory(
    serve: Serve, workdir: Path, tmp_path: Path
) -> None:
    (tmp_path / "secret.txt").write_text("not for the model")
    server = serve(
        [
            [ToolCall("read_file", {"path": "../secret.txt"})],
            "I may not read that file.",
        ]
    )
    store = f"sqlite:///{tmp_path}/cli.db"

    code, out, err = Cli(*run_args(server, store, workdir, "Read ../secret.txt")).finish()

    assert code == 0, out + err
    _, entries = await stored(store, task_id_in(out))
    (result,) = [e.payload for e in entries if e.kind is EntryKind.TOOL_RESULT]
    assert result["outcome"] == "error"
    assert "outside the working directory" in result["content"]
    assert "not for the model" not in out + str([e.payload for e in entries])


@pytest.mark.slow
def test_a_missing_key_variable_is_named(serve: Serve, workdir: Path, tmp_path: Path) -> None:
    server = serve(["never asked"])
    args = run_args(server, f"sqlite:///{tmp_path}/cli.db", workdir, "Hi")
    args[args.index(KEY_ENV)] = "DURAGENT_TEST_NO_SUCH_KEY"

    code, _, err = Cli(*args).finish()

    assert code == 1
    assert "DURAGENT_TEST_NO_SUCH_KEY: that environment variable is not set" in err
    assert server.requests == []


# --- Ctrl-C ------------------------------------------------------------------------------


@pytest.mark.slow
async def test_ctrl_c_mid_stream_pauses_and_continue_finishes(
    serve: Serve, workdir: Path, tmp_path: Path
) -> None:
    answer = "Here is a long answer that streams slowly, piece by piece, to the end."
    server = serve([Answer(answer, input_tokens=30, output_tokens=15)], chunk_delay=0.05)
    server.stall_next(after=8)  # the first answer stops half-way until the client goes
    store = f"sqlite:///{tmp_path}/cli.db"

    cli = Cli(*run_args(server, store, workdir, "Say something long"))
    task_id = task_id_in(cli.wait_for("task t_"))
    server.wait_stalled()
    cli.wait_for(answer[:8])  # the streamed text is on the screen
    cli.interrupt()
    code, out, err = cli.finish()

    assert code == 130, out + err
    assert "Pausing at the next safe point" in out
    assert f"⏸ paused task {task_id}" in out
    hint = continue_hint(out)
    assert hint[:2] == ["continue", task_id] and SECRET not in out + err
    server.wait_hangups(1)  # the model's stream was cut when the task paused
    task, _ = await stored(store, task_id)
    assert task.status is TaskStatus.PAUSED and task.output is None

    # Continuing with another model is refused: the task's requests are pinned.
    other = [*hint]
    other[other.index("--model") + 1] = "openai:gpt-4.1"
    code, _, err = Cli(*other).finish()
    assert code == 1 and f"was started with --model {MODEL}" in err

    code, out, err = Cli(*hint).finish()

    assert code == 0, out + err
    assert "The model's answer was interrupted; asking again." in out
    assert answer in out
    assert f"✓ completed task {task_id}" in out
    task, _ = await stored(store, task_id)
    assert task.status is TaskStatus.COMPLETED and task.output == answer
    assert (task.usage.input_tokens, task.usage.output_tokens) == (30, 15)
    first, again = server.requests
    assert again.body == first.body  # the same question, asked again


@pytest.mark.slow  # waits out the killed process's lease (15 s)
async def test_after_a_crash_continue_says_it_waits_for_the_lease_then_takes_over(
    serve: Serve, workdir: Path, tmp_path: Path
) -> None:
    answer = "An answer that streams slowly, piece by piece, to its very end."
    server = serve([Answer(answer)], chunk_delay=0.05)
    server.stall_next(after=8)
    store = f"sqlite:///{tmp_path}/cli.db"
    cli = Cli(*run_args(server, store, workdir, "Say something"))
    task_id = task_id_in(cli.wait_for("task t_"))
    server.wait_stalled()
    cli.wait_for(answer[:8])
    cli.proc.kill()  # SIGKILL: the task keeps its lease until it expires
    cli.finish()
    task, _ = await stored(store, task_id)
    assert task.status is TaskStatus.RUNNING and task.lease.owner is not None

    # The operator command does not fail: it says what the task waits for.
    code, out, err = Cli("resume", task_id, "--store", store).finish()
    assert code == 0, out + err
    assert re.search(r"waiting for the previous owner's lease, \d+ s", out), out

    flags = run_args(server, store, workdir, "")[2:]  # --model ... --workdir ... --allow read
    code, out, err = Cli("continue", task_id, *flags).finish()
    assert code == 0, out + err
    waited = re.search(r"waiting for the previous owner's lease, (\d+) s", out)
    assert waited and 0 < int(waited.group(1)) <= 15, out
    assert task.lease.owner in " ".join(out.split())
    assert "took the task over from its previous owner" in out
    assert answer in out and f"✓ completed task {task_id}" in out


def black_hole() -> socket.socket:
    """A listening socket that takes connections and never answers."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(8)
    hole.settimeout(30)
    return hole


@pytest.mark.slow
async def test_a_second_ctrl_c_aborts_while_a_tool_still_runs(
    serve: Serve, workdir: Path, tmp_path: Path
) -> None:
    with black_hole() as hole:
        url = "http://{}:{}/slow".format(*hole.getsockname())
        server = serve([Answer("Fetching it.", [ToolCall("http_get", {"url": url})])])
        store = f"sqlite:///{tmp_path}/cli.db"

        args = run_args(server, store, workdir, "Fetch the slow page", allow="http")
        cli = Cli(*args, "--allow-private-network")
        task_id = task_id_in(cli.wait_for("⚙ http_get"))
        conn, _ = hole.accept()  # the tool is waiting for an answer that never comes
        with conn:
            cli.interrupt()
            cli.wait_for("press Ctrl-C again to abort")
            cli.interrupt()
            code, out, err = cli.finish()

    assert code == 130, out + err
    assert "Aborting" in out and f"✗ aborted task {task_id}" in out
    task, entries = await stored(store, task_id)
    assert task.status is TaskStatus.ABORTED
    (result,) = [e.payload for e in entries if e.kind is EntryKind.TOOL_RESULT]
    assert result["outcome"] == "interrupted"  # cut off by the abort, not by its own timeout


# --- asking the user ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("answer", ["y", "n"])
async def test_writing_a_file_waits_for_the_users_yes(
    serve: Serve, workdir: Path, tmp_path: Path, answer: str
) -> None:
    call = ToolCall("write_file", {"path": "out/hello.txt", "content": "written by the agent"})
    server = serve([Answer("I'll write it.", [call]), "Finished."])
    store = f"sqlite:///{tmp_path}/cli.db"

    cli = Cli(*run_args(server, store, workdir, "Write hello.txt"), stdin=subprocess.PIPE)
    cli.wait_for("[y/N/e to edit the arguments] ")
    assert not (workdir / "out").exists()  # nothing written before the answer
    cli.send(answer + "\n")
    code, out, err = cli.finish()

    assert code == 0, out + err
    assert "? Approve write_file(" in out
    task, entries = await stored(store, task_id_in(out))
    assert task.status is TaskStatus.COMPLETED
    (result,) = [e.payload for e in entries if e.kind is EntryKind.TOOL_RESULT]
    if answer == "y":
        assert (workdir / "out/hello.txt").read_text() == "written by the agent"
        assert result["outcome"] == "ok"
    else:
        assert not (workdir / "out").exists()
        assert result["outcome"] == "denied"


@pytest.mark.slow
async def test_the_user_edits_the_arguments_before_approving(
    serve: Serve, workdir: Path, tmp_path: Path
) -> None:
    call = ToolCall("write_file", {"path": "out/hello.txt", "content": "written by the agent"})
    server = serve([Answer("I'll write it.", [call]), "Finished."])
    store = f"sqlite:///{tmp_path}/cli.db"

    cli = Cli(*run_args(server, store, workdir, "Write hello.txt"), stdin=subprocess.PIPE)
    cli.wait_for("[y/N/e to edit the arguments] ")
    cli.send("e\n")
    cli.wait_for('arguments as JSON (now {"path": "out/hello.txt"')
    cli.send("{oops\n")  # not JSON: said, and asked again
    cli.wait_for("not JSON")
    cli.send("e\n")
    cli.send('{"path": 7}\n')  # refused by the tool's schema: said, and asked again
    cli.wait_for("invalid arguments for write_file: path: Input should be a valid string")
    cli.send("e\n")
    cli.send('{"path": "out/edited.txt", "content": "edited at the terminal"}\n')
    code, out, err = cli.finish()

    assert code == 0, out + err
    assert not (workdir / "out/hello.txt").exists()
    assert (workdir / "out/edited.txt").read_text() == "edited at the terminal"
    task, entries = await stored(store, task_id_in(out))
    assert task.status is TaskStatus.COMPLETED
    (result,) = [e.payload for e in entries if e.kind is EntryKind.TOOL_RESULT]
    assert result["outcome"] == "ok"
    decisions = [
        e.payload
        for e in entries
        if e.kind is EntryKind.CHECKPOINT and e.payload["type"] == "decision"
    ]
    assert [d.get("arguments") for d in decisions] == [
        {"path": "out/edited.txt", "content": "edited at the terminal"}
    ]


@pytest.mark.slow
async def test_with_no_one_to_answer_the_task_waits_for_continue(
    serve: Serve, workdir: Path, tmp_path: Path
) -> None:
    call = ToolCall("write_file", {"path": "later.txt", "content": "approved later"})
    server = serve([[call], "Written."])
    store = f"sqlite:///{tmp_path}/cli.db"

    code, out, err = Cli(*run_args(server, store, workdir, "Write later.txt")).finish()

    assert code == 0, out + err
    task_id = task_id_in(out)
    assert f"task {task_id} waits for your answer" in out
    task, _ = await stored(store, task_id)
    assert task.status is TaskStatus.WAITING and not (workdir / "later.txt").exists()

    cli = Cli(*continue_hint(out), stdin=subprocess.PIPE)
    cli.wait_for("[y/N/e to edit the arguments] ")
    cli.send("yes\n")
    code, out, err = cli.finish()

    assert code == 0, out + err
    assert (workdir / "later.txt").read_text() == "approved later"
    task, _ = await stored(store, task_id)
    assert task.status is TaskStatus.COMPLETED and task.output == "Written."


@pytest.mark.slow
async def test_continue_takes_its_directory_from_the_pin_never_from_the_context(
    serve: Serve, workdir: Path, tmp_path: Path
) -> None:
    """API clients write a task's context; its pin (config) only the runtime writes."""
    call = ToolCall("write_file", {"path": "later.txt", "content": "approved later"})
    server = serve([[call], "Written."])
    store = f"sqlite:///{tmp_path}/cli.db"
    code, out, err = Cli(*run_args(server, store, workdir, "Write later.txt")).finish()
    assert code == 0, out + err
    task_id = task_id_in(out)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    s = open_store(store)
    await s.open()
    try:  # what an API client could do: name another directory in the context
        task = await s.get_task(task_id)
        await s.commit(
            Commit(patches=[TaskPatch(task_id, {"context": {WORKDIR_KEY: str(elsewhere)}})])
        )
    finally:
        await s.close()

    # From another directory, with no flag but the id: the pinned workdir is used.
    cli = Cli("continue", task_id, "--store", store, stdin=subprocess.PIPE, cwd=elsewhere)
    cli.wait_for("[y/N/e to edit the arguments] ")
    cli.send("yes\n")
    code, out, err = cli.finish()
    assert code == 0, out + err
    assert (workdir / "later.txt").read_text() == "approved later"
    assert list(elsewhere.iterdir()) == []
    assert task.config["tools"][0]["workdir"] == str(workdir)


@pytest.mark.slow  # waits out the killed process's lease (15 s)
async def test_continue_after_sigkill_sends_to_the_pinned_base_url(
    serve: Serve, workdir: Path, tmp_path: Path
) -> None:
    pinned = serve([[ToolCall("write_file", {"path": "a.txt", "content": "x"})], "unused"])
    other = serve(["unused", "Finished at the other server."])
    pinned.stall_next(after=0)
    store = f"sqlite:///{tmp_path}/cli.db"
    cli = Cli(*run_args(pinned, store, workdir, "Write a.txt"))
    task_id = task_id_in(cli.wait_for("task t_"))
    pinned.wait_stalled()
    cli.proc.kill()  # SIGKILL mid-request
    cli.finish()
    task, _ = await stored(store, task_id)
    assert task.config["request"]["base_url"] == pinned.base_url
    assert task.config["tools"] == [
        {"workdir": str(workdir), "allow": ["read"], "private_network": False}
    ]
    assert SECRET.encode() not in store_bytes(tmp_path)  # never a secret

    # A flag that contradicts the pin: refused in one line, nothing sent anywhere.
    for flag in (["--base-url", other.base_url], ["--workdir", str(tmp_path)], ["--yes"]):
        code, out, err = Cli("continue", task_id, "--store", store, *flag).finish()
        assert code == 1, out + err
        assert len(err.strip().splitlines()) == 1, err
        assert "--force" in err and flag[0] in err, err
    assert len(pinned.requests) == 1 and other.requests == []

    # No flags at all (no --base-url, no key variable): the pinned server is asked.
    code, out, err = Cli("continue", task_id, "--store", store, cwd=tmp_path).finish()
    assert code == 0, out + err
    assert "took the task over" in out and "waits for your answer" in out, out
    assert len(pinned.requests) == 2 and other.requests == []

    # --force: the contradicting URL is used, and the task is pinned to it.
    cli = Cli(
        "continue",
        task_id,
        "--store",
        store,
        "--base-url",
        other.base_url,
        "--force",
        stdin=subprocess.PIPE,
    )
    cli.wait_for("[y/N/e to edit the arguments] ")
    cli.send("yes\n")
    code, out, err = cli.finish()
    assert code == 0, out + err
    assert "Finished at the other server." in out and "re-pinned" in out
    assert len(pinned.requests) == 2 and len(other.requests) == 1
    task, _ = await stored(store, task_id)
    assert task.status is TaskStatus.COMPLETED
    assert task.config["request"]["base_url"] == other.base_url
    assert (workdir / "a.txt").read_text() == "x"


@pytest.mark.slow
async def test_the_same_request_id_returns_the_same_task(
    serve: Serve, workdir: Path, tmp_path: Path
) -> None:
    server = serve(["Done once."])
    store = f"sqlite:///{tmp_path}/cli.db"
    args = [*run_args(server, store, workdir, "Do it once"), "--request-id", "job-42"]

    code, first, err = Cli(*args).finish()
    assert code == 0, first + err
    code, again, err = Cli(*args).finish()

    assert code == 0, again + err
    task_id = task_id_in(first)
    assert task_id_in(again) == task_id
    assert f"task {task_id} has ended; there is nothing to continue" in again
    assert f"✓ completed task {task_id}" in again
    assert len(server.requests) == 1  # the model was asked once


# --- what the tools may do without asking --------------------------------------------------


@pytest.mark.slow
async def test_reading_a_file_asks_first_unless_the_run_allows_it(
    serve: Serve, workdir: Path, tmp_path: Path
) -> None:
    read = ToolCall("read_file", {"path": "notes.txt"})
    server = serve([[read], "Read it."])
    store = f"sqlite:///{tmp_path}/cli.db"

    cli = Cli(*run_args(server, store, workdir, "Read my notes", allow=""), stdin=subprocess.PIPE)
    cli.wait_for("[y/N/e to edit the arguments] ")
    cli.send("n\n")
    code, out, err = cli.finish()

    assert code == 0, out + err
    assert "? Approve read_file(" in out
    _, entries = await stored(store, task_id_in(out))
    (result,) = [e.payload for e in entries if e.kind is EntryKind.TOOL_RESULT]
    assert result["outcome"] == "denied" and "hello from the notes" not in str(entries)


@pytest.mark.slow
@pytest.mark.parametrize("private", [False, True])
async def test_http_get_reaches_a_local_server_only_with_the_flag(
    serve: Serve, workdir: Path, tmp_path: Path, private: bool
) -> None:
    from support.http import answer, serving

    with serving(answer("the local secret")) as local:
        server = serve([[ToolCall("http_get", {"url": f"{local}/"})], "Fetched."])
        store = f"sqlite:///{tmp_path}/cli.db"
        args = [*run_args(server, store, workdir, "Fetch it", allow=""), "--yes"]
        if private:
            args.append("--allow-private-network")
        code, out, err = Cli(*args).finish()

    assert code == 0, out + err
    _, entries = await stored(store, task_id_in(out))
    (result,) = [e.payload for e in entries if e.kind is EntryKind.TOOL_RESULT]
    if private:
        assert result["outcome"] == "ok" and "the local secret" in result["content"]
    else:
        assert result["outcome"] == "error" and "the local secret" not in str(entries)
        assert "loopback" in result["content"] and "--allow-private-network" in result["content"]


# --- what `continue` takes from the task's pin ----------------------------------------------


def pinned_task(tmp_path: Path, reach: list[dict[str, object]]) -> Task:
    config = {"request": {"model": MODEL, "base_url": "http://127.0.0.1:9/v1"}, "tools": reach}
    return Task(agent="run-default-x", input="x", config=config)


def flags(**given: object) -> Options:
    options: dict[str, object] = {
        "base_url": None,
        "workdir": None,
        "allow": "",
        "yes": False,
        "private_network": False,
    }
    return Options(**{**options, **given})  # type: ignore[arg-type]


def test_continue_takes_every_flag_not_given_from_the_pin(tmp_path: Path) -> None:
    reach = [{"workdir": str(tmp_path), "allow": ["read", "write"], "private_network": True}]
    url, grants, clashes = flags().against(pinned_task(tmp_path, reach))
    assert url == "http://127.0.0.1:9/v1" and clashes == []
    assert grants == Grants(tmp_path, frozenset({"read", "write"}), True)
    # The same values given again are no contradiction.
    same = flags(base_url=url, workdir=tmp_path, allow="write,read", private_network=True)
    assert same.against(pinned_task(tmp_path, reach))[2] == []


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"base_url": "http://127.0.0.1:10/v1"}, "--base-url"),
        ({"allow": "read"}, "--allow read"),
        ({"yes": True}, "--yes"),
        ({"private_network": True}, "--allow-private-network"),
        ({"workdir": Path("/")}, "--workdir"),
    ],
)
def test_a_flag_that_contradicts_the_pin_is_named(
    tmp_path: Path, given: dict[str, object], named: str
) -> None:
    reach = [{"workdir": str(tmp_path), "allow": ["read", "write"], "private_network": False}]
    _, _, clashes = flags(**given).against(pinned_task(tmp_path, reach))
    assert len(clashes) == 1 and clashes[0].startswith(named), clashes


def test_a_task_without_tools_still_pins_its_base_url(tmp_path: Path) -> None:
    _, _, clashes = flags(base_url="http://127.0.0.1:10/v1").against(pinned_task(tmp_path, []))
    assert clashes == ["--base-url http://127.0.0.1:10/v1 (pinned: http://127.0.0.1:9/v1)"]


@pytest.mark.slow
def test_run_against_an_unreachable_model_prints_only_the_clean_message(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = child_env(OPENAI_API_KEY="sk-test-not-used")
    result = run_script(
        "run",
        "say hi",
        "--model",
        "openai:gpt-4o-mini",
        "--base-url",
        f"http://127.0.0.1:{port}/v1",
        "--store",
        "sqlite:///run.db",
        "--agent-tools",
        "none",
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "could not reach OpenAI" in result.stdout
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.strip() == "", result.stderr
    # With DURAGENT_DEBUG=1 the library's log comes back, traceback and all.
    debug = run_script(*result.args[1:], cwd=tmp_path, env={**env, "DURAGENT_DEBUG": "1"})
    assert debug.returncode == 1 and "Traceback" in debug.stderr
