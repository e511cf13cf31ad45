"""The end-to-end validation of the fleet model: real offline jobs against ``servebook fleet``.

* :mod:`.plan` — the job plan (``servebook/data/e2e_jobs.toml``) and fleet's prediction of each job.
* :mod:`.job` — the recorder (``python -m servebook.lab.e2e.job plan|check|run``): one engine per model,
  run in a child process (:mod:`.child`), one JSON per model (schema ``servebook.e2e/1``).
* :mod:`.analysis` — recorded jobs against fleet: predicted vs measured, and where the time went.
* :mod:`.running_peak` — a recorded engine's peak of running requests against the concurrency figures.
"""
