"""`pacs.grpo.packing`: pack / unpack round trip, positions, budgets, labels within sequences."""

from __future__ import annotations

import pytest
import torch

from pacs.grpo.packing import IGNORE_INDEX, next_token_logps, pack, shift_labels, unpack


def _batch():
    """Rows of very different lengths, padding on both sides, an empty row and a one-token row."""
    torch.manual_seed(0)
    B, T = 6, 12
    ids = torch.randint(1, 50, (B, T))
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, (lo, hi) in enumerate([(3, 12), (0, 2), (5, 5), (4, 5), (0, 12), (2, 9)]):
        mask[b, lo:hi] = 1
    return ids, mask


def _sequences(ids, mask):
    return [ids[b][mask[b].bool()].tolist() for b in range(ids.size(0))]


def _segments(p):
    """The packed rows split where the positions restart: what sdpa/eager read as sequences."""
    out = []
    for r in range(p.input_ids.size(0)):
        for i, pos in enumerate(p.position_ids[r].tolist()):
            if pos == 0:
                out.append([])
            out[-1].append(p.input_ids[r, i].item())
    return out


@pytest.mark.parametrize("budget", [None, 1, 9, 12, 100])
def test_round_trip_positions_and_budget(budget):
    ids, mask = _batch()
    p = pack(ids, mask, budget)
    lengths = mask.sum(1).tolist()
    assert p.num_real_tokens == sum(lengths) and p.num_positions == p.input_ids.numel()
    # round trip: every real token back in its place, fill at pads
    back = unpack(p, p.input_ids, fill=-1)
    assert torch.equal(back, ids.masked_fill(mask == 0, -1))
    # each segment is a whole sequence in order (filler segments are all zeros); positions restart per sequence
    real = [s for s in _sequences(ids, mask) if s]
    segs = [s for s in _segments(p) if any(s)]
    assert sorted(segs) == sorted(real)  # rows are filled longest first (first fit decreasing)
    for r in range(p.input_ids.size(0)):
        pos = p.position_ids[r]
        starts = (pos == 0).nonzero().squeeze(1).tolist() + [pos.numel()]
        for a, b in zip(starts[:-1], starts[1:], strict=True):
            assert pos[a:b].tolist() == list(range(b - a))
    # rows within the budget unless a sequence alone is longer
    used = [(p.input_ids[r] != 0).sum().item() for r in range(p.input_ids.size(0))]  # ids are >= 1
    for u in used:
        assert budget is None or u <= max(budget, max(lengths))
    if budget is None:
        assert p.input_ids.size(0) == 1 and p.num_positions == p.num_real_tokens
    if budget == 1:  # every non-empty sequence longer than the budget: a row each
        assert p.input_ids.size(0) == sum(n > 0 for n in lengths)
    # cu_seq_lens: int32 segment boundaries over the flattened rows, max_length the longest
    cu = p.cu_seq_lens.tolist()
    assert p.cu_seq_lens.dtype == torch.int32 and cu[0] == 0 and cu[-1] == p.num_positions
    flat_pos = p.position_ids.reshape(-1)
    assert sorted(set(cu[:-1])) == (flat_pos == 0).nonzero().squeeze(1).tolist()
    assert p.max_length == max(b - a for a, b in zip(cu[:-1], cu[1:], strict=True))


def test_first_fit_decreasing():
    ids, mask = torch.ones(4, 6, dtype=torch.long), torch.zeros(4, 6, dtype=torch.long)
    for b, n in enumerate([5, 4, 1, 3]):
        mask[b, :n] = 1
    p = pack(ids, mask, 6)
    # longest first: 5 -> row 0; 4 -> row 1; 3 -> row 2; 1 -> row 0 (fits); a row keeps batch order
    assert p.input_ids.shape == (3, 6)
    assert p.position_ids.tolist()[0] == [0, 1, 2, 3, 4, 0]
    assert p.position_ids.tolist()[1][:4] == [0, 1, 2, 3]


def test_empty_batch_and_one_token_rows():
    ids = torch.tensor([[3, 4], [5, 6]])
    p = pack(ids, torch.zeros_like(ids))
    assert p.num_real_tokens == 0 and unpack(p, p.input_ids, fill=-1).eq(-1).all()
    assert shift_labels(p, ids).eq(IGNORE_INDEX).all()
    p = pack(ids, torch.tensor([[0, 1], [1, 0]]))
    assert p.input_ids.tolist() == [[4, 5]] and p.position_ids.tolist() == [[0, 0]]
    assert shift_labels(p, ids).eq(IGNORE_INDEX).all()  # a one-token sequence predicts nothing
    assert unpack(p, torch.ones(1, 2), fill=0.0, shifted=True).eq(0).all()


def test_bad_input():
    with pytest.raises(ValueError, match="same shape"):
        pack(torch.ones(2, 3), torch.ones(2, 4))
    with pytest.raises(ValueError, match="max_tokens_per_row"):
        pack(torch.ones(2, 3), torch.ones(2, 3), 0)


class _TinyCausal(torch.nn.Module):
    """A causal model whose logits at a position depend on every earlier token of the row and on the position (a
    cumulative sum of embeddings plus a position embedding): crossing a sequence boundary changes them."""

    def __init__(self, vocab=50):
        super().__init__()
        torch.manual_seed(1)
        self.emb, self.pos = torch.nn.Embedding(vocab, 16), torch.nn.Embedding(64, 16)
        self.head = torch.nn.Linear(16, vocab)

    def forward(self, ids, position_ids):
        # attention restricted to the sequence: reset the running sum where the positions restart
        h = self.emb(ids)
        seg = (position_ids == 0).long().cumsum(-1)
        out = torch.zeros_like(h)
        for r in range(ids.size(0)):
            for s in seg[r].unique():
                idx = (seg[r] == s).nonzero().squeeze(1)
                out[r, idx] = h[r, idx].cumsum(0)
        return self.head(torch.tanh(out + self.pos(position_ids)))


def _reference_logps(model, ids, mask):
    """Each sequence forwarded alone: (B, T) log p(token | earlier tokens of its sequence), 0 at pads/first tokens."""
    out = torch.zeros(ids.shape)
    for b in range(ids.size(0)):
        cols = mask[b].bool().nonzero().squeeze(1)
        if cols.numel() < 2:
            continue
        seq = ids[b, cols].unsqueeze(0)
        logits = model(seq, torch.arange(seq.size(1)).unsqueeze(0))
        lp = torch.log_softmax(logits[0, :-1], -1).gather(-1, seq[0, 1:].unsqueeze(-1)).squeeze(-1)
        out[b, cols[1:]] = lp
    return out


@pytest.mark.parametrize("budget", [None, 10])
def test_next_token_logps_match_each_sequence_alone(budget):
    ids, mask = _batch()
    model = _TinyCausal()
    p = pack(ids, mask, budget)
    logps = next_token_logps(p, model(p.input_ids, p.position_ids))
    torch.testing.assert_close(logps, _reference_logps(model, ids, mask), rtol=0, atol=1e-6)
    # the same through shift_labels + unpack(shifted=True), as with TRL's fused head's `shift_labels`
    labels = ids.masked_fill(mask == 0, IGNORE_INDEX)
    sl = shift_labels(p, labels)
    lp = torch.log_softmax(model(p.input_ids, p.position_ids), -1).gather(-1, sl.clamp(min=0).unsqueeze(-1))
    lp = lp.squeeze(-1).masked_fill(sl == IGNORE_INDEX, 0)
    torch.testing.assert_close(unpack(p, lp, shifted=True), logps, rtol=0, atol=1e-6)


def test_mutations_fail():
    """A packing without the position reset, or with labels crossing a sequence boundary, is caught."""
    ids, mask = _batch()
    model = _TinyCausal()
    p = pack(ids, mask)
    ref = _reference_logps(model, ids, mask)
    # no position reset: positions count on over the whole row
    flat_pos = torch.arange(p.input_ids.size(1)).unsqueeze(0)
    assert not torch.allclose(next_token_logps(p, model(p.input_ids, flat_pos)), ref, atol=1e-3)
    # labels rolled across the row (verl#6475): each sequence's first token scored from the previous one's last
    logits = model(p.input_ids, p.position_ids)
    rolled = torch.log_softmax(logits[:, :-1], -1).gather(-1, p.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    rolled = torch.nn.functional.pad(rolled, (1, 0)).reshape(-1)  # position p: log p(token p | position p - 1)
    crossing = torch.zeros(ids.numel()).index_put((p.src[1:],), rolled[p.dst[1:]]).view(ids.shape)
    assert not torch.allclose(crossing, ref, atol=1e-3)
    # and the labels themselves: none crosses a boundary
    sl = shift_labels(p, ids).reshape(-1)
    assert sl[p.dst[p.first][1:] - 1].eq(IGNORE_INDEX).all()  # each sequence's last token predicts nothing


def test_unpack_is_differentiable():
    ids, mask = _batch()
    p = pack(ids, mask, 7)
    v = torch.randn(*p.input_ids.shape, requires_grad=True)
    unpack(p, v, shifted=True).sum().backward()
    g = v.grad.reshape(-1)
    expected = torch.zeros_like(g)
    expected[p.dst[~p.first] - 1] = 1  # every prediction of a real token, nothing else
    assert torch.equal(g, expected)
