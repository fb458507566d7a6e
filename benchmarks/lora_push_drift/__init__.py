"""benchmarks/lora_push_drift/: see benchmarks/README.md."""
