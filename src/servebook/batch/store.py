"""Durable, append-only JSONL results keyed by request id.

Rules that make a kill -9 (or a power cut) lose nothing and duplicate nothing:

* A result counts only when its whole line, newline included, is on disk. The driver
  appends a chunk's lines with ``write`` on an ``O_APPEND`` descriptor, then ``fsync``:
  once :meth:`ResultStore.append` returns, the chunk survives a crash.
* A crash can leave a torn tail: bytes after the last newline (a write cut short), or a
  last line that is not a complete JSON record. :func:`repair_torn_tail` detects it, moves
  those bytes to ``<output>.torn`` (kept for inspection, never counted) and truncates the
  file at the end of the last complete record. Those requests simply run again.
* A bad line *before* the last one is not a crash artefact (appends never rewrite the
  middle of a file): it is reported as an error, never "repaired" by guessing.
* On restart the driver reads the done ids and skips them; a second record for an id is
  an error (two drivers wrote the same file), and a lock file stops two drivers from
  appending to one output at the same time.
"""
from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from servebook.errors import ServebookError


@dataclass(frozen=True)
class RepairReport:
    """What :func:`repair_torn_tail` found: bytes removed (0 when the file was whole)."""

    path: Path
    removed_bytes: int
    kept_records: int
    torn_copy: Path | None

    @property
    def repaired(self) -> bool:
        return self.removed_bytes > 0


def _record_id(line: bytes) -> str | None:
    """The id of a complete record line, or None when the line is not one."""
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(obj, dict) or "id" not in obj:
        return None
    return str(obj["id"])


def repair_torn_tail(path: str | Path) -> RepairReport:
    """Cut a crash's torn last record off ``path`` (see the module docstring).

    Returns a report; raises ServebookError when a line other than the last is damaged.
    A missing file is reported as whole and empty.
    """
    path = Path(path)
    if not path.exists():
        return RepairReport(path, 0, 0, None)
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1          # end of the last newline-terminated line (0 if none)
    lines = data[:end].split(b"\n")[:-1] if end else []
    keep_end = end
    if lines and _record_id(lines[-1]) is None:
        # The last terminated line is not a record: a torn write that happened to end
        # in a newline byte, or zero-filled blocks. Drop it too.
        keep_end = end - len(lines[-1]) - 1
        lines = lines[:-1]
    for number, line in enumerate(lines, start=1):
        if _record_id(line) is None:
            raise ServebookError(
                f"{path}: line {number} is not a complete result record, but it is not the last line, "
                "so this is not a crash's torn write; move the file aside and inspect it "
                "(the driver never rewrites earlier lines)")
    removed = len(data) - keep_end
    torn_copy = None
    if removed:
        torn_copy = path.with_name(path.name + ".torn")
        with open(torn_copy, "ab") as handle:
            handle.write(data[keep_end:])
            handle.flush()
            os.fsync(handle.fileno())
        with open(path, "r+b") as handle:
            handle.truncate(keep_end)
            handle.flush()
            os.fsync(handle.fileno())
    return RepairReport(path, removed, len(lines), torn_copy)


def read_results(path: str | Path) -> dict[str, dict]:
    """Every complete record of ``path`` by id (a torn tail is ignored, not repaired).

    Raises ServebookError on a duplicate id or a damaged line before the last one.
    """
    path = Path(path)
    if not path.exists():
        return {}
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    lines = data[:end].split(b"\n")[:-1] if end else []
    out: dict[str, dict] = {}
    for number, line in enumerate(lines, start=1):
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            obj = None
        if not isinstance(obj, dict) or "id" not in obj:
            if number == len(lines):
                break                      # torn last line: not a result
            raise ServebookError(f"{path}: line {number} is not a result record; run `servebook batch repair` "
                                 "only on a crash's torn tail, and inspect damage elsewhere by hand")
        rid = str(obj["id"])
        if rid in out:
            raise ServebookError(f"{path}: id {rid!r} has two results (line {number} repeats it); "
                                 "two drivers wrote this file: give each replica its own --output")
        out[rid] = obj
    return out


class ResultStore:
    """The output file of one driver: repair on open, then fsync'd appends of whole chunks.

    Use as a context manager; it holds ``<output>.lock`` so a second driver on the same
    output fails at once instead of interleaving records.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fd: int | None = None
        self._lock = None
        self.repair: RepairReport | None = None
        self.done: dict[str, dict] = {}

    def __enter__(self) -> "ResultStore":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.path.with_name(self.path.name + ".lock"), "a+")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise ServebookError(f"another driver is writing {self.path}; wait for it, or give this one "
                                 "another --output (one output file per replica)") from None
        self.repair = repair_torn_tail(self.path)
        self.done = read_results(self.path)
        created = not self.path.exists()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if created:                         # make the new directory entry durable too
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def append(self, records: Iterable[dict]) -> int:
        """Append records (each with an ``id`` not yet done) in one write, then fsync.

        Returns the number appended. Raises ServebookError for an id already done.
        """
        if self._fd is None:
            raise RuntimeError("ResultStore is not open; use it as a context manager")
        batch = list(records)
        seen: set[str] = set()
        for rec in batch:
            rid = str(rec["id"])
            if rid in self.done or rid in seen:
                raise ServebookError(f"id {rid!r} already has a result in {self.path}; the driver must skip done ids")
            seen.add(rid)
        blob = b"".join(json.dumps(rec, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
                        for rec in batch)
        view = memoryview(blob)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        os.fsync(self._fd)
        for rec in batch:
            self.done[str(rec["id"])] = rec
        return len(batch)
