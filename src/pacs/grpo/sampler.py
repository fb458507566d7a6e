"""TRL's prompt order in every epoch, however the run got there: exact resume past the first epoch.

TRL's `RepeatSampler` seeds one `torch.Generator` with `args.seed` when it is built and draws epoch e's permutation as
that generator's (e+1)-th `randperm`, one per pass. It has no `set_epoch`, and transformers' `Trainer` does not replay
the passes of the epochs a checkpoint already trained, so a run resumed in epoch 2 or later draws epoch 0's order again
and trains on other prompts than the uninterrupted run would have (TRL's own `GRPOTrainer` has this flaw).

[`EpochRepeatSampler`] is TRL's sampler (same arguments, same batches) that knows which epoch it is drawing: each pass
reseeds the generator with `seed` and draws `epoch + 1` permutations, keeping the last one, so epoch e's order is TRL's
whatever happened before; a pass moves it to the next epoch, and `set_epoch(e)` places it. Uninterrupted, it yields
exactly what `RepeatSampler` yields (`HardenedGRPOTrainer` stays bit-identical to `GRPOTrainer`); resumed, the layer
places it at transformers' own `epochs_trained` (`HardenedGRPOTrainer._init_training_state`), which reaches the
sampler however deeply accelerate wrapped it (on 2 processes a mid-epoch resume wraps it in a `SkipBatchSampler` over
a `BatchSamplerShard`, one level deeper than `DataLoaderShard.set_epoch` looks).

>>> import torch
>>> from trl.trainer.utils import RepeatSampler
>>> trl_sampler = RepeatSampler(range(6), mini_repeat_count=1, batch_size=2, seed=0)
>>> epochs = [list(trl_sampler) for _ in range(3)]  # TRL's three epochs, drawn in one go
>>> resumed = EpochRepeatSampler.from_sampler(RepeatSampler(range(6), mini_repeat_count=1, batch_size=2, seed=0))
>>> resumed.set_epoch(2)  # a fresh process resuming in epoch 2
>>> list(resumed) == epochs[2]
True
"""

from __future__ import annotations

import torch
from trl.trainer.utils import RepeatSampler


__all__ = ["EpochRepeatSampler"]


class EpochRepeatSampler(RepeatSampler):
    """TRL's `RepeatSampler` whose pass number e draws TRL's epoch-e order (the (e+1)-th `randperm` of a generator
    seeded with `seed`), also in a process that starts at epoch e. See the module docstring.

    Args:
        *args, **kwargs: `RepeatSampler`'s.

    Attributes:
        epoch (`int`): The epoch the next pass draws (0 at first; each pass adds 1; `set_epoch` sets it).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.epoch = 0

    @classmethod
    def from_sampler(cls, sampler: RepeatSampler) -> EpochRepeatSampler:
        """The same sampler (TRL's settings, its generator object), drawing by epoch from now on."""
        new = cls.__new__(cls)
        new.__dict__.update(vars(sampler))
        new.epoch = 0
        return new

    def set_epoch(self, epoch: int) -> None:
        """The next pass draws epoch `epoch`'s order."""
        self.epoch = int(epoch)

    def __iter__(self):
        if self.shuffle and self.seed is not None:
            # the same generator object (accelerate may hold it as its synchronized generator), reseeded: epoch e's
            # order is its (e+1)-th permutation, as TRL draws it in an uninterrupted run
            self.generator.manual_seed(self.seed)
            for _ in range(self.epoch):
                torch.randperm(self.num_samples, generator=self.generator)
        self.epoch += 1
        return super().__iter__()
