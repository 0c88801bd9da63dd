"""The application setting a task's plan (its pending steps), as `update_plan` does.

The model's built-in `update_plan` tool keeps the plan in the task's `plan`
document (runtime/_builtin.py); `Runtime.set_plan` writes the same document, so
`steps` (library, REST, CLI) shows whichever wrote last, and a UI notice says
the application set it (the page's timeline). The model is not told: its view
holds only what it said and what its tools and the user answered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from duragent.errors import UsageError
from duragent.runtime._builtin import PLAN_KEY
from duragent.runtime._log import notice
from duragent.store._commits import Commit, DocumentWrite
from duragent.store._protocol import Store
from duragent.types import Task, task_scope

MAX_STEPS = 200
MAX_STEP_CHARS = 2000


def checked_steps(steps: Any) -> list[str]:
    """The steps as a list of non-empty strings, or UsageError saying what is wrong."""
    if isinstance(steps, str) or not isinstance(steps, Sequence):
        raise UsageError(f"a plan is a list of steps (strings), not {type(steps).__name__}")
    if len(steps) > MAX_STEPS:
        raise UsageError(f"a plan has at most {MAX_STEPS} steps, not {len(steps)}")
    out = []
    for i, step in enumerate(steps):
        if not isinstance(step, str) or not step.strip():
            raise UsageError(f"step {i + 1} of the plan is not a non-empty string: {step!r:.60}")
        if len(step) > MAX_STEP_CHARS:
            raise UsageError(f"step {i + 1} of the plan is longer than {MAX_STEP_CHARS} characters")
        out.append(step)
    return out


async def write_plan(store: Store, task: Task, steps: Sequence[str]) -> None:
    """Commit `steps` as the task's pending steps (an empty list clears the plan)."""
    if task.status.terminal:
        raise UsageError(
            f"task {task.id} has ended ({task.status.value}): its plan is no longer changed"
        )
    pending = checked_steps(steps)
    listed = "; ".join(f"{i}. {s}" for i, s in enumerate(pending, 1)) or "no pending steps"
    await store.commit(
        Commit(
            entries=[notice(task.id, task.iterations + 1, f"The plan was set: {listed}")],
            documents=[DocumentWrite(task_scope(task.id), PLAN_KEY, {"pending": pending})],
        )
    )
