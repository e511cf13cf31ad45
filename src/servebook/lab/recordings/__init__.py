"""Recorded lab results read back, for every lab alike (this package imports no lab's module).

* :mod:`.recorded` — schema ``servebook.lab/1`` and provenance checked, the file the book renders, the
  "What ran" table, figure titles.
* :mod:`.rerecordings` — the run a re-recording replaced, and what changed (on the quantities the lab's
  module names).
* :mod:`.engine_stats` — prefix-cache hit rates and running requests read from a recording.
* :mod:`.startup_cases` — recorded GPU start-ups (``gpu_record.py startup``) beside servebook's prediction.
"""
