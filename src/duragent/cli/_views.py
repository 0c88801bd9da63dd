"""`duragent steps` (a task's completed steps, its plan and its output), `duragent
plan` (set its pending steps) and `duragent tree` (a task and its sub-tasks): the
library's `Runtime.steps`, `Runtime.set_plan` and `Runtime.tree` at the terminal,
as tables or `--json`."""

from __future__ import annotations

from dataclasses import asdict

import typer
from rich.table import Table
from rich.tree import Tree

from duragent._terminal import safe
from duragent.cli._common import (
    JSON,
    STORE,
    emit_json,
    fail,
    make_console,
    operator_runtime,
    run_async,
)
from duragent.cli._format import clip, count, status_markup
from duragent.errors import UsageError
from duragent.runtime._reading import TaskTree
from duragent.runtime._views import Steps

app = typer.Typer()


@app.command()
def steps(
    task_id: str = typer.Argument(..., help="The task's id."),
    store: str = STORE,
    as_json: bool = JSON,
) -> None:
    """Show a task's completed steps (what the model thought and did), its plan, its output."""

    async def go() -> Steps:
        async with operator_runtime(store) as rt:
            return await rt.steps(task_id)

    got = run_async(go())
    if as_json:
        emit_json(asdict(got))
        return
    console = make_console()
    console.print(f"task {safe(task_id)}: {count(got.iterations, 'complete round')}")
    if got.completed:
        table = Table()
        for col in ("round", "thought", "actions"):
            table.add_column(col, no_wrap=col == "round")
        for step in got.completed:
            actions = "\n".join(
                f"{a['tool']}({clip(a['arguments'], 40)}) → [{a['outcome'] or 'no result yet'}] "
                f"{clip(a['observation'] or '', 50)}"
                for a in step.actions
            )
            table.add_row(str(step.round), safe(clip(step.thought or "", 120)), safe(actions))
        console.print(table)
    for item in got.pending:
        console.print(f"pending: {safe(clip(item, 120))}")
    if got.output is not None:
        console.print(f"output: {safe(clip(got.output, 400))}")


@app.command()
def plan(
    task_id: str = typer.Argument(..., help="The task's id."),
    step: list[str] = typer.Option(
        [], "--step", help="A pending step, in order (repeat for more)."
    ),
    clear: bool = typer.Option(False, "--clear", help="No pending steps."),
    store: str = STORE,
    as_json: bool = JSON,
) -> None:
    """Set a task's pending steps (its plan), as the model's update_plan tool does."""
    if not step and not clear:
        fail(UsageError("give the plan's steps (--step TEXT, repeated), or --clear to empty it"))
    if step and clear:
        fail(UsageError("--clear takes no --step"))

    async def go() -> Steps:
        async with operator_runtime(store) as rt:
            return await rt.set_plan(task_id, step)

    got = run_async(go())
    if as_json:
        emit_json({"task_id": task_id, "pending": got.pending})
        return
    console = make_console()
    console.print(f"task {safe(task_id)}: {count(len(got.pending), 'pending step')}")
    for i, item in enumerate(got.pending, 1):
        console.print(f"{i}. {safe(clip(item, 120))}")


def _node(tree: Tree | None, node: TaskTree) -> Tree:
    t = node.task
    label = f"{safe(t.id)}  {safe(t.agent)}  {status_markup(t)}"
    branch = Tree(label) if tree is None else tree.add(label)
    for child in node.children:
        _node(branch, child)
    return branch


def _as_data(node: TaskTree) -> dict[str, object]:
    return {
        "task": node.task.model_dump(mode="json"),
        "children": [_as_data(child) for child in node.children],
    }


@app.command()
def tree(
    task_id: str = typer.Argument(..., help="The task's id."),
    store: str = STORE,
    as_json: bool = JSON,
) -> None:
    """Show a task and its sub-tasks, with their status."""

    async def go() -> TaskTree:
        async with operator_runtime(store) as rt:
            return await rt.tree(task_id)

    got = run_async(go())
    if as_json:
        emit_json(_as_data(got))
        return
    make_console().print(_node(None, got))
