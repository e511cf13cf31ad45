"""One module per GPU lab: its prediction, tables, figure and reader.

``lab1_memory``, ``lab2_batching``, ``lab3_preemption``, ``lab4_fp8_kv``, ``lab5_chunked_prefill``,
``lab6_prefix_caching``, ``lab7_speculative`` (with ``lab7_train_pair``, its trained model pair),
``lab8_batch_tactics``, ``lab9_parallel``. The lab page (``labs/lN_*.md``), its results page
(``labs/results_lN.md``) and the chapter's section call the same functions, so they print the same table.
:mod:`.rendered` names what a lab adds to the generic readers of :mod:`servebook.lab.recordings`.
"""
