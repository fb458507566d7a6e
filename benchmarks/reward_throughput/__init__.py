"""benchmarks/reward_throughput/: see benchmarks/README.md."""
