"""Errors the lab harness raises: each names what went wrong and what to change."""
from __future__ import annotations

from servebook.errors import ServebookError


class LabError(ServebookError):
    """A lab could not run as asked (bad profile, missing result, failed load run)."""


class PortInUseError(LabError):
    """The port asked for is taken; the message names it and, when known, the owning PID."""


class EngineStartError(LabError):
    """The engine exited or timed out before ``/health`` answered.

    Attributes:
        error_line: the engine's own error line (``ValueError: ...``), or "" if none was found.
        hint: what to change.
        log: the engine's whole output.
    """

    def __init__(self, message: str, *, error_line: str = "", hint: str = "", log: str = ""):
        super().__init__(message)
        self.error_line = error_line
        self.hint = hint
        self.log = log
