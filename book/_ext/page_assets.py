"""Sphinx extension: each script tag once per page.

With Sphinx 7.4 some extensions' inline scripts reach the page twice (sphinx-thebe's
``const THEBE_JS_URL = ...`` then throws "Identifier has already been declared" in the browser,
which the browser tests catch). Drop exact duplicates, keeping the first occurrence and the order.
"""
from __future__ import annotations


def _dedupe_scripts(app, pagename, templatename, context, doctree) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen: set = set()
    unique = []
    for script in scripts:
        # The same inline script may come once with filename None and once with "".
        filename = getattr(script, "filename", None) or (str(script) if not hasattr(script, "filename") else "")
        key = (filename, tuple(sorted(getattr(script, "attributes", {}).items())))
        if key in seen:
            continue
        seen.add(key)
        unique.append(script)
    context["script_files"] = unique


def setup(app):
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
