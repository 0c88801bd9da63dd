"""How a task runner is asked to stop from outside, and hears it.

A request (pause, abort, release, deadline, and an interrupt: a pause that goes
on with the messages sent) reaches the runner's `Controls`, from this process
(Runtime, the worker, the deadline's timer) or written on the task's row by
another and seen by a commit. The runner acts on it at a safe point, or at once
inside an interruptible stretch. How a task then stops and ends is
runtime/_ending.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

_PAST = {"pause": "paused", "abort": "aborted", "release": "released"}


class Interrupted(Exception):
    """A control request cut an interruptible stretch short."""


class Abandoned(Exception):
    """This worker lost the task's lease: stop at once and write nothing more."""


@dataclass
class Control:
    """A request to stop: pause (status paused), abort (terminal), release
    (hand the task back to the queue, e.g. on worker shutdown), or deadline
    (the task's deadline passed: failed, status reason `deadline`)."""

    action: Literal["pause", "abort", "release", "deadline"]
    rollback: bool = False
    reason: str | None = None
    # A pause that goes on at once with the messages sent to interrupt (runtime/_inbox.py);
    # `token` (the message id) makes a request heard twice act once.
    resume: bool = False
    token: str | None = None

    @classmethod
    def from_row(cls, control: Mapping[str, Any]) -> Control:
        """The request a task row's `control` field holds (written by Runtime._stop,
        or a release by Runtime.migrate)."""
        reason, token = control.get("reason"), control.get("token")
        action = control.get("action")
        return cls(
            action if action in ("abort", "release") else "pause",
            bool(control.get("rollback")),
            None if reason is None else str(reason),
            resume=bool(control.get("resume")),
            token=None if token is None else str(token),
        )


class Controls:
    """The control requests one runner has heard: the one it is to act on
    (`current`), the interrupts already acted on, and the stretches a request
    may cut short (a model stream, a retry back-off, a wait on tools)."""

    def __init__(self) -> None:
        self.current: Control | None = None
        # Set by an abort, or by a draining worker whose grace period is over: cuts a
        # stop's wait for running tools short (they are cancelled and answered).
        self.hurry = asyncio.Event()
        # An interrupt changed the log: the runner rebuilds its round from it.
        self.reread = False
        self._listeners: list[Callable[[], None]] = []  # see first_done
        self._target: asyncio.Task[Any] | None = None  # inside an interruptible stretch
        self._interrupting = False
        self._handled_tokens: set[str] = set()  # interrupts already acted on

    def request(self, control: Control) -> None:
        if control.token is not None and control.token in self._handled_tokens:
            return
        # An interrupt (a pause that goes on) gives way to a plain pause or an abort.
        yields = self.current is not None and self.current.resume and not control.resume
        if self.current is None or control.action == "abort" or yields:
            self.current = control
            for listener in list(self._listeners):
                listener()
            if control.action == "abort":
                self.hurry.set()
            if self._target is not None and not self._interrupting:
                self._interrupting = True
                self._target.cancel()

    def hear_row(self, control: Mapping[str, Any] | None) -> None:
        """A request on the task's row as a commit left it: a pause/abort committed by
        another process. Every commit sees it, so no tool starts after the commit that
        precedes it (the intents)."""
        current = self.current
        if control and (
            current is None
            or current.action != control.get("action")
            or current.resume != bool(control.get("resume"))
        ):
            self.request(Control.from_row(control))

    def resumed(self, control: Control) -> None:
        """An interrupt is done: the runner goes on (an abort asked meanwhile stays)."""
        if control.token is not None:
            self._handled_tokens.add(control.token)
        if self.current is control:
            self.current = None
        self.reread = True

    @contextlib.asynccontextmanager
    async def interruptible(self) -> AsyncIterator[None]:
        """A stretch (a model stream, a retry back-off) that a control request may cut.

        request() cancels this task only while it is suspended inside such a
        stretch, so the cancellation always lands here and is turned into
        Interrupted; a cancellation from anyone else passes through.
        """
        if self.current is not None:
            raise Interrupted
        task = asyncio.current_task()
        self._target = task
        try:
            yield
        except asyncio.CancelledError:
            if self._interrupting and task is not None:
                self._interrupting = False
                task.uncancel()
                raise Interrupted from None
            raise
        finally:
            self._target = None

    async def first_done(self, jobs: Iterable[asyncio.Future[Any]], *, or_control: bool) -> None:
        """Wait until one of `jobs` is done or, with `or_control`, a control request
        is here (one that came before counts, after the jobs' next step).

        What asyncio.wait(FIRST_COMPLETED) with a task waiting on the control
        event does, without the two tasks, the sets and the cancellation a round
        would pay for it on every tool call.
        """
        loop = asyncio.get_running_loop()
        wake: asyncio.Future[None] = loop.create_future()

        def poke(_: object = None) -> None:
            if not wake.done():
                wake.set_result(None)

        jobs = list(jobs)
        for job in jobs:
            job.add_done_callback(poke)
        if or_control:
            self._listeners.append(poke)
            if self.current is not None:
                loop.call_soon(poke)
        try:
            await wake
        finally:
            for job in jobs:
                job.remove_done_callback(poke)
            if or_control:
                self._listeners.remove(poke)


def cancelled(control: Control, when: str) -> str:
    """The result a call stopped by `control` gets (`when`: "while it ran", ...)."""
    why = (
        f"the task's deadline passed {when}"
        if control.action == "deadline"
        else f"the task was {_PAST[control.action]} {when}"
    )
    if when == "while it ran":  # cut off mid-call: whatever it did may have happened
        return f"Tool call cancelled: {why}. It may or may not have taken effect."
    return f"Tool call cancelled: {why}."
