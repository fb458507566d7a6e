"""Throughput and hostile-input timings of the bounded math-verify reward.

    HF_HUB_OFFLINE=1 python -m benchmarks.reward_throughput.reward_throughput                  # 1000 items
    HF_HUB_OFFLINE=1 python -m benchmarks.reward_throughput.reward_throughput --num-workers 4  # another pool size

Verifications per second of `pacs.rewards` (the bounded process-pool verifier, as `math_reward` runs it) against
plain in-process math-verify (`verify(parse(gold), parse(pred))`, the unbounded baseline), on MATH-500 gold answers
with a realistic mix of completions: half boxed and right, a quarter boxed and wrong, a quarter without a box.
Also times each hostile input of the tests, from the main thread and from a worker thread.
"""

import argparse
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor

from tests.hostile_completions import HOSTILE_COMPLETIONS


os.environ.setdefault("HF_HUB_OFFLINE", "1")


def make_items(num_items: int):
    from pacs.data import load_benchmark

    golds = load_benchmark("math500")["solution"]
    items = []
    for i in range(num_items):
        gold = golds[i % len(golds)]
        body = "Let me think step by step. We compute a few things first: $x^2 + 1 = 5$, so $x = 2$. " * 4
        if i % 4 in (0, 1):
            completion = body + f"Therefore the final answer is $\\boxed{{{gold}}}$."
        elif i % 4 == 2:
            completion = body + "Therefore the final answer is $\\boxed{17}$."
        else:
            completion = body + f"So the answer is {gold}."
        items.append((completion, gold))
    return items


def plain_math_verify(items):
    from math_verify import LatexExtractionConfig, parse, verify

    return [float(verify(parse("\\boxed{" + g + "}", [LatexExtractionConfig()]), parse(c))) for c, g in items]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-items", type=int, default=1000)
    parser.add_argument("--num-workers", type=int, default=None, help="default: the library's default")
    args = parser.parse_args(argv)
    results = {}
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)

    from pacs import rewards, verifier_pool

    items = make_items(args.num_items)
    completions, golds = [c for c, _ in items], [g for _, g in items]
    num_workers = args.num_workers or verifier_pool._default_num_workers()
    print(f"{len(items)} items, {os.cpu_count()} CPUs, {num_workers} verifier workers")

    start = time.perf_counter()
    plain = plain_math_verify(items)
    t_plain = time.perf_counter() - start
    print(f"plain in-process math-verify (main thread): {len(items) / t_plain:7.1f} verifications/s")

    start = time.perf_counter()
    rewards.score_completions(completions[:2], golds[:2], num_workers=num_workers)  # start the pool
    t_start = time.perf_counter() - start
    start = time.perf_counter()
    pooled = [r for r, _ in rewards.score_completions(completions, golds, num_workers=num_workers)]
    t_pool = time.perf_counter() - start
    print(f"pacs bounded verifier ({num_workers} processes):      {len(items) / t_pool:7.1f} verifications/s")
    results.update(plain_per_s=len(items) / t_plain, pool_per_s=len(items) / t_pool, pool_startup_s=t_start)
    print(f"  (pool start-up, once per process: {t_start:.2f} s)")
    start = time.perf_counter()
    in_proc = [r for r, _ in rewards.score_completions(completions, golds, num_workers=0)]
    t_in = time.perf_counter() - start
    print(f"pacs rules in-process (num_workers=0):       {len(items) / t_in:7.1f} verifications/s")
    agree = sum(a == b for a, b in zip(plain, pooled)) / len(items)
    print(
        f"accuracy plain / pooled: {sum(plain) / len(items):.3f} / {sum(pooled) / len(items):.3f} "
        f"(agreement {agree:.3f}); pooled == in-process: {pooled == in_proc}"
    )

    print("hostile inputs (seconds; main thread / worker thread; result):")
    for name, text in HOSTILE_COMPLETIONS.items():
        start = time.perf_counter()
        r1 = rewards.math_reward([text], ["3"])
        t1 = time.perf_counter() - start
        with ThreadPoolExecutor(2) as pool:
            start = time.perf_counter()
            r2 = pool.submit(rewards.math_reward, [text], ["3"]).result()
            t2 = time.perf_counter() - start
        results[f"hostile/{name}"] = (t1, t2)
        print(f"  {name:16s} {len(text):7d} chars  {t1:5.2f} / {t2:5.2f}  {r1} {r2}")
    pool = verifier_pool._VerifierPool(1, timeout=3.0, mv_timeout=60)
    start = time.perf_counter()
    r = pool.map([("9^{9^{9^{9}}}", "", "3")])
    print(f"  hard kill (in-worker alarm off, 3 s deadline): {time.perf_counter() - start:.2f} s {r} {pool.stats}")
    pool.shutdown()
    return results


if __name__ == "__main__":
    main()
