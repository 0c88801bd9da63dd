"""`duragent run --output-schema FILE` as a real process against a scripted
OpenAI-compatible server: the schema goes with the request, a wrong answer is
asked again, and the answer's JSON is the task's output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from duragent.types import TaskStatus
from support.cli_run import Cli, Serve, run_args, serve, stored, task_id_in, workdir

__all__ = ["serve", "workdir"]  # the fixtures this module uses from support.cli_run

SCHEMA = {
    "title": "Summary",
    "type": "object",
    "properties": {"files": {"type": "integer"}, "topic": {"type": "string"}},
    "required": ["files", "topic"],
}


@pytest.mark.slow
async def test_run_with_an_output_schema_gives_checked_json(
    serve: Serve, workdir: Path, tmp_path: Path
) -> None:
    server = serve(['{"files": "two"}', '{"files": 2, "topic": "notes"}'])
    store = f"sqlite:///{tmp_path}/cli.db"
    schema = tmp_path / "summary.json"
    schema.write_text(json.dumps(SCHEMA))

    args = [*run_args(server, store, workdir, "Summarise"), "--output-schema", str(schema)]
    code, out, err = Cli(*args).finish()

    assert code == 0, out + err
    task, _ = await stored(store, task_id_in(out))
    assert task.status is TaskStatus.COMPLETED
    assert task.output == {"files": 2, "topic": "notes"}
    assert '"topic": "notes"' in out  # printed, pretty
    fmt = server.requests[0].json["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "Summary"
    assert "files" in server.requests[1].json["messages"][-1]["content"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("text", "says"),
    [("{not json", "not a JSON file"), ('{"type": "array"}', '"type": "object"')],
)
def test_a_bad_schema_file_is_one_line_and_asks_nothing(
    serve: Serve, workdir: Path, tmp_path: Path, text: str, says: str
) -> None:
    server = serve(["never asked"])
    schema = tmp_path / "bad.json"
    schema.write_text(text)
    args = run_args(server, f"sqlite:///{tmp_path}/cli.db", workdir, "Hi")
    code, _, err = Cli(*args, "--output-schema", str(schema)).finish()
    assert code != 0
    assert says in err and len(err.strip().splitlines()) == 1, err
    assert server.requests == []
