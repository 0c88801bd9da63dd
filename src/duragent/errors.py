"""Every error duragent raises, grouped by who must act on it.

- `UsageError`: the caller asked for something that cannot be done.
  `InvalidOption` and `InvalidType` also subclass `ValueError` / `TypeError`,
  so `except ValueError` around a misuse keeps working. `NotFound`: what was
  named does not exist (the server answers 404).
- `StoreError`: the store refused or could not do a write or read.
- `ModelError`: a model provider failed.
- `StepFailed`, `ToolArgumentError`, `MCPServerError`: a tool call failed.
Lower libraries' exceptions (sqlite3, psycopg, SDKs) are translated into
these at the boundary and never escape raw.

    DuragentError
    ├── UsageError
    │   ├── InvalidOption (ValueError)
    │   │   └── InvalidStoreURL
    │   ├── InvalidType (TypeError)
    │   ├── InvalidTransition
    │   ├── InvalidValue
    │   ├── InvalidArguments
    │   ├── NotFound
    │   │   ├── TaskNotFound
    │   │   ├── QueueNotFound
    │   │   ├── ScheduleNotFound
    │   │   └── SessionNotFound
    │   ├── ScheduleUnreadable
    │   ├── UnknownAgent
    │   ├── DuplicateRequest
    │   ├── TaskBusy
    │   ├── NoStore
    │   ├── MissingExtra
    │   └── MissingCredential
    ├── WaitTimedOut (TimeoutError)
    │   └── ControlPending
    ├── TaskFailed
    ├── IncompatibleEntry
    ├── StoreError
    │   ├── StaleLease
    │   ├── LostCommits
    │   ├── Conflict
    │   ├── StoreVersionError
    │   ├── StoreLocked
    │   ├── StoreCorrupt
    │   ├── StoreNotFound
    │   └── StoreUnavailable
    │       ├── StoreFull
    │       └── CommitOutcomeUnknown
    ├── ModelError
    │   ├── RetryableModelError
    │   ├── MalformedModelOutput
    │   └── ContextOverflow
    ├── StepFailed
    ├── ToolArgumentError (ValueError)
    └── MCPServerError

The server adds its own (duragent.server: `LimitReached`, `BadRequest`, both
UsageErrors); the HTTP client raises each problem as a class that is both its
`duragent.client.ApiError` and the error above of its kind (duragent.client:
`TaskNotFound` is a `TaskNotFound` here too); `duragent._fetch.BlockedAddress` is a PermissionError.

Every error pickles with its message and attributes (a worker process can
hand one to another), whatever its `__init__` takes: see `DuragentError.__reduce__`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import ValidationError


def _restore(cls: type[DuragentError], args: tuple[Any, ...]) -> DuragentError:
    # BaseException.__new__ sets .args without calling __init__, whose
    # signature differs per class; the attributes come back through __dict__.
    return cls.__new__(cls, *args)


class DuragentError(Exception):
    """Base of every duragent error."""

    def __reduce__(self) -> tuple[Any, ...]:
        # The default (cls(*self.args)) calls __init__ with the formatted
        # message, which breaks every class whose __init__ takes other arguments.
        return (_restore, (type(self), self.args), self.__dict__)


# --- the caller's mistakes --------------------------------------------------


class UsageError(DuragentError):
    """The call cannot be done as asked; the message says what to do instead."""


class InvalidOption(UsageError, ValueError):
    """An argument, option or setting has a value duragent does not accept; the
    message says which values it does."""


def invalid_option(what: str, exc: ValidationError) -> InvalidOption:
    """A pydantic ValidationError of something the user built (a Queue, a Schedule) as
    the `InvalidOption` duragent raises for every other bad option."""
    reasons = []
    for error in exc.errors():
        msg = str(error["msg"]).removeprefix("Value error, ")
        where = ".".join(str(part) for part in error["loc"])
        reasons.append(f"{where}: {msg}" if where else msg)
    return InvalidOption(f"invalid {what}: " + "; ".join(reasons))


def check_seconds(name: str, value: float, *, most: float = 10 * 365 * 86400.0) -> float:
    """`value` as a number of seconds a loop can wait on: finite, above zero, at most
    `most` (ten years: later times overflow); else InvalidOption naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidOption(f"{name} is a number of seconds, not {value!r}")
    if not 0 < value <= most:  # `not`, so NaN fails too
        raise InvalidOption(f"{name} must be above 0 and at most {most:g} seconds, not {value!r}")
    return float(value)


def check_delay(name: str, value: float, *, most: float = 10 * 365 * 86400.0) -> float:
    """`value` as a delay in seconds where zero means "at once": finite, zero or more,
    at most `most`; else InvalidOption naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidOption(f"{name} is a number of seconds, not {value!r}")
    if not 0 <= value <= most:  # `not`, so NaN fails too
        raise InvalidOption(
            f"{name} must be at least 0 and at most {most:g} seconds, not {value!r}"
        )
    return float(value)


def check_count(name: str, value: int, *, least: int, of: str = "") -> int:
    """`value` as a whole number at least `least` (of `of`, e.g. "tasks"); else
    InvalidOption naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        what = f"a whole number of {of}" if of else "a whole number"
        raise InvalidOption(f"{name} is {what} >= {least}, not {value!r}")
    return value


class NoStore(UsageError):
    """A command that never creates a store (`duragent ls`, `show`…) found none
    where it looked."""


class InvalidStoreURL(InvalidOption):
    """`open_store` cannot read the URL (no scheme, an unknown scheme, no path)."""


class InvalidType(UsageError, TypeError):
    """Something of a kind duragent cannot use here (a tool taking *args, a step
    returning a value that is not JSON)."""


class InvalidTransition(UsageError):
    """A task status change the lifecycle does not allow (e.g. out of `completed`)."""

    def __init__(self, old: str, new: str, detail: str | None = None) -> None:
        self.old = old
        self.new = new
        msg = f"a task cannot go from {old!r} to {new!r}"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class NotFound(UsageError):
    """What the call names does not exist (or not for the caller): a task, queue,
    schedule or session. The server answers 404."""


class TaskNotFound(NotFound):
    """No task with this id (or none the caller may see)."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        super().__init__(f"no task with id {task_id!r}")


class QueueNotFound(NotFound):
    """No queue of that name has limits."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"no queue named {name!r} has limits")


class ScheduleNotFound(NotFound):
    """No schedule of that name (for that owner)."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"no schedule named {name!r}")


class SessionNotFound(NotFound):
    """No session of that id for that owner."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(f"no session {session_id!r}")


class ScheduleUnreadable(UsageError):
    """A stored schedule that no longer validates (written by older code, or by hand):
    it never fires, and the only thing to do with it is to delete it."""

    def __init__(self, key: str, why: str) -> None:
        self.key = key
        super().__init__(f"schedule {key} is stored with invalid fields ({why}); delete it")


class UnknownAgent(UsageError):
    """A task names an agent this runtime does not have."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        if known:
            super().__init__(f"no agent named {name!r}; known agents: {', '.join(sorted(known))}")
        else:  # most likely `duragent serve` started without --agents
            super().__init__(
                f"no agent named {name!r}: no agents are registered here; give them to "
                "Runtime(agents=[...]), or to `duragent serve` / `worker` as --agents module:attr"
            )


class InvalidValue(UsageError):
    """A value no store can keep (too deeply nested, NaN, a NUL or a lone surrogate)."""

    def __init__(self, message: str, *, path: tuple[str | int, ...] = ()) -> None:
        self.path = path
        super().__init__(message)


class InvalidArguments(UsageError):
    """Arguments a person gave a tool call (an edited approval) don't fit the tool's schema."""


class DuplicateRequest(UsageError):
    """A submission reused a request_id of the same owner with a different input, or a
    message sent into a task reused one of that task's request_ids with another text."""

    def __init__(self, request_id: str, task_id: str, message: str | None = None) -> None:
        self.request_id = request_id
        self.task_id = task_id
        super().__init__(
            message
            or f"request_id {request_id!r} already started task {task_id!r} with another "
            "agent or input; use a new request_id for a new task (the same request_id with "
            "the same input returns the existing task)"
        )


class TaskBusy(UsageError):
    """A message came in while the task runs a turn and its strategy is `reject`."""

    def __init__(self, task_id: str, status: str) -> None:
        self.task_id = task_id
        super().__init__(
            f"task {task_id!r} is {status} (a turn runs) and its multitask_strategy is "
            "'reject'; send again once it ends, or pass multitask_strategy='enqueue', "
            "'interrupt' or 'rollback'"
        )


class WaitTimedOut(DuragentError, TimeoutError):
    """A wait for a task ended before the task did; the task goes on, untouched.

    A TimeoutError too, so `except TimeoutError` around `wait(timeout=)` still works.
    """

    def __init__(self, task_id: str, status: str, timeout: float, waited_for: str) -> None:
        self.task_id, self.status = task_id, status
        self._made_of: tuple[Any, ...] = (task_id, status, timeout, waited_for)
        super().__init__(
            f"task {task_id!r} is still {status} after {timeout:g} s of waiting for "
            f"{waited_for}; waiting did not stop it"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Built again from its arguments: an OSError (TimeoutError) made by __new__
        # alone forgets its message.
        return (type(self), self._made_of)


class TaskFailed(DuragentError):
    """`Runtime.result` of a task that ended without completing (failed, aborted,
    blocked); `status` and `reason` say how, `task_id` which."""

    def __init__(self, task_id: str, status: str, reason: str | None) -> None:
        self.task_id, self.status, self.reason = task_id, status, reason
        super().__init__(
            f"task {task_id!r} ended {status}: {reason or 'no reason given'}; it has no result"
        )


class ControlPending(WaitTimedOut):
    """A pause or abort was recorded on a task whose worker has not acted on it yet:
    it applies when that worker reaches a safe point or, if the worker is gone,
    when its lease ends and a worker (or the next pause/abort) takes the task."""

    def __init__(self, task_id: str, action: str, timeout: float, holder: str) -> None:
        self.task_id, self.status, self.action = task_id, "running", action
        self._made_of = (task_id, action, timeout, holder)
        DuragentError.__init__(
            self,
            f"the {action} of task {task_id!r} is recorded, but its worker ({holder}) did "
            f"not reach a safe point within {timeout:g} s; it applies when that worker "
            "does or, if the worker is gone, when a worker next takes the task",
        )


class MissingExtra(UsageError):
    """A feature needs an optional dependency that is not installed."""

    def __init__(self, what: str, extra: str) -> None:
        super().__init__(f"{what} needs an optional extra: pip install 'duragent[{extra}]'")


class MissingCredential(UsageError):
    """A model provider needs an API key that was not given."""

    def __init__(self, provider: str, env_var: str) -> None:
        self.env_var = env_var
        super().__init__(
            f"{provider} needs an API key: set the {env_var} environment variable "
            "or pass api_key= to the model"
        )


class IncompatibleEntry(DuragentError):
    """One task's log holds an entry this version cannot read (a kind a later
    version wrote): that task is blocked(incompatible_store); the store and its
    other tasks are fine. Not a StoreError: nothing is wrong with the store."""

    def __init__(self, task_id: str, seq: int, kind: str, why: str = "unknown entry kind") -> None:
        self.task_id = task_id
        self.seq = seq
        self.kind = kind
        super().__init__(
            f"task {task_id!r}: entry {seq} (kind {kind!r}) cannot be read by this version "
            f"of duragent ({why}); run the task with the version that wrote it, or a newer one"
        )


# --- the store --------------------------------------------------------------


class StoreError(DuragentError):
    """The store could not do what was asked."""


class LostCommits(StoreError):
    """The store holds a task behind what it told this writer was committed: commits
    it acknowledged are gone (the database failed over to a replica that had not
    received them: asynchronous replication). Nothing was written; the runner
    blocks the task(lost_commits) rather than run it again from the shorter log
    (docs/architecture.md, "Failover of the database server")."""

    def __init__(self, task_id: str, stored: int, acknowledged: int) -> None:
        self.task_id = task_id
        self.stored = stored
        self.acknowledged = acknowledged
        super().__init__(
            f"task {task_id!r}: the store's log ends at entry {stored}, but entries up to "
            f"{acknowledged} had been committed and acknowledged: the store lost commits "
            "(a failover to a replica that had not received them?)"
        )


class StaleLease(StoreError):
    """The writer's lease epoch is no longer current: another owner took over."""

    def __init__(self, task_id: str, epoch: int, current: int, holder: str | None = None) -> None:
        self.task_id = task_id
        self.epoch = epoch
        self.current = current
        held = (
            f"the current epoch is {current}"
            if holder is None
            else f"that epoch is now held by {holder!r} (a failover lost this worker's claim)"
        )
        super().__init__(
            f"task {task_id!r}: commit carries lease epoch {epoch} but {held}; "
            "another worker owns this task now, nothing was written"
        )


class Conflict(StoreError):
    """A conditional write found the row in another state than expected."""


class StoreVersionError(StoreError):
    """The store was written by a newer duragent; this one will not touch it."""

    def __init__(self, where: str, found: int, supported: int) -> None:
        self.found = found
        self.supported = supported
        super().__init__(
            f"{where} has schema version {found}, but this duragent supports up to version "
            f"{supported}; upgrade duragent to open it (nothing was changed)"
        )


class StoreLocked(StoreError):
    """A single-owner store is already open in another process."""


class StoreCorrupt(StoreError):
    """The store's files hold data that cannot be read back."""


class StoreUnavailable(StoreError):
    """The store could not be reached (connection lost, server down)."""


class StoreFull(StoreUnavailable):
    """The disk (or the process's file-size limit) has no room for the store's writes.

    Not `StoreCorrupt`: the files are intact, and the store works again once
    space is freed.
    """

    def __init__(self, path: str, free_bytes: int | None, detail: str = "") -> None:
        self.path = path
        self.free_bytes = free_bytes
        self.detail = detail
        free = "unknown" if free_bytes is None else f"{free_bytes} bytes"
        why = f" ({detail})" if detail else ""
        super().__init__(
            f"disk full: cannot write the store at {path}{why}; free space there: {free}. "
            "Free some space (or raise the file-size limit) and try again; nothing was lost"
        )


class StoreNotFound(StoreError):
    """The store's directory does not exist (duragent creates a store, not its parents)."""

    def __init__(self, directory: str, hint: str = "") -> None:
        self.directory = directory
        self.hint = hint
        super().__init__(f"directory does not exist: {directory}" + (f"; {hint}" if hint else ""))


class CommitOutcomeUnknown(StoreUnavailable):
    """The connection was lost while the commit was in flight: it may or may not
    have been applied. Re-read what it wrote to find out; never apply it again blind."""


# --- models -----------------------------------------------------------------


class ModelError(DuragentError):
    """A model provider failed."""

    retryable: bool = False

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        self.retry_after = retry_after
        super().__init__(message)


class RetryableModelError(ModelError):
    """A provider failure worth asking again (rate limit, overload, a dropped connection)."""

    retryable = True


class CompactionFailed(DuragentError):
    """A user's `compact=` function failed, or returned what is no summary (nothing
    is stored); the task fails with this as its reason (runtime/_compaction.py)."""


class ContextOverflow(ModelError):
    """The provider refused the request as longer than the model's context window.

    Not retried as it is: the runtime compacts the task's view and asks again
    (runtime/_compaction.py). `tokens` and `limit` when the provider said them.
    """

    def __init__(
        self, message: str, *, tokens: int | None = None, limit: int | None = None
    ) -> None:
        self.tokens = tokens
        self.limit = limit
        super().__init__(message)


class MalformedModelOutput(ModelError):
    """The provider's stream could not be parsed (a garbled event). Asked again:
    such corruption is usually transient (a proxy, a dropped byte)."""

    retryable = True


# --- tool steps -------------------------------------------------------------


class StepFailed(DuragentError):
    """A step raised (its failure is recorded); on a re-run the recorded failure is
    raised again instead of running the step again."""

    def __init__(self, step: str, error: str) -> None:
        super().__init__(f"step {step!r} failed: {error}")
        self.step = step
        self.error = error


class ToolArgumentError(DuragentError, ValueError):
    """The model's arguments don't fit the tool's signature (the call's result tells
    the model so). A ValueError too, as it was before it was a DuragentError."""


class MCPServerError(DuragentError):
    """The MCP server could not be reached, or refused a request."""
