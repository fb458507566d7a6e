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

(the paper's score ablation, Appendix D.3, also compares GRPO's standardised score and Dr. GRPO's
$\psi_i = r_i - \frac{1}{G} \sum_j r_j$, ``grpo`` and ``dr_grpo``)

$$
\mathcal{L}(\theta) = -\frac{1}{B} \sum_{i=1}^{B}
\left[w^+_i R_i \log \sigma(\psi_i) + w^-_i (1 - R_i) \log (1 - \sigma(\psi_i))\right]
$$

with $w^\pm_i$ per-group balanced class weights (for a hard label this is $w_i\,\mathrm{BCE}(\sigma(\psi_i), R_i)$).
$\sigma(\psi_i)$ is the policy's own prediction that $o_i$ is correct: the policy is actor and critic at once. The
gradient is $\nabla_\theta \mathcal{L} = \frac{1}{B} \sum_i w_i (\sigma(\psi_i) - R_i) \nabla_\theta \psi_i$; on an
on-policy step $\psi \equiv 0$ and $\sigma = 1/2$, so with $w \equiv 1$ the constant 1/2 cancels inside every group and
$\nabla_\theta \mathcal{L} = -\frac{\beta}{B} \sum_i \big(R_i - \frac{1}{G-1}\sum_{j\ne i} R_j\big)
\nabla_\theta \log \pi_\theta(o_i)$: exactly RLOO's policy gradient. Later optimizer steps on the same rollout
($\psi \neq 0$) add the critic's calibration term (see `docs/pacs_trainer.md`).

The loss couples the rows of a group, but its gradient is a sum of per-row terms:
$\nabla_\theta \mathcal{L} = \sum_i c_i \nabla_\theta r_i$ with $c_i = \partial \mathcal{L} / \partial r_i$, one
number per completion that depends only on the group's $r$ and labels. [`pacs_coefficients`] computes $c$ in closed
form, so that a group spread over micro-batches and processes still gets the exact whole-group gradient (the trainer
backpropagates $\sum_i c_i r_i$ micro-batch by micro-batch).

Semantics match the authors' released code (``compute_pacs_loss`` in ritzz-ai/PACS): the loss is divided by the
batch size $B$, not by $\sum_i w_i$. Rows ``g*G .. g*G+G-1`` of every argument are the completions of one prompt.

A group whose counted completions all carry the same label is *uniform* ([`mixed_group_mask`]); off-policy its gradient
is label-free (it pulls the group's $\psi$ together). ``uniform_groups="drop"`` gives its rows weight 0 and keeps the
divisor $B$, so that the mixed groups' gradient is unchanged (`PACSConfig.pacs_uniform_groups`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .grpo.dynamic_sampling import uniform_signal  # pure torch, as this module


REWARD_PROXIES = ("log_ratio", "mean_logp")
SCORES = ("rloo", "grpo", "dr_grpo", "naive")
CLASS_WEIGHTS = ("balanced", "positive_only", "negative_only", None)
UNIFORM_GROUPS = ("keep", "drop")

GRPO_STD_EPS = 1e-6  # as the reference implementation


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"Unknown {name} {value!r}; valid values are {list(choices)}.")


def _check_groups(num_rows: int, num_generations: int) -> None:
    if num_rows % num_generations != 0:
        raise ValueError(
            f"The batch ({num_rows} rows) must hold whole groups of num_generations={num_generations} consecutive rows."
        )


def compute_reward_proxy(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor | None,
    completion_mask: torch.Tensor,
    beta: float = 1.0,
    reward_proxy: str = "log_ratio",
) -> torch.Tensor:
    r"""Sequence-level reward proxy $r_i$ computed from the policy's own log-probabilities.

    The per-token differences and their sum are computed in float32 (float64 stays float64) whatever the input
    dtype: a sum of thousands of bf16 differences would be off by tens of percent.

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
        `torch.Tensor` of shape `(B,)`, float32 or float64.
    """
    _check_choice("reward_proxy", reward_proxy, REWARD_PROXIES)
    dtype = torch.promote_types(per_token_logps.dtype, torch.float32)
    logps = per_token_logps.to(dtype)  # (B, T)
    mask = completion_mask.to(dtype)  # (B, T)
    if reward_proxy == "log_ratio":
        old = logps.detach() if old_per_token_logps is None else old_per_token_logps.to(dtype)
        return beta * ((logps - old) * mask).sum(-1)  # (B,)
    return beta * (logps * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)  # (B,)


def compute_score(
    rewards: torch.Tensor, num_generations: int, score: str = "rloo", valid: torch.Tensor | None = None
) -> torch.Tensor:
    r"""Group-relative score $\psi_i$, the logit of the implicit critic.

    Args:
        rewards (`torch.Tensor` of shape `(B,)`):
            Reward proxies $r_i$; rows `g*G .. g*G+G-1` belong to one prompt.
        num_generations (`int`):
            Group size $G$; `B % G == 0`.
        score (`str`, *optional*, defaults to `"rloo"`):
            `"rloo"`: $\psi_i = r_i - \frac{1}{n-1}\sum_{j \ne i} r_j$;
            `"grpo"`: $\psi_i = (r_i - \bar r_g) / (\mathrm{std}_g(r) + 10^{-6})$ with the unbiased std;
            `"dr_grpo"`: $\psi_i = r_i - \bar r_g$, the group mean including $i$ and no std (Dr. GRPO, Liu et al.
            2025; the paper's Appendix D.3), i.e. $\frac{n-1}{n}$ times `"rloo"`;
            `"naive"`: $\psi_i = r_i$.
        valid (`torch.Tensor` of shape `(B,)`, *optional*):
            `True` for rows that are samples of the policy. Rows with `False` (a completion whose mask is empty, so
            that $r = 0$ by construction) are left out of the group statistics: the sums, means and std above run over
            the $n$ valid rows of the group, and invalid rows get $\psi = 0$. `None`: all rows are valid ($n = G$).

    Returns:
        `torch.Tensor` of shape `(B,)`.
    """
    _check_choice("score", score, SCORES)
    if score == "naive":
        return rewards if valid is None else rewards * valid.to(rewards.dtype)
    G = num_generations
    _check_groups(rewards.numel(), G)
    if G < 2:
        raise ValueError(
            f"score={score!r} compares completions within a group and needs num_generations >= 2, got {G}."
        )
    grouped = rewards.view(-1, G)  # (B/G, G)
    v = torch.ones_like(grouped) if valid is None else valid.to(rewards.dtype).view(-1, G)  # (B/G, G)
    n = v.sum(-1, keepdim=True)  # (B/G, 1) valid rows per group
    total = (grouped * v).sum(-1, keepdim=True)  # (B/G, 1)
    if score == "rloo":
        loo_mean = (total - grouped) / (n - 1).clamp(min=1.0)  # (B/G, G) mean of the other valid rows
        return ((grouped - loo_mean) * v).view(-1)
    centered = (grouped - total / n.clamp(min=1.0)) * v  # (B/G, G)
    if score == "dr_grpo":
        return centered.view(-1)
    _check_branch(score, "grpo")
    var = centered.pow(2).sum(-1, keepdim=True) / (n - 1).clamp(min=1.0)  # (B/G, 1) unbiased
    # sqrt has an infinite derivative at 0 and psi == 0 on every on-policy step: take the root only where var > 0
    # (the "double where" keeps NaN out of the backward pass), so the loss and its gradient stay finite.
    positive = var > 0
    std = torch.where(positive, torch.where(positive, var, torch.ones_like(var)).sqrt(), torch.zeros_like(var))
    return (centered / (std + GRPO_STD_EPS)).view(-1)


def _check_branch(score: str, branch: str) -> None:  # a score in SCORES with no branch: an error, not `branch`'s
    if score != branch:
        raise NotImplementedError(f"score={score!r} is listed in SCORES but pacs.loss has no computation for it.")


def compute_class_weights(
    labels: torch.Tensor,
    num_generations: int,
    class_weight: str | None = "balanced",
    sample_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Weights $(w^+_i, w^-_i)$ of the positive and negative halves of each completion's BCE term.

    The loss of row $i$ is $-[w^+_i R_i \log\sigma(\psi_i) + w^-_i (1 - R_i) \log(1 - \sigma(\psi_i))]$.

    Args:
        labels (`torch.Tensor` of shape `(B,)`):
            Verifiable rewards in `[0, 1]`.
        num_generations (`int`):
            Group size $G$.
        class_weight (`str` or `None`, *optional*, defaults to `"balanced"`):
            `"balanced"`: in a group with soft positive count $k = \sum_i R_i$ over its $n$ counted rows and
            $0 < k < n$, $w^+ = n / 2k$ and $w^- = n / 2(n - k)$ (scikit-learn's "balanced" rule per group), so that
            the positive and negative halves carry the same total weight $n/2$ for hard and soft labels alike; groups
            with $k \in \{0, n\}$ get $w^\pm = 1$. `"positive_only"`: $w^+ = 1, w^- = 0$. `"negative_only"`:
            $w^+ = 0, w^- = 1$. `None`: $w^\pm = 1$.
        sample_weight (`torch.Tensor` of shape `(B,)`, *optional*):
            Extra non-negative per-completion weight multiplied into both halves (e.g. 0 for a completion no reward
            function could score, or a sequence-level importance weight). Rows with weight 0 are left out of the
            class counts ($n$ and $k$ above run over the rows with weight > 0).

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: $w^+$ and $w^-$, each of shape `(B,)`.
    """
    _check_choice("class_weight", class_weight, CLASS_WEIGHTS)
    labels = labels.to(torch.float32) if not labels.is_floating_point() else labels
    ones = torch.ones_like(labels)
    if class_weight is None:
        pos, neg = ones, ones
    elif class_weight == "positive_only":
        pos, neg = ones, torch.zeros_like(labels)
    elif class_weight == "negative_only":
        pos, neg = torch.zeros_like(labels), ones
    else:
        G = num_generations
        _check_groups(labels.numel(), G)
        present = ones if sample_weight is None else (sample_weight > 0).to(labels.dtype)
        n = present.view(-1, G).sum(-1, keepdim=True)  # (B/G, 1) rows that count
        k = (labels * present).view(-1, G).sum(-1, keepdim=True)  # (B/G, 1) positives (soft)
        mixed = (k > 0) & (k < n)  # (B/G, 1) both classes present
        pos_w = torch.where(mixed, n / (2 * torch.where(mixed, k, torch.ones_like(k))), torch.ones_like(k))
        neg_w = torch.where(mixed, n / (2 * torch.where(mixed, n - k, torch.ones_like(k))), torch.ones_like(k))
        pos = pos_w.expand(-1, G).reshape(-1)  # (B,)
        neg = neg_w.expand(-1, G).reshape(-1)  # (B,)
    if sample_weight is not None:
        sample_weight = sample_weight.to(labels.dtype)
        pos, neg = pos * sample_weight, neg * sample_weight
    return pos, neg


def compute_class_weight(
    labels: torch.Tensor,
    num_generations: int,
    class_weight: str | None = "balanced",
    sample_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""Per-completion weight $w_i = R_i w^+_i + (1 - R_i) w^-_i$ (see [`compute_class_weights`]).

    For a hard label this is the weight of the whole BCE term: $G/2k$ for a positive and $G/2(G-k)$ for a negative
    in a mixed group, 1 in a pure group (`"balanced"`); $R_i$ (`"positive_only"`); $1 - R_i$ (`"negative_only"`).

    Returns:
        `torch.Tensor` of shape `(B,)`.
    """
    pos, neg = compute_class_weights(labels, num_generations, class_weight, sample_weight)
    labels = labels.to(pos.dtype)
    return labels * pos + (1 - labels) * neg


def mixed_group_mask(labels: torch.Tensor, counted: torch.Tensor, num_generations: int) -> torch.Tensor:
    r"""Rows of the mixed groups: those whose counted completions do not all carry the same label.

    A group is *uniform* when the labels of its counted rows are all equal (for 0/1 labels: all correct or all wrong;
    soft labels must be exactly equal) or when it has fewer than 2 counted rows; every other group is *mixed*. Only
    mixed groups hold a label contrast; a uniform group's PACS gradient is label-free (it pulls the group's $\psi$
    together, see `docs/pacs_trainer.md`).

    Args:
        labels (`torch.Tensor` of shape `(B,)`):
            Labels $R_i$ in `[0, 1]`; rows `g*G .. g*G+G-1` belong to one prompt.
        counted (`torch.Tensor` of shape `(B,)`):
            `True` for the rows whose label counts (in the trainer: sample weight > 0, i.e. scored by some reward
            function, with a non-empty completion mask); the other rows' labels are ignored.
        num_generations (`int`):
            Group size $G$; `B % G == 0`.

    Returns:
        `torch.Tensor` of shape `(B,)`, bool: `True` for every row of a mixed group (whatever its own `counted`).

    >>> labels = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    >>> mixed_group_mask(labels, torch.tensor([True] * 6 + [False, True]), 4).tolist()  # row 6 is not counted
    [True, True, True, True, False, False, False, False]
    """
    _check_groups(labels.numel(), num_generations)
    uniform = uniform_signal(labels, counted.bool(), num_generations)  # (B/G,) dynamic sampling's rule, the same
    return (~uniform).repeat_interleave(num_generations)  # (B,)


def _group_weights(labels, num_generations, score, class_weight, sample_weight, valid, uniform_groups="keep"):
    """Class weights with invalid rows, rows of groups left with < 2 valid rows and (`uniform_groups="drop"`) rows of
    uniform groups weighted 0; the rows that take part before that last rule, and the mixed groups' rows."""
    keep = torch.ones_like(labels) if sample_weight is None else sample_weight.to(labels.dtype)
    if valid is not None:
        v = valid.to(labels.dtype)
        if score != "naive":  # a group needs two real samples to compare them
            v = v * (v.view(-1, num_generations).sum(-1, keepdim=True) >= 2).expand(-1, num_generations).reshape(-1)
        keep = keep * v
    mixed = mixed_group_mask(labels, keep > 0, num_generations)  # (B,)
    weight = keep * mixed.to(keep.dtype) if uniform_groups == "drop" else keep  # (B,) the normaliser stays B
    return compute_class_weights(labels, num_generations, class_weight, weight), keep, mixed


def _loss_terms(rewards, labels, num_generations, score, class_weight, sample_weight, valid, uniform_groups):
    """The loss, its statistics, and (labels, w+, w-) in the dtype of psi, for `pacs_loss_from_rewards` and
    `pacs_coefficients`."""
    B = rewards.shape[0]
    if labels.shape != (B,):
        raise ValueError(f"labels must have shape ({B},) to match the {B} completions, got {tuple(labels.shape)}.")
    _check_groups(B, num_generations)
    _check_choice("class_weight", class_weight, CLASS_WEIGHTS)
    _check_choice("uniform_groups", uniform_groups, UNIFORM_GROUPS)
    psi = compute_score(rewards, num_generations, score, valid)  # (B,)
    labels = labels.to(psi.dtype)
    (pos, neg), keep, mixed = _group_weights(
        labels, num_generations, score, class_weight, sample_weight, valid, uniform_groups
    )  # (B,) each
    pos, neg = pos.to(psi.dtype), neg.to(psi.dtype)
    # -[w+ R log sigma(psi) + w- (1 - R) log sigma(-psi)], with log sigma(x) = -softplus(-x)
    per_sample = pos * labels * F.softplus(-psi) + neg * (1 - labels) * F.softplus(psi)  # (B,)
    loss = per_sample.sum() / B
    stats = {
        "rewards": rewards.detach(),
        "psi": psi.detach(),
        "weights": (labels * pos + (1 - labels) * neg).detach(),
        "counted": keep.detach() > 0,  # the samples, whatever their class weight (the critic's metrics)
        "mixed": mixed,  # rows of groups whose counted labels differ (`mixed_group_mask`)
        "probs": torch.sigmoid(psi.detach()),
        "per_sample_loss": F.binary_cross_entropy_with_logits(psi.detach(), labels, reduction="none"),
    }
    return loss, stats, (labels, pos, neg)


def pacs_loss_from_rewards(
    rewards: torch.Tensor,
    labels: torch.Tensor,
    num_generations: int,
    score: str = "rloo",
    class_weight: str | None = "balanced",
    sample_weight: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
    uniform_groups: str = "keep",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""The PACS loss of whole groups given their reward proxies $r$ (see [`pacs_loss`] for the arguments).

    Args:
        rewards (`torch.Tensor` of shape `(B,)`):
            Reward proxies $r_i$ (from [`compute_reward_proxy`]).
        valid (`torch.Tensor` of shape `(B,)`, *optional*):
            Rows that are samples of the policy (see [`compute_score`]); invalid rows, and groups left with fewer than
            2 valid rows (every score but `"naive"`), contribute no loss.

    Returns:
        `tuple[torch.Tensor, dict[str, torch.Tensor]]`: as [`pacs_loss`].
    """
    loss, stats, _ = _loss_terms(
        rewards, labels, num_generations, score, class_weight, sample_weight, valid, uniform_groups
    )
    return loss, stats


def pacs_coefficients(
    rewards: torch.Tensor,
    labels: torch.Tensor,
    num_generations: int,
    score: str = "rloo",
    class_weight: str | None = "balanced",
    sample_weight: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
    normalizer: float | None = None,
    uniform_groups: str = "keep",
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    r"""Closed-form $c_i = \partial \mathcal{L} / \partial r_i$ of the PACS loss of whole groups, and the loss.

    $\nabla_\theta \mathcal{L} = \sum_i c_i \nabla_\theta r_i$, so backpropagating $\sum_i c_i r_i$ over any split
    of the rows (micro-batches, processes) gives the exact whole-group gradient. With
    $g_i = \partial \mathcal{L} / \partial \psi_i = [w^-_i (1 - R_i) \sigma(\psi_i) - w^+_i R_i \sigma(-\psi_i)] / B$
    and $n$ valid rows in the group:

    - `"naive"`: $c_i = g_i$;
    - `"rloo"`: $c_i = g_i - \frac{1}{n-1} \sum_{j \ne i} g_j$;
    - `"dr_grpo"`: $c_i = g_i - \frac{1}{n} \sum_j g_j$;
    - `"grpo"`: with $d = r - \bar r$, $s$ the unbiased std and $\epsilon = 10^{-6}$,
      $c_i = \frac{g_i - \bar g}{s + \epsilon} - \frac{(\sum_j g_j d_j)\, d_i}{(s + \epsilon)^2 (n - 1)\, s}$
      (the second term is 0 where $s = 0$, as in [`compute_score`]).

    On an on-policy step $r \equiv 0$, so $c$ depends on the labels (and weights) alone.

    Args:
        rewards (`torch.Tensor` of shape `(B,)`):
            Reward proxies $r_i$ at the current parameters (no grad needed).
        labels, num_generations, score, class_weight, sample_weight, valid:
            As in [`pacs_loss_from_rewards`].
        normalizer (`float`, *optional*):
            Divide by this instead of $B$ (e.g. the number of rows of an optimizer step across all processes).
        uniform_groups (`str`, *optional*, defaults to `"keep"`):
            As in [`pacs_loss`]; with `"drop"` every row of a uniform group gets $c_i = 0$.

    Returns:
        `tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]`: $c$ `(B,)`, the 0-dim loss (divided by
        `normalizer` or $B$) and the statistics of [`pacs_loss`].

    Example:

    >>> import torch
    >>> labels = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    >>> coef, loss, _ = pacs_coefficients(torch.zeros(4, dtype=torch.float64), labels, 4, class_weight=None)
    >>> [round(c, 4) for c in (4 * coef).tolist()]  # on-policy, no weights: -(R_i - mean of the others' R) / B
    [-1.0, 0.3333, 0.3333, 0.3333]
    """
    rewards = rewards.detach()
    loss, stats, (labels, pos, neg) = _loss_terms(
        rewards, labels, num_generations, score, class_weight, sample_weight, valid, uniform_groups
    )
    B = rewards.shape[0]
    scale = B / normalizer if normalizer is not None else 1.0
    loss = loss * scale
    psi = stats["psi"]
    g = (neg * (1 - labels) * torch.sigmoid(psi) - pos * labels * torch.sigmoid(-psi)) * (scale / B)  # (B,)
    if score == "naive":
        return g, loss, stats
    G = num_generations
    v = torch.ones_like(g) if valid is None else valid.to(g.dtype)
    g, v = (g * v).view(-1, G), v.view(-1, G)  # (B/G, G)
    n = v.sum(-1, keepdim=True)  # (B/G, 1)
    g_total = g.sum(-1, keepdim=True)  # (B/G, 1)
    if score == "rloo":
        coef = g - (g_total - g) / (n - 1).clamp(min=1.0)
        return (coef * v).view(-1), loss, stats
    if score == "dr_grpo":
        return ((g - g_total / n.clamp(min=1.0)) * v).view(-1), loss, stats
    _check_branch(score, "grpo")
    r = rewards.to(g.dtype).view(-1, G)
    d = (r - (r * v).sum(-1, keepdim=True) / n.clamp(min=1.0)) * v  # (B/G, G)
    var = d.pow(2).sum(-1, keepdim=True) / (n - 1).clamp(min=1.0)  # (B/G, 1)
    s = var.clamp(min=0).sqrt()
    denom = s + GRPO_STD_EPS
    first = (g - g_total / n.clamp(min=1.0)) / denom
    second = (g * d).sum(-1, keepdim=True) * d / (denom.pow(2) * (n - 1).clamp(min=1.0) * torch.where(s > 0, s, 1.0))
    coef = first - torch.where(s > 0, second, torch.zeros_like(second))
    return (coef * v).view(-1), loss, stats


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
    uniform_groups: str = "keep",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""The PACS loss $-\frac{1}{B}\sum_i [w^+_i R_i \log\sigma(\psi_i) + w^-_i (1-R_i) \log(1-\sigma(\psi_i))]$.

    Rows whose `completion_mask` is empty (truncated and masked, or all tool output) are not samples of the policy
    ($r = 0$ by construction): they are left out of their group's statistics and contribute no loss.

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
            See [`compute_class_weights`].
        sample_weight (`torch.Tensor` of shape `(B,)`, *optional*):
            Extra per-completion weight (see [`compute_class_weights`]).
        uniform_groups (`str`, *optional*, defaults to `"keep"`):
            `"keep"`: every group takes part (the paper). `"drop"`: every row of a uniform group (its counted rows'
            labels all equal, or fewer than 2 counted rows: see [`mixed_group_mask`]; a row counts when its sample
            weight is > 0 and it is a sample of the policy) gets sample weight 0, so that its gradient is exactly 0;
            the loss is still divided by $B$, all rows of the batch.

    Returns:
        `tuple[torch.Tensor, dict[str, torch.Tensor]]`: the 0-dim loss, and detached statistics for logging:
        `rewards` `(B,)`, `psi` `(B,)`, `weights` `(B,)` $= R w^+ + (1-R) w^-$, `counted` `(B,)` (bool: the samples
        that take part, whatever their class weight: sample weight > 0, in a group with two of them; uniform groups
        included whatever `uniform_groups`), `mixed` `(B,)` (bool: the rows of mixed groups), `probs` `(B,)`
        $= \sigma(\psi)$ and `per_sample_loss` `(B,)` (unweighted BCE).

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
    _check_groups(B, num_generations)
    rewards = compute_reward_proxy(per_token_logps, old_per_token_logps, completion_mask, beta, reward_proxy)  # (B,)
    valid = completion_mask.sum(-1) > 0  # (B,) rows that are samples of the policy
    return pacs_loss_from_rewards(
        rewards, labels, num_generations, score, class_weight, sample_weight, None if valid.all() else valid,
        uniform_groups,
    )  # fmt: skip
