"""`padding_free` (`pacs.grpo.padding_free`): every forward of the layer and of PACS computes real tokens only, with the
padded path's log-probs, gradients and training runs, checked on first use and refused where it cannot be exact.

fp32 on the tiny Qwen3 (sdpa), batches of very different lengths with padding on both sides.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from trl import GRPOTrainer

from pacs import PACSTrainer
from pacs.grpo import HardenedGRPOConfig, HardenedGRPOTrainer
from pacs.grpo import padding_free as pf
from pacs.grpo.checks import check_padding_free
from pacs.grpo.packing import IGNORE_INDEX, pack, shift_labels, unpack
from pacs.testing import build_qwen3_moe, build_tiny_tokenizer
from tests.launching import ZERO3_CPU_ACCELERATE_CONFIG, accelerate_launch, run_launched
from tests.scripts.train_resume import resume_runs
from tests.tiny_config import tiny_pacs_config
from tests.tool_calls import called_a_tool, multiply, scripted_generate


def parity_reward(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


def prompts(n=32):
    """Prompts of very different lengths: most short, every fifth long."""
    return Dataset.from_dict(
        {
            "prompt": [
                f"What is {i} + {2 * i}?" + (" Add the tens, then the ones." * 6 if i % 5 == 0 else "")
                for i in range(n)
            ]
        }
    )


class FixedCompletions:
    """Completions a fixed function of (prompt, row), of very different lengths (1 to 20 tokens), so that the run with
    padding_free and the run without see the same batches."""

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations):
        letters = [self.processing_class.convert_tokens_to_ids(c) for c in "abcdefgh"]
        start = self.accelerator.process_index * len(prompt_ids)
        completions = []
        for j, ids in enumerate(prompt_ids):
            gen = torch.Generator().manual_seed(sum(ids) * 1000 + (start + j) % num_generations)
            length = [1, 2, 3, 20][int(torch.randint(0, 4, (1,), generator=gen))]
            tokens = [letters[int(k)] for k in torch.randint(0, len(letters), (length,), generator=gen)]
            completions.append(tokens + [self.processing_class.eos_token_id])
        return completions, None


class FixedGRPO(FixedCompletions, HardenedGRPOTrainer):
    pass


class FixedPACS(FixedCompletions, PACSTrainer):
    pass


def grpo_config(output_dir, **overrides) -> HardenedGRPOConfig:
    keys = ("use_cpu", "bf16", "per_device_train_batch_size", "num_generations", "learning_rate", "logging_steps",
            "save_strategy", "report_to", "seed")  # fmt: skip
    base = tiny_pacs_config(output_dir)
    return HardenedGRPOConfig(output_dir=str(output_dir), **{k: getattr(base, k) for k in keys} | overrides)


def ragged_batch(vocab: int, seed: int = 0):
    """(input_ids, attention_mask, logits_to_keep): prompts left-padded and completions right-padded to very different
    lengths (1 to 24 prompt tokens, 0 to 16 completion tokens)."""
    torch.manual_seed(seed)
    P, C = 24, 16
    shapes = [(24, 16), (1, 2), (5, 16), (3, 0), (8, 6), (2, 1), (12, 3)]
    ids = torch.randint(5, vocab, (len(shapes), P + C))
    mask = torch.zeros_like(ids)
    for b, (p, c) in enumerate(shapes):
        mask[b, P - p : P + c] = 1
    return ids, mask, C


@pytest.fixture(scope="module")
def trainer(tiny_model_dir, tmp_path_factory):
    args = grpo_config(tmp_path_factory.mktemp("pf"), padding_free=True)
    return HardenedGRPOTrainer(model=tiny_model_dir, reward_funcs=parity_reward, args=args, train_dataset=prompts())


def _logps(trainer, padding_free: bool, ids, mask, keep, budget=None, **kwargs):
    trainer.args.padding_free, trainer.args.padding_free_max_tokens_per_row = padding_free, budget
    try:
        return trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, keep, compute_entropy=True, **kwargs
        )
    finally:
        trainer.args.padding_free, trainer.args.padding_free_max_tokens_per_row = True, None


def _alone(trainer, ids, mask, keep):
    """Each sequence forwarded alone, without padding, through GRPOTrainer's own forward: (B, keep)."""
    out = torch.zeros(ids.size(0), keep)
    for b in range(ids.size(0)):
        cols = mask[b].bool().nonzero().squeeze(1)
        completion = int((cols >= ids.size(1) - keep).sum())
        if completion == 0 or len(cols) < 2:
            continue
        seq = ids[b, cols].unsqueeze(0)
        logps, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
            trainer, trainer.model, seq, torch.ones_like(seq), completion
        )
        out[b, :completion] = logps[0]  # completions are right-padded
    return out


@pytest.mark.parametrize("budget,batch_size", [(None, None), (None, 3), (20, None), (1, 2)])
def test_logps_match_the_padded_path_and_each_sequence_alone(trainer, budget, batch_size):
    ids, mask, keep = ragged_batch(trainer.model.config.vocab_size)
    with torch.no_grad():
        on = _logps(trainer, True, ids, mask, keep, budget, batch_size=batch_size)
        off = _logps(trainer, False, ids, mask, keep, batch_size=batch_size)
        alone = _alone(trainer, ids, mask, keep)
    scored = mask[:, -keep:].bool()
    scored[:, 0] &= mask[:, -keep - 1].bool()  # a completion's first token needs a prompt token before it
    assert scored.sum() > 30
    for a, b in ((on[0], off[0]), (on[1], off[1]), (on[0], alone)):  # log-probs, entropies; each sequence alone
        assert (a - b).abs()[scored].max() < 1e-5
    assert on[0][~scored].eq(0).all() and off[0][~scored].eq(0).all()  # TRL's zeros where nothing is scored


def test_gradients_match_the_padded_path(trainer):
    ids, mask, keep = ragged_batch(trainer.model.config.vocab_size, seed=1)
    grads = []
    for on in (True, False):
        trainer.model.zero_grad()
        logps, entropies, _ = _logps(trainer, on, ids, mask, keep, budget=30 if on else None)
        ((logps * mask[:, -keep:]).sum() + 0.1 * (entropies * mask[:, -keep:]).sum()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in trainer.model.parameters()]))
    trainer.model.zero_grad()
    assert ((grads[0] - grads[1]).norm() / grads[1].norm()).item() < 1e-4


def test_positions_computed_are_the_real_tokens(trainer):
    ids, mask, keep = ragged_batch(trainer.model.config.vocab_size)
    positions = []
    hook = trainer.model.get_input_embeddings().register_forward_hook(lambda m, i, o: positions.append(i[0].numel()))

    def computed(padding_free, budget=None):
        positions.clear()
        _logps(trainer, padding_free, ids, mask, keep, budget=budget)
        return sum(positions)

    try:
        with torch.no_grad():
            _logps(trainer, True, ids, mask, keep)  # the self-check has run (fixture's first use or here)
            one_row = computed(True, budget=ids.numel())  # one packed row: flash-attention's layout
            packed = computed(True)  # sdpa's default: rows no longer than the longest sequence
            padded = computed(False)
    finally:
        hook.remove()
    real, longest = mask.sum().item(), mask.sum(1).max().item()
    assert one_row <= 1.1 * real and padded >= 2 * real
    assert packed < padded and packed % longest == 0 and packed < real + longest  # first fit decreasing: < 1 row lost
    # the metric the loss's forward logs, each time
    frac = trainer._metrics[trainer._mode]["pacs/real_token_frac"][-3:]
    assert frac == pytest.approx([real / one_row, real / packed, real / padded])


def _no_position_reset(input_ids, attention_mask, max_tokens_per_row=None):
    p = pack(input_ids, attention_mask, max_tokens_per_row)
    L = p.input_ids.size(1)
    return type(p)(**{**vars(p), "position_ids": torch.arange(L).expand_as(p.input_ids)})


def _crossing_labels(packed, labels):
    """Labels rolled over the packed rows, across sequence boundaries (verl#6475)."""
    flat = torch.full((packed.num_positions,), IGNORE_INDEX)
    flat[packed.dst] = labels.reshape(-1)[packed.src]
    return torch.cat([flat[1:], flat[:1]]).view_as(packed.input_ids)


def _crossing_unpack(packed, values, fill=0.0, *, shifted=False):
    if not shifted:
        return unpack(packed, values, fill)
    B, T = packed.batch_shape
    flat = values.reshape(packed.num_positions, *values.shape[2:])
    out = flat.new_full((B * T, *values.shape[2:]), fill)
    return out.index_put((packed.src[1:],), flat[packed.dst[1:] - 1]).view(B, T, *values.shape[2:])


@pytest.mark.parametrize("mutation", ["no_position_reset", "crossing_labels", "attention_mask"])
def test_mutations_fail_the_checks(trainer, monkeypatch, mutation):
    ids, mask, keep = ragged_batch(trainer.model.config.vocab_size)
    if mutation == "no_position_reset":
        monkeypatch.setattr(pf, "pack", _no_position_reset)
    elif mutation == "crossing_labels":
        monkeypatch.setattr(pf, "shift_labels", _crossing_labels)
        monkeypatch.setattr(pf, "unpack", _crossing_unpack)
    else:  # an all-ones mask: transformers then reads the row as one sequence
        forward = pf._packed_forward
        monkeypatch.setattr(
            pf, "_packed_forward", lambda model, packed, *a, **k: forward(
                model, packed, *a, **k, attention_mask=torch.ones_like(packed.input_ids)
            ),
        )  # fmt: skip
    with pytest.raises(RuntimeError, match=r"attn_implementation='sdpa'.*padding_free: false"):
        pf.check_packing(trainer.model, ids, mask, attn_implementation="sdpa", tolerance=1e-3)
    if mutation != "crossing_labels":  # labels crossing only reach each sequence's first (prompt) token
        with torch.no_grad():
            trainer._packing_checked = True
            on = _logps(trainer, True, ids, mask, keep)[0]
            off = _logps(trainer, False, ids, mask, keep)[0]
        assert (on - off).abs().max() > 1e-3


def test_the_self_check_runs_once_with_the_same_forwards_on_every_batch_size(trainer, monkeypatch):
    calls = []
    forward = pf._packed_forward
    monkeypatch.setattr(pf, "_packed_forward", lambda *a, **k: calls.append(1) or forward(*a, **k))
    ids, mask, _ = ragged_batch(trainer.model.config.vocab_size)
    for rows in (1, 2, 7):  # a process with fewer rows runs as many forwards (ZeRO-3 gathers in every forward)
        calls.clear()
        pf.check_packing(trainer.model, ids[:rows], mask[:rows], attn_implementation="sdpa", tolerance=1e-3)
        assert len(calls) == 4
    trainer._packing_checked = False
    calls.clear()
    with torch.no_grad():
        _logps(trainer, True, ids, mask, 16)
        _logps(trainer, True, ids, mask, 16)
    assert len(calls) == 4 + 2 and trainer._packing_checked


# ---------------------------------------------------------------------------------------------------------------------
# Training runs: on and off, 4 optimizer steps, the same weights
# ---------------------------------------------------------------------------------------------------------------------

RUNS = {
    # GRPO, 2 optimizer steps per generation (TRL's old log-probs) and TRL's reference model (beta > 0)
    "grpo": (FixedGRPO, dict(steps_per_generation=2, beta=0.04)),
    "grpo_dynamic_sampling": (FixedGRPO, dict(steps_per_generation=2, dynamic_sampling=True)),
    "pacs_whole": (FixedPACS, {}),
    "pacs_split": (
        FixedPACS,
        dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, steps_per_generation=4),
    ),
    "pacs_reference": (FixedPACS, dict(pacs_anchor="reference", pacs_reference_reset_generations=0)),
    "pacs_num_iterations": (FixedPACS, dict(steps_per_generation=2, num_iterations=2)),
    "pacs_gradient_checkpointing": (FixedPACS, dict(gradient_checkpointing=True)),
    "pacs_lora": (FixedPACS, dict(learning_rate=5e-2)),
    "pacs_row_budget": (FixedPACS, dict(padding_free_max_tokens_per_row=32)),
    "pacs_moe": (FixedPACS, {}),
}


def _run(trainer_cls, model_dir, output_dir, padding_free: bool, lora: bool, **overrides):
    settings = dict(max_steps=4, max_completion_length=24, logging_steps=1, padding_free=padding_free) | overrides
    if not padding_free:
        settings.pop("padding_free_max_tokens_per_row", None)
    if trainer_cls is FixedGRPO:
        args = grpo_config(output_dir, **settings)
    else:
        args = tiny_pacs_config(output_dir, **settings)
    peft = None
    if lora:
        from peft import LoraConfig

        peft = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = trainer_cls(
        model=model_dir, reward_funcs=parity_reward, args=args, train_dataset=prompts(), peft_config=peft
    )
    before = torch.cat([p.detach().flatten().clone() for p in trainer.model.parameters()])
    trainer.train()
    after = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
    return before, after, trainer


@pytest.fixture(scope="module")
def moe_model_dir(tmp_path_factory) -> str:
    tokenizer = build_tiny_tokenizer()
    path = tmp_path_factory.mktemp("moe")
    build_qwen3_moe(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("name", list(RUNS))
def test_training_with_padding_free_matches_the_padded_run(request, tiny_model_dir, tmp_path, name):
    trainer_cls, overrides = RUNS[name]
    model_dir = request.getfixturevalue("moe_model_dir") if name == "pacs_moe" else tiny_model_dir
    off = _run(trainer_cls, model_dir, tmp_path / "off", False, name == "pacs_lora", **overrides)
    on = _run(trainer_cls, model_dir, tmp_path / "on", True, name == "pacs_lora", **overrides)
    update = (off[1] - off[0]).norm()
    assert update > 0 and torch.equal(on[0], off[0])
    assert ((on[1] - off[1]).norm() / update).item() < 1e-3
    logs = [[e for e in t.state.log_history if "loss" in e] for t in (off[2], on[2])]
    assert len(logs[0]) == len(logs[1]) == 4
    assert [e["loss"] for e in logs[1]] == pytest.approx([e["loss"] for e in logs[0]], rel=1e-3, abs=1e-5)
    frac = [[e["pacs/real_token_frac"] for e in log] for log in logs]
    assert max(frac[0]) < 0.9  # the padded run computes its padding
    if name == "pacs_moe":  # with the load-balancing loss, one packed row per micro-batch: no filler
        assert min(frac[1]) == 1.0
    else:  # sdpa: rows no longer than the longest sequence (or 32 tokens), whose filler is computed
        pairs = list(zip(frac[1], frac[0], strict=True))
        assert all(on >= off for on, off in pairs) and any(on > off for on, off in pairs), pairs
    if name == "pacs_moe":
        assert all(e["aux_loss"] > 0 for e in logs[1])
        assert [e["aux_loss"] for e in logs[1]] == pytest.approx([e["aux_loss"] for e in logs[0]], rel=1e-4)
    if name == "pacs_split":
        assert on[2]._pacs_split


def tool_prompts():
    return Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": f"{i} times 4?" + " Think." * (i % 4) * 5}] for i in range(24)]}
    )


def _tool_reply():
    """Row i's reply (as tests/test_dynamic_sampling_paths.py's): even rows call the tool, then reply after its
    response; odd rows answer at once."""
    call = json.dumps({"name": "multiply", "arguments": {"a": 3, "b": 4}})

    def reply(prompt, i):
        if "<tool_response>" in prompt:
            return "It is 12. " * (1 + i % 3)
        return f"<tool_call>\n{call}\n</tool_call>" if i % 2 == 0 else "No."

    return reply


def test_tools_with_padding_free_match_the_padded_run(tool_model_dir, tmp_path):
    # multi-turn completions (tool calls, their responses, masked by `tool_mask`, and the replies) packed whole
    from unittest.mock import patch

    runs = []
    for on in (False, True):
        args = grpo_config(
            tmp_path / str(on), padding_free=on, max_steps=4, steps_per_generation=2, max_completion_length=64,
            num_generations=2,
        )  # fmt: skip
        trainer = HardenedGRPOTrainer(
            model=tool_model_dir, reward_funcs=called_a_tool, tools=[multiply], args=args, train_dataset=tool_prompts()
        )
        before = torch.cat([p.detach().flatten().clone() for p in trainer.model.parameters()])
        with patch.object(
            trainer.model, "generate", side_effect=scripted_generate(trainer.processing_class, _tool_reply())
        ):
            trainer.train()
        runs.append((before, torch.cat([p.detach().flatten() for p in trainer.model.parameters()]), trainer))
    (before, off, _), (_, on, trainer) = runs
    assert (off - before).norm() > 0
    assert ((on - off).norm() / (off - before).norm()).item() < 1e-3
    steps = [e for e in trainer.state.log_history if "loss" in e]
    padded = [e for e in runs[0][2].state.log_history if "loss" in e]
    fracs = [(e["pacs/real_token_frac"], p["pacs/real_token_frac"]) for e, p in zip(steps, padded, strict=True)]
    assert all(on >= off for on, off in fracs) and any(on > off for on, off in fracs), fracs  # rows of <= the longest
    assert any(e["reward"] > 0 for e in steps)  # tools called


def test_resume_with_padding_free_and_dynamic_sampling_is_exact(tiny_model_dir, tmp_path):
    # the self-check runs again in a resumed process: in eval mode, without grad, it must draw no random numbers
    record = resume_runs(
        tiny_model_dir, str(tmp_path), (4, 1, 2, 1, 4), [1, 3], padding_free=True, dynamic_sampling=True,
        max_completion_length=6,
    )  # fmt: skip
    assert max(record["ds_rounds"]) > 1
    for k, run in record["resumed"].items():
        assert run["relative_difference"] <= 1e-6, (k, run["relative_difference"])  # as tests/test_checkpoints.py


@pytest.mark.distributed
def test_zero3_on_two_processes_matches_the_padded_run(tiny_model_dir, tmp_path):
    # ZeRO-3 gathers every parameter in every forward, collectively: every process must run as many forwards, the
    # self-check's included; prompts of different lengths, so the processes pack different rows
    (tmp_path / "zero3_cpu.yaml").write_text(ZERO3_CPU_ACCELERATE_CONFIG)
    cmd = [*accelerate_launch(), "--config_file", str(tmp_path / "zero3_cpu.yaml"), "--num_processes", "2"]
    cmd += [str(Path(__file__).parent / "scripts" / "train_tiny.py"), tiny_model_dir]
    params, logs = {}, {}
    for name, flag in (("off", "padding_free=0"), ("on", "padding_free=1")):
        (tmp_path / name).mkdir()
        run_launched([*cmd, str(tmp_path / name), flag, "max_completion_length=16"], tmp_path)
        params[name] = torch.load(tmp_path / name / "params0.pt")
        logs[name] = [json.loads((tmp_path / name / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(r["world_size"], r["zero_stage"]) for r in logs["on"]] == [(2, 3), (2, 3)]
    before, after = params["off"]["before"], params["off"]["after"]
    assert torch.equal(params["on"]["before"], before) and (after - before).norm() > 0
    assert ((params["on"]["after"] - after).norm() / (after - before).norm()).item() < 1e-3
    steps = [e for e in logs["on"][0]["log_history"] if "loss" in e]
    padded = [e for e in logs["off"][0]["log_history"] if "loss" in e]
    pairs = [(e["pacs/real_token_frac"], p["pacs/real_token_frac"]) for e, p in zip(steps, padded, strict=True)]
    assert steps and all(on >= off for on, off in pairs) and any(on > off for on, off in pairs), pairs


# ---------------------------------------------------------------------------------------------------------------------
# Refused before the model loads
# ---------------------------------------------------------------------------------------------------------------------


def test_refusals_before_the_model_loads(tiny_model_dir, tmp_path, monkeypatch):
    def load(*args, **kwargs):
        raise AssertionError("GRPOTrainer.__init__ ran: the model loads before the checks")

    monkeypatch.setattr(GRPOTrainer, "__init__", load)
    for settings, message in (
        (dict(use_liger_kernel=True), "padding_free does not support use_liger_kernel"),
        (dict(model_init_kwargs={"attn_implementation": "flex_attention"}), "attn_implementation='flex_attention'"),
    ):
        args = grpo_config(tmp_path, padding_free=True, **settings)
        with pytest.raises(ValueError, match=message):
            HardenedGRPOTrainer(model=tiny_model_dir, reward_funcs=parity_reward, args=args, train_dataset=prompts())
    args = grpo_config(tmp_path, padding_free=True, model_init_kwargs={"attn_implementation": "eager"})
    with pytest.raises(AssertionError, match="the model loads"):  # eager isolates packed sequences
        HardenedGRPOTrainer(model=tiny_model_dir, reward_funcs=parity_reward, args=args, train_dataset=prompts())
    with pytest.raises(AssertionError, match="the model loads"):  # off: nothing refused
        off = grpo_config(tmp_path, use_liger_kernel=True)
        HardenedGRPOTrainer(model=tiny_model_dir, reward_funcs=parity_reward, args=off, train_dataset=prompts())
    from transformers import Qwen2VLConfig

    vision = types.SimpleNamespace(config=Qwen2VLConfig())
    with pytest.raises(ValueError, match="padding_free does not support vision-language models"):
        check_padding_free(vision, grpo_config(tmp_path, padding_free=True))
    with pytest.raises(ValueError, match="padding_free_max_tokens_per_row must be an integer >= 1"):
        grpo_config(tmp_path, padding_free=True, padding_free_max_tokens_per_row=0)


def test_a_row_budget_with_the_moe_load_balancing_loss_is_refused(moe_model_dir, tmp_path):
    args = tiny_pacs_config(tmp_path, padding_free=True, padding_free_max_tokens_per_row=64)
    with pytest.raises(ValueError, match="router_aux_loss_coef: 0.0"):
        PACSTrainer(model=moe_model_dir, reward_funcs=parity_reward, args=args, train_dataset=prompts())


def test_the_fused_head_keywords_are_checked_against_the_installed_trl(monkeypatch):
    from pacs.grpo import _compat

    _compat.check_trl()
    monkeypatch.setattr(_compat, "FUSED_HEAD_KWARGS", (*_compat.FUSED_HEAD_KWARGS, "renamed_labels"))
    with pytest.raises(ImportError, match="add_fused_lm_head's renamed_labels"):
        _compat.check_trl()


def test_shift_labels_is_what_the_fused_head_scores():
    # the packed forward's labels: the padded labels, pre-shifted within each sequence
    ids = torch.tensor([[0, 3, 4, 5], [6, 7, 0, 0]])
    mask = (ids != 0).long()
    p = pack(ids, mask)
    assert shift_labels(p, ids.masked_fill(mask == 0, IGNORE_INDEX)).tolist() == [
        [4, 5, IGNORE_INDEX, 7, IGNORE_INDEX]
    ]
