"""Seed 000's StateManager behaviour, with a clock the test controls."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from duragent.runtime._state import DebouncedState


class FakeClock:
    """Time moves only when the test says so; sleepers wake when it passes their deadline."""

    def __init__(self) -> None:
        self.t = 0.0  # quarter steps keep float sums exact
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self.t + seconds, fut))
        await fut

    async def advance(self, seconds: float) -> None:
        for _ in range(10):  # let just-scheduled timers register their sleep first
            await asyncio.sleep(0)
        self.t += seconds
        for deadline, fut in list(self._sleepers):
            if deadline <= self.t and not fut.done():
                fut.set_result(None)
        self._sleepers = [(d, f) for d, f in self._sleepers if not f.done()]
        for _ in range(10):  # let woken savers run to completion
            await asyncio.sleep(0)


class Saves:
    def __init__(self, fail_first: int = 0) -> None:
        self.saved: list[dict[str, Any]] = []
        self.fail_first = fail_first
        self.running = 0
        self.max_running = 0

    async def __call__(self, state: dict[str, Any]) -> None:
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            await asyncio.sleep(0)
            if self.fail_first:
                self.fail_first -= 1
                raise OSError("disk hiccup")
            self.saved.append(state)
        finally:
            self.running -= 1


async def test_rapid_updates_make_one_write() -> None:
    clock, saves = FakeClock(), Saves()
    st = DebouncedState({"n": 0}, saves, debounce=1.0, max_wait=5.0, clock=clock)
    for i in range(1, 11):
        st.update(n=i)
        assert st.state["n"] == i  # memory first: visible at once
        await clock.advance(0.1)
    assert saves.saved == []
    await clock.advance(1.0)
    assert saves.saved == [{"n": 10}]


async def test_continuous_updates_write_every_max_wait() -> None:
    clock, saves = FakeClock(), Saves()
    st = DebouncedState({"n": 0}, saves, debounce=1.0, max_wait=5.0, clock=clock)
    for i in range(1, 49):  # an update every 0.25 s for 12 s: never 1 s of quiet
        st.update(n=i)
        await clock.advance(0.25)
    # n=i is made at t=(i-1)/4. First unsaved change at t=0 -> the timer fires at
    # t=5.0 holding n=20; n=21 (t=5.0) starts the next wait -> saved at t=10.0 with n=40.
    assert [s["n"] for s in saves.saved] == [20, 40]


async def test_flush_writes_immediately_and_only_when_dirty() -> None:
    clock, saves = FakeClock(), Saves()
    st = DebouncedState({"n": 0}, saves, clock=clock)
    st.update(n=1, status="completed")
    await st.flush()
    assert saves.saved == [{"n": 1, "status": "completed"}]
    await st.flush()
    assert len(saves.saved) == 1
    await clock.advance(10)
    assert len(saves.saved) == 1


async def test_failed_save_is_retried_and_saves_never_overlap() -> None:
    clock, saves = FakeClock(), Saves(fail_first=2)
    st = DebouncedState({"n": 0}, saves, debounce=1.0, retry_delay=0.5, clock=clock)
    st.update(n=1)
    await clock.advance(1.0)  # first try fails
    assert saves.saved == [] and st.dirty
    await clock.advance(0.5)  # retry fails
    await clock.advance(0.5)  # retry succeeds
    assert saves.saved == [{"n": 1}]
    assert saves.max_running == 1


async def test_take_hands_state_to_a_commit_and_cancels_the_timer() -> None:
    clock, saves = FakeClock(), Saves()
    st = DebouncedState({"n": 0}, saves, clock=clock)
    st.update(n=5)
    assert st.take() == {"n": 5}
    assert st.take() is None
    await clock.advance(10)
    assert saves.saved == []


@pytest.mark.parametrize("n", [3])
async def test_flush_surfaces_a_persistent_failure(n: int) -> None:
    saves = Saves(fail_first=n)
    st = DebouncedState({"x": 1}, saves, clock=FakeClock())
    st.update(x=2)
    with pytest.raises(OSError):
        await st.flush()
    await st.close()
