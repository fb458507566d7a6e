"""Tests of `pacs.loss`: hand-computed values, gradcheck of all 24 variants, the RLOO reduction, rank splitting."""

import itertools
import math

import pytest
import torch

from pacs.loss import (
    CLASS_WEIGHTS,
    REWARD_PROXIES,
    SCORES,
    compute_class_weight,
    compute_class_weights,
    compute_reward_proxy,
    compute_score,
    mixed_group_mask,
    pacs_coefficients,
    pacs_loss,
    pacs_loss_from_rewards,
)


VARIANTS = list(itertools.product(REWARD_PROXIES, SCORES, CLASS_WEIGHTS))


def _bce(logit: float, label: float) -> float:
    p = 1 / (1 + math.exp(-logit))
    return -(label * math.log(p) + (1 - label) * math.log(1 - p))


def _batch(B=8, T=5, G=4, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    logps = -torch.rand(B, T, generator=gen, dtype=dtype) * 2
    old = logps + 0.3 * torch.randn(B, T, generator=gen, dtype=dtype)
    mask = torch.ones(B, T, dtype=dtype)
    mask[1, 3:] = 0  # padding
    mask[5, 1:] = 0
    labels = torch.tensor([1, 0, 0, 1, 0, 0, 0, 1], dtype=dtype)[:B]
    return logps, old, mask, labels


def test_variant_count():
    assert len(VARIANTS) == 32  # 2 proxies x 4 scores x 4 class weights


def test_dr_grpo_score_is_r_minus_the_group_mean_in_value_and_gradient():
    # Dr. GRPO's score (the paper's Appendix D.3 ablation): psi_i = r_i - mean_g r, the mean including i, no std
    r = torch.tensor([1.0, 2.0, 3.0, 6.0, 0.5, -0.5, 0.25, 0.25], dtype=torch.float64, requires_grad=True)
    psi = compute_score(r, 4, "dr_grpo")
    expected = [1 - 3, 2 - 3, 3 - 3, 6 - 3, 0.5 - 0.125, -0.5 - 0.125, 0.25 - 0.125, 0.25 - 0.125]
    assert psi.tolist() == pytest.approx(expected, rel=1e-15, abs=1e-15)
    assert psi.dtype == torch.float64
    # d psi_i / d r_j = [i == j] - 1/G within a group, 0 across groups
    (jacobian,) = torch.autograd.functional.jacobian(lambda x: compute_score(x, 4, "dr_grpo"), (r.detach(),))
    block = torch.eye(4, dtype=torch.float64) - 1 / 4
    torch.testing.assert_close(jacobian, torch.block_diag(block, block), rtol=0, atol=1e-15)
    # (G - 1) / G times RLOO's score, which subtracts the mean of the others
    torch.testing.assert_close(psi, 3 / 4 * compute_score(r, 4, "rloo"), rtol=1e-14, atol=1e-14)
    # the loss through it: value from the hand-computed psi, gradient from gradcheck
    labels = torch.tensor([1, 0, 0, 1, 0, 0, 0, 1], dtype=torch.float64)
    loss, stats = pacs_loss_from_rewards(r, labels, 4, "dr_grpo", None)
    assert loss.item() == pytest.approx(sum(_bce(p, y) for p, y in zip(expected, labels.tolist())) / 8, rel=1e-12)
    assert torch.autograd.gradcheck(lambda x: pacs_loss_from_rewards(x, labels, 4, "dr_grpo")[0], (r,))


def test_hand_computed_rloo_balanced():
    # Two groups of G=2, T=2. r_i = sum_t m (logp - old).
    logps = torch.tensor([[-1.0, -2.0], [-0.5, -0.5], [-1.0, -1.0], [-2.0, -3.0]])
    old = torch.tensor([[-1.5, -2.0], [-0.5, -1.0], [-1.0, -1.0], [-1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    labels = torch.tensor([1.0, 0.0, 1.0, 1.0])
    r = [0.5, 0.0, 0.0, -3.0]  # row 1's second token is masked out
    psi = [r[0] - r[1], r[1] - r[0], r[2] - r[3], r[3] - r[2]]  # G=2: minus the other one
    w = [1.0, 1.0, 1.0, 1.0]  # group 1: one positive, one negative -> G/2k = 1; group 2: all positive -> 1
    expected = sum(wi * _bce(p, y) for wi, p, y in zip(w, psi, labels.tolist())) / 4
    loss, stats = pacs_loss(logps, old, mask, labels, 2, beta=1.0)
    assert stats["rewards"].tolist() == pytest.approx(r)
    assert stats["psi"].tolist() == pytest.approx(psi)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    # beta scales psi linearly
    loss2, stats2 = pacs_loss(logps, old, mask, labels, 2, beta=2.0)
    assert stats2["psi"].tolist() == pytest.approx([2 * p for p in psi])
    assert loss2.item() == pytest.approx(sum(_bce(2 * p, y) for p, y in zip(psi, labels.tolist())) / 4, rel=1e-6)


def test_hand_computed_rloo_g4_weights_and_divide_by_B():
    # G=4, one group; r = (1, 2, 3, 6); psi_i = r_i - mean of the other three.
    r = torch.tensor([1.0, 2.0, 3.0, 6.0])
    logps = r[:, None].repeat(1, 1)
    labels = torch.tensor([1.0, 0.0, 0.0, 0.0])
    loss, stats = pacs_loss(logps, torch.zeros_like(logps), torch.ones_like(logps), labels, 4)
    psi = [1 - 11 / 3, 2 - 10 / 3, 3 - 9 / 3, 6 - 6 / 3]
    w = [4 / 2, 4 / 6, 4 / 6, 4 / 6]  # k=1 of G=4: G/2k and G/2(G-k)
    assert stats["psi"].tolist() == pytest.approx(psi, rel=1e-6)
    assert stats["weights"].tolist() == pytest.approx(w, rel=1e-6)
    expected = sum(wi * _bce(p, y) for wi, p, y in zip(w, psi, labels.tolist())) / 4  # by B, not sum(w)
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_grpo_score_uses_unbiased_std():
    r = torch.tensor([1.0, 2.0, 3.0, 6.0, 0.0, 0.0, 1.0, 1.0])
    psi = compute_score(r, 4, "grpo")
    for g in range(2):
        x = r[4 * g : 4 * g + 4].tolist()
        mean = sum(x) / 4
        std = math.sqrt(sum((v - mean) ** 2 for v in x) / 3)
        assert psi[4 * g : 4 * g + 4].tolist() == pytest.approx([(v - mean) / (std + 1e-6) for v in x], rel=1e-6)


def test_naive_score_and_mean_logp_proxy():
    logps = torch.tensor([[-1.0, -3.0], [-2.0, -4.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    r = compute_reward_proxy(logps, None, mask, beta=2.0, reward_proxy="mean_logp")
    assert r.tolist() == pytest.approx([2 * -2.0, 2 * -2.0])
    assert compute_score(r, 2, "naive").tolist() == r.tolist()
    # an all-masked row (e.g. masked truncated completion) has proxy 0, not NaN
    r0 = compute_reward_proxy(logps, None, torch.zeros_like(mask), reward_proxy="mean_logp")
    assert r0.tolist() == [0.0, 0.0]


def test_class_weights_rules():
    labels = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    balanced = compute_class_weight(labels, 4, "balanced")
    assert balanced.tolist() == pytest.approx([2.0, 2 / 3, 2 / 3, 2 / 3] + [1.0] * 8)
    assert compute_class_weight(labels, 4, "positive_only").tolist() == labels.tolist()
    assert compute_class_weight(labels, 4, "negative_only").tolist() == (1 - labels).tolist()
    assert compute_class_weight(labels, 4, None).tolist() == [1.0] * 12
    # balanced: positives and negatives carry the same total weight in a mixed group
    lab = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0])
    w = compute_class_weight(lab, 8, "balanced")
    assert (w * lab).sum().item() == pytest.approx((w * (1 - lab)).sum().item())


def test_sample_weight_zero_rows_leave_class_counts():
    labels = torch.tensor([1.0, 0.0, 0.0, 0.0])
    sample_weight = torch.tensor([1.0, 1.0, 0.0, 1.0])  # row 2 unscorable: group counts n=3, k=1
    w = compute_class_weight(labels, 4, "balanced", sample_weight)
    assert w.tolist() == pytest.approx([3 / 2, 3 / 4, 0.0, 3 / 4])


@pytest.mark.parametrize("reward_proxy,score,class_weight", VARIANTS)
def test_gradcheck_all_variants(reward_proxy, score, class_weight):
    logps, old, mask, labels = _batch()
    logps.requires_grad_(True)

    def f(x):
        return pacs_loss(x, old, mask, labels, 4, 1.5, reward_proxy, score, class_weight)[0]

    assert torch.autograd.gradcheck(f, (logps,), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("reward_proxy,score,class_weight", VARIANTS)
def test_on_policy_psi_zero_is_finite(reward_proxy, score, class_weight):
    logps, _, mask, labels = _batch(dtype=torch.float32)
    logps.requires_grad_(True)
    loss, stats = pacs_loss(logps, None, mask, labels, 4, 1.0, reward_proxy, score, class_weight)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(logps.grad).all()
    if reward_proxy == "log_ratio":
        assert stats["psi"].abs().max().item() == 0.0
    # a fully degenerate batch (all labels equal, all proxies equal) is finite too
    flat = torch.zeros(8, 5, requires_grad=True)
    loss0, _ = pacs_loss(flat, None, mask, torch.zeros(8), 4, 1.0, reward_proxy, score, class_weight)
    loss0.backward()
    assert torch.isfinite(loss0) and torch.isfinite(flat.grad).all()


@pytest.mark.parametrize("beta", [1.0, 2.0])
def test_on_policy_gradient_is_rloo(beta):
    B, T, G = 8, 6, 4
    logps, _, mask, _ = _batch(B, T, G)
    labels = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    logps.requires_grad_(True)
    loss, _ = pacs_loss(logps, None, mask, labels, G, beta=beta, class_weight=None)
    loss.backward()
    grouped = labels.view(-1, G)
    advantage = (grouped - (grouped.sum(-1, keepdim=True) - grouped) / (G - 1)).view(-1)  # RLOO: R_i - mean_{j!=i}
    expected = -(beta / B) * advantage[:, None] * mask
    torch.testing.assert_close(logps.grad, expected)


def test_split_over_two_ranks_matches_one_process():
    # DDP averages the gradients of the ranks; each rank averages over its own whole groups.
    logps, old, mask, labels = _batch(B=8, G=4)
    labels = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    full = logps.clone().requires_grad_(True)
    pacs_loss(full, old, mask, labels, 4, beta=2.0)[0].backward()

    parts = [logps[:4].clone().requires_grad_(True), logps[4:].clone().requires_grad_(True)]
    rank_losses = [
        pacs_loss(part, old[4 * r : 4 * r + 4], mask[4 * r : 4 * r + 4], labels[4 * r : 4 * r + 4], 4, 2.0)[0]
        for r, part in enumerate(parts)
    ]
    (sum(rank_losses) / 2).backward()  # the all-reduce mean of DDP
    torch.testing.assert_close(torch.cat([p.grad for p in parts]), full.grad)


def test_off_policy_gradient_differs_from_rloo():
    logps, old, mask, labels = _batch()
    logps.requires_grad_(True)
    pacs_loss(logps, old, mask, labels, 4, class_weight=None)[0].backward()
    on = logps.detach().clone().requires_grad_(True)
    pacs_loss(on, None, mask, labels, 4, class_weight=None)[0].backward()
    assert not torch.allclose(logps.grad, on.grad)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"reward_proxy": "logratio"}, "reward_proxy"),
        ({"score": "ppo"}, "score"),
        ({"class_weight": "question"}, "class_weight"),
    ],
)
def test_unknown_variant_raises(kwargs, match):
    logps, old, mask, labels = _batch()
    with pytest.raises(ValueError, match=match):
        pacs_loss(logps, old, mask, labels, 4, **kwargs)


def test_bad_shapes_raise():
    logps, old, mask, labels = _batch()
    with pytest.raises(ValueError, match="whole groups"):
        pacs_loss(logps, old, mask, labels, 3)
    with pytest.raises(ValueError, match="labels must have shape"):
        pacs_loss(logps, old, mask, labels[:4], 4)


SCORE_WEIGHT = list(itertools.product(SCORES, CLASS_WEIGHTS))


@pytest.mark.parametrize("score,class_weight", SCORE_WEIGHT)
@pytest.mark.parametrize("case", ["hard", "soft_with_weights", "invalid_rows", "on_policy"])
def test_coefficients_match_autograd_through_the_loss(score, class_weight, case):
    gen = torch.Generator().manual_seed(7)
    B, G = 12, 4
    rewards = torch.randn(B, generator=gen, dtype=torch.float64)
    labels = torch.tensor([1, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 1], dtype=torch.float64)
    sample_weight = valid = None
    if case == "soft_with_weights":
        labels = torch.rand(B, generator=gen, dtype=torch.float64)
        sample_weight = torch.rand(B, generator=gen, dtype=torch.float64) + 0.5
        sample_weight[3] = 0.0  # unscorable: out of the class counts, still in the statistics
    if case == "invalid_rows":
        valid = torch.ones(B, dtype=torch.bool)
        valid[[1, 6, 7, 8]] = False  # group 1 keeps 2 valid rows, group 2 keeps 3
        valid[4] = False  # group 1 now has a single valid row: no loss
    if case == "on_policy":
        rewards = torch.zeros(B, dtype=torch.float64)
    leaf = rewards.clone().requires_grad_(True)
    loss, _ = pacs_loss_from_rewards(leaf, labels, G, score, class_weight, sample_weight, valid)
    (expected,) = torch.autograd.grad(loss, leaf)
    coef, loss_c, _ = pacs_coefficients(rewards, labels, G, score, class_weight, sample_weight, valid)
    torch.testing.assert_close(coef, expected, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(loss_c, loss.detach())
    # a different normalizer (rows of the optimizer step over all processes) rescales both
    coef2, loss2, _ = pacs_coefficients(
        rewards, labels, G, score, class_weight, sample_weight, valid, normalizer=3 * B
    )
    torch.testing.assert_close(coef2, expected / 3, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(loss2, loss.detach() / 3)


def test_coefficients_split_rows_give_the_whole_group_gradient():
    # sum_i c_i grad r_i over any split of the rows == grad of the whole-group loss
    logps, old, mask, labels = _batch(B=8, G=4)
    full = logps.clone().requires_grad_(True)
    pacs_loss(full, old, mask, labels, 4, beta=2.0)[0].backward()
    r = compute_reward_proxy(logps, old, mask, beta=2.0)
    coef, _, _ = pacs_coefficients(r, labels, 4)
    grads = []
    for rows in ([0, 5], [1, 2, 3], [4, 6, 7]):  # micro-batches that cut both groups
        part = logps[rows].clone().requires_grad_(True)
        (coef[rows] * compute_reward_proxy(part, old[rows], mask[rows], beta=2.0)).sum().backward()
        grads.append((rows, part.grad))
    split = torch.zeros_like(logps)
    for rows, g in grads:
        split[rows] = g
    torch.testing.assert_close(split, full.grad)


def test_soft_labels_are_balanced():
    # labels [0.1, 0, 0, 0]: k = 0.1 of n = 4; both halves must carry n/2 = 2
    labels = torch.tensor([0.1, 0.0, 0.0, 0.0])
    pos, neg = compute_class_weights(labels, 4, "balanced")
    assert (pos * labels).sum().item() == pytest.approx(2.0)
    assert (neg * (1 - labels)).sum().item() == pytest.approx(2.0)
    # hard labels: identical to the per-row rule
    hard = torch.tensor([1.0, 0.0, 0.0, 0.0])
    pos, neg = compute_class_weights(hard, 4, "balanced")
    assert (hard * pos + (1 - hard) * neg).tolist() == pytest.approx([2.0, 2 / 3, 2 / 3, 2 / 3])
    # the loss weighs the two halves of a soft row separately
    psi = torch.tensor([0.3, -0.2, 0.1, 0.4], dtype=torch.float64)
    loss, _ = pacs_loss_from_rewards(psi * 0, labels.double(), 4, "naive")
    assert loss.item() == pytest.approx(math.log(2) * (2.0 + 2.0) / 4)


def test_emptied_rows_leave_the_group_statistics():
    # row 3's mask is empty (truncated + masked): r = 0 by construction, not a sample; leave it out of the mean
    logps = torch.tensor([[-1.0], [-2.0], [-3.0], [-9.0]], dtype=torch.float64)
    old = torch.zeros_like(logps)
    mask = torch.tensor([[1.0], [1.0], [1.0], [0.0]], dtype=torch.float64)
    labels = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    _, stats = pacs_loss(logps, old, mask, labels, 4)
    assert stats["psi"].tolist() == pytest.approx([-1 - (-5 / 2), -2 - (-4 / 2), -3 - (-3 / 2), 0.0])
    assert stats["weights"][3].item() == 0.0
    # a group left with a single valid row contributes no loss at all
    mask1 = torch.tensor([[1.0], [0.0], [0.0], [0.0]], dtype=torch.float64)
    x = logps.clone().requires_grad_(True)
    loss, _ = pacs_loss(x, old, mask1, labels, 4)
    loss.backward()
    assert loss.item() == 0.0 and x.grad.abs().sum().item() == 0.0


def test_reward_proxy_sums_in_float32_from_bf16():
    gen = torch.Generator().manual_seed(0)
    T = 4096
    old = -torch.rand(1, T, generator=gen, dtype=torch.float64) * 3
    new = old + 1e-3 * torch.randn(1, T, generator=gen, dtype=torch.float64)
    r = compute_reward_proxy(new.to(torch.bfloat16), old.to(torch.bfloat16), torch.ones(1, T))
    assert r.dtype == torch.float32
    # the bf16 inputs themselves are rounded (~3 significant digits); summing in bf16 is far worse
    in_bf16 = ((new.to(torch.bfloat16) - old.to(torch.bfloat16)) * torch.ones(1, T, dtype=torch.bfloat16)).sum()
    ref = (new.to(torch.bfloat16).double() - old.to(torch.bfloat16).double()).sum().item()
    assert r.item() == pytest.approx(ref, rel=1e-5)
    assert abs(in_bf16.item() - ref) > 10 * abs(r.item() - ref)


def test_docstring_examples_run():
    import doctest

    import pacs.loss

    result = doctest.testmod(pacs.loss)
    assert result.attempted > 0 and result.failed == 0


def test_mixed_group_mask_rules():
    labels = torch.tensor(
        [1, 0, 0, 0] + [0, 0, 0, 0] + [1, 1, 1, 1] + [1, 0, 1, 1] + [1, 0, 0, 0] + [0.5] * 4 + [0.5, 0.4, 0.5, 0.5]
    )
    counted = torch.ones(28, dtype=torch.bool)
    counted[13] = False  # the only 0 of group 3 is not counted: its counted labels are all 1
    counted[17:20] = False  # group 4 has one counted row: nothing to contrast
    expected = [True, False, False, False, False, False, True]  # soft labels: uniform only when exactly equal
    assert mixed_group_mask(labels, counted, 4).tolist() == [m for m in expected for _ in range(4)]
    with pytest.raises(ValueError, match="whole groups"):
        mixed_group_mask(labels, counted, 3)


def _uniform_and_mixed_groups(dtype=torch.float64):
    """Five groups of 4 off-policy (psi != 0): 0 and 3 mixed (3 with soft labels), 1 all wrong, 2 all right, 4 all
    wrong among its counted rows (row 16, the only right one, has weight 0); rows 3 and 13 weigh 0 too."""
    gen = torch.Generator().manual_seed(3)
    rewards = torch.randn(20, generator=gen, dtype=dtype)
    labels = torch.tensor(
        [1, 0, 0, 1] + [0] * 4 + [1] * 4 + [0.7, 0.2, 1, 0] + [1, 0, 0, 0], dtype=dtype
    )  # fmt: skip
    sample_weight = torch.ones(20, dtype=dtype)
    sample_weight[[3, 13, 16]] = 0
    mixed = torch.tensor([True] * 4 + [False] * 8 + [True] * 4 + [False] * 4)
    return rewards, labels, sample_weight, mixed


@pytest.mark.parametrize("score,class_weight", SCORE_WEIGHT)
def test_dropping_uniform_groups_is_the_loss_of_the_mixed_rows_alone(score, class_weight):
    rewards, labels, sample_weight, mixed = _uniform_and_mixed_groups()
    B, G = rewards.numel(), 4
    r = rewards.clone().requires_grad_()
    loss, stats = pacs_loss_from_rewards(r, labels, G, score, class_weight, sample_weight, uniform_groups="drop")
    loss.backward()
    assert stats["mixed"].tolist() == mixed.tolist()
    # the mixed rows alone, divided by the same normaliser B (not by their own number: no re-normalised mean)
    r_mixed = rewards[mixed].clone().requires_grad_()
    alone, _ = pacs_loss_from_rewards(r_mixed, labels[mixed], G, score, class_weight, sample_weight[mixed])
    alone = alone * mixed.sum() / B
    alone.backward()
    torch.testing.assert_close(loss, alone, rtol=1e-12, atol=0)
    torch.testing.assert_close(r.grad[mixed], r_mixed.grad, rtol=1e-12, atol=1e-15)
    assert torch.equal(r.grad[~mixed], torch.zeros(int((~mixed).sum()), dtype=r.dtype))  # exactly 0
    # what the option removes: kept, the uniform groups push (psi != 0), and the mixed rows' gradient is the same
    r_kept = rewards.clone().requires_grad_()
    pacs_loss_from_rewards(r_kept, labels, G, score, class_weight, sample_weight)[0].backward()
    assert r_kept.grad[~mixed].abs().sum() > 1e-3
    torch.testing.assert_close(r_kept.grad[mixed], r.grad[mixed], rtol=1e-12, atol=1e-15)
    # the closed-form coefficients of the split path agree, and are exactly 0 on the uniform groups' rows
    coef, coef_loss, _ = pacs_coefficients(
        rewards, labels, G, score, class_weight, sample_weight, uniform_groups="drop"
    )  # fmt: skip
    torch.testing.assert_close(coef, r.grad, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(coef_loss, loss.detach(), rtol=1e-12, atol=0)
    assert torch.equal(coef[~mixed], torch.zeros_like(coef[~mixed]))


def test_dropping_uniform_groups_through_pacs_loss_with_emptied_rows():
    # an emptied row (not a sample) is no counted row either: group 1's counted labels are all 0 once row 4 is gone
    logps, old, mask, labels = _batch()  # labels [1, 0, 0, 1 | 0, 0, 0, 1]
    labels = labels.clone()
    labels[4], labels[7] = 1.0, 0.0
    mask = mask.clone()
    mask[4] = 0
    logps = logps.clone().requires_grad_()
    loss, stats = pacs_loss(logps, old, mask, labels, 4, uniform_groups="drop")
    loss.backward()
    assert stats["mixed"].tolist() == [True] * 4 + [False] * 4
    assert stats["counted"].tolist() == [True] * 4 + [False] + [True] * 3  # the critic still sees group 1
    assert torch.equal(logps.grad[4:], torch.zeros_like(logps.grad[4:]))
    kept = logps.detach().clone().requires_grad_()
    pacs_loss(kept, old, mask, labels, 4)[0].backward()
    torch.testing.assert_close(kept.grad[:4], logps.grad[:4], rtol=1e-12, atol=1e-15)
    assert kept.grad[4:].abs().sum() > 1e-3


@pytest.mark.parametrize("score", SCORES)
def test_dropping_changes_nothing_where_every_group_is_mixed(score):
    # bit for bit: the option only multiplies the sample weights of uniform groups' rows by 0
    logps, old, mask, labels = _batch()
    results = []
    for kwargs in ({}, {"uniform_groups": "keep"}, {"uniform_groups": "drop"}):
        x = logps.clone().requires_grad_()
        loss, _ = pacs_loss(x, old, mask, labels, 4, score=score, **kwargs)
        loss.backward()
        coef, _, _ = pacs_coefficients(
            torch.randn(8, dtype=torch.float64, generator=torch.Generator().manual_seed(1)), labels, 4, score, **kwargs
        )
        results.append((loss.detach(), x.grad, coef))
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))
    with pytest.raises(ValueError, match="uniform_groups"):
        pacs_loss(logps, old, mask, labels, 4, uniform_groups="filter")


def test_a_score_listed_without_its_own_computation_is_an_error(monkeypatch):
    # a name added to SCORES and to no branch must fail, not compute GRPO's score under another name
    import pacs.loss

    monkeypatch.setattr(pacs.loss, "SCORES", (*SCORES, "new_score"))
    rewards = torch.tensor([0.1, 0.2, 0.3, 0.4])
    with pytest.raises(NotImplementedError, match="score='new_score' is listed in SCORES"):
        compute_score(rewards, 4, "new_score")
    with pytest.raises(NotImplementedError, match="score='new_score' is listed in SCORES"):
        pacs_coefficients(rewards, torch.tensor([1.0, 0.0, 1.0, 0.0]), 4, score="new_score")
