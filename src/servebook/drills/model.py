"""What a drill is (:class:`Drill`), the chapter sections and kinds, and loading ``data/drills.toml``.

A drill's numbers come from :mod:`servebook.drills.calls`; placeholders in its text are filled
from them (see :mod:`servebook.drills`).
"""
from __future__ import annotations

import importlib
import math
import random
import string
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from servebook.drills.exhibit import Exhibit
from servebook.errors import DrillError

DATA_FILE = Path(__file__).resolve().parent.parent / "data" / "drills.toml"

KINDS = ("concept", "numeric", "debugging", "design")

#: Section numbers and titles of the chapter (from the draft's outline).
SECTIONS = {
    "6.1": "Why a serving engine at all",
    "6.2": "PagedAttention",
    "6.3": "Continuous batching",
    "6.4": "Prefill and decode are different machines",
    "6.5": "Where the GPU's memory actually goes",
    "6.6": "gpu-memory-utilization",
    "6.7": "max-model-len",
    "6.8": "KV cache dtype",
    "6.9": "max-num-seqs",
    "6.10": "max-num-batched-tokens",
    "6.11": "Chunked prefill",
    "6.12": "Prefix caching",
    "6.13": "Async scheduling and CUDA graphs",
    "6.14": "TP, PP, DP and EP",
    "6.15": "MoE versus dense",
    "6.16": "How speculative decoding works",
    "6.17": "Assistant draft models",
    "6.18": "MTP and the other methods",
    "6.19": "Tuning acceptance",
    "6.20": "The 15k deployment",
    "6.21": "The 30k deployment",
    "6.22": "Sizing a ten-million-request job",
    "6.23": "Batch-mode tactics",
    "6.24": "Defaults: what to keep, what to set",
    "6.25": "Key takeaways",
}

CALLS_MODULE = "servebook.drills.calls"



@dataclass(frozen=True)
class Drill:
    """One interview question (see the module docstring for the fields' meaning)."""

    id: str
    section: str
    kind: str
    question: str
    answer: str
    call: str | None = None
    args: dict = field(default_factory=dict)
    variants: dict = field(default_factory=dict)
    unit: str = ""
    rel_tol: float = 0.03
    abs_tol: float = 0.0
    keywords: tuple[tuple[str, ...], ...] = ()
    facts: dict = field(default_factory=dict)
    exhibit: Exhibit | None = None
    pitfall: str = ""

    @property
    def numeric(self) -> bool:
        """True when the answer is a number computed by a library call."""
        return self.call is not None

    @property
    def section_title(self) -> str:
        return SECTIONS[self.section]

    @property
    def num_variants(self) -> int:
        """Distinct argument combinations the seeds can pick (1 without variants)."""
        n = 1
        for values in self.variants.values():
            n *= len(values)
        return n

    # ---------------------------------------------------------------- arguments
    def args_for(self, seed: int = 0) -> dict:
        """Arguments for ``seed``: seed 0 is the base question; others pick each variant list's value."""
        if not isinstance(seed, int) or seed < 0:
            raise DrillError(f"seed {seed!r} is not allowed; use an integer >= 0")
        args = dict(self.args)
        if seed and self.variants:
            rng = random.Random(f"{self.id}:{seed}")
            for key in sorted(self.variants):
                args[key] = rng.choice(self.variants[key])
        return args

    def variant_args(self) -> list[dict]:
        """Every argument combination the variants allow (the base arguments first)."""
        import itertools

        keys = sorted(self.variants)
        combos = [dict(self.args)]
        for values in itertools.product(*(self.variants[k] for k in keys)):
            args = {**self.args, **dict(zip(keys, values))}
            if args not in combos:
                combos.append(args)
        return combos

    # ---------------------------------------------------------------- answers
    def compute(self, args: dict) -> float:
        """The answer for explicit arguments (in :attr:`unit`)."""
        if not self.numeric:
            raise DrillError(f"drill {self.id} is a {self.kind} question without a computed answer")
        return float(_call(self.call, args))

    def expected(self, seed: int = 0) -> float:
        """The computed answer for ``seed`` (in :attr:`unit`)."""
        return self.compute(self.args_for(seed))

    def facts_for(self, seed: int = 0) -> dict[str, float]:
        """Every ``facts`` entry computed for ``seed`` (``$arg`` in their args means the drill's arg)."""
        args = self.args_for(seed)
        out = {}
        for name, entry in self.facts.items():
            fargs = {k: (args[v[1:]] if isinstance(v, str) and v.startswith("$") else v)
                     for k, v in entry.get("args", {}).items()}
            out[name] = float(_call(entry["call"], fargs))
        return out

    def _fields(self, seed: int) -> dict[str, Any]:
        fields: dict[str, Any] = dict(self.args_for(seed))
        fields.update(self.facts_for(seed))
        if self.numeric:
            fields["value"] = self.expected(seed)
        fields["unit"] = self.unit
        return fields

    def question_text(self, seed: int = 0) -> str:
        """The question with this seed's arguments filled in."""
        return _fill(self.question, self._fields(seed), self.id)

    def answer_text(self, seed: int = 0) -> str:
        """The worked answer (mechanism, then the computed number) for this seed."""
        return _fill(self.answer, self._fields(seed), self.id)

    def is_accepted(self, value: float, seed: int = 0, *, expected: float | None = None) -> bool:
        """True when ``value`` is within tolerance of the computed answer (or of ``expected``)."""
        exp = self.expected(seed) if expected is None else expected
        return math.isclose(value, exp, rel_tol=self.rel_tol, abs_tol=self.abs_tol)


def _call(name: str, args: dict) -> Any:
    module, _, func = name.rpartition(".")
    if module != CALLS_MODULE:
        raise DrillError(f"drill calls must be functions of {CALLS_MODULE}, not {name!r}")
    fn = getattr(importlib.import_module(module), func, None)
    if fn is None:
        raise DrillError(f"{name} does not exist; add it to {CALLS_MODULE}")
    return fn(**args)


def _fill(template: str, fields: dict, drill_id: str) -> str:
    try:
        return string.Formatter().vformat(template.strip(), (), fields)
    except (KeyError, IndexError, ValueError) as exc:
        raise DrillError(f"drill {drill_id}: placeholder {exc} in its text has no value") from None


# -------------------------------------------------------------------- loading

def _drill_from_entry(e: dict, where: str) -> Drill:
    for key in ("id", "section", "kind", "question", "answer"):
        if key not in e:
            raise DrillError(f"{where}: a drill lacks {key!r}")
    if e["kind"] not in KINDS:
        raise DrillError(f"{where}: drill {e['id']} has kind {e['kind']!r}; use one of {', '.join(KINDS)}")
    if e["section"] not in SECTIONS:
        raise DrillError(f"{where}: drill {e['id']} names section {e['section']!r}; use 6.1 ... 6.25")
    if e["kind"] == "numeric" and "call" not in e:
        raise DrillError(f"{where}: numeric drill {e['id']} needs a 'call'")
    if "call" not in e and not e.get("keywords"):
        raise DrillError(f"{where}: drill {e['id']} needs a 'call' or 'keywords' to grade an answer")
    exhibit = Exhibit(**e["exhibit"]) if "exhibit" in e else None
    return Drill(
        id=e["id"], section=e["section"], kind=e["kind"], question=e["question"], answer=e["answer"],
        call=e.get("call"), args=dict(e.get("args", {})), variants=dict(e.get("variants", {})),
        unit=e.get("unit", ""), rel_tol=float(e.get("rel_tol", 0.03)), abs_tol=float(e.get("abs_tol", 0.0)),
        keywords=tuple(tuple(g) for g in e.get("keywords", ())), facts=dict(e.get("facts", {})),
        exhibit=exhibit, pitfall=e.get("pitfall", ""),
    )


@lru_cache(maxsize=4)
def _load(path: str) -> tuple[Drill, ...]:
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise DrillError(f"{p} is not valid TOML: {exc}") from None
    drills = tuple(_drill_from_entry(e, str(p)) for e in data.get("drill", []))
    seen: set[str] = set()
    for d in drills:
        if d.id in seen:
            raise DrillError(f"{p}: drill id {d.id!r} appears twice; ids must be unique")
        seen.add(d.id)
    return drills


def load_drills(path: str | Path | None = None) -> list[Drill]:
    """Every drill, in file order (grouped by section there)."""
    return list(_load(str(path or DATA_FILE)))


def get_drill(drill_id: str, path: str | Path | None = None) -> Drill:
    """One drill by id; the error lists the ids that exist."""
    for d in load_drills(path):
        if d.id == drill_id:
            return d
    known = ", ".join(d.id for d in load_drills(path))
    raise DrillError(f"no drill {drill_id!r}; use one of: {known}")
