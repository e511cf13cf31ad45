"""``servebook drills``: list, show and check the interview drills of page 6.26.

    servebook drills list [--json] [--section 6.5] [--kind numeric]
    servebook drills show ID [--seed N] [--answer]
    servebook drills check ID ANSWER [--seed N] [--json]

``check`` exits 0 when the answer is accepted and 1 when it is not (2 for bad input).
"""
from __future__ import annotations

import json

from servebook.drills import KINDS, SECTIONS, check_answer, get_drill, load_drills, tolerance_text
from servebook.errors import ServebookError


def register(sub) -> None:
    p = sub.add_parser("drills", help="interview drills: list them, show one, check an answer")
    dsub = p.add_subparsers(dest="drills_command", metavar="{list,show,check}", required=True)

    lp = dsub.add_parser("list", help="every drill: id, section, kind, question")
    lp.add_argument("--json", action="store_true", help="print a JSON list")
    lp.add_argument("--section", choices=list(SECTIONS), help="only this chapter section")
    lp.add_argument("--kind", choices=KINDS, help="only this kind of drill")
    lp.set_defaults(func=run_list)

    sp = dsub.add_parser("show", help="one drill's question (and with --answer its worked answer)")
    sp.add_argument("id", help="drill id (see `servebook drills list`)")
    sp.add_argument("--seed", type=int, default=0, help="variant seed (0: the base question)")
    sp.add_argument("--answer", action="store_true", help="also print the worked answer")
    sp.add_argument("--json", action="store_true", help="print JSON")
    sp.set_defaults(func=run_show)

    cp = dsub.add_parser("check", help="grade an answer (a number, or a sentence for concept drills)")
    cp.add_argument("id", help="drill id")
    cp.add_argument("answer", help="your answer, e.g. '128 KiB' or a sentence")
    cp.add_argument("--seed", type=int, default=0, help="variant seed the question was shown with")
    cp.add_argument("--json", action="store_true", help="print JSON")
    cp.set_defaults(func=run_check)


def _question_or_why_not(drill) -> str:
    """The drill's question; where it is computed from recorded lab results that are not here, why not.

    ``show`` and ``check`` still fail on such a drill, with the same message.
    """
    try:
        return drill.question_text(0)
    except ServebookError as exc:
        return f"(question not available here: {exc})"


def run_list(args) -> int:
    drills = [d for d in load_drills()
              if (args.section is None or d.section == args.section) and (args.kind is None or d.kind == args.kind)]
    rows = [{"id": d.id, "section": d.section, "kind": d.kind, "question": _question_or_why_not(d)} for d in drills]
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for r in rows:
            print(f"{r['section']:5s} {r['kind']:9s} {r['id']}\n      {r['question']}")
    return 0


def run_show(args) -> int:
    d = get_drill(args.id)
    info = {"id": d.id, "section": d.section, "section_title": d.section_title, "kind": d.kind,
            "seed": args.seed, "question": d.question_text(args.seed),
            "exhibit": d.exhibit.text() if d.exhibit else None}
    if args.answer:
        info["answer"] = d.answer_text(args.seed)
        if d.numeric:
            info.update(expected=d.expected(args.seed), unit=d.unit, call=d.call, args=d.args_for(args.seed),
                        tolerance=tolerance_text(d))
        if d.pitfall:
            info["pitfall"] = d.pitfall
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    print(f"{d.id} ({d.kind}, section {d.section} {d.section_title})\n")
    print(info["question"])
    if info["exhibit"]:
        print("\n" + info["exhibit"])
    if args.answer:
        print("\nAnswer:\n" + info["answer"])
        if d.numeric:
            value = info["expected"]
            shown = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
            print(f"\n= {shown} {d.unit} ({info['tolerance']}; {d.call})")
        if d.pitfall:
            print("\nCommon mistake: " + d.pitfall)
    return 0


def run_check(args) -> int:
    g = check_answer(args.id, args.answer, seed=args.seed)
    if args.json:
        print(json.dumps({"id": g.drill_id, "seed": g.seed, "correct": g.correct, "given": g.given,
                          "expected": g.expected, "unit": g.unit, "missing": list(g.missing),
                          "message": g.message, "explanation": g.explanation}, indent=1))
    else:
        print(g.message + "\n\n" + g.explanation)
    return 0 if g.correct else 1
