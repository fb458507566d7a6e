"""Two processes simulated on two threads: `two_processes(fn)` runs `fn(process_index, gather)` where `gather`
all-gathers a tensor as `accelerator.gather` would on two processes (concatenated in process order). For the pure
row-moving pieces (tests/test_dynamic_sampling.py, tests/test_rows.py); the real two-process tests launch gloo."""

import threading

import torch


def two_processes(fn) -> dict:
    """`{process_index: fn(process_index, gather)}` for process indices 0 and 1."""
    barrier, slots, results = threading.Barrier(2), {}, {}

    def worker(p):
        calls = 0

        def gather(tensor):
            nonlocal calls
            slots[(calls, p)] = tensor
            barrier.wait()
            out = torch.cat([slots[(calls, 0)], slots[(calls, 1)]])
            barrier.wait()
            calls += 1
            return out

        results[p] = fn(p, gather)

    threads = [threading.Thread(target=worker, args=(p,)) for p in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results
