"""Train PACS with vLLM in server mode, the weight push stubbed; launched by tests/vllm_tier/test_trainer_vllm.py.

PYTHONPATH=. accelerate launch --multi_gpu --num_processes 2 tests/vllm_tier/scripts/train_server.py MODEL_DIR OUT_DIR BASE_URL P GA S STEPS
PYTHONPATH=. python tests/vllm_tier/scripts/train_server.py MODEL_DIR OUT_DIR BASE_URL 4 1 1 2
PYTHONPATH=. accelerate launch --multi_gpu --num_processes 2 tests/vllm_tier/scripts/train_server.py MODEL_DIR OUT_DIR BASE_URL 4 1 2 4 \
    --dynamic-sampling

With `--dynamic-sampling`: `dynamic_sampling=True` on prompts of which only every third can be solved (`hard_reward`),
so that generation batches need top-up rounds; the record then has the weight pushes (the stubbed push still runs
TRL's `sync_weights`) and, on the main process, the prompts of every request sent to the server.

TRL 1.16 pushes weights to a vLLM server only over NCCL (CUDA): here `VLLMClient.init_communicator` and
`update_named_params` do nothing, so the server keeps sampling from the initial weights. Generation, labels, the
importance-sampling correction and the group layouts run as on a GPU; the weights the server samples from do not
follow training.
"""

import contextlib
import json
import os
import sys

from datasets import Dataset

from pacs import PACSTrainer
from tests.tiny_config import tiny_pacs_config


def parity_reward(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


def hard_reward(prompts, completions, **kwargs):
    """Only prompts marked "mixed" can be solved (by odd-length completions): the others make uniform groups."""
    return [float("mixed" in p and len(c) % 2 == 1) for p, c in zip(prompts, completions, strict=True)]


@contextlib.contextmanager
def stubbed_weight_push():
    """TRL's server-mode weight push (NCCL) replaced by nothing."""
    from trl.generation.vllm_client import VLLMClient

    saved = VLLMClient.init_communicator, VLLMClient.update_named_params
    VLLMClient.init_communicator = lambda self, device=0: None
    VLLMClient.update_named_params = lambda self, *args, **kwargs: None
    try:
        yield
    finally:
        VLLMClient.init_communicator, VLLMClient.update_named_params = saved


def train(
    model_dir, out_dir, base_url, per_device, grad_accum, steps_per_generation, max_steps, dynamic_sampling=False
) -> dict:
    """Train; return what every micro-batch's loss saw (rows, labels, labels recomputed from the completions)."""
    dataset = Dataset.from_dict({"prompt": [f"What is {i} + {2 * i}?" for i in range(64)]})
    reward = parity_reward
    if dynamic_sampling:
        dataset = Dataset.from_dict({"prompt": [f"Q{i} {'mixed' if i % 3 == 0 else 'hard'}?" for i in range(64)]})
        reward = hard_reward
    args = tiny_pacs_config(
        out_dir,
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=base_url,
        vllm_server_timeout=60,
        max_completion_length=16,
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=grad_accum,
        steps_per_generation=steps_per_generation,
        max_steps=max_steps,
        dynamic_sampling=dynamic_sampling,
    )
    with stubbed_weight_push():
        trainer = PACSTrainer(model=model_dir, reward_funcs=reward, args=args, train_dataset=dataset)
        seen, pushes, requests = [], [], []
        compute_loss = trainer._compute_loss
        decode = trainer.processing_class.batch_decode

        def spy(model, inputs):
            texts = decode(inputs["completion_ids"], skip_special_tokens=True)
            prompts = decode(inputs["prompt_ids"], skip_special_tokens=True)
            seen.append(
                {
                    "index": inputs["pacs_index"].tolist(),
                    "labels": inputs["pacs_labels"].tolist(),
                    "recomputed": reward(prompts=prompts, completions=texts),
                    "prompts": prompts,
                }
            )
            return compute_loss(model, inputs)

        trainer._compute_loss = spy
        generation = trainer.vllm_generation
        sync_weights = generation.sync_weights

        def counting_sync():
            pushes.append(trainer.state.global_step)
            sync_weights()

        generation.sync_weights = counting_sync
        client = getattr(generation, "vllm_client", None)
        if client is not None:  # the main process: what each request asks the server for
            generate = client.generate

            def recording_generate(prompts, *args, **kwargs):
                requests.append({"step": trainer.state.global_step, "prompts": decode(prompts), "n": kwargs.get("n")})
                return generate(prompts, *args, **kwargs)

            client.generate = recording_generate
        trainer.train()
    return {
        "rank": trainer.accelerator.process_index,
        "world_size": trainer.accelerator.num_processes,
        "layout": trainer._pacs_layout,
        "seen": seen,
        "pushes": pushes,
        "requests": requests,
        "log_history": trainer.state.log_history,
    }


if __name__ == "__main__":
    model_dir, out_dir, base_url, *rest = sys.argv[1:]
    numbers = [int(x) for x in rest if not x.startswith("--")]
    record = train(model_dir, out_dir, base_url, *numbers, dynamic_sampling="--dynamic-sampling" in rest)
    with open(os.path.join(out_dir, f"rank{record['rank']}.json"), "w") as f:
        json.dump(record, f)
