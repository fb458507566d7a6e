"""benchmarks/step_cost/: see benchmarks/README.md."""
