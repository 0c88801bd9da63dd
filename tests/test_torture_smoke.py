"""The crash-torture harness (bench/torture.py) keeps working, and its checker can fail.

A few real trials per backend (SIGKILL a worker process at random moments,
restart it, let it finish) must report zero violations; the checker must
reject fabricated histories that break each invariant.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root holds bench/

from bench import torture
from bench.torture import StoreDump, TaskDump, check

from conftest import require_postgres

# --- real trials -----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("store", "trials"),
    [("sqlite", 3), ("jsonl", 1), ("postgres", 1)],
)
def test_sigkill_trials_report_no_violations(
    store: str, trials: int, capsys: pytest.CaptureFixture[str]
) -> None:
    if store == "postgres":
        require_postgres()
    reason = torture.available_stores().get(store)
    if reason is not None:
        pytest.skip(reason)
    code = torture.main(
        ["--trials", str(trials), "--kills", "2", "--tasks", "3", "--store", store, "--seed", "7"]
    )
    out = capsys.readouterr().out
    summary = next(line for line in out.splitlines() if line.startswith(f"{store}: trials"))
    assert "violations 0 " in summary, out
    assert "VIOLATION" not in out
    assert code == 0
    assert f"trials {trials}," in summary and "tool runs 0," not in summary


def test_memory_store_is_refused() -> None:
    with pytest.raises(SystemExit):
        torture.main(["--store", "memory", "--trials", "1"])


# --- the checker on fabricated histories -------------------------------------------

T = "t_1"
KEY_U = f"{T}:1:call_0_0"  # a never-replay call
KEY_S = f"{T}:1:call_0_1"  # a replay-safe call


def clean_history() -> tuple[StoreDump, list[StoreDump], list[str], dict[str, str]]:
    """One task, one round with a never-replay and a replay-safe call, killed once
    after its intents were committed; the safe call was re-run, the unsafe one reported
    interrupted (it had started). Passes every check."""
    assistant = {
        "role": "assistant",
        "content": "calling",
        "tool_calls": [
            {
                "id": cid,
                "type": "function",
                "function": {"name": f"{k}_op", "arguments": "{}"},
            }
            for cid, k in (("call_0_0", "unsafe"), ("call_0_1", "safe"))
        ],
    }
    entries: list[tuple[int, str, int, dict[str, Any]]] = [
        (1, "api_message", 1, {"role": "user", "content": "torture task 0"}),
        (2, "status", 0, {"from": "pending", "to": "running", "takeover": False}),
        (3, "api_message", 1, assistant),
        (4, "tool_intent", 1, {"call_id": "call_0_0", "name": "unsafe_op", "replay": "never"}),
        (5, "tool_intent", 1, {"call_id": "call_0_1", "name": "safe_op", "replay": "safe"}),
    ]
    before_kill = StoreDump({T: _task(entries, "running", None, [])})
    entries = [
        *entries,
        (6, "status", 0, {"from": "running", "to": "running", "takeover": True}),
        (
            7,
            "tool_result",
            1,
            {"role": "tool", "tool_call_id": "call_0_0", "content": "x", "outcome": "interrupted"},
        ),
        (
            8,
            "tool_result",
            1,
            {"role": "tool", "tool_call_id": "call_0_1", "content": "ok", "outcome": "ok"},
        ),
        (9, "api_message", 2, {"role": "assistant", "content": "torture task 0 finished"}),
    ]
    view = [
        {"role": "user", "content": "torture task 0"},
        assistant,
        {"role": "tool", "tool_call_id": "call_0_0", "content": "x"},
        {"role": "tool", "tool_call_id": "call_0_1", "content": "ok"},
        {"role": "assistant", "content": "torture task 0 finished"},
    ]
    final = StoreDump({T: _task(entries, "completed", "torture task 0 finished", view)})
    ledger = [
        f"start unsafe {KEY_U}",
        f"start safe {KEY_S}",
        f"start safe {KEY_S}",  # the re-run after the kill
        f"end safe {KEY_S}",
    ]
    return final, [before_kill], ledger, {"torture task 0": "torture task 0 finished"}


def _task(entries: list[Any], status: str, output: Any, view: list[Any]) -> TaskDump:
    last = entries[-1][0] if entries else 0
    return TaskDump(T, status, "torture task 0", output, last, list(entries), view)


def test_checker_accepts_a_clean_history() -> None:
    violations, counts = check(*clean_history())
    assert violations == []
    assert (counts.safe_reruns, counts.interrupted, counts.unsafe_runs) == (1, 1, 1)


Mutation = Callable[[StoreDump, list[StoreDump], list[str]], None]


def _twice_unsafe(final: StoreDump, snaps: list[StoreDump], ledger: list[str]) -> None:
    ledger.append(f"start unsafe {KEY_U}")


def _effect_without_intent(final: StoreDump, snaps: list[StoreDump], ledger: list[str]) -> None:
    ledger.append(f"start unsafe {T}:1:call_9_9")


def _lost_after_kill(final: StoreDump, snaps: list[StoreDump], ledger: list[str]) -> None:
    snaps[0].tasks[T].entries.append((99, "progress", 1, {"text": "only before the kill"}))
    snaps[0].tasks[T].last_seq = 99


def _changed_after_kill(final: StoreDump, snaps: list[StoreDump], ledger: list[str]) -> None:
    seq, kind, rnd, payload = final.tasks[T].entries[2]
    final.tasks[T].entries[2] = (seq, kind, rnd, {**payload, "content": "rewritten"})


def _seq_gap(final: StoreDump, snaps: list[StoreDump], ledger: list[str]) -> None:
    del final.tasks[T].entries[5]


def _call_without_result(final: StoreDump, snaps: list[StoreDump], ledger: list[str]) -> None:
    del final.tasks[T].view[3]


def _two_results(final: StoreDump, snaps: list[StoreDump], ledger: list[str]) -> None:
    t = final.tasks[T]
    t.view.insert(3, {"role": "tool", "tool_call_id": "call_0_0", "content": "again"})
    result = {"role": "tool", "tool_call_id": "call_0_0", "content": "y", "outcome": "ok"}
    t.entries.append((10, "tool_result", 1, result))
    t.last_seq = 10


def _unsafe_ok_not_run(final: StoreDump, snaps: list[StoreDump], ledger: list[str]) -> None:
    ledger.remove(f"start unsafe {KEY_U}")
    seq, kind, rnd, payload = final.tasks[T].entries[6]
    final.tasks[T].entries[6] = (seq, kind, rnd, {**payload, "outcome": "ok"})


def _safe_interrupted(final: StoreDump, snaps: list[StoreDump], ledger: list[str]) -> None:
    seq, kind, rnd, payload = final.tasks[T].entries[7]
    final.tasks[T].entries[7] = (seq, kind, rnd, {**payload, "outcome": "interrupted"})


def _not_completed(final: StoreDump, snaps: list[StoreDump], ledger: list[str]) -> None:
    final.tasks[T].status = "failed"


def _task_missing(final: StoreDump, snaps: list[StoreDump], ledger: list[str]) -> None:
    final.tasks.clear()


@pytest.mark.parametrize(
    ("mutate", "says"),
    [
        (_twice_unsafe, "never-replay tool ran 2 times"),
        (_effect_without_intent, "no committed intent"),
        (_lost_after_kill, "is missing at the end"),
        (_changed_after_kill, "changed"),
        (_seq_gap, "without gaps"),
        (_call_without_result, "0 results in the model view"),
        (_two_results, "2 stored results"),
        (_unsafe_ok_not_run, "is ok but ran 0x"),
        (_safe_interrupted, "replay-safe call"),
        (_not_completed, "ended failed"),
        (_task_missing, "0 tasks for input"),
    ],
)
def test_checker_rejects_a_violation(mutate: Mutation, says: str) -> None:
    final, snaps, ledger, expected = copy.deepcopy(clean_history())
    mutate(final, snaps, ledger)
    violations, counts = check(final, snaps, ledger, expected)
    assert any(says in v for v in violations), violations
    assert counts.violations == len(violations) > 0
