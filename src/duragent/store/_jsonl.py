"""The JSONL store: one append-only log file in a directory, owned by one process.

The state lives in memory exactly as in MemoryStore (and is changed by the
same commit algorithm); this module only makes it durable. Each commit is
written as its record lines followed by a commit marker line. On open the log
is replayed; lines after the last marker belong to a commit that never
finished (the process died mid-write) and are cut off the file, so a commit
exists on disk if and only if its marker does.

Every record and marker line ends with the CRC-32 of the rest of the line
(`{...,"crc":"1a2b3c4d"}`, log format 2), so a byte changed after the write
is reported instead of being read back. A torn tail never holds such a line:
a process killed mid-write leaves an unfinished last line, power loss leaves
zeros. A format-1 log (no checksums) is rewritten as format 2 on open.

    log.jsonl   header line, then records and markers (created 0600)
    lock        flock'ed by the owning process, holds its pid (0600)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qsl

from duragent.errors import (
    InvalidOption,
    StoreCorrupt,
    StoreError,
    StoreLocked,
    StoreUnavailable,
    StoreVersionError,
)
from duragent.store._codec import kind_as_stored
from duragent.store._files import (
    DIR_MODE,
    FILE_MODE,
    LOG_NAME,
    full_error,
    is_full,
    require_parent,
)
from duragent.store._memory import SCHEMA_VERSION, MemoryStore, _MemoryTx
from duragent.store._open_files import Held, hold
from duragent.store._session_scopes import LEGACY_PREFIX, migrated_scope
from duragent.types import Document, Entry, EntryKind, Task

Durability = Literal["normal", "full"]
_T = TypeVar("_T")

LOCK_NAME = "lock"
COMPACT_SUFFIX = ".compact"
FORMAT = "duragent-jsonl"
# The layout of the lines (not of the data: that is SCHEMA_VERSION).
# 1: plain JSON lines; 2: every record and marker carries its CRC-32.
LOG_VERSION = 2

_CRC_KEY = b',"crc":"'
_SEAL_LEN = len(_CRC_KEY) + 8 + 2  # ,"crc":"  8 hex digits  "}


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _seal(line: bytes) -> bytes:
    """A JSON object line with its CRC-32 as a last key (computed over `line`)."""
    return b'%s%s%08x"}' % (line[:-1], _CRC_KEY, zlib.crc32(line))


def _unseal(line: bytes) -> bytes | None:
    """The line as it was sealed, or None if its checksum is missing or wrong."""
    if len(line) <= _SEAL_LEN or line[-_SEAL_LEN:-10] != _CRC_KEY or line[-2:] != b'"}':
        return None
    body = line[:-_SEAL_LEN] + b"}"
    try:
        crc = int(line[-10:-2], 16)
    except ValueError:
        return None
    return body if zlib.crc32(body) == crc else None


def _header(schema_version: int = SCHEMA_VERSION) -> bytes:
    head = {"format": FORMAT, "schema_version": schema_version, "log_version": LOG_VERSION}
    return (_dumps(head) + "\n").encode()


_V1_HEADER = _dumps({"format": FORMAT, "schema_version": 1}).encode()


def _marker(records: int) -> bytes:
    return _seal(_dumps({"t": "commit", "records": records}).encode()) + b"\n"


def _body(lines: list[str]) -> bytes:
    return b"".join(_seal(line.encode()) + b"\n" for line in lines)


def _entry_line(e: Entry) -> str:
    return _dumps(
        {
            "t": "entry",
            "task_id": e.task_id,
            "seq": e.seq,
            "kind": e.kind.value,
            "round": e.round,
            "payload": e.payload,
            "at": e.created_at.isoformat(),
        }
    )


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# Data and size, without the metadata fsync would also flush (where the OS offers it).
_sync = getattr(os, "fdatasync", os.fsync)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_new(path: str, data: bytes) -> None:
    """Write a whole file (mode 0600) and fsync it, ready to be renamed into place."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _damaged(path: str, number: int, offset: int, what: str, good_end: int) -> StoreCorrupt:
    return StoreCorrupt(
        f"{path}:{number}: {what} (line {number} starts at byte {offset}); the log was "
        "changed after it was written, nothing was opened. Restore it from a backup, or "
        f"keep the commits before the damage by cutting the file there: truncate -s "
        f"{good_end} {path} (every later commit is lost)"
    )


def _acquire_lock(directory: str) -> int:
    fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StoreLocked(
            f"the JSONL store {directory} is owned by pid {holder}; it can have one owner at "
            "a time: stop that process, or use sqlite:// or postgresql:// to share a store "
            "between processes"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


@dataclass(slots=True)
class CompactResult:
    bytes_before: int
    bytes_after: int
    entries_dropped: int


class JSONLStore(MemoryStore):
    """`JSONLStore("/abs/dir", durability="normal" | "full")`.

    `normal` survives the process being killed (the OS has every write);
    `full` fsyncs the records before writing the marker, and the marker
    before acknowledging, so a commit also survives power loss.
    """

    migrated_from: int  # the schema version the log was written with

    def __init__(self, directory: str, *, durability: Durability = "normal") -> None:
        if durability not in ("normal", "full"):
            raise InvalidOption(f"durability must be 'normal' or 'full', not {durability!r}")
        directory = os.path.abspath(os.path.expanduser(directory))
        super().__init__(f"jsonl://{directory}")
        self.directory = directory
        self.path = os.path.join(directory, LOG_NAME)
        self.durability: Durability = durability
        self.truncated_bytes = 0  # how much torn tail the last open cut off
        self.log_upgraded_from: int | None = None  # the line format an upgrade on open left
        self._opened = False
        self._closed = False
        # Made by `open`: the log's descriptors, the directory's hold, its size.
        self._held: Held
        self._lock_fd: int
        self._fd: int
        self._size = 0
        self.migrated_from = SCHEMA_VERSION  # the schema version the log was written with

    async def open(self) -> None:
        """Create the directory if needed, lock it, replay the log and migrate it;
        again, nothing."""
        self._open_files()

    def _open_files(self) -> None:
        if self._opened:
            return
        if self._closed:
            raise StoreError(f"store {self.url} is closed")
        directory = self.directory
        # The store is the directory: created here (0700), its parent never.
        require_parent(directory, "create it first (duragent creates the store, not its parents)")
        # The whole directory, until close: no tool of ours touches it.
        self._held = hold([directory])
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(directory, DIR_MODE)
            self._lock_fd = _acquire_lock(directory)
        except OSError as exc:
            self._held.release()
            raise _open_error(directory, exc) from None
        except BaseException:
            self._held.release()
            raise
        try:
            self._size = self._replay()
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            os.close(self._lock_fd)
            self._held.release()
            raise _open_error(self.path, exc) from None
        except BaseException:
            os.close(self._lock_fd)
            self._held.release()
            raise
        self._opened = True
        if self.migrated_from < SCHEMA_VERSION:
            self._migrate()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> JSONLStore:
        """jsonl:///rel/dir or jsonl:////abs/dir, ?durability=full (keyword options win)."""
        from duragent.store._files import jsonl_directory

        query = url.partition("?")[2]
        opts: dict[str, Any] = {**dict(parse_qsl(query)), **options}
        return cls(jsonl_directory(url), **opts)

    # --- lifecycle ---

    async def close(self) -> None:
        self._close_files()

    def _close_files(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._opened:
            return
        os.close(self._fd)
        os.close(self._lock_fd)  # closing the descriptor releases the flock
        self._held.release()

    async def __aenter__(self) -> JSONLStore:
        await self.open()
        return self

    # --- replay ---

    def _replay(self) -> int:
        """Load the log into memory, cut off a torn tail; return the file's size."""
        data = self._read_log()
        if b"\n" not in data:
            if not (_header().startswith(data) or _V1_HEADER.startswith(data)):
                raise StoreCorrupt(f"{self.path}:1: not a duragent JSONL log (bad header line)")
            # New, or died while writing the header: nothing was ever committed.
            self._create_log()
            return len(_header())
        lines = data.split(b"\n")
        version = self._check_header(lines[0])
        valid_end, kept = self._apply_commits(lines, sealed=version >= 2)
        if version < 2:
            self.truncated_bytes = len(data) - valid_end
            return self._upgrade_log(version, kept)
        if _holds_a_whole_line(lines[-1]):
            # An unfinished line is a prefix of what was written; this one holds a whole
            # line and more, so its newline was changed.
            start = len(data) - len(lines[-1])
            raise _damaged(self.path, len(lines), start, "checksum mismatch", valid_end)
        if valid_end < len(data):
            self.truncated_bytes = len(data) - valid_end
            with open(self.path, "r+b") as f:
                f.truncate(valid_end)
                f.flush()
                os.fsync(f.fileno())
        return valid_end

    def _read_log(self) -> bytes:
        """The log file's bytes (none if there is no file yet)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path + COMPACT_SUFFIX)  # a compaction that died before its rename
        try:
            with open(self.path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return b""

    def _apply_commits(self, lines: list[bytes], *, sealed: bool) -> tuple[int, list[bytes]]:
        """Apply each group of records its commit marker closes; the offset where the
        last committed group ends, and (format 1) the committed lines to rewrite.
        `lines` is the log split at newlines: the header first, the unended rest last."""
        offset = valid_end = len(lines[0]) + 1
        group: list[tuple[int, dict[str, Any]]] = []
        kept: list[bytes] = []
        pending: list[bytes] = []
        unreadable: tuple[int, int, str] | None = None  # first bad line since the last marker
        for number, line in enumerate(lines[1:-1], start=2):
            start, offset = offset, offset + len(line) + 1
            record = self._record(line, number, start, sealed=sealed, valid_end=valid_end)
            if isinstance(record, str):
                unreadable = unreadable or (number, start, record)
                continue
            if record["t"] != "commit":
                group.append((number, record))
                pending.append(line)
                continue
            if unreadable is not None:
                # A commit marker after a bad line: the damage is not a torn tail.
                raise _damaged(self.path, *unreadable, valid_end)
            if record.get("records") != len(group):
                raise _damaged(
                    self.path,
                    number,
                    start,
                    f"commit marker counts {record.get('records')} records but "
                    f"{len(group)} precede it",
                    valid_end,
                )
            self._apply(group)
            if not sealed:
                kept += pending
                kept.append(line)
            group, pending = [], []
            valid_end = offset
        return valid_end, kept

    def _record(
        self, line: bytes, number: int, start: int, *, sealed: bool, valid_end: int
    ) -> dict[str, Any] | str:
        """The record on line `number` (at byte `start`), or why it cannot be read when
        that may still be a torn tail; StoreCorrupt when it cannot be."""
        body = line
        if sealed:
            unsealed = _unseal(line)
            if unsealed is None:
                if b"\0" in line:
                    # Zeros where power loss left a hole: torn, if nothing committed follows.
                    return "unreadable line"
                # A whole line that is not what was written: a changed byte. (A process
                # killed mid-write leaves its line unfinished: that one is not read here.)
                what = "checksum mismatch" if _parses(line) else "unreadable line"
                raise _damaged(self.path, number, start, what, valid_end)
            body = unsealed
        try:
            record: dict[str, Any] = json.loads(body)
            record["t"]  # raises unless it is an object that names its record type
        except (ValueError, TypeError, KeyError) as exc:
            if sealed:  # its checksum held, so a writer wrote it this way
                raise _damaged(self.path, number, start, f"bad record: {exc}", valid_end) from None
            return f"unreadable line: {exc}"
        return record

    def _upgrade_log(self, version: int, lines: list[bytes]) -> int:
        """Rewrite a format-1 log's committed lines with checksums; the new size.

        Written whole and fsynced beside the old file before it replaces it,
        so a crash leaves one of the two intact (a leftover is removed on open).
        """
        # The data keeps its schema version: _migrate (after replay) moves it on.
        out = [_header(self.migrated_from or SCHEMA_VERSION)]
        for line in lines:
            line = line.strip()
            if not line.endswith(b"}"):
                line = _dumps(json.loads(line)).encode()
            out.append(_seal(line) + b"\n")
        data = b"".join(out)
        tmp = self.path + COMPACT_SUFFIX
        _write_new(tmp, data)
        os.replace(tmp, self.path)
        _fsync_dir(self.directory)
        self.log_upgraded_from = version
        return len(data)

    def _create_log(self) -> None:
        tmp = self.path + COMPACT_SUFFIX
        _write_new(tmp, _header())
        os.replace(tmp, self.path)
        _fsync_dir(self.directory)

    def _check_header(self, line: bytes) -> int:
        """The header's log format version; refuses a foreign file or a newer duragent's."""
        try:
            header = json.loads(line)
            found = header["schema_version"]
            log_version = header.get("log_version", 1)
            ok = (
                header["format"] == FORMAT
                and isinstance(found, int)
                and isinstance(log_version, int)
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            ok = False
        if not ok:
            raise StoreCorrupt(f"{self.path}:1: not a duragent JSONL log (bad header line)")
        if log_version > LOG_VERSION:
            raise StoreVersionError(f"{self.path} (log format)", log_version, LOG_VERSION)
        if found > SCHEMA_VERSION:
            raise StoreVersionError(self.path, found, SCHEMA_VERSION)
        self.migrated_from = found  # older versions are migrated once replayed
        return int(log_version)

    def _apply(self, group: list[tuple[int, dict[str, Any]]]) -> None:
        """Install one committed group through the same path a live commit takes."""
        tx = _MemoryTx(self)
        doomed: list[str] = []
        for number, r in group:
            try:
                kind = r["t"]
                if kind == "task":
                    task = Task.model_validate(r["v"])
                    tx.tasks[task.id] = _dumps(r["v"])
                elif kind == "entry":
                    tx.entries.append(
                        Entry.model_construct(
                            task_id=r["task_id"],
                            seq=int(r["seq"]),
                            kind=kind_as_stored(r["kind"]),
                            round=int(r["round"]),
                            payload=r["payload"],
                            created_at=datetime.fromisoformat(r["at"]),
                        )
                    )
                elif kind == "doc":
                    doc = Document.model_validate(r["v"])
                    tx.docs[(doc.scope, doc.key)] = _dumps(r["v"])
                elif kind == "undoc":
                    tx.docs[(r["scope"], r["key"])] = None
                elif kind == "delete":
                    doomed += [str(tid) for tid in r["ids"]]
                else:
                    raise ValueError(f"unknown record type {kind!r}")
            except (ValueError, TypeError, KeyError) as exc:
                raise StoreCorrupt(f"{self.path}:{number}: bad record: {exc}") from exc
        tx.install()
        self._forget(doomed)

    def _migrate(self) -> None:
        """Bring the replayed state to SCHEMA_VERSION and rewrite the log with it.

        Version 2: session documents are scoped per owner (_session_scopes.py).
        The rewrite is a compaction, so a crash leaves the old log or the new.
        """
        owners: dict[str, set[str | None]] = {}
        for raw in self._tasks.values():
            task = Task.model_validate_json(raw)
            if task.session_id is not None:
                owners.setdefault(task.session_id, set()).add(task.owner)
        # All out first, then all back in: a renamed one never lands on one not yet renamed.
        legacy = [(k, raw) for k, raw in self._docs.items() if k[0].startswith(LEGACY_PREFIX)]
        for k, _raw in legacy:
            del self._docs[k]
        for (scope, key), raw in legacy:
            session_id = scope[len(LEGACY_PREFIX) :]
            new = migrated_scope(session_id, owners.get(session_id, ()))
            doc = Document.model_validate_json(raw).model_copy(update={"scope": new})
            self._docs[(new, key)] = doc.model_dump_json()
        try:
            self.compact()
        except OSError as exc:
            self._close_files()
            raise StoreUnavailable(f"could not migrate the JSONL store {self.path}: {exc}") from exc

    def _readable(self) -> None:
        # Before open() nothing is replayed: a read would find an empty store.
        if not self._opened and not self._closed:
            raise StoreError(
                f"store {self.url} is not open: use `async with store:` or `await store.open()`"
            )

    # --- writing ---

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"store {self.url} is closed")
        if not self._opened:
            raise StoreError(
                f"store {self.url} is not open: use `async with store:` or `await store.open()`"
            )

    def _append(self, lines: list[str]) -> None:
        """Write one commit: its records, then its marker. On failure, leave no trace."""
        body = _body(lines)
        marker = _marker(len(lines))
        try:
            if self.durability == "full":
                _write_all(self._fd, body)
                _sync(self._fd)
                _write_all(self._fd, marker)
                _sync(self._fd)
            else:
                _write_all(self._fd, body + marker)
        except OSError as exc:
            try:
                # Records without a marker would be cut off on the next open anyway,
                # but a later commit's marker must never follow them.
                os.ftruncate(self._fd, self._size)
            except OSError:
                self._close_files()
            if is_full(exc):
                raise full_error(self.path, exc) from exc
            raise StoreUnavailable(f"could not write the JSONL store {self.path}: {exc}") from exc
        self._size += len(body) + len(marker)

    def _run(self, job: Callable[[_MemoryTx], _T]) -> _T:
        self._check_open()
        tx = _MemoryTx(self)
        result = job(tx)
        if tx.tasks or tx.entries or tx.docs:
            self._append(_tx_lines(tx))  # on disk first: memory only ever holds committed state
            tx.install()
            self._signal.notify()
            self._moved.fire(frozenset(tx.tasks))
        return result

    def _record_delete(self, task_ids: list[str]) -> None:
        """A delete record on disk first, then the tasks leave memory."""
        self._check_open()
        self._append([_dumps({"t": "delete", "ids": task_ids})])

    async def reclaim_space(self) -> None:
        """Rewrite the log without the deleted tasks (compaction)."""
        self.compact()

    # --- compaction ---

    def compact(self) -> CompactResult:
        """Rewrite the log as one commit of the current state.

        Kept: every task's latest row, every entry with its original seq
        (voided ones too: they are the audit trail), every document. Dropped:
        superseded task rows and documents, deleted tasks, and the progress
        entries of finished tasks but their custom events (no recovery will ever read them; a live
        task's progress may still be read to resume, so it stays).
        The new file is complete and fsynced before it replaces the old one,
        so a crash at any moment leaves one of the two intact.
        """
        self._check_open()
        lines: list[str] = []
        dropped = 0
        for tid, raw in self._tasks.items():
            lines.append('{"t":"task","v":' + raw + "}")
            finished = Task.model_validate_json(raw).status.terminal
            kept = []
            for row in self._entries.get(tid, ()):
                seq, kind, rnd, payload, created = row
                # (a tool's custom event is kept: it is history, not a stream)
                if finished and kind == EntryKind.PROGRESS and "event" not in json.loads(payload):
                    dropped += 1
                    continue
                kept.append(row)
                entry = Entry.model_construct(
                    task_id=tid,
                    seq=seq,
                    kind=kind_as_stored(kind),
                    round=rnd,
                    payload=json.loads(payload),
                    created_at=created,
                )
                lines.append(_entry_line(entry))
            if tid in self._entries:
                self._entries[tid] = kept
        lines += ['{"t":"doc","v":' + raw + "}" for raw in self._docs.values()]
        tmp = self.path + COMPACT_SUFFIX
        data = _header()
        if lines:
            data += _body(lines) + _marker(len(lines))
        _write_new(tmp, data)
        os.replace(tmp, self.path)
        _fsync_dir(self.directory)
        before, self._size = self._size, len(data)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        return CompactResult(bytes_before=before, bytes_after=len(data), entries_dropped=dropped)


def _tx_lines(tx: _MemoryTx) -> list[str]:
    # Task and document rows are already JSON text: embed them without re-encoding.
    lines = ['{"t":"task","v":' + raw + "}" for raw in tx.tasks.values()]
    lines += [_entry_line(e) for e in tx.entries]
    for (scope, key), raw in tx.docs.items():
        if raw is None:
            lines.append(_dumps({"t": "undoc", "scope": scope, "key": key}))
        else:
            lines.append('{"t":"doc","v":' + raw + "}")
    return lines


def compact(path: str) -> CompactResult:
    """Compact the JSONL store in directory `path` (which no process may have open)."""
    store = JSONLStore(path, durability="full")
    store._open_files()
    try:
        return store.compact()
    finally:
        store._close_files()


def _holds_a_whole_line(segment: bytes) -> bool:
    """A whole sealed line and more bytes (a cut write ends, at most, with the line)."""
    at = segment.find(_CRC_KEY)
    while at != -1:
        end = at + _SEAL_LEN
        if end < len(segment) and _unseal(segment[:end]) is not None:
            return True
        at = segment.find(_CRC_KEY, at + 1)
    return False


def _parses(line: bytes) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def _open_error(path: str, exc: OSError) -> StoreError:
    if is_full(exc):
        return full_error(path, exc)
    return StoreUnavailable(f"cannot open the JSONL store {path}: {exc}")
