"""`duragent compact`: maintenance of a store's files."""

from __future__ import annotations

import os

import typer

from duragent.cli._common import STORE_ENV, fail
from duragent.errors import DuragentError, UsageError

app = typer.Typer()


def _jsonl_directory(url: str) -> str:
    scheme, sep, _ = url.partition("://")
    if not sep or scheme.lower() != "jsonl":
        raise typer.BadParameter(
            f"{url!r} is not a JSONL store; only jsonl:///dir stores are compacted by duragent "
            "(for SQLite run VACUUM; PostgreSQL vacuums itself)",
            param_hint="--store",
        )
    from duragent.store._files import jsonl_directory

    try:
        return jsonl_directory(url)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--store") from None


def _lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


@app.command()
def compact(
    store: str = typer.Option(
        ...,
        "--store",
        envvar=STORE_ENV,
        show_envvar=True,
        help="The JSONL store to compact: jsonl:///dir.",
    ),
) -> None:
    """Rewrite a JSONL store's log as its current state (no process may have it open).

    Removed: superseded task rows and documents, deleted tasks, commit markers
    of old commits, and the progress entries of finished tasks. Every task,
    every other entry (voided ones too) and every document stays.
    """
    from duragent.store._files import LOG_NAME
    from duragent.store._jsonl import compact as compact_log

    directory = _jsonl_directory(store)
    log = os.path.join(directory, LOG_NAME)
    if not os.path.isfile(log):
        fail(UsageError(f"no JSONL store in {directory} (no {LOG_NAME})"))
    lines_before = _lines(log)
    try:
        result = compact_log(directory)
    except DuragentError as exc:
        fail(exc)
    lines_after = _lines(log)
    saved = result.bytes_before - result.bytes_after
    share = saved / result.bytes_before if result.bytes_before else 0.0
    typer.echo(f"compacted {directory}")
    typer.echo(
        f"  log: {result.bytes_before:,} -> {result.bytes_after:,} bytes (-{share:.0%}), "
        f"{lines_before:,} -> {lines_after:,} lines"
    )
    others = lines_before - lines_after - result.entries_dropped
    typer.echo(
        f"  removed: {result.entries_dropped:,} progress entries of finished tasks; "
        f"{others:,} superseded task rows, documents, deleted tasks' records and commit markers"
    )
