"""`pacs.grpo.rows.move_rows`, the one primitive that moves a batch's rows between processes (dynamic sampling's
assembly, the split path's row exchange): its padding rules, and on two real processes (gloo) that each receives its
own rows only, not the whole batch, with the same result as through an all-gather."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pacs.grpo.rows import move_rows, pad_value
from tests.simulated_processes import two_processes


N, PAD = 4, -1
PERMUTATION = [0, 4, 1, 5, 2, 6, 3, 7]  # new position t holds global row PERMUTATION[t] (the split path's exchange)


def _rows(p: int) -> dict[str, torch.Tensor]:
    # process p holds global rows p*N .. p*N+N-1; its widths differ from the other process's
    label = torch.arange(p * N, (p + 1) * N)
    return {
        "label": label,  # (N,)
        "prompt_ids": label[:, None].repeat(1, 2 + 2 * p),  # (N, 2 or 4), padded on the left
        "completion_ids": label[:, None].repeat(1, 5 - 2 * p),  # (N, 5 or 3), padded on the right
        "tool_mask": torch.zeros(N, 5 - 2 * p, dtype=torch.long),  # padded with 1
        "flag": label % 2 == 0,  # bool
    }


def _targets(p: int) -> torch.Tensor:
    target = torch.empty(2 * N, dtype=torch.long)
    target[torch.tensor(PERMUTATION)] = torch.arange(2 * N)
    return target[p * N : (p + 1) * N]


def _check(p: int, out: dict) -> None:
    mine = PERMUTATION[p * N : (p + 1) * N]
    assert out["label"].tolist() == mine
    assert out["prompt_ids"].shape == (N, 4) and out["completion_ids"].shape == (N, 5)
    for row, g in enumerate(mine):
        width = 2 if g < N else 4  # the prompt width of the process it came from
        assert out["prompt_ids"][row].tolist() == [PAD] * (4 - width) + [g] * width
        width = 5 if g < N else 3
        assert out["completion_ids"][row].tolist() == [g] * width + [PAD] * (5 - width)
        assert out["tool_mask"][row].tolist() == [0] * width + [1] * (5 - width)
    assert out["flag"].dtype == torch.bool and out["flag"].tolist() == [g % 2 == 0 for g in mine]


def test_padding_rules():
    assert [pad_value(k, 9) for k in ("prompt_ids", "completion_ids", "prompt_mask", "tool_mask")] == [9, 9, 0, 1]


def test_through_a_gather_every_process_gets_its_rows():
    results = two_processes(
        lambda p, gather: move_rows([_rows(p)], _targets(p), N, p, gather, lambda key: pad_value(key, PAD))
    )
    for p in (0, 1):
        _check(p, results[p])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(p: int, port: int, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=p, world_size=2)
    received, gathered = [], []
    scatter = dist.scatter

    def counting_scatter(tensor, scatter_list=None, src=0, **kwargs):
        if src != p:
            received.append(tensor.size(0))  # rows this process receives from another
        return scatter(tensor, scatter_list, src=src, **kwargs)

    def gather(tensor):
        gathered.append(tensor.numel())
        out = [torch.empty_like(tensor) for _ in range(2)]
        dist.all_gather(out, tensor)
        return torch.cat(out)

    dist.scatter = counting_scatter
    try:
        out = move_rows([_rows(p)], _targets(p), N, p, gather, lambda key: pad_value(key, PAD))
    finally:
        dist.scatter = scatter
    torch.save({"out": out, "received": received, "gathered": gathered}, os.path.join(folder, f"{p}.pt"))
    dist.destroy_process_group()


@pytest.mark.distributed
def test_on_two_processes_each_receives_its_own_rows_only(tmp_path):
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    for p in (0, 1):
        record = torch.load(tmp_path / f"{p}.pt")
        _check(p, record["out"])
        # 2 of its 4 rows come from the other process: 2 rows per tensor (the rows plus their positions), never the
        # other process's 4; the all-gathers carry only the counts and widths (a few numbers), no row
        assert record["received"] == [2] * 6, record["received"]
        assert max(record["gathered"]) <= 5, record["gathered"]
