"""Train a Qwen model with PACS (arXiv:2509.02522), or the GRPO baseline: the design card's launch command, a thin
shim over `pacs.train.main` (the same arguments as `pacs train`; see that module for every option).

This script trains in its own process, like `python -m pacs.train`; `accelerate launch` starts one per GPU. The
`pacs train` command does that launch itself from the recipe's `accelerate_config` (`pacs train --config
qwen3_4b_pacs`). Recipes are the shipped ones by name (`pacs recipes` lists them) or YAML files by path.

Check a launch before spending a GPU (the same checks run here at start, before any model loads; docs/recipes.md):

    pacs plan --config qwen3_4b_pacs

CPU smoke run, offline, in seconds, against a local model directory (the tiny model the tests build):

    python -c "from pacs.testing import build_tiny_model; build_tiny_model('/tmp/tiny-qwen3')"
    HF_HUB_OFFLINE=1 python examples/train_qwen.py --config tiny_cpu --model_name_or_path /tmp/tiny-qwen3

One node, 8 GPUs, DeepSpeed ZeRO-3, vLLM colocated (the paper's setting; see the recipe for the batch arithmetic):

    accelerate launch --config_file src/pacs/accelerate_configs/zero3.yaml \
        examples/train_qwen.py --config qwen3_4b_pacs

The GRPO baseline on the same data and batch arithmetic:

    accelerate launch --config_file src/pacs/accelerate_configs/zero3.yaml \
        examples/train_qwen.py --config qwen3_4b_grpo

Two nodes x 8 GPUs (run the same command on every node, with that node's rank; the 8B recipe assumes 16 processes):

    accelerate launch --config_file src/pacs/accelerate_configs/zero3_multinode.yaml \
        --machine_rank $NODE_RANK --main_process_ip $MASTER_ADDR \
        examples/train_qwen.py --config qwen3_8b_pacs

LoRA (the base model stays frozen in bf16, so ZeRO-2 is enough):

    accelerate launch --config_file src/pacs/accelerate_configs/zero2.yaml \
        examples/train_qwen.py --config qwen3_8b_pacs_lora

vLLM in server mode on its own GPUs (here GPUs 4-7 generate, GPUs 0-3 train; rescale the batch as the recipe says;
tensor parallelism, since TRL's vllm-serve keeps data_parallel_size at 1 for dense models):

    CUDA_VISIBLE_DEVICES=4,5,6,7 trl vllm-serve --model Qwen/Qwen3-4B --tensor_parallel_size 4 --max_model_len 9216 &
    CUDA_VISIBLE_DEVICES=0,1,2,3 accelerate launch --config_file src/pacs/accelerate_configs/zero3.yaml \
        --num_processes 4 examples/train_qwen.py --config qwen3_4b_pacs \
        --vllm_mode server --gradient_accumulation_steps 64 --steps_per_generation 256 --expected_world_size 4

Resume from the newest complete checkpoint in `output_dir` with `--resume_from_checkpoint true` (a checkpoint whose save
was cut short by a crash is skipped, with a warning naming it), or give a checkpoint folder. PACS resumes exactly, in
the middle of a generation batch too (docs/recipes.md, "Resuming after a crash").
"""

import logging
import sys

from pacs.options import run_command
from pacs.train import main, parse_args


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(run_command("examples/train_qwen.py", lambda: main(*parse_args(prog="examples/train_qwen.py"))))
