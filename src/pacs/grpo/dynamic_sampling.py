"""Dynamic sampling (DAPO, https://arxiv.org/abs/2503.14476, section 3.2): generation batches of groups whose rewards
differ, topped up with fresh prompts until the batch is full.

A group whose completions all get the same reward gives GRPO a zero advantage (and PACS only its label-free term), so
on a hard task most of a generation batch trains nothing. With `dynamic_sampling=True` (`HardenedGRPOConfig`), the
layer generates the batch as usual (round 1), drops the uniform groups, generates further rounds of fresh prompts from
its own seeded stream over the training set (`TopUpStream`) until enough groups differ or
`dynamic_sampling_max_rounds` is reached, and assembles the batch from the first mixed groups in generation order
(`select_groups`), filling with uniform groups when rounds run out (the fallback, counted). The same thing in other
frameworks: verl `algorithm.filter_groups.enable` / `max_num_gen_batches`, OpenRLHF `--dynamic_filtering`, ms-swift
`--dynamic_sample` / `--max_resample_times`, NeMo RL `use_dynamic_sampling`.

The pieces here are pure (torch and the process group only, no TRL): `mixed_groups` (which groups differ),
`select_groups` (which groups make the batch), `TopUpStream` (where top-up prompts come from), `assemble_rows` (the
kept rows, gathered and re-sliced so that each process holds its share, as TRL's contiguous process slices).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch


__all__ = [
    "Round", "TopUpStream", "assemble_batch", "assemble_rows", "batch_metrics", "mixed_groups", "prompt_key",
    "select_groups", "token_count", "uniform_signal",
]  # fmt: skip

STATE_FILE = "pacs_dynamic_sampling.json"
"""The top-up stream's position in a checkpoint, written by the main process (`TopUpStream.save`)."""

PROMPT_ALIGNED = frozenset({"prompt_ids", "prompt_mask"})
"""Row tensors padded on the left (TRL pads prompts left); every other `(B, T, ...)` row tensor is padded right."""

TOPUP_SEED_OFFSET = 104_729
"""Added to `args.seed` for the top-up stream, so that it is not the Trainer sampler's permutation of the data."""


@dataclasses.dataclass(frozen=True)
class Round:
    """One generation round of a dynamically sampled batch: which groups are uniform `(groups,)` bool, and how many
    of its completions were scored out of how many (gathered: the same on every process)."""

    uniform: torch.Tensor
    scored: int
    total: int


def prompt_key(row: dict) -> str | object:
    """What makes two rows one prompt (not drawn twice into one generation batch): its `prompt`; a row without one (an
    `environment_factory` owns the data: `reset()` makes each rollout's prompt) equals no other row."""
    return repr(row["prompt"]) if "prompt" in row else object()


def uniform_signal(values: torch.Tensor, valid: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Which groups are uniform: every valid completion of the group has the same value (fewer than two valid
    completions: uniform, nothing can differ). Equality over the whole group, not a leave-one-out test (which would
    drop the lone winner of `[1, 0, 0, 0]`).

    Args:
        values (`torch.Tensor` of shape `(B,)`): each completion's signal (the weighted reward sum, or PACS's label).
        valid (`torch.Tensor` of shape `(B,)`, bool): False where the completion was not scored (left out).
        num_generations (`int`): G, groups of G consecutive rows.

    Returns:
        `torch.Tensor` of shape `(B // G,)`, bool: True where the group is uniform.

    >>> uniform_signal(torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1]), torch.ones(8, dtype=torch.bool), 4)
    tensor([False,  True])
    """
    if values.numel() % num_generations:
        raise ValueError(f"{values.numel()} rows do not split into groups of num_generations={num_generations}.")
    v = values.view(-1, num_generations)  # (groups, G), compared in its own dtype
    v = v if v.is_floating_point() else v.double()
    ok = valid.view(-1, num_generations) & torch.isfinite(v)  # (groups, G)
    big = torch.finfo(v.dtype).max
    high = torch.where(ok, v, torch.full_like(v, -big)).amax(dim=1)  # (groups,)
    low = torch.where(ok, v, torch.full_like(v, big)).amin(dim=1)  # (groups,)
    return (ok.sum(dim=1) < 2) | (high == low)


def mixed_groups(values: torch.Tensor, valid: torch.Tensor, num_generations: int) -> torch.Tensor:
    """`~uniform_signal(...)`: the groups that carry signal, `(B // G,)` bool."""
    return ~uniform_signal(values, valid, num_generations)


def select_groups(mixed: Sequence[torch.Tensor], needed: int) -> tuple[list[tuple[int, int]], int]:
    """The groups of the assembled generation batch, in generation order.

    The first `needed` mixed groups over the rounds (surplus mixed groups of the last round are trimmed); where the
    rounds found fewer, uniform groups fill the batch in generation order (the fallback).

    Args:
        mixed (`Sequence[torch.Tensor]`): one `(groups_r,)` bool tensor per round, True where the group differs.
        needed (`int`): groups in a generation batch.

    Returns:
        `(picks, fallback)`: `picks` is `needed` pairs `(round, group)` in the batch's order (mixed groups first,
        then the fallback's uniform ones), `fallback` the number of uniform groups let in.

    >>> select_groups([torch.tensor([True, False, False]), torch.tensor([False, True, True])], 3)
    ([(0, 0), (1, 1), (1, 2)], 0)
    >>> select_groups([torch.tensor([False, True, False])], 2)
    ([(0, 1), (0, 0)], 1)
    """
    kept = [(r, g) for r, m in enumerate(mixed) for g in m.nonzero().flatten().tolist()][:needed]
    fallback = needed - len(kept)
    if fallback:
        uniform = [(r, g) for r, m in enumerate(mixed) for g in (~m).nonzero().flatten().tolist()]
        if len(uniform) < fallback:
            raise ValueError(f"{len(kept) + len(uniform)} groups generated, {needed} needed.")
        kept += uniform[:fallback]
    return kept, fallback


@dataclasses.dataclass
class TopUpStream:
    """Where top-up prompts come from: a seeded permutation of the (map-style) training set, epoch after epoch.

    Every process holds the same stream and draws the same indices (then takes its own slice of the rows), so no
    collective is needed. Its position (`epoch`, `position`) and the running count of generated completions ride in
    every checkpoint (`state_dict`), so that a resumed run draws what the uninterrupted one would have. The Trainer's
    epochs count the batches of its own sampler only; the stream's epochs are its own passes over the data.

    >>> stream = TopUpStream(seed=0)
    >>> a = stream.draw(10, 3, key=lambda i: i, used=set())
    >>> b = TopUpStream(seed=0).draw(10, 3, key=lambda i: i, used=set())
    >>> a == b and len(set(a)) == 3
    True
    """

    seed: int
    epoch: int = 0
    position: int = 0
    generated_completions: int = 0  # running total, generated by every round of every batch

    def _order(self, size: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed + TOPUP_SEED_OFFSET + self.epoch)
        return torch.randperm(size, generator=generator).tolist()

    def draw(self, size: int, count: int, key: Callable[[int], Any], used: set) -> list[int] | None:
        """`count` dataset indices whose `key` is not in `used` (the prompts of this generation batch so far; the
        drawn keys are added to it), or `None` (the stream unchanged) when one pass over the data cannot supply them.

        Args:
            size (`int`): the dataset's length.
            count (`int`): prompts to draw.
            key (`Callable[[int], Any]`): an index's prompt key (its prompt), compared with `used`.
            used (`set`): keys already in the batch; updated.
        """
        epoch, position, order = self.epoch, self.position, self._order(size)
        picked, seen, looked = [], set(), 0
        while len(picked) < count:
            if looked >= size:  # a whole pass without enough fresh prompts: the stream stays where it was
                return None
            if position >= size:
                epoch, position = epoch + 1, 0
                order = TopUpStream(self.seed, epoch)._order(size)
            index = order[position]
            position, looked = position + 1, looked + 1
            k = key(index)
            if k in used or k in seen:
                continue
            picked.append(index)
            seen.add(k)
        self.epoch, self.position = epoch, position
        used |= seen
        return picked

    def topup(self, dataset, needed: int, G: int, process_index: int, n: int, used: set) -> list[dict] | None:
        """This process's rows of a top-up round: `needed` fresh prompts, each `G` times in a row (TRL's sampler's
        order), process `p` taking rows `p*n .. p*n+n-1`; `None` when the data has too few fresh prompts."""
        drawn = self.draw(len(dataset), needed, lambda i: prompt_key(dataset[i]), used)
        if drawn is None:
            return None
        rows = [i for i in drawn for _ in range(G)][process_index * n : (process_index + 1) * n]
        return [dataset[i] for i in rows]

    def save(self, folder: str) -> None:
        with open(os.path.join(folder, STATE_FILE), "w") as f:
            json.dump(self.state_dict(), f)

    def load(self, checkpoint: str) -> None:
        """Restores `save`'s state; a checkpoint without it (a run without dynamic sampling) leaves the stream at 0."""
        path = os.path.join(checkpoint, STATE_FILE)
        if os.path.isfile(path):
            with open(path) as f:
                self.load_state_dict(json.load(f))

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "generated_completions": self.generated_completions}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self.generated_completions = int(state["generated_completions"])


def _pad_width(tensor: torch.Tensor, width: int, value, left: bool) -> torch.Tensor:
    missing = width - tensor.size(1)
    if missing == 0:
        return tensor
    filler = tensor.new_full((tensor.size(0), missing, *tensor.shape[2:]), value)
    return torch.cat([filler, tensor] if left else [tensor, filler], dim=1)


def assemble_rows(
    rounds: Sequence[dict[str, torch.Tensor]],
    picks: Sequence[tuple[int, int]],
    num_generations: int,
    process_index: int,
    gather: Callable[[torch.Tensor], torch.Tensor],
    pad_values: dict[str, Any],
) -> dict[str, torch.Tensor]:
    """This process's rows of the assembled generation batch.

    Round `r` holds, on process `p`, rows `p*n .. p*n+n-1` of its global batch (TRL's contiguous slices; `n` rows on
    every process and in every round). The assembled batch is group `picks[k]`'s `G` rows at rows `k*G .. k*G+G-1`;
    each process keeps its own picked rows, every process gathers them, and takes rows `p*n .. p*n+n-1` of the
    assembled batch, so every process holds `n` rows and groups are contiguous and whole as before.

    Args:
        rounds (`Sequence[dict]`): each round's batch on this process; every value a tensor whose first dimension is
            `n` (rows). Rows' other dimensions are padded to the widest (over rounds and processes): `prompt_ids` and
            `prompt_mask` on the left, the rest on the right, with `pad_values[key]` (default 0).
        picks (`Sequence[tuple[int, int]]`): `(round, group)` of each group of the assembled batch
            ([`select_groups`]).
        num_generations (`int`): G.
        process_index (`int`): this process.
        gather (`Callable`): all-gather along dimension 0 over processes (tensors of equal shape); the identity on one.
        pad_values (`dict`): padding value per key.

    Returns:
        `dict`: the keys of `rounds[0]`, `n` rows each.
    """
    G, n = num_generations, next(iter(rounds[0].values())).size(0)
    keys, device = list(rounds[0]), next(iter(rounds[0].values())).device
    for r, batch in enumerate(rounds):
        if list(batch) != keys or any(v.size(0) != n for v in batch.values()):
            raise ValueError(f"round {r}'s batch has keys {list(batch)} or row counts unlike round 0's {keys} x {n}.")
    # 1. where each picked row goes: target row t = k*G + j comes from round r, global row g*G + j
    targets, sources = [], []  # this process's picked rows: target position, (round, local row)
    for k, (r, g) in enumerate(picks):
        for j in range(G):
            row = g * G + j
            if row // n == process_index:
                targets.append(k * G + j)
                sources.append((r, row % n))
    # 2. every row tensor padded to the widest over rounds and processes
    widths = torch.tensor([max(b[key].size(1) if b[key].dim() > 1 else 0 for b in rounds) for key in keys])
    widths = gather(widths.to(device)).view(-1, len(keys)).amax(dim=0).tolist()
    local = {}
    for key, width in zip(keys, widths):
        parts = []
        for r, batch in enumerate(rounds):
            rows = [i for rr, i in sources if rr == r]
            if not rows:
                continue
            value = batch[key][torch.tensor(rows, device=batch[key].device)]
            if value.dim() > 1:
                value = _pad_width(value, width, pad_values.get(key, 0), key in PROMPT_ALIGNED)
            parts.append(value)
        local[key] = parts
    order = [i for r in range(len(rounds)) for i, (rr, _) in enumerate(sources) if rr == r]  # rows as concatenated
    position = torch.tensor([targets[i] for i in order], dtype=torch.long)
    # 3. gather the picked rows (padded to the same count on every process) and take this process's slice
    most = int(gather(torch.tensor([position.numel()], device=device)).max())
    position = torch.cat([position, torch.full((most - position.numel(),), -1, dtype=torch.long)]).to(device)
    everywhere = gather(position)  # (W * most,)
    mine = ((everywhere >= process_index * n) & (everywhere < (process_index + 1) * n)).nonzero().flatten()
    mine = mine[everywhere[mine].argsort()]
    if mine.numel() != n:
        raise RuntimeError(f"dynamic sampling assembled {mine.numel()} rows for process {process_index}, not {n}.")
    output = {}
    for key in keys:
        template = rounds[0][key]
        value = torch.cat(local[key]) if local[key] else template[:0]
        if value.dim() > 1 and value.size(1) != widths[keys.index(key)]:  # no picked row here: an empty, widened one
            value = value.new_zeros((0, widths[keys.index(key)], *value.shape[2:]))
        filler = value.new_zeros((most - value.size(0), *value.shape[1:]))
        is_bool = value.dtype == torch.bool
        padded = torch.cat([value, filler])
        gathered = gather(padded.to(torch.uint8) if is_bool else padded)
        gathered = gathered.bool() if is_bool else gathered
        output[key] = gathered[mine]
    return output


def assemble_batch(batches: list[dict], picks, G: int, process_index: int, gather, pad_id: int) -> dict:
    """[`assemble_rows`] on TRL's batches (every per-row tensor; `num_items_in_batch`, the generation batch's loss
    tokens over all processes, computed anew). Multimodal inputs (non-row values) are refused naming the key."""
    rows = [{k: v for k, v in b.items() if k != "num_items_in_batch"} for b in batches]
    n = batches[0]["prompt_ids"].size(0)
    for key, value in rows[0].items():
        if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.size(0) != n:
            raise ValueError(
                f"dynamic_sampling cannot assemble the batch's {key!r} ({type(value).__name__}): only per-row "
                "tensors can be filtered (multimodal inputs are not supported); turn dynamic_sampling off."
            )
    pads = {"prompt_ids": pad_id, "completion_ids": pad_id, "tool_mask": 1}
    output = assemble_rows(rows, picks, G, process_index, gather, pads)
    mask = output["completion_mask"] * output["tool_mask"] if "tool_mask" in output else output["completion_mask"]
    output["num_items_in_batch"] = gather(mask.sum()).sum()
    return output


def token_count(output: dict, gather, max_completion_length: int) -> int:
    """TRL's `num_input_tokens_seen` increment for a batch: its prompt and completion tokens over all processes (a
    completion masked out by `mask_truncated_completions` ran to `max_completion_length`)."""
    completion = output["completion_mask"].sum(dim=1)  # (n,)
    completion = torch.where(completion > 0, completion, max_completion_length)
    return int(gather(output["prompt_mask"].sum() + completion.sum()).sum())


def batch_metrics(rounds: Sequence[Round], needed: int, fallback: int) -> dict[str, float]:
    """A generation batch's `pacs/ds/*` metrics: its rounds, the groups they generated and how many differed, the
    fallback's uniform groups, completions generated per completion trained."""
    generated = len(rounds) * needed
    return {
        "pacs/ds/rounds": len(rounds),
        "pacs/ds/groups_generated": generated,
        "pacs/ds/mixed_groups_generated": sum(int((~r.uniform).sum()) for r in rounds),
        "pacs/ds/fallback_groups": fallback,
        "pacs/ds/generated_per_trained": generated / needed,
    }
