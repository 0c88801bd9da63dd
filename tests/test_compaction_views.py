"""Compactions shown where a person looks: REST history, `duragent show`, the page."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
from typer.testing import CliRunner

from duragent import Runtime
from duragent.cli import app
from duragent.types import TaskStatus
from server_agents import agents
from support.api import auth, client, runtime, start, wait_for

__all__ = ["client", "runtime"]  # the fixtures this module uses from support.api


async def test_rest_history_lists_the_compactions_and_every_round(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    tid = await start(client, "reader")
    await wait_for(runtime, tid, TaskStatus.COMPLETED)
    r = await client.get(f"/v1/tasks/{tid}/history", headers=auth("alice"))
    assert r.status_code == 200, r.text
    body = r.json()
    compactions = body["compactions"]
    assert compactions and all(c["how"] == "summarised" for c in compactions)
    first = compactions[0]
    assert first["from_round"] == 1 and first["to_round"] >= 1
    assert "last page" in first["summary"]
    # Every round is still there, whole: compaction changes only the model's view.
    assert [x["round"] for x in body["rounds"]] == list(range(1, 14))
    assert all(len(x["calls"][0]["result"]) > 2_000 for x in body["rounds"][:12])
    assert body["rounds"][-1]["assistant"] == "Read all 12 pages."


def test_show_marks_the_compactions_with_their_summary(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/show.db"

    async def run() -> str:
        async with Runtime(url, agents(), poll_interval=0.05) as rt:
            task = await (await rt.submit("reader", "go")).wait(timeout=60)
            assert task.status is TaskStatus.COMPLETED, task.error
            return task.id

    tid = asyncio.run(run())
    result = CliRunner().invoke(app, ["show", tid, "--store", url], env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "compaction: rounds 1–" in out and "summarised" in out
    assert "Read the pages; last page" in out  # the summary, visible
    assert "Rounds 1-" in out and "summarised to fit the context window" in out  # the notice
    # Export holds every entry: each result whole, and the compactions.
    result = CliRunner().invoke(app, ["export", tid, "--store", url])
    assert result.exit_code == 0, result.output
    entries = json.loads(result.output)["entries"]
    results = [e["payload"]["content"] for e in entries if e["kind"] == "tool_result"]
    assert len(results) == 12 and all(len(r) > 2_000 for r in results)
    assert any(e["kind"] == "compaction" for e in entries)
