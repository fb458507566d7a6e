"""The training config of the tests' CPU runs on `pacs.testing`'s tiny model (the `tiny_model_dir` fixture)."""

from __future__ import annotations

import os


def tiny_pacs_config(output_dir: str | os.PathLike, **overrides):
    """A `PACSConfig` for a few seconds of CPU training on the tiny model: groups of 4, one group per micro-batch,
    8-token completions, 3 steps, a large learning rate so that parameters visibly move, no saving, no reporting.

    Args:
        output_dir (`str` or `os.PathLike`):
            The trainer's output directory.
        **overrides:
            Any `PACSConfig` field, replacing the defaults above.
    """
    from pacs import PACSConfig

    base = dict(
        output_dir=str(output_dir),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=3,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
    )
    return PACSConfig(**{**base, **overrides})
