"""The durable agent runtime."""

from duragent.runtime._agent import Agent, BuiltinTools, Limits, RetryPolicy, Timing
from duragent.runtime._approvals import Decision
from duragent.runtime._context import ToolContext
from duragent.runtime._guardrails import GuardrailResult
from duragent.runtime._reading import TaskTree
from duragent.runtime._runtime import Runtime, Submission
from duragent.runtime._steering import Edit, History, RoundRecord
from duragent.runtime._tools import Tool, tool
from duragent.runtime._worker import Worker, WorkerOptions

__all__ = [
    "Agent",
    "BuiltinTools",
    "Decision",
    "Edit",
    "GuardrailResult",
    "History",
    "Limits",
    "RetryPolicy",
    "RoundRecord",
    "Runtime",
    "Submission",
    "TaskTree",
    "Timing",
    "Tool",
    "ToolContext",
    "Worker",
    "WorkerOptions",
    "tool",
]
