"""The draft chapter's arithmetic, reproduced exactly so the book can show where it goes wrong.

Modules:
    memory   section 6.5's ``report()``: KV budget and concurrency on the draft's assumed shapes
    fleet    section 6.22's batch-job estimate, and its five scenarios against :mod:`servebook.perf.fleet`

Nothing outside the comparison pages, notebooks and tests should call it.
"""
