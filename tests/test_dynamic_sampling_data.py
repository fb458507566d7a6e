"""Dynamic sampling trains on the right data (issue 53), with scripted generations on the tiny model:

- one rule for "uniform": for PACS over the rows its loss counts (a truncated completion masked out by
  `mask_truncated_completions` is not one), for GRPO as TRL computes advantages (the truncated row is in its baseline);
- top-ups see what round 1 sees: the columns the Trainer's dataloader keeps (`remove_unused_columns`), the dataset's
  order with `shuffle_dataset=False`, and a stream whose seed rides with its position;
- settings it cannot serve (image data, an `environment_factory` without a training set) refused before the model
  loads;
- `num_tokens`, the completions table and the old / reference log-probs are those of the batch that trains (one no-grad
  forward of each trained row per kind, none of a dropped row);
- each round is pruned, as it finishes, to the groups that can still be picked;
- beside it, TRL #6789: truncated sampling with vLLM's importance-sampling correction warns.
"""

from unittest.mock import patch

import pytest
import torch
from datasets import Dataset
from trl import GRPOTrainer

from pacs import PACSTrainer
from pacs.grpo import HardenedGRPOConfig, HardenedGRPOTrainer
from pacs.grpo.dynamic_sampling import DynamicSampling, Round, TopUpStream, candidate_groups
from tests.recording import RecordingGRPO
from tests.tiny_config import tiny_pacs_config


GRPO_KEYS = (
    "output_dir", "use_cpu", "bf16", "per_device_train_batch_size", "num_generations", "max_completion_length",
    "max_steps", "learning_rate", "logging_steps", "save_strategy", "report_to", "seed",
)  # fmt: skip


def grpo_config(output_dir, **overrides) -> HardenedGRPOConfig:
    base = {k: getattr(tiny_pacs_config(output_dir), k) for k in GRPO_KEYS}
    return HardenedGRPOConfig(**{**base, "steps_per_generation": 1, **overrides})


def said_yes(completions, **kwargs):
    return [float(c.strip().startswith("Yes")) for c in completions]


def scripted_generate(tokenizer, reply, max_completion_length):
    """A stand-in for `model.generate`: row i gets `reply(prompt text, i)`; `None` is a completion that runs to
    `max_completion_length` without an end (truncated), anything else ends with eos."""

    def generate(input_ids, **kwargs):
        prompts = tokenizer.batch_decode(input_ids)
        rows = []
        for i, text in enumerate(prompts):
            answer = reply(text, i)
            if answer is None:
                ids = tokenizer.encode(" ".join(["No"] * 4 * max_completion_length), add_special_tokens=False)
                rows.append(ids[:max_completion_length])
            else:
                rows.append(tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id])
        width = max(map(len, rows))
        rows = [row + [tokenizer.pad_token_id] * (width - len(row)) for row in rows]
        return torch.cat([input_ids, torch.tensor(rows, device=input_ids.device)], dim=1)

    return generate


def _train(trainer, reply):
    tokenizer = trainer.processing_class
    generate = scripted_generate(tokenizer, reply, trainer.args.max_completion_length)
    with patch.object(trainer.model, "generate", side_effect=generate):
        trainer.train()
    return trainer


def _ds_logs(trainer) -> list[dict]:
    return [e for e in trainer.state.log_history if "pacs/ds/rounds" in e]


# ---------------------------------------------------------------------------------------------------------------------
# 1. One rule for "uniform"
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm, fallback", [("pacs", 1), ("grpo", 0)])
def test_a_group_uniform_over_the_rows_the_loss_counts_is_uniform(tiny_model_dir, tmp_path, algorithm, fallback):
    # every group is [truncated, Yes, Yes, Yes]: with mask_truncated_completions PACS's loss counts [1, 1, 1] (uniform);
    # GRPO's advantages keep the truncated row in the baseline, so the group trains (mixed)
    settings = dict(dynamic_sampling=True, dynamic_sampling_max_rounds=1, mask_truncated_completions=True, max_steps=2)
    if algorithm == "pacs":
        args = tiny_pacs_config(tmp_path, steps_per_generation=1, **settings)
        trainer = PACSTrainer(model=tiny_model_dir, reward_funcs=said_yes, args=args, train_dataset=_prompts(8))
    else:
        args = grpo_config(tmp_path, **settings)
        trainer = HardenedGRPOTrainer(
            model=tiny_model_dir, reward_funcs=said_yes, args=args, train_dataset=_prompts(8)
        )
    _train(trainer, lambda prompt, i: None if i % 4 == 0 else "Yes.")
    logs = _ds_logs(trainer)
    assert len(logs) == 2 and all(e["pacs/ds/fallback_groups"] == fallback for e in logs), logs


# ---------------------------------------------------------------------------------------------------------------------
# 2. Top-ups see what round 1 sees
# ---------------------------------------------------------------------------------------------------------------------


def _prompts(n, mixed=(0,), **columns) -> Dataset:
    data = {"prompt": [f"Q{i} {'mixed' if i in mixed else 'hard'}?" for i in range(n)], **columns}
    return Dataset.from_dict(data)


def _mixed_reply(prompt, i):
    # the "mixed" prompts' groups differ (Yes / No by row), every other prompt's group is all No
    return "Yes." if "mixed" in prompt and i % 2 == 0 else "No."


def test_top_ups_see_the_columns_round_one_sees(tiny_model_dir, tmp_path):
    calls = []

    def reward(completions, **kwargs):
        calls.append(sorted(k for k in kwargs if k in ("answer", "prompt")))
        return said_yes(completions)

    data = _prompts(16, answer=[str(i) for i in range(16)])
    args = grpo_config(tmp_path, dynamic_sampling=True, remove_unused_columns=True, max_steps=1)
    trainer = HardenedGRPOTrainer(model=tiny_model_dir, reward_funcs=reward, args=args, train_dataset=data)
    _train(trainer, _mixed_reply)
    assert _ds_logs(trainer)[0]["pacs/ds/rounds"] > 1  # top-ups ran
    assert len(calls) > 1 and all(c == calls[0] for c in calls), calls  # no 'answer' in any round, as in round 1


def test_without_shuffle_top_ups_come_in_the_dataset_order_and_the_table_shows_the_trained_rows(
    tiny_model_dir, tmp_path
):
    # round 1 is Q0 (mixed), Q1 (hard); with shuffle_dataset=False the top-ups draw Q2, Q3 (hard), Q4, Q5 (Q4 mixed)
    # in dataset order; the batch is Q0 and Q4, and the completions table (TRL keeps the last round's) shows them
    args = grpo_config(
        tmp_path, dynamic_sampling=True, shuffle_dataset=False, max_steps=1, per_device_train_batch_size=8
    )
    trainer = HardenedGRPOTrainer(
        model=tiny_model_dir, reward_funcs=said_yes, args=args, train_dataset=_prompts(12, mixed=(0, 4))
    )
    _train(trainer, _mixed_reply)
    assert _ds_logs(trainer)[0]["pacs/ds/rounds"] == 3
    table = [p.split()[0] for p in trainer._logs["prompt"]]
    assert table == ["Q0"] * 4 + ["Q4"] * 4
    assert list(trainer._logs["rewards"]["said_yes"]) == [1.0, 0.0] * 4


def test_the_stream_draws_in_dataset_order_without_shuffle_and_its_seed_rides_with_its_position():
    stream = TopUpStream(seed=5, shuffle=False)
    assert stream.draw(10, 3, lambda i: i, {1}) == [0, 2, 3]
    assert stream.draw(10, 2, lambda i: i, set()) == [4, 5]  # from where it stands
    state = stream.state_dict()
    assert (state["seed"], state["shuffle"]) == (5, False)
    again = TopUpStream(seed=5, shuffle=False)
    again.load_state_dict(state)
    assert again.draw(10, 1, lambda i: i, set()) == [6]
    for other in (TopUpStream(seed=6, shuffle=False), TopUpStream(seed=5)):
        with pytest.raises(ValueError, match="seed=5, shuffle_dataset=False"):
            other.load_state_dict(state)


# ---------------------------------------------------------------------------------------------------------------------
# 3. Refused before the model loads
# ---------------------------------------------------------------------------------------------------------------------


class Env:
    def reset(self, **kwargs):
        return "Go."


def test_image_data_and_an_environment_without_data_are_refused_before_the_model_loads(
    tiny_model_dir, tmp_path, monkeypatch
):
    def load(*args, **kwargs):
        raise AssertionError("GRPOTrainer.__init__ ran: the model loads before the checks")

    monkeypatch.setattr(GRPOTrainer, "__init__", load)
    args = grpo_config(tmp_path, dynamic_sampling=True)
    images = Dataset.from_dict({"prompt": [[{"role": "user", "content": "What is it?"}]], "image": [None]})
    with pytest.raises(ValueError, match="column 'image'") as error:
        HardenedGRPOTrainer(model=tiny_model_dir, reward_funcs=said_yes, args=args, train_dataset=images)
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="environment_factory has none") as error:
        HardenedGRPOTrainer(model=tiny_model_dir, reward_funcs=said_yes, args=args, environment_factory=Env)
    assert "\n" not in str(error.value)


# ---------------------------------------------------------------------------------------------------------------------
# 4, 5. The counters and the log-probs of the batch that trains
# ---------------------------------------------------------------------------------------------------------------------


def test_num_tokens_counts_the_trained_batch_whenever_rounds_follow(tiny_model_dir, tmp_path):
    # round 1: Q0 mixed, Q1 hard; round 2 finds no mixed group, so the fallback keeps round 1's groups in order
    args = grpo_config(
        tmp_path, dynamic_sampling=True, dynamic_sampling_max_rounds=2, shuffle_dataset=False, max_steps=1,
        per_device_train_batch_size=8,
    )  # fmt: skip
    trainer = RecordingGRPO(model=tiny_model_dir, reward_funcs=said_yes, args=args, train_dataset=_prompts(12))
    _train(trainer, _mixed_reply)
    (entry,) = _ds_logs(trainer)
    assert (entry["pacs/ds/rounds"], entry["pacs/ds/fallback_groups"]) == (2, 1)
    batch = trainer.batches[0]
    tokens = int(batch["prompt_mask"].sum() + batch["completion_mask"].sum())
    assert entry["num_tokens"] == trainer.state.num_input_tokens_seen == tokens


class ProxyRecording(PACSTrainer):
    """Records, for every training micro-batch, the largest |log pi - log pi_old| the loss sees."""

    def _per_token_logps(self, model, inputs, **kwargs):
        result = super()._per_token_logps(model, inputs, **kwargs)
        if torch.is_grad_enabled() and self.model.training and "old_per_token_logps" in inputs:
            gap = (result[0].detach() - inputs["old_per_token_logps"]).abs() * inputs["completion_mask"]
            self.gaps = [*getattr(self, "gaps", []), float(gap.max())]
        return result


def _layout_prompts(n=16) -> Dataset:
    # period 4: mixed, hard, hard with a long answer, mixed; prompts of different lengths
    kinds = ["mixed", "hard", "hard long", "mixed"]
    return Dataset.from_dict({"prompt": [f"Q{i} {kinds[i % 4]}?" + " more" * (i % 3) for i in range(n)]})


def _layout_reply(prompt, i):
    # the dropped (hard) groups of a round can be wider than the groups kept: the batch's padding is not its rounds'
    if "mixed" in prompt:
        return "Yes." if i % 2 == 0 else "No, it is not" + " so" * (i % 3)
    return "No" + " no" * 12 if "long" in prompt else "No."


@pytest.mark.parametrize("dynamic_sampling", [False, True], ids=["off", "on"])
def test_old_log_probs_are_the_policys_own_on_the_trained_layout(tiny_model_dir, tmp_path, dynamic_sampling):
    # learning rate 0, bf16: pi_old (TRL's old log-probs: steps_per_generation 2, one micro-batch per step) must equal
    # the policy's own in the loss, so the rollout anchor's reward proxy is exactly 0; in order (shuffle_dataset off),
    # a generation's rounds are [Q0 mixed, Q1 hard] + [Q2 hard long, Q3 mixed] -> Q0, Q3, then [Q2 hard long, Q3
    # mixed] + [Q4 mixed, Q5 hard] -> Q3, Q4: a kept group's round is narrower than the batch
    args = tiny_pacs_config(
        tmp_path, dynamic_sampling=dynamic_sampling, bf16=True, learning_rate=0.0, max_steps=4, steps_per_generation=2,
        pacs_anchor="rollout", shuffle_dataset=False, max_completion_length=16,
    )  # fmt: skip
    trainer = ProxyRecording(model=tiny_model_dir, reward_funcs=said_yes, args=args, train_dataset=_layout_prompts())
    _train(trainer, _layout_reply)
    if dynamic_sampling:
        assert all(e["pacs/ds/rounds"] > 1 for e in _ds_logs(trainer))
    assert len(trainer.gaps) == 4 and max(trainer.gaps) == 0.0, trainer.gaps


def test_grpo_reference_log_probs_are_the_policys_own_on_the_trained_layout(tiny_model_dir, tmp_path):
    # beta > 0, learning rate 0, bf16: TRL's reference log-probs equal the policy's, so its logged kl is exactly 0
    args = grpo_config(
        tmp_path, dynamic_sampling=True, bf16=True, learning_rate=0.0, beta=0.04, max_steps=2,
        per_device_train_batch_size=8, shuffle_dataset=False, max_completion_length=16,
    )  # fmt: skip
    trainer = HardenedGRPOTrainer(
        model=tiny_model_dir, reward_funcs=said_yes, args=args, train_dataset=_layout_prompts()
    )
    _train(trainer, _layout_reply)
    logs = _ds_logs(trainer)
    assert len(logs) == 2 and all(e["pacs/ds/rounds"] > 1 for e in logs)
    assert [e["kl"] for e in logs] == [0.0, 0.0]


# ---------------------------------------------------------------------------------------------------------------------
# 6. Rounds pruned as they finish
# ---------------------------------------------------------------------------------------------------------------------


def test_a_finished_round_keeps_only_the_groups_that_can_still_be_picked():
    # 3 groups needed: round 1 has one mixed group, so at most 2 uniform ones can fill: its third is dropped
    keep = candidate_groups([torch.tensor([False, True, False, False])], 3)
    assert keep[0].tolist() == [True, True, True, False]
    # once 3 mixed groups are found, no uniform group can be picked
    keep = candidate_groups([torch.tensor([False, True, False, False]), torch.tensor([True, False, True, True])], 3)
    assert [k.tolist() for k in keep] == [[False, True, False, False], [True, False, True, False]]


def test_the_rounds_held_never_exceed_what_can_be_picked_and_assemble_the_same_batch():
    G, n = 2, 8  # one process, 4 groups of 2 per round (4 needed)
    patterns = [[False, True, False, False], [False, False, False, False], [True, False, True, True]]  # mixed
    held_rows = []

    class Spy(DynamicSampling):
        def _prune(self, batches, held, mixed, needed):
            super()._prune(batches, held, mixed, needed)
            held_rows.append(sum(h.numel() for h in held))

    sampling = Spy(seed=0, shuffle=False, num_generations=G, max_rounds=3)
    data = [{"prompt": f"p{i}"} for i in range(40)]

    def generate_round(rows):
        r = len(held_rows)
        label = torch.tensor([100 * r + i for i in range(n)])
        batch = {"prompt_ids": label[:, None], "completion_ids": label[:, None], "completion_mask": torch.ones(n, 1)}
        return batch, Round(~torch.tensor(patterns[r]), n, n)

    sampled = sampling.generate(data[:n], generate_round, data, 0, 1, lambda t: t, lambda x: x, 0)
    # round 1: 1 mixed + 3 uniform that may fill; round 2: nothing new can be picked beyond them; round 3: full
    assert held_rows == [8, 8, 8]
    assert sampled.picks == [(0, 1), (2, 0), (2, 2), (2, 3)] and sampled.fallback == 0
    assert sampled.output["prompt_ids"].flatten().tolist() == [2, 3, 200, 201, 204, 205, 206, 207]


class CountingForwards(HardenedGRPOTrainer):
    """Counts the rows of every forward without grad (old and reference log-probs)."""

    no_grad_rows = 0

    def _get_per_token_logps_and_entropies(self, model, input_ids, *args, **kwargs):
        if not torch.is_grad_enabled():
            self.no_grad_rows += input_ids.size(0)
        return super()._get_per_token_logps_and_entropies(model, input_ids, *args, **kwargs)


def test_no_grad_forwards_are_of_the_trained_rows_only(tiny_model_dir, tmp_path):
    # old log-probs (2 micro-batches per generation, one per step) and reference ones (beta > 0): one forward of each
    # trained row for each, however many rounds were generated and dropped
    args = grpo_config(
        tmp_path, dynamic_sampling=True, beta=0.04, steps_per_generation=2, max_steps=2, per_device_train_batch_size=8
    )
    data = _prompts(36, mixed=range(0, 36, 3))
    trainer = CountingForwards(model=tiny_model_dir, reward_funcs=said_yes, args=args, train_dataset=data)
    _train(trainer, _mixed_reply)
    (entry,) = _ds_logs(trainer)
    assert entry["pacs/ds/rounds"] > 1
    assert trainer.no_grad_rows == 2 * 16  # 16 rows trained, old and reference


# ---------------------------------------------------------------------------------------------------------------------
# TRL #6789: vLLM's importance-sampling ratio under truncated sampling
# ---------------------------------------------------------------------------------------------------------------------


def test_truncated_sampling_with_the_vllm_correction_warns_naming_the_bias_and_the_way_out(caplog):
    from types import SimpleNamespace

    from pacs.grpo.checks import check_importance_sampling

    def args(**overrides):
        base = dict(
            use_vllm=True, vllm_importance_sampling_correction=True, top_p=1.0, top_k=0, min_p=None,
            generation_kwargs=None,
        )  # fmt: skip
        return SimpleNamespace(**{**base, **overrides})

    for bad, named in [
        ({"top_p": 0.95}, "top_p=0.95"), ({"top_k": 20}, "top_k=20"), ({"min_p": 0.05}, "min_p=0.05"),
        ({"generation_kwargs": {"top_p": 0.9}}, "top_p=0.9"),
    ]:  # fmt: skip
        caplog.clear()
        with caplog.at_level("WARNING", logger="pacs.grpo.checks"):
            check_importance_sampling(args(**bad))
        assert (
            named in caplog.text
            and "#6789" in caplog.text
            and "vllm_importance_sampling_correction=False" in (caplog.text)
        ), bad
    for fine in [{}, {"top_p": 0.9, "vllm_importance_sampling_correction": False}, {"top_p": 0.9, "use_vllm": False}]:
        caplog.clear()
        with caplog.at_level("WARNING", logger="pacs.grpo.checks"):
            check_importance_sampling(args(**fine))
        assert not caplog.text, fine
