"""`TaskFilter`: which tasks a bulk operation acts on, one model for the library,
the REST body and the CLI's options (a filter added here is added to all three)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from duragent.runtime._fingerprint import VERSION_PATTERN
from duragent.store._commits import TaskQuery
from duragent.types import TaskStatus


class TaskFilter(BaseModel):
    """Which tasks a bulk operation acts on: every field given must match (the
    filters of `Runtime.list_tasks`). `status` defaults to every status the
    action applies to; a status it does not apply to is refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: list[TaskStatus] | None = None
    agent: str | None = Field(default=None, min_length=1, max_length=200)
    queue: str | None = Field(default=None, min_length=1, max_length=200)
    version: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        pattern=VERSION_PATTERN,
        description="Only tasks pinned to this agent version (`Task.agent_version`).",
    )
    metadata: dict[str, str] | None = Field(
        default=None, description="Labels every matched task has with exactly these values."
    )
    created_after: datetime | None = None
    created_before: datetime | None = None
    updated_after: datetime | None = None
    updated_before: datetime | None = None
    id_prefix: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="Only tasks whose id starts with this text (the page's search box).",
    )
    owner: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="Only this owner's tasks (over REST: admins only; others always "
        "act on their own tasks only).",
    )

    @field_validator("created_after", "created_before", "updated_after", "updated_before")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("a time needs a zone, e.g. 2030-01-01T09:00:00Z")
        return value

    def query(self, statuses: Sequence[TaskStatus], **more: Any) -> TaskQuery:
        """The store query of the tasks in `statuses` this filter matches (`more`: set too)."""
        fields: dict[str, Any] = {
            "status": list(statuses),
            "agent": self.agent,
            "queue": self.queue,
            "metadata": dict(self.metadata) if self.metadata else None,
            "created_after": self.created_after,
            "created_before": self.created_before,
            "updated_after": self.updated_after,
            "updated_before": self.updated_before,
            "id_prefix": self.id_prefix,
            "owner": self.owner,
            "agent_version": self.version,
        }
        return TaskQuery(**{**fields, **more})
