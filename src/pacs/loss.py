r"""The PACS objective as pure tensor functions (no TRL, no DeepSpeed: importable and testable on its own).

PACS ("Implicit Actor Critic Coupling via a Supervised Learning Framework for RLVR", https://arxiv.org/abs/2509.02522)
turns RL with verifiable rewards into supervised learning. For a prompt with a group of $G$ completions
$o_1, \dots, o_G$ and verifiable rewards $R_i \in [0, 1]$, the policy scores its own completions:

$$
r_i = \beta \sum_t m_{it} \left(\log \pi_\theta(o_{i,t}) - \log \pi_{\mathrm{old}}(o_{i,t})\right)
\qquad \text{(reward proxy, ``log_ratio``)}
$$

$$
\psi_i = r_i - \frac{1}{G-1} \sum_{j \neq i} r_j
\qquad \text{(group score, ``rloo``)}
$$

$$
\mathcal{L}(\theta) = \frac{1}{B} \sum_{i=1}^{B} w_i \,
\mathrm{BCE}\!\left(\sigma(\psi_i), R_i\right)
= -\frac{1}{B} \sum_i w_i \left[R_i \log \sigma(\psi_i) + (1 - R_i) \log (1 - \sigma(\psi_i))\right]
$$

with $w_i$ per-group balanced class weights. $\sigma(\psi_i)$ is the policy's own prediction that $o_i$ is correct:
the policy is actor and critic at once. The gradient is
$\nabla_\theta \mathcal{L} = \frac{1}{B} \sum_i w_i (\sigma(\psi_i) - R_i) \nabla_\theta \psi_i$; on an on-policy step
$\psi \equiv 0$ and $\sigma = 1/2$, so with $w \equiv 1$ the constant 1/2 cancels inside every group and
$\nabla_\theta \mathcal{L} = -\frac{\beta}{B} \sum_i \big(R_i - \frac{1}{G-1}\sum_{j\ne i} R_j\big)
\nabla_\theta \log \pi_\theta(o_i)$: exactly RLOO's policy gradient. Later optimizer steps on the same rollout
($\psi \neq 0$) add the critic's calibration term (see `docs/pacs_trainer.md`).

Semantics match the authors' released code (``compute_pacs_loss`` in ritzz-ai/PACS): the loss is divided by the
batch size $B$, not by $\sum_i w_i$. Rows ``g*G .. g*G+G-1`` of every argument are the completions of one prompt.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


REWARD_PROXIES = ("log_ratio", "mean_logp")
SCORES = ("rloo", "grpo", "naive")
CLASS_WEIGHTS = ("balanced", "positive_only", "negative_only", None)

GRPO_STD_EPS = 1e-6  # as the reference implementation


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"Unknown {name} {value!r}; valid values are {list(choices)}.")


def compute_reward_proxy(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor | None,
    completion_mask: torch.Tensor,
    beta: float = 1.0,
    reward_proxy: str = "log_ratio",
) -> torch.Tensor:
    r"""Sequence-level reward proxy $r_i$ computed from the policy's own log-probabilities.

    Args:
        per_token_logps (`torch.Tensor` of shape `(B, T)`):
            Log-probabilities of the completion tokens under the current policy (with grad).
        old_per_token_logps (`torch.Tensor` of shape `(B, T)` or `None`):
            Log-probabilities under the policy that sampled the completions. `None` means on-policy
            (`per_token_logps.detach()`). Unused by `"mean_logp"`.
        completion_mask (`torch.Tensor` of shape `(B, T)`):
            1 for completion tokens that count, 0 for padding (and tool-output / masked-truncated tokens).
        beta (`float`, *optional*, defaults to `1.0`):
            Scale of the proxy (the temperature of the implicit critic's logit).
        reward_proxy (`str`, *optional*, defaults to `"log_ratio"`):
            `"log_ratio"`: $r_i = \beta \sum_t m_{it} (\log\pi_{it} - \log\pi^{old}_{it})$;
            `"mean_logp"`: $r_i = \beta \sum_t m_{it} \log\pi_{it} / \sum_t m_{it}$.

    Returns:
        `torch.Tensor` of shape `(B,)`.
    """
    _check_choice("reward_proxy", reward_proxy, REWARD_PROXIES)
    mask = completion_mask.to(per_token_logps.dtype)  # (B, T)
    if reward_proxy == "log_ratio":
        if old_per_token_logps is None:
            old_per_token_logps = per_token_logps.detach()
        return beta * ((per_token_logps - old_per_token_logps) * mask).sum(-1)  # (B,)
    return beta * (per_token_logps * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)  # (B,)


def compute_score(rewards: torch.Tensor, num_generations: int, score: str = "rloo") -> torch.Tensor:
    r"""Group-relative score $\psi_i$, the logit of the implicit critic.

    Args:
        rewards (`torch.Tensor` of shape `(B,)`):
            Reward proxies $r_i$; rows `g*G .. g*G+G-1` belong to one prompt.
        num_generations (`int`):
            Group size $G$; `B % G == 0`.
        score (`str`, *optional*, defaults to `"rloo"`):
            `"rloo"`: $\psi_i = r_i - \frac{1}{G-1}\sum_{j \ne i} r_j$;
            `"grpo"`: $\psi_i = (r_i - \bar r_g) / (\mathrm{std}_g(r) + 10^{-6})$ with the unbiased std;
            `"naive"`: $\psi_i = r_i$.

    Returns:
        `torch.Tensor` of shape `(B,)`.
    """
    _check_choice("score", score, SCORES)
    if score == "naive":
        return rewards
    G = num_generations
    if rewards.numel() % G != 0:
        raise ValueError(f"The batch ({rewards.numel()} rows) must hold whole groups of num_generations={G} rows.")
    if G < 2:
        raise ValueError(
            f"score={score!r} compares completions within a group and needs num_generations >= 2, got {G}."
        )
    grouped = rewards.view(-1, G)  # (B/G, G)
    if score == "rloo":
        loo_mean = (grouped.sum(-1, keepdim=True) - grouped) / (G - 1)  # (B/G, G) mean of the others
        return (grouped - loo_mean).view(-1)
    centered = grouped - grouped.mean(-1, keepdim=True)  # (B/G, G)
    var = centered.pow(2).sum(-1, keepdim=True) / (G - 1)  # (B/G, 1) unbiased
    # sqrt has an infinite derivative at 0 and psi == 0 on every on-policy step: take the root only where var > 0
    # (the "double where" keeps NaN out of the backward pass), so the loss and its gradient stay finite.
    positive = var > 0
    std = torch.where(positive, torch.where(positive, var, torch.ones_like(var)).sqrt(), torch.zeros_like(var))
    return (centered / (std + GRPO_STD_EPS)).view(-1)


def compute_class_weight(
    labels: torch.Tensor,
    num_generations: int,
    class_weight: str | None = "balanced",
    sample_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""Per-completion weights $w_i$ of the BCE terms.

    Args:
        labels (`torch.Tensor` of shape `(B,)`):
            Verifiable rewards in `[0, 1]`.
        num_generations (`int`):
            Group size $G$.
        class_weight (`str` or `None`, *optional*, defaults to `"balanced"`):
            `"balanced"`: in a group with $k$ of $G$ labels equal to 1 and $0 < k < G$, $w = G / 2k$ for positives
            and $G / 2(G - k)$ for negatives (scikit-learn's "balanced" rule per group); groups with $k \in \{0, G\}$
            get $w = 1$. Soft labels count fractionally: $w_i = R_i G/2k + (1 - R_i) G/2(G-k)$ with $k = \sum R$.
            `"positive_only"`: $w_i = R_i$ (1 for correct, 0 for wrong). `"negative_only"`: $w_i = 1 - R_i$.
            `None`: $w \equiv 1$.
        sample_weight (`torch.Tensor` of shape `(B,)`, *optional*):
            Extra non-negative per-completion weight multiplied in (e.g. 0 for a completion no reward function could
            score, or a sequence-level importance weight). Rows with weight 0 are left out of the class counts
            ($G$ and $k$ above become per-group counts over the rows with weight > 0).

    Returns:
        `torch.Tensor` of shape `(B,)`.
    """
    _check_choice("class_weight", class_weight, CLASS_WEIGHTS)
    labels = labels.to(torch.float32) if not labels.is_floating_point() else labels
    if class_weight is None:
        weights = torch.ones_like(labels)
    elif class_weight == "positive_only":
        weights = labels.clone()
    elif class_weight == "negative_only":
        weights = 1.0 - labels
    else:
        G = num_generations
        if labels.numel() % G != 0:
            raise ValueError(f"The batch ({labels.numel()} rows) must hold whole groups of num_generations={G} rows.")
        present = torch.ones_like(labels) if sample_weight is None else (sample_weight > 0).to(labels.dtype)
        grouped = (labels * present).view(-1, G)  # (B/G, G)
        n = present.view(-1, G).sum(-1, keepdim=True)  # (B/G, 1) rows that count
        k = grouped.sum(-1, keepdim=True)  # (B/G, 1) positives (soft)
        mixed = (k > 0) & (k < n)  # (B/G, 1) both classes present
        pos_w = n / (2 * torch.where(mixed, k, torch.ones_like(k)))  # (B/G, 1)
        neg_w = n / (2 * torch.where(mixed, n - k, torch.ones_like(k)))  # (B/G, 1)
        lab = labels.view(-1, G)
        balanced = lab * pos_w + (1 - lab) * neg_w  # (B/G, G)
        weights = torch.where(mixed, balanced, torch.ones_like(balanced)).view(-1)
    if sample_weight is not None:
        weights = weights * sample_weight.to(weights.dtype)
    return weights


def pacs_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor | None,
    completion_mask: torch.Tensor,
    labels: torch.Tensor,
    num_generations: int,
    beta: float = 1.0,
    reward_proxy: str = "log_ratio",
    score: str = "rloo",
    class_weight: str | None = "balanced",
    sample_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""The PACS loss $\frac{1}{B}\sum_i w_i\,\mathrm{BCEWithLogits}(\psi_i, R_i)$ of one batch of whole groups.

    Args:
        per_token_logps (`torch.Tensor` of shape `(B, T)`):
            Log-probabilities of the completion tokens under the current policy (with grad).
        old_per_token_logps (`torch.Tensor` of shape `(B, T)` or `None`):
            Log-probabilities under the policy that sampled them; `None` means `per_token_logps.detach()`.
        completion_mask (`torch.Tensor` of shape `(B, T)`):
            1 for real completion tokens, 0 for padding.
        labels (`torch.Tensor` of shape `(B,)`):
            Verifiable rewards in `[0, 1]`.
        num_generations (`int`):
            Group size $G$: rows `g*G .. g*G+G-1` are the completions of one prompt; `B % G == 0`.
        beta (`float`, *optional*, defaults to `1.0`):
            Scale of the reward proxy (PACS's $\beta$; not TRL's KL coefficient).
        reward_proxy (`str`, *optional*, defaults to `"log_ratio"`):
            See [`compute_reward_proxy`].
        score (`str`, *optional*, defaults to `"rloo"`):
            See [`compute_score`].
        class_weight (`str` or `None`, *optional*, defaults to `"balanced"`):
            See [`compute_class_weight`].
        sample_weight (`torch.Tensor` of shape `(B,)`, *optional*):
            Extra per-completion weight (see [`compute_class_weight`]).

    Returns:
        `tuple[torch.Tensor, dict[str, torch.Tensor]]`: the 0-dim loss, and detached statistics for logging:
        `rewards` `(B,)`, `psi` `(B,)`, `weights` `(B,)`, `probs` `(B,)` $= \sigma(\psi)$ and
        `per_sample_loss` `(B,)` (unweighted BCE).

    Example:

    >>> import torch
    >>> logps = torch.zeros(4, 3, requires_grad=True)
    >>> loss, stats = pacs_loss(logps, None, torch.ones(4, 3), torch.tensor([1.0, 0.0, 0.0, 0.0]), 4)
    >>> round(loss.item(), 4)  # on-policy: psi == 0, every term is log(2) weighted by w = (2, 2/3, 2/3, 2/3)
    0.6931
    """
    B = per_token_logps.shape[0]
    if labels.shape != (B,):
        raise ValueError(f"labels must have shape ({B},) to match per_token_logps, got {tuple(labels.shape)}.")
    if B % num_generations != 0:
        raise ValueError(
            f"The batch ({B} rows) must hold whole groups of num_generations={num_generations} consecutive rows."
        )
    _check_choice("class_weight", class_weight, CLASS_WEIGHTS)
    rewards = compute_reward_proxy(per_token_logps, old_per_token_logps, completion_mask, beta, reward_proxy)  # (B,)
    psi = compute_score(rewards, num_generations, score)  # (B,)
    labels = labels.to(psi.dtype)
    weights = compute_class_weight(labels, num_generations, class_weight, sample_weight).to(psi.dtype)  # (B,)
    per_sample_loss = F.binary_cross_entropy_with_logits(psi, labels, reduction="none")  # (B,)
    loss = (weights * per_sample_loss).sum() / B
    stats = {
        "rewards": rewards.detach(),
        "psi": psi.detach(),
        "weights": weights.detach(),
        "probs": torch.sigmoid(psi.detach()),
        "per_sample_loss": per_sample_loss.detach(),
    }
    return loss, stats
