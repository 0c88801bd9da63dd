"""The durable agent runtime."""

from duragent.runtime.agent import Agent
from duragent.runtime.approvals import Decision
from duragent.runtime.context import ToolContext
from duragent.runtime.runtime import Runtime, Submission, TaskTree
from duragent.runtime.steering import Edit, History, RoundRecord
from duragent.runtime.tools import Tool, tool
from duragent.runtime.worker import Worker

__all__ = [
    "Agent",
    "Decision",
    "Edit",
    "History",
    "RoundRecord",
    "Runtime",
    "Submission",
    "TaskTree",
    "Tool",
    "ToolContext",
    "Worker",
    "tool",
]
