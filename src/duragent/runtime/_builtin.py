"""Tools every agent can be given: its plan (pending steps) and questions to the user."""

from __future__ import annotations

from duragent.runtime._context import ToolContext, WaitForInput
from duragent.runtime._tools import tool

PLAN_KEY = "plan"


@tool(name="update_plan", replay="safe")
async def update_plan(steps: list[str], ctx: ToolContext) -> str:
    """Record your plan: the steps still to do, in order. Call it again as steps get done.

    Args:
        steps: the pending steps, each a short sentence
    """
    ctx.documents.put(PLAN_KEY, {"pending": steps})
    return f"plan saved ({len(steps)} pending steps)"


@tool(name="ask_user")
async def ask_user(question: str, ctx: ToolContext) -> WaitForInput:
    """Ask the user a question and wait for the answer.

    Args:
        question: what you need to know
    """
    return ctx.wait_for_input(question)


# Asking is its only effect and its question is in its arguments: a worker that
# takes the task over after a crash (the question's wait not yet committed)
# asks the same question again instead of answering it "interrupted". (It stays
# replay "never" otherwise: a rollback keeps a question that was asked.)
ask_user.asks_only = True
