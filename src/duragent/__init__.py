"""duragent: durable AI agent tasks."""

from __future__ import annotations

from duragent.errors import (
    Conflict,
    DuragentError,
    InvalidTransition,
    ModelError,
    StaleLease,
    StoreCorrupt,
    StoreError,
    StoreLocked,
    StoreUnavailable,
    StoreVersionError,
    TaskNotFound,
    UsageError,
)
from duragent.store import Commit, Store, TaskPatch, TaskQuery, open_store
from duragent.types import (
    AssistantMessage,
    BlockReason,
    Document,
    Entry,
    EntryKind,
    NewEntry,
    SystemMessage,
    Task,
    TaskStatus,
    ToolMessage,
    UserMessage,
    WaitReason,
    check_transition,
)

__version__ = "0.1.0"

__all__ = [
    "AssistantMessage",
    "BlockReason",
    "Commit",
    "Conflict",
    "Document",
    "DuragentError",
    "Entry",
    "EntryKind",
    "InvalidTransition",
    "ModelError",
    "NewEntry",
    "StaleLease",
    "Store",
    "StoreCorrupt",
    "StoreError",
    "StoreLocked",
    "StoreUnavailable",
    "StoreVersionError",
    "SystemMessage",
    "Task",
    "TaskNotFound",
    "TaskPatch",
    "TaskQuery",
    "TaskStatus",
    "ToolMessage",
    "UsageError",
    "UserMessage",
    "WaitReason",
    "__version__",
    "check_transition",
    "open_store",
]
