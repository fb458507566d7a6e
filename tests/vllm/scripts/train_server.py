"""Train PACS with vLLM in server mode, the weight push stubbed; launched by tests/vllm/test_trainer_vllm.py.

accelerate launch --multi_gpu --num_processes 2 tests/vllm/scripts/train_server.py MODEL_DIR OUT_DIR BASE_URL P GA S STEPS
python tests/vllm/scripts/train_server.py MODEL_DIR OUT_DIR BASE_URL 4 1 1 2

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
from pacs.testing import tiny_pacs_config


def parity_reward(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


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


def train(model_dir, out_dir, base_url, per_device, grad_accum, steps_per_generation, max_steps) -> dict:
    """Train; return what every micro-batch's loss saw (rows, labels, labels recomputed from the completions)."""
    dataset = Dataset.from_dict({"prompt": [f"What is {i} + {2 * i}?" for i in range(64)]})
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
    )
    with stubbed_weight_push():
        trainer = PACSTrainer(model=model_dir, reward_funcs=parity_reward, args=args, train_dataset=dataset)
        seen = []
        compute_loss = trainer._compute_loss

        def spy(model, inputs):
            texts = trainer.processing_class.batch_decode(inputs["completion_ids"], skip_special_tokens=True)
            seen.append(
                {
                    "index": inputs["pacs_index"].tolist(),
                    "labels": inputs["pacs_labels"].tolist(),
                    "recomputed": parity_reward(texts),
                }
            )
            return compute_loss(model, inputs)

        trainer._compute_loss = spy
        trainer.train()
    return {
        "rank": trainer.accelerator.process_index,
        "world_size": trainer.accelerator.num_processes,
        "layout": trainer._pacs_layout,
        "seen": seen,
        "log_history": trainer.state.log_history,
    }


if __name__ == "__main__":
    model_dir, out_dir, base_url, *numbers = sys.argv[1:]
    record = train(model_dir, out_dir, base_url, *map(int, numbers))
    with open(os.path.join(out_dir, f"rank{record['rank']}.json"), "w") as f:
        json.dump(record, f)
