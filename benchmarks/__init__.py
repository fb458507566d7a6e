"""The benchmark studies, as a package: run each from the repository root with `python -m`, e.g.

    python -m benchmarks.learning.learning --smoke
    python -m benchmarks.gpu_check --rehearse

One subpackage per study (benchmarks/<study>/: its scripts, report module and results); what the studies share sits
here: `harness` (machine record, statistics, log summaries, the per-run cache and worker pool), `rl_runs` (the trainers
the task studies compare and one cached run of each), `_tasks` (the addition task), `report` (markdown rendering).

Importing the package sets the offline environment, so it holds before any study imports transformers, whatever the
order of its imports (and in every worker process, which imports the package again).
"""

import os


for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "WANDB_DISABLED": "true",
}.items():
    os.environ.setdefault(_key, _value)
