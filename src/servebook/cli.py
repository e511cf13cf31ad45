"""The ``servebook`` command line.

Each sub-command lives in its own module under :mod:`servebook.commands` and
exposes ``register(subparsers)``, which adds its parser and sets ``func`` to a
callable taking the parsed namespace and returning an exit status. Modules are
discovered, so adding a command never touches this file.
"""
from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

from servebook import commands
from servebook._version import __version__
from servebook.errors import ServebookError


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every discovered sub-command."""
    parser = argparse.ArgumentParser(
        prog="servebook",
        description="Calculators and tools from the chapter 'Serving with vLLM'.",
    )
    parser.add_argument("--version", action="version", version=f"servebook {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return status
    except ServebookError as exc:
        print(f"servebook {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader stopped reading (``servebook plan ... | head -1``): not an error of ours. Point
        # stdout at /dev/null so Python's final flush does not raise again, and end as a process
        # killed by SIGPIPE conventionally does (128 + 13), without a traceback.
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print(f"servebook {args.command}: interrupted", file=sys.stderr)
        return 130  # 128 + SIGINT, as a shell reports Ctrl-C


#: Exit status after the reader closed our stdout: 128 + SIGPIPE, what a shell reports for ``yes | head``.
EXIT_BROKEN_PIPE = 141


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a file (captured in tests)
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
