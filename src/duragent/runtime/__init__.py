"""The durable agent runtime."""

from duragent.runtime.agent import Agent, BuiltinTools, Limits, RetryPolicy, Timing
from duragent.runtime.approvals import Decision
from duragent.runtime.context import ToolContext
from duragent.runtime.reading import TaskTree
from duragent.runtime.runtime import Runtime, Submission
from duragent.runtime.steering import Edit, History, RoundRecord
from duragent.runtime.tools import Tool, tool
from duragent.runtime.worker import Worker, WorkerOptions

__all__ = [
    "Agent",
    "BuiltinTools",
    "Decision",
    "Edit",
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
