"""The ``servebook`` command line.

Each sub-command lives in its own module under :mod:`servebook.commands` and
exposes ``register(subparsers)``, which adds its parser and sets ``func`` to a
callable taking the parsed namespace and returning an exit status. Modules are
discovered, so adding a command never touches this file.
"""
from __future__ import annotations

import argparse
import importlib
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
        return int(args.func(args) or 0)
    except ServebookError as exc:
        print(f"servebook {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
