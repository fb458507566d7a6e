"""Train PACS on the tiny model with groups split over micro-batches (and processes); launched by
tests/test_split.py.

PYTHONPATH=. accelerate launch --multi_gpu --num_processes 2 --cpu tests/scripts/train_split.py MODEL_DIR OUT_DIR P GA S ITERATIONS
PYTHONPATH=. python tests/scripts/train_split.py MODEL_DIR OUT_DIR 12 1 1 2          # the same run in one process, whole groups
PYTHONPATH=. accelerate launch --config_file ZERO3_CPU.yaml tests/scripts/train_split.py MODEL_DIR OUT_DIR 1 4 8 1
Flags: --lora (a LoRA adapter), --no-shuffle (keep the generation order of groups).

Completions are a fixed function of (prompt, position in its group), not sampled, so that one process and two see
identical completions and labels: group g of each generation batch is mixed (two odd, two even lengths) when g % 3 == 0 and uniform otherwise (so
with 12 rows over 2 processes, rank 1 holds only rows of uniform groups).
"""

import sys

import torch
from datasets import Dataset

from pacs import PACSTrainer
from tests.scripts.train_tiny import train_and_record
from tests.tiny_config import tiny_pacs_config


def parity_reward(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


class FixedCompletions(PACSTrainer):
    truncate_every = 0  # > 0: every n-th row gets no EOS (truncated; emptied by mask_truncated_completions)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations):
        n = len(prompt_ids)
        start = self.accelerator.process_index * n  # row number in the generation batch over all processes
        tokenizer = self.processing_class
        letters = [tokenizer.convert_tokens_to_ids(c) for c in "abcdefgh"]
        completion_ids = []
        for j, ids in enumerate(prompt_ids):
            row = start + j
            gen = torch.Generator().manual_seed(sum(ids) * 1000 + row % num_generations)
            mixed = (row // num_generations) % 3 == 0  # lengths of both parities in a mixed group, all even otherwise
            length = 1 + row % 2 + 2 * int(torch.randint(0, 3, (1,), generator=gen)) if mixed else 4
            tokens = [letters[int(k)] for k in torch.randint(0, len(letters), (length,), generator=gen)]
            truncated = self.truncate_every and row % self.truncate_every == self.truncate_every // 2
            completion_ids.append(tokens if truncated else tokens + [tokenizer.eos_token_id])
        return completion_ids, None


def main(model_dir, out_dir, per_device, grad_accum, steps_per_generation, iterations, lora=False) -> None:
    dataset = Dataset.from_dict({"prompt": [f"What is {i} + {2 * i}?" for i in range(64)]})
    args = tiny_pacs_config(
        out_dir,
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=grad_accum,
        steps_per_generation=steps_per_generation,
        num_iterations=iterations,
        max_steps=2,
        optim="sgd",
        learning_rate=0.2,
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        seed=1,
    )
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = FixedCompletions(
        model=model_dir, reward_funcs=parity_reward, args=args, train_dataset=dataset, peft_config=peft_config
    )
    train_and_record(trainer, out_dir)


if __name__ == "__main__":
    model_dir, out_dir, *numbers = sys.argv[1:]
    if "--no-shuffle" in numbers:  # groups in generation order, as the row exchange of the split path keeps them
        import pacs._compat

        pacs._compat.shuffle_groups = lambda seq_dict, group_size: seq_dict
    lora = "--lora" in numbers
    main(model_dir, out_dir, *[int(x) for x in numbers if not x.startswith("--")], lora=lora)
