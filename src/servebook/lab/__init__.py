"""The GPU labs' code, one subpackage per job (each imports only those listed before it):

* :mod:`servebook.lab.errors` — what every lab module raises (:class:`~servebook.lab.errors.LabError`...).
* :mod:`servebook.lab.harness` — running real vLLM engines and measuring them: ``vllm serve`` servers,
  offline ``LLM`` jobs, ``vllm bench serve``, ``/metrics``, the engine's step recorder, load generators,
  lab profiles (``cpu-smoke``, ``gpu``), the runner's deadline and split sweeps, saving a result with its
  provenance, predict-then-measure tables. A lab page's first cell imports it
  (``from servebook.lab.harness import VllmServer, get_profile, save_result``).
* :mod:`servebook.lab.recordings` — reading recorded lab results back: schema and provenance checked
  (:mod:`~servebook.lab.recordings.recorded`), re-recordings compared
  (:mod:`~servebook.lab.recordings.rerecordings`), engine statistics read from a recording
  (:mod:`~servebook.lab.recordings.engine_stats`). They know no lab: what a lab adds (a merger of part
  files, the quantities a re-recording is compared on) comes from the lab's own module.
* :mod:`servebook.lab.analyses` — one module per lab (``lab1_memory`` ... ``lab9_parallel``): its
  prediction, tables, figure and reader, which the lab page, its results page and the chapter share.
* :mod:`servebook.lab.e2e` — the end-to-end validation of the fleet model: the job plan, the recorder
  (parent and engine child), and the analysis of recorded jobs against ``servebook fleet``.

CONTRIBUTING.md ("Adding a lab") lists the files a new lab touches.
"""
