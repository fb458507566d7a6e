r"""The implicit critic's metrics: how well $\sigma(\psi_i)$ predicts the label $R_i$, measured so that it can fail.

PACS's critic is the policy's own score $\psi_i$. With a group-relative score (RLOO: $\psi_i = r_i - \frac{1}{G-1}
\sum_{j \neq i} r_j$) $\psi$ sums to zero within every group, so $\sigma(\psi)$ cannot say "this whole group is right":
a group whose completions share one label always has at least one wrong sign, whatever the critic knows. Sign accuracy
against "always guess the majority label" (carried by those uniform groups) is therefore ill-posed, and the metrics
here look only inside groups that hold both labels ("mixed" groups):

- **ranking**: the share of (correct, incorrect) pairs of the same group whose $\psi$ is ordered right, ties counting
  $\frac{1}{2}$, pooled over every such pair of every mixed group (a within-group ranking accuracy; 0.5 = no
  information, and exactly 0.5 when $\psi \equiv 0$, as on every first step after a generation with
  `pacs_anchor="rollout"`);
- **Brier on mixed groups**: the mean of $(\sigma(\psi_i) - R_i)^2$ over the completions of mixed groups (0.25 when
  $\psi \equiv 0$ and labels are 0/1).

A label counts as correct when $R \geq \frac{1}{2}$ (soft labels from `pacs_label_transform` are split there for the
ranking; the Brier score uses $R$ itself). The completions that take part are the samples, whatever their class
weight (with `pacs_class_weight="positive_only"` the negatives weigh 0 in the loss but are still ranked), and whose
$\psi$ is finite (a NaN is no evidence either way).

The functions return sums (`concordant`, `pairs`, `brier_sum`, `mixed_rows`), not ratios, so that an optimizer step's
micro-batches and processes pool exactly (`CriticTally`).
"""

from __future__ import annotations

import torch


SUM_KEYS = ("concordant", "pairs", "brier_sum", "mixed_rows")


def ranking_sums(
    psi: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor, num_generations: int
) -> dict[str, torch.Tensor]:
    """Sums for the within-group ranking and the mixed-group Brier score over whole groups.

    Args:
        psi (`torch.Tensor` of shape `(B,)`): the critic's logits, rows g*G .. g*G+G-1 one group.
        labels (`torch.Tensor` of shape `(B,)`): labels in [0, 1].
        valid (`torch.Tensor` of shape `(B,)`, bool): completions that take part (the samples, whatever their class
            weight); those with a non-finite psi are left out.
        num_generations (`int`): group size G.

    Returns:
        `dict` of 0-dim float64 tensors: `concordant` (right-ordered pairs, ties 1/2), `pairs` ((correct, incorrect)
        pairs within groups), `brier_sum` (sum of (sigma(psi) - R)^2 over the valid completions of mixed groups) and
        `mixed_rows` (their number).

    >>> s = ranking_sums(torch.tensor([1.0, 0.0, 0.0, -1.0]), torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.ones(4) > 0, 4)
    >>> float(s["concordant"]), float(s["pairs"])  # pairs (0,1) right, (0,3) right, (2,1) tie, (2,3) right
    (3.5, 4.0)
    """
    G = num_generations
    psi, labels = psi.detach().double().view(-1, G), labels.detach().double().view(-1, G)  # (g, G)
    valid = valid.view(-1, G) & psi.isfinite()  # (g, G)
    psi = torch.where(valid, psi, torch.zeros_like(psi))  # no NaN in the products below (masked out anyway)
    correct, incorrect = valid & (labels >= 0.5), valid & (labels < 0.5)  # (g, G)
    pair = correct.unsqueeze(2) & incorrect.unsqueeze(1)  # (g, G, G): i correct, j incorrect, same group
    diff = psi.unsqueeze(2) - psi.unsqueeze(1)  # (g, G, G): psi_i - psi_j
    score = (diff > 0).double() + 0.5 * (diff == 0).double()  # (g, G, G)
    mixed = (correct.any(1) & incorrect.any(1)).unsqueeze(1) & valid  # (g, G)
    brier = (torch.sigmoid(psi) - labels) ** 2  # (g, G)
    return {
        "concordant": (score * pair).sum(),
        "pairs": pair.sum().double(),
        "brier_sum": (brier * mixed).sum(),
        "mixed_rows": mixed.sum().double(),
    }


def critic_metrics(
    psi: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor, rewards: torch.Tensor, num_generations: int
) -> dict[str, float]:
    """The implicit critic's metrics over whole groups (all `(B,)`; valid completions are those with `weights > 0`, the
    samples whatever their class weight, and a finite psi).

    Descriptive, per micro-batch: the spread of psi, how far sigma(psi) is from 1/2, the Brier score over all
    completions. The well-posed measures of the critic are `ranking_sums`' (`CriticTally`).

    >>> m = critic_metrics(torch.tensor([2.0, -2.0]), torch.tensor([1.0, 0.0]), torch.ones(2), torch.ones(2), 2)
    >>> m["pacs/psi_std"], m["pacs/frac_mixed_groups"]
    (2.0, 1.0)
    """
    valid = (weights > 0) & psi.isfinite()  # (B,)
    psi = torch.where(valid, psi, torch.zeros_like(psi))  # a NaN times weight 0 is still NaN
    w = valid.to(psi.dtype)
    labels, rewards = labels.to(psi.dtype), rewards.to(psi.dtype)
    probs = torch.sigmoid(psi)
    count = w.sum().clamp(min=1.0)

    def valid_mean(x: torch.Tensor) -> float:
        return ((x * w).sum() / count).item()

    psi_mean = valid_mean(psi)
    groups_valid = w.view(-1, num_generations).sum(-1)  # (groups,)
    groups_pos = (labels * w).view(-1, num_generations).sum(-1)  # (groups,)
    margin = (probs - 0.5).abs()[valid]
    return {
        "pacs/psi_mean": psi_mean,
        "pacs/psi_std": valid_mean((psi - psi_mean) ** 2) ** 0.5,
        "pacs/critic_brier": valid_mean((probs - labels) ** 2),
        "pacs/critic_margin": margin.float().quantile(0.5).item() if margin.numel() else 0.0,
        "pacs/critic_close_frac": valid_mean(((labels - probs).abs() < 0.1).to(psi.dtype)),
        "pacs/label_mean": valid_mean(labels),
        "pacs/proxy_abs_mean": valid_mean(rewards.abs()),
        "pacs/frac_mixed_groups": ((groups_pos > 0) & (groups_pos < groups_valid)).float().mean().item(),
    }


class CriticTally:
    """Pools `ranking_sums` over the micro-batches of one optimizer step, then turns them into metrics.

    `add` the sums of each micro-batch (already gathered over processes); `flush` at the step's last micro-batch
    returns `pacs/critic_ranking` and `pacs/critic_brier_mixed` when the step held a mixed group, and
    `pacs/critic_ranking_fresh` when the step was a generation's first (`fresh=True`).

    >>> t = CriticTally(); t.add(ranking_sums(torch.tensor([1.0, -1.0]), torch.tensor([1.0, 0.0]), torch.ones(2) > 0, 2))
    >>> t.flush(fresh=True)["pacs/critic_ranking_fresh"]
    1.0
    """

    def __init__(self):
        self.sums = dict.fromkeys(SUM_KEYS, 0.0)

    def add(self, sums: dict[str, torch.Tensor]) -> None:
        for key in SUM_KEYS:
            self.sums[key] += float(sums[key])

    def flush(self, fresh: bool) -> dict[str, float]:
        sums, self.sums = self.sums, dict.fromkeys(SUM_KEYS, 0.0)
        metrics = {}
        if sums["pairs"] > 0:
            metrics["pacs/critic_ranking"] = sums["concordant"] / sums["pairs"]
            if fresh:
                metrics["pacs/critic_ranking_fresh"] = metrics["pacs/critic_ranking"]
        if sums["mixed_rows"] > 0:
            metrics["pacs/critic_brier_mixed"] = sums["brier_sum"] / sums["mixed_rows"]
        return metrics


__all__ = ["CriticTally", "critic_metrics", "ranking_sums"]
