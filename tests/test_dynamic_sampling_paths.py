"""Dynamic sampling (`pacs.grpo.dynamic_sampling`) on the paths beside plain generation: tools and environments,
`num_iterations > 1`, and DeepSpeed ZeRO-3 on two processes. vLLM colocate and server mode and the LoRA push with it
on: tests/vllm_tier/test_dynamic_sampling_vllm.py.

- Tools and environments: TRL builds each call's tool dicts and draws its environment instances from its pool per
  generation call, so every round gets its own and scores its own rollouts; the assembled batch keeps `tool_mask`.
  An environment that owns the data (rows without a prompt: `reset()` makes it) draws its top-ups like any row.
- `num_iterations > 1`: the assembled batch is trained on `num_iterations` times, and a resume inside it is exact.
- ZeRO-3 on two processes: filtering, assembly and exact resume (inside a generation batch and between two).
"""

import json
import socket
from pathlib import Path
from unittest.mock import patch

import pytest
import torch
from datasets import Dataset

from pacs.grpo import HardenedGRPOConfig
from pacs.grpo.dynamic_sampling import uniform_signal
from tests.launching import ZERO3_CPU_ACCELERATE_CONFIG, accelerate_launch, run_launched
from tests.recording import RecordingGRPO as Recording  # the batch as assembled
from tests.scripts.train_resume import resume_runs
from tests.tool_calls import called_a_tool, multiply, scripted_generate


RESUME_SCRIPT = Path(__file__).parent / "scripts" / "train_resume.py"
TOLERANCE = 1e-6  # relative to the update the uninterrupted run made, as tests/test_checkpoints.py


def _free_port() -> int:
    with socket.socket() as s:  # another job on the machine may hold accelerate's default port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def grpo_config(output_dir, **overrides) -> HardenedGRPOConfig:
    base = dict(
        output_dir=str(output_dir), use_cpu=True, bf16=False, per_device_train_batch_size=4, num_generations=2,
        max_completion_length=64, max_steps=3, learning_rate=1e-2, logging_steps=1, save_strategy="no",
        report_to="none", seed=0, dynamic_sampling=True, steps_per_generation=1,
    )  # fmt: skip
    return HardenedGRPOConfig(**{**base, **overrides})


def _ds_logs(trainer) -> list[dict]:
    return [
        {k: v for k, v in e.items() if k.startswith("pacs/ds/")}
        for e in trainer.state.log_history
        if "pacs/ds/rounds" in e
    ]


# ---------------------------------------------------------------------------------------------------------------------
# Tools and environments
# ---------------------------------------------------------------------------------------------------------------------


def _tool_call(name, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


class Level:
    """Owns the data (its rows carry only `level`) and the reward: 1.0 once its tool was called."""

    resets = 0

    def reset(self, level, **kwargs):
        Level.resets += 1
        self.calls = 0
        return f"Level {level}."

    def act(self, x: int) -> int:
        """
        Act.

        Args:
            x: A value.

        Returns:
            The value.
        """
        self.calls += 1
        return x

    def get_reward(self) -> float:
        return float(self.calls > 0)


def _reply(easy: str, tool: str):
    """The even row of each group of 2 calls the tool on an easy prompt: mixed; hard prompts never: uniform."""

    def reply(prompt, i):
        if "<tool_response>" in prompt:
            return "It is 12."
        return (
            _tool_call(tool, **({"x": 1} if tool == "act" else {"a": 3, "b": 4}))
            if easy in prompt and i % 2 == 0
            else "No."
        )

    return reply


CASES = {
    "tools": dict(
        reply=_reply("(easy)", "multiply"),
        kwargs=lambda: dict(
            reward_funcs=called_a_tool,
            tools=[multiply],
            train_dataset=Dataset.from_dict(
                {
                    "prompt": [
                        [{"role": "user", "content": f"{i} times 4 ({'easy' if i % 3 == 0 else 'hard'})?"}]
                        for i in range(24)
                    ]
                }
            ),
        ),  # fmt: skip
    ),
    "environment": dict(
        reply=_reply("Level easy.", "act"),
        kwargs=lambda: dict(
            environment_factory=Level,
            train_dataset=Dataset.from_dict({"level": ["easy" if i % 3 == 0 else f"hard {i}" for i in range(24)]}),
        ),
    ),
}


def _called(tokenizer, batch) -> torch.Tensor:
    texts = tokenizer.batch_decode(batch["completion_ids"])
    return torch.tensor([float("<tool_call>" in t) for t in texts])


@pytest.mark.filterwarnings("ignore:You are using 'environment_factory'")
@pytest.mark.parametrize("case", list(CASES))
def test_tools_and_environments_top_up_per_round_and_train_on_mixed_groups(tool_model_dir, tmp_path, case):
    Level.resets = 0
    trainer = Recording(model=tool_model_dir, args=grpo_config(tmp_path), **CASES[case]["kwargs"]())
    tokenizer = trainer.processing_class
    with patch.object(trainer.model, "generate", side_effect=scripted_generate(tokenizer, CASES[case]["reply"])):
        trainer.train()
    logs = _ds_logs(trainer)
    assert len(trainer.batches) == len(logs) == 3
    assert any(e["pacs/ds/rounds"] > 1 for e in logs), logs  # two in three prompts are hard: top-ups were needed
    for batch, entry in zip(trainer.batches, logs, strict=True):
        assert "tool_mask" in batch and batch["tool_mask"].shape == batch["completion_mask"].shape
        called = _called(tokenizer, batch)
        uniform = int(uniform_signal(called, torch.ones_like(called, dtype=torch.bool), 2).sum())
        assert uniform == entry["pacs/ds/fallback_groups"] == 0, (case, called.tolist())
    if case == "environment":  # every round drew its own rollouts' environments and reset them
        assert Level.resets == sum(e["pacs/ds/rounds"] for e in logs) * 4  # 4 rows per round
    assert all(torch.isfinite(torch.tensor(e["loss"])) for e in trainer.state.log_history if "loss" in e)


# ---------------------------------------------------------------------------------------------------------------------
# num_iterations > 1
# ---------------------------------------------------------------------------------------------------------------------


def test_num_iterations_trains_the_assembled_batch_again_and_resumes_exactly(tiny_model_dir, tmp_path):
    # one group of 4 per micro-batch, 2 micro-batches per generation, each generation trained on twice: a generation
    # every 4 optimizer steps; checkpoints 1 and 2 fall inside one (2: between its two iterations), 4 between two
    record = resume_runs(
        tiny_model_dir, str(tmp_path), (4, 1, 2, 2, 6), [1, 2, 4], dynamic_sampling=True, max_completion_length=6
    )
    assert record["generated_at"] == [0, 4] and max(record["ds_rounds"]) > 1
    for k, run in record["resumed"].items():
        assert run["rollout_saved"] == (k % 4 != 0), k
        assert run["relative_difference"] <= TOLERANCE, (k, run["relative_difference"])
        assert run["generated_at"] == [s for s in record["generated_at"] if s >= k], k


# ---------------------------------------------------------------------------------------------------------------------
# DeepSpeed ZeRO-3, two processes
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.distributed
def test_resume_with_dynamic_sampling_under_zero3_on_two_processes_is_exact(tiny_model_dir, tmp_path):
    # 2 processes x 2 rows, G 4: each group spans both processes, 2 optimizer steps per generation; the rounds are
    # gathered and re-sliced over the processes while ZeRO-3 shards every parameter; checkpoint 1 falls inside a
    # generation batch, 2 between two
    (tmp_path / "zero3_cpu.yaml").write_text(
        ZERO3_CPU_ACCELERATE_CONFIG.replace("num_processes: 1", "num_processes: 2")
    )
    out = tmp_path / "out"
    out.mkdir()
    launcher = [*accelerate_launch(), "--config_file", str(tmp_path / "zero3_cpu.yaml")]
    cmd = [*launcher, "--main_process_port", str(_free_port()), str(RESUME_SCRIPT), tiny_model_dir, str(out)]
    run_launched([*cmd, "2", "2", "4", "1", "4", "1", "2", "--dynamic-sampling"], tmp_path)
    records = [json.loads(p.read_text()) for p in sorted(out.glob("resume*.json"))]
    assert [r["rank"] for r in records] == [0, 1] and all(r["zero_stage"] == 3 for r in records)
    for record in records:
        assert max(record["ds_rounds"]) > 1  # top-ups happened
        assert record["update_norm"] > 0
        for k, run in record["resumed"].items():
            assert run["rollout_saved"] == (int(k) % 2 == 1), k
            assert run["relative_difference"] <= TOLERANCE, (k, run["relative_difference"])
            assert run["generated_at"] == [s for s in record["generated_at"] if s >= int(k)], k
