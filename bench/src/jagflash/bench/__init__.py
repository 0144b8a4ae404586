"""jagflash-bench: the side-by-side harness every jagflash performance claim comes from.

Workloads (``workloads``) with exact FLOPs from their real lengths (``flops``), providers
(``providers``: jagflash's backends and the peers), checks against a float32 reference
(``reference``), timing (``timing``), worker processes (``runner``) and a long-format CSV with
the markdown table and PNG plots generated from it (``report``). Run ``python -m jagflash.bench
--help``. Importing this package imports neither torch nor any kernel.
"""
