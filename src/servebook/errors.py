"""Errors a reader can act on.

Every error the library raises for bad input is a :class:`ServebookError` whose
message says what is wrong *and what to change*. The CLI prints the message
(no traceback) and exits with status 2.
"""


class ServebookError(ValueError):
    """Bad input or an impossible configuration; the message says what to change."""


class ConfigError(ServebookError):
    """A config.json that is malformed or lacks fields the calculators need."""


class DoesNotFitError(ServebookError):
    """A model or a batch that does not fit in the memory it was given."""


class UnknownGPUError(ServebookError):
    """A GPU name that is not in the catalogue."""


class DrillError(ServebookError):
    """A drill id, seed, answer or data entry that cannot be used (:mod:`servebook.drills`)."""
