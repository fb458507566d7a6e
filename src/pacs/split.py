"""The split path: groups cut by micro-batches (and processes) still get the exact whole-group gradient.

Used when `per_device_train_batch_size` is not a multiple of `num_generations`, so a micro-batch holds part of a group.
The PACS loss couples the completions of a group (the score $\\psi$ compares them), so it cannot be evaluated on part
of one; but its gradient is $\\sum_i c_i \\nabla r_i$ with $c = \\partial L / \\partial r$ of the whole groups, in
closed form (`pacs.loss.pacs_coefficients`). So:

1. `split_layout` picks where the rows of an optimizer step live (or names a valid setting), and `exchange_rows`
   redistributes the generation batch once when only the step over all processes holds whole groups.
2. `attach_step_coefficients` runs when the first micro-batch of an optimizer step is prepared (before its graph
   exists, so the extra forward without grad adds no peak memory): it takes $r$ of every row of the step, gathers the
   step's rows of all processes into whole groups, computes $c$ and the step's loss, and stores them in the step's
   micro-batches (`pacs_coef` `(B,)`, `pacs_step_loss` `()`). Nothing is kept on the trainer.
3. `PACSTrainer._compute_loss` backpropagates $\\sum_i c_i r_i$ of each micro-batch.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from ._compat import MULTIMODAL_KEYS
from .grpo.rows import move_rows, pad_value
from .grpo.terms import loss_mask
from .loss import pacs_coefficients


__all__ = ["attach_step_coefficients", "exchange_order", "exchange_rows", "split_layout"]


def split_layout(
    per_device_batch: int, grad_accum: int, steps_per_generation: int, world_size: int, num_generations: int
) -> str:
    """How the split path keeps every optimizer step made of whole groups, or a `ValueError` naming a valid setting.

    Used when `per_device_batch` is not a multiple of `num_generations` (a micro-batch holds part of a group). Each
    process generates a contiguous slice of the generation batch (TRL's layout, which vLLM server mode relies on).
    Returns:

    - `"local"`: the step spans the whole generation batch (`steps_per_generation == gradient_accumulation_steps`;
      groups may span processes), or each process's share of it (`per_device_batch * grad_accum` rows) is a whole
      number of groups: the rows stay where they were generated.
    - `"exchange"`: only the step over all processes holds whole groups (`world_size * per_device_batch * grad_accum`
      rows, e.g. 8 GPUs with one row each and groups of 8, several optimizer steps per generation): after each
      generation the rows are redistributed once (`pacs.grpo.rows.move_rows`: each process receives its own) so that
      every process holds its share of every step's groups.

    >>> split_layout(1, 8, 32, 1, 8)  # one GPU, 8 micro-batches of 1 per optimizer step, 4 steps per generation
    'local'
    >>> split_layout(1, 1, 4, 8, 8)  # 8 GPUs x 1 row: a group per optimizer step, spread over the 8 processes
    'exchange'
    """
    P, GA, S, W, G = per_device_batch, grad_accum, steps_per_generation, world_size, num_generations
    if S % GA != 0:
        raise ValueError(
            f"per_device_train_batch_size ({P}) is not a multiple of num_generations ({G}), so groups are split over "
            f"micro-batches; then every optimizer step must lie within one generation batch: steps_per_generation "
            f"({S}) must be a multiple of gradient_accumulation_steps ({GA}), e.g. steps_per_generation={4 * GA}."
        )
    if S == GA or (P * GA) % G == 0:
        return "local"
    if (W * P * GA) % G == 0:
        return "exchange"
    ga = G // math.gcd(W * P, G)  # smallest accumulation that makes W * P * GA a multiple of G
    raise ValueError(
        f"{W} process(es) x per_device_train_batch_size={P} x gradient_accumulation_steps={GA} = {W * P * GA} rows per "
        f"optimizer step do not hold whole groups of num_generations={G}. Use gradient_accumulation_steps={ga} (with "
        f"steps_per_generation={4 * ga} for 4 optimizer steps per generation), or steps_per_generation={GA} (one "
        "optimizer step per generation; num_iterations > 1 for off-policy steps)."
    )


def exchange_order(rows_per_process: int, world_size: int, rows_per_step: int, num_generations: int) -> torch.Tensor:
    """For `"exchange"` layouts: which rows of the gathered generation batch each process trains on, in order.

    Optimizer step j takes the groups j*q .. (j+1)*q - 1 of the generation batch (q groups per step; the prompts are
    already in random order, TRL's sampler shuffles them), and process p takes rows p*M .. (p+1)*M - 1 of them
    (M = `rows_per_step` per process). Row `g*G + i` is completion i of group g, as TRL gathers them.

    Returns:
        `torch.Tensor` of shape `(world_size, rows_per_process)`: row `p` lists, step by step, process p's rows.

    >>> exchange_order(4, 2, 2, 4).tolist()  # 2 processes, 2 groups of 4, 2 optimizer steps of 1 group each
    [[0, 1, 4, 5], [2, 3, 6, 7]]
    """
    n, W, M = rows_per_process, world_size, rows_per_step
    steps = n // M
    return torch.arange(W * n).view(steps, W, M).transpose(0, 1).reshape(W, n)


def exchange_rows(output: dict, accelerator, pad_token_id: int, rows_per_step: int, num_generations: int) -> dict:
    """Redistribute the generation batch over processes so that each optimizer step holds whole groups.

    Each process's rows move to their places in `exchange_order` (`pacs.grpo.rows.move_rows`: its token ids, masks and
    per-token log-probabilities, padded to the widest process, prompts on the left).
    """
    unsupported = [key for key in MULTIMODAL_KEYS if output.get(key) is not None]
    if unsupported:
        raise ValueError(
            f"Groups split over processes with rows exchanged between them do not support {unsupported}; use a "
            "gradient_accumulation_steps that makes per_device_train_batch_size x gradient_accumulation_steps a "
            "multiple of num_generations."
        )
    n, W, p = output["prompt_ids"].size(0), accelerator.num_processes, accelerator.process_index
    order = exchange_order(n, W, rows_per_step, num_generations).flatten()  # (W*n,) global row at each new position
    target = torch.empty_like(order)
    target[order] = torch.arange(order.numel())  # each global row's new position
    device = output["prompt_ids"].device
    rows = {k: v for k, v in output.items() if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.size(0) == n}
    pad = functools.partial(pad_value, pad_token_id=pad_token_id)
    moved = move_rows([rows], target[p * n : (p + 1) * n].to(device), n, p, accelerator.gather, pad)
    return {key: moved.get(key, value) for key, value in output.items()}  # scalars (num_items_in_batch) stay


def _whole_groups(gather, rows: dict[str, torch.Tensor], num_generations: int) -> dict[str, torch.Tensor]:
    # every process's rows of the step, gathered and sorted by `pacs_index` into whole groups
    index = gather(rows["pacs_index"])
    order = torch.argsort(index)
    gathered = {key: gather(value)[order] for key, value in rows.items() if key != "pacs_index"}
    gathered["pacs_index"] = index = index[order]
    G = num_generations
    groups = index.view(-1, G) // G if index.numel() % G == 0 else None
    if groups is None or not (groups == groups[:, :1]).all():
        raise RuntimeError(
            f"PACS split path: this optimizer step does not hold whole groups of num_generations={G} completions "
            f"(rows {index.tolist()}); please report this with your batch settings."
        )
    return gathered


def attach_step_coefficients(
    batches: list[dict],
    reward_proxy: Callable[[dict, torch.Tensor], torch.Tensor],
    sample_weight: Callable[[dict, torch.Tensor], torch.Tensor],
    gather: Callable[[torch.Tensor], torch.Tensor],
    num_generations: int,
    generation_batch_size: int,
    score: str,
    class_weight: str,
    uniform_groups: str = "keep",
) -> tuple[torch.Tensor, dict, torch.Tensor]:
    """Store in each micro-batch of an optimizer step its coefficients c_i = dL/dr_i of the step's whole groups
    (`pacs_coef`, `(B,)`) and the step's PACS loss (`pacs_step_loss`, `()`); return the step's loss, its stats (`psi`,
    `weights`, `rewards`, `counted`, `mixed`) and labels over those whole groups, for the trainer to log the critic.

    `reward_proxy(batch, mask)`: r `(B,)` of a micro-batch under the current policy, without grad (exactly 0 where the
    policy is the anchor); `sample_weight(batch, mask)`: each row's weight `(B,)`; `gather`: the all-gather over
    processes (`accelerator.gather`). `score`, `class_weight`, `uniform_groups`: the `PACSConfig` settings
    (`pacs_score`, `pacs_class_weight`, `pacs_uniform_groups`).

    1. r of every row of the step on this process; 2. gather r, labels and weights of all processes into whole groups
       (`pacs_index`); 3. c in closed form (`pacs_coefficients`) over all rows of the step, normalised by their number
       as the whole-group path is.
    """
    rows = {key: [] for key in ("pacs_index", "rewards", "labels", "weight", "valid")}
    for batch in batches:
        mask = loss_mask(batch)  # (B, T)
        rows["pacs_index"].append(batch["pacs_index"])
        rows["rewards"].append(reward_proxy(batch, mask).float())
        rows["labels"].append(batch["pacs_labels"].float())
        rows["weight"].append(sample_weight(batch, mask))
        rows["valid"].append(mask.sum(-1) > 0)
    step = _whole_groups(gather, {key: torch.cat(value) for key, value in rows.items()}, num_generations)
    coef, loss, stats = pacs_coefficients(
        step["rewards"], step["labels"], num_generations, score, class_weight,
        step["weight"], None if step["valid"].all() else step["valid"], uniform_groups=uniform_groups,
    )  # fmt: skip
    by_index = torch.zeros(generation_batch_size, device=coef.device, dtype=coef.dtype)
    by_index[step["pacs_index"]] = coef
    for batch in batches:
        batch["pacs_coef"] = by_index[batch["pacs_index"]]  # (B,)
        batch["pacs_step_loss"] = loss.detach()  # ()
    return loss, stats, step["labels"]
