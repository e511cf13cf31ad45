"""Process checks the tests share: is a process (or a process group) still alive, read from /proc."""
from __future__ import annotations

from pathlib import Path


def _stat_fields(stat: Path) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name, or None when the process is gone."""
    try:
        return stat.read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (an orphan's zombie may wait for a non-reaping init)."""
    fields = _stat_fields(Path(f"/proc/{pid}/stat"))
    return fields is not None and fields[0] != "Z"


def group_alive(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat_fields(stat)
        if fields is not None and int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found
