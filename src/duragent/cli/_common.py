"""What every command shares: how an error reaches the terminal (one line, never a
traceback; DURAGENT_DEBUG=1 brings back the library's logs with tracebacks), the
`--store` option (else DURAGENT_STORE, else a store in the user's data directory;
commands that only read or act on existing tasks never create one), the
operator's runtime, ages like `30d`, help that shows flags
as flags, and the path `--agents module:attr` is imported from.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import sys
import warnings
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import typer
from pydantic_core import to_jsonable_python
from rich.console import Console
from typer.core import TyperGroup

from duragent._terminal import CleanFormatter, SafeConsole, clean
from duragent.errors import DuragentError, MissingExtra, NoStore, UsageError
from duragent.runtime._runtime import Runtime
from duragent.store._files import DIR_MODE, absolute_hint, missing_store, url_path

T = TypeVar("T")

DEBUG_ENV = "DURAGENT_DEBUG"
STORE_ENV = "DURAGENT_STORE"
STORE_HOME = "duragent"  # the store's folder in the user's data directory


def data_home() -> Path:
    """Where a user's data lives: $XDG_DATA_HOME, else ~/.local/share (%LOCALAPPDATA%
    on Windows), as the XDG Base Directory spec says."""
    xdg = os.environ.get("XDG_DATA_HOME", "")
    if os.path.isabs(xdg):  # the spec: a relative value is invalid, and ignored
        return Path(xdg)
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"])
    return Path.home() / ".local" / "share"


def default_store_url() -> str:
    """The CLI's store when neither --store nor DURAGENT_STORE names one: duragent.db in
    the user's data directory, never in the folder a command runs in, which is the
    root of `duragent run`'s file tools (and often a git checkout)."""
    return f"sqlite:///{data_home() / STORE_HOME / 'duragent.db'}"


def _store_or_default(value: str | None) -> str:
    return value or default_store_url()


STORE = typer.Option(
    None,
    "--store",
    envvar=STORE_ENV,
    show_envvar=True,
    callback=_store_or_default,
    show_default=f"$XDG_DATA_HOME/{STORE_HOME}/duragent.db",
    help="Store URL: sqlite:///file.db, jsonl:///dir or postgresql://…; the flag wins "
    f"over {STORE_ENV}.",
)


def require_store(url: str) -> None:
    """Refuse, naming where it looked, unless the store `url` names exists: a command
    that only reads or acts on existing tasks never creates a store."""
    where = missing_store(url)
    if where is None:
        return
    detail = ""
    parent = os.path.dirname(where)
    # A missing folder is a mistyped path more often than a missing store (the
    # default store's folder is made with the store: nothing to say about it).
    if not os.path.isdir(parent) and url != default_store_url():
        scheme = url.partition("://")[0].lower()
        detail = f" (directory does not exist: {parent}; {absolute_hint(scheme, url_path(url))})"
    raise NoStore(
        f"no store at {where}{detail}: this command never creates one; name yours with "
        f"--store URL or {STORE_ENV}=URL"
    )


def prepare_store(url: str) -> None:
    """Before a command that may create its store: the default store's folder (0700)."""
    if url == default_store_url():
        home = data_home() / STORE_HOME
        try:
            home.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                home.mkdir(DIR_MODE)
        except OSError as exc:
            raise UsageError(
                f"cannot make the store's folder {home}: {exc.strerror or exc}; name "
                f"another store with --store URL or {STORE_ENV}=URL"
            ) from None


class Commands(TyperGroup):
    """Shows flags as `--keep` and `--crash/--no-crash` in help, without a `<bool>` type
    column (typer's rich help labels every flag, `--help` included, with one).

    Typed loosely: typer ships its own copy of click, whose classes are private.
    """

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            _untype_flags(command.get_params(ctx))
        return command

    def get_params(self, ctx: Any) -> Any:
        params = super().get_params(ctx)
        _untype_flags(params)
        return params


def _untype_flags(params: list[Any]) -> None:
    for param in params:
        if getattr(param, "is_flag", False) and getattr(param, "metavar", "") is None:
            param.metavar = ""


def exit_code(exc: BaseException) -> int:
    """2 for what the command line itself got wrong (a malformed URL, a missing extra);
    1 for everything else duragent refused."""
    return 2 if isinstance(exc, (MissingExtra, ValueError)) else 1


def fail(exc: BaseException, code: int | None = None) -> NoReturn:
    """One line on stderr and the exit code (`code`, else `exit_code(exc)`), instead of a
    traceback."""
    # The message may quote model or web text: it is cleaned of terminal controls.
    typer.secho(f"error: {clean(str(exc))}", fg=typer.colors.RED, err=True)
    raise typer.Exit(exit_code(exc) if code is None else code)


def run_async(make: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine; a duragent error or a malformed store URL (ValueError)
    is one line on stderr and exit code `exit_code(...)`."""
    try:
        return asyncio.run(make)
    except (DuragentError, ValueError) as exc:
        if debugging():
            raise  # asked for: the traceback
        fail(exc)


_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(text: str, what: str = "a duration") -> timedelta:
    """'90s', '15m', '12h', '30d' -> a timedelta (a bad one is a usage error, exit 2)."""
    try:
        return timedelta(seconds=float(text[:-1]) * _UNITS[text[-1]])
    except (KeyError, ValueError, IndexError, OverflowError):
        raise typer.BadParameter(f"{text!r} is not {what} like 90s, 15m, 12h or 30d") from None


def parse_age(text: str) -> timedelta:
    """'30d', '12h', '15m', '90s' -> a timedelta."""
    return parse_duration(text, "an age")


JSON = typer.Option(False, "--json", help="Print JSON (for jq and scripts), not a table.")
_C1 = re.compile(r"[\x7f-\x9f]")


def emit_json(data: Any) -> None:
    """`data` as indented JSON on stdout. json.dumps escapes C0 controls (ESC too);
    C1 controls are legal raw in JSON text but commands to a terminal: escaped as well."""
    text = json.dumps(to_jsonable_python(data), indent=2, ensure_ascii=False)
    typer.echo(_C1.sub(lambda m: f"\\u{ord(m.group()):04x}", text))


def make_console(**options: Any) -> Console:
    """The console every command prints with: it cleans what it writes (_terminal.py)."""
    return SafeConsole(highlight=False, **options)


@asynccontextmanager
async def operator_runtime(url: str, *, create: bool = False) -> AsyncIterator[Runtime]:
    """A runtime without a worker: operator commands act on the store; workers run tasks.
    Only with `create` (a command that records something new) is a missing store made."""
    if create:
        prepare_store(url)
    else:
        require_store(url)
    async with Runtime(url, run_worker=False) as rt:
        yield rt


def import_from_cwd() -> None:
    """Let `--agents myagents:AGENTS` find ./myagents.py, as `python -m` and uvicorn do.

    The `duragent` script's own directory is first on sys.path, not the
    directory the user is in.
    """
    cwd = os.getcwd()
    if not any(os.path.abspath(p or ".") == cwd for p in sys.path):
        sys.path.insert(0, cwd)


def debugging() -> bool:
    """Whether the user asked for tracebacks and DEBUG logs (DURAGENT_DEBUG=1 or --debug)."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


LOG_FORMAT = "%(asctime)s %(name)s %(message)s"


def quiet_logs() -> None:
    """The library logs a failing task; the terminal commands say what happened in one
    line, so those records go nowhere unless asked for (`worker` and `serve` log to
    the terminal: `log_to_terminal`). A warning from a library is one line too."""
    warnings.showwarning = _warning_line
    if debugging():
        _handler(logging.DEBUG)
    else:
        logging.getLogger("duragent").addHandler(logging.NullHandler())


def log_to_terminal() -> None:
    """Logs on stderr for the long-running commands, each record cleaned of terminal
    controls: duragent's (and the server's, which uvicorn levels) from INFO, other
    libraries' from WARNING, so an HTTP client's line per model request stays out."""
    if debugging():
        _handler(logging.DEBUG)
        return
    _handler(logging.WARNING)
    logging.getLogger("duragent").setLevel(logging.INFO)


def _handler(level: int) -> None:
    root = logging.getLogger()
    if not any(isinstance(h.formatter, CleanFormatter) for h in root.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(CleanFormatter(LOG_FORMAT))
        root.addHandler(handler)
    root.setLevel(level)


def _warning_line(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """A library's warning (a FutureWarning, a DeprecationWarning) as one line on
    stderr, without the source line Python quotes; where it came from with --debug."""
    where = f" ({filename}:{lineno})" if debugging() else ""
    text = " ".join(str(message).split())
    sys.stderr.write(clean(f"warning: {category.__name__}: {text}{where}") + "\n")
