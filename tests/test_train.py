"""`pacs train` (`pacs.train`) and its shim `examples/train_qwen.py`: end to end on the tiny CPU recipe (`pacs train`,
the shim with LoRA, ZeRO-3 launched by `pacs train` from an `accelerate_config`, resume), the shipped GPU recipes'
batch arithmetic against the paper's setting, the shipped accelerate launch configs, and the recipe reader's errors."""

import dataclasses
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pacs.plan import batch_arithmetic, check_training_plan
from pacs.recipes import ACCELERATE_CONFIGS_DIR as ACCELERATE_CONFIGS
from pacs.recipes import RECIPES_DIR as RECIPES
from tests.launching import free_port


ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_qwen.py"
TINY_RECIPE = RECIPES / "tiny_cpu.yaml"

GPU_RECIPES = [
    "qwen3_4b_pacs.yaml",
    "qwen3_8b_pacs.yaml",
    "qwen3_8b_pacs_lora.yaml",
    "qwen3_4b_grpo.yaml",
    "qwen3_8b_grpo.yaml",
]
PACS_RECIPES = ["qwen3_4b_pacs.yaml", "qwen3_8b_pacs.yaml", "qwen3_8b_pacs_lora.yaml"]
# The paper's verl setting: 1024 prompts x 8 completions per rollout, PPO mini-batches of 256 prompts.
PAPER_PROMPTS_PER_GENERATION, PAPER_NUM_GENERATIONS, PAPER_PROMPTS_PER_STEP = 1024, 8, 256


@pytest.fixture(scope="module")
def train_qwen():
    """`pacs.train`, which `pacs train` and the shim `examples/train_qwen.py` run."""
    import pacs.train

    return pacs.train


def parse_recipe(train_qwen, recipe: Path, *overrides: str):
    # bf16 recipes only parse on a machine without GPU when use_cpu is set; nothing else depends on it
    return train_qwen.parse_args(["--config", str(recipe), "--use_cpu", "true", *overrides])


def run(cmd: list[str], timeout: float = 400) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        pytest.fail(
            f"{' '.join(cmd)} exited with {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
        )
    return result


def tiny_args(model_dir: str, output_dir: Path, *overrides: str, command=("-m", "pacs", "train")) -> list[str]:
    """`pacs train --config tiny_cpu ...` (by name, as a user types it); `command=(SCRIPT,)` runs the shim."""
    config = ["--config", "tiny_cpu", "--model_name_or_path", model_dir, "--output_dir", str(output_dir)]
    return [*command, *config, *overrides]


# ---------------------------------------------------------------------------------------------------------------------
# Recipes: parse with TrlParser, the paper's batch arithmetic at the stated world size
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_recipe_batch_arithmetic(train_qwen, recipe):
    script_args, args, model_args = parse_recipe(train_qwen, RECIPES / recipe)

    # the world size the YAML states in prose is the one the script checks
    header = re.search(r"Assumes (\d+) nodes? x 8 GPUs = (\d+) processes", (RECIPES / recipe).read_text())
    assert header, f"{recipe} must state the node/GPU count it assumes"
    nodes, world_size = map(int, header.groups())
    assert world_size == 8 * nodes == script_args.expected_world_size

    arithmetic = batch_arithmetic(args, world_size)
    assert arithmetic["completions_per_generation"] == PAPER_PROMPTS_PER_GENERATION * PAPER_NUM_GENERATIONS == 8192
    assert arithmetic["prompts_per_generation"] == PAPER_PROMPTS_PER_GENERATION
    assert arithmetic["completions_per_optimizer_step"] == PAPER_PROMPTS_PER_STEP * PAPER_NUM_GENERATIONS
    assert arithmetic["optimizer_steps_per_generation"] == 4
    # one group per device micro-batch
    assert args.num_generations == args.per_device_train_batch_size == PAPER_NUM_GENERATIONS
    assert args.num_iterations == 1


def test_single_gpu_lora_recipe_splits_groups_over_micro_batches(train_qwen):
    from pacs.trainer import split_layout

    recipe = RECIPES / "qwen3_8b_pacs_lora_1gpu.yaml"
    script_args, args, model_args = parse_recipe(train_qwen, recipe)
    assert script_args.expected_world_size == 1 and model_args.use_peft
    assert model_args.model_name_or_path == "Qwen/Qwen3-8B"
    assert args.per_device_train_batch_size in (1, 2) and args.num_generations == 8
    arithmetic = batch_arithmetic(args, 1)
    assert arithmetic["optimizer_steps_per_generation"] == 4  # the paper's ratio
    assert arithmetic["completions_per_generation"] == 4 * arithmetic["completions_per_optimizer_step"]
    assert args.max_completion_length == 8192 and args.gradient_checkpointing
    assert not args.vllm_importance_sampling_correction
    layout = split_layout(
        args.per_device_train_batch_size, args.gradient_accumulation_steps, args.steps_per_generation, 1, 8
    )
    assert layout == "local"
    # every multi-GPU recipe says how to trade micro-batch size for memory
    for name in GPU_RECIPES:
        assert "per_device_train_batch_size 4, 2 or 1" in (RECIPES / name).read_text(), name


@pytest.mark.parametrize("recipe", [*PACS_RECIPES, "qwen3_8b_pacs_lora_1gpu.yaml"])
def test_pacs_recipes_follow_the_paper(train_qwen, recipe):
    script_args, args, model_args = parse_recipe(train_qwen, RECIPES / recipe)
    assert script_args.algorithm == "pacs"
    # the post-trained Qwen3 models whose scores are the paper's base rows (the recipes say why)
    assert model_args.model_name_or_path in ("Qwen/Qwen3-4B", "Qwen/Qwen3-8B")
    assert (args.pacs_beta, args.pacs_reward_proxy, args.pacs_score) == (1.0, "log_ratio", "rloo")
    assert args.pacs_class_weight == "balanced"
    assert args.beta == 0.0  # no KL
    assert args.learning_rate == (1e-5 if model_args.use_peft else 1e-6)
    assert args.lr_scheduler_type == "constant" and args.warmup_steps == 0
    assert (args.temperature, args.top_p, args.max_completion_length) == (1.0, 1.0, 8192)
    assert script_args.max_prompt_tokens == 1024 and args.vllm_max_model_length == 1024 + 8192
    assert (args.pacs_anchor, args.pacs_reference_reset_generations) == ("reference", 8)  # anchor.md's pick
    assert args.use_vllm and args.vllm_mode == "colocate"
    assert args.bf16 and args.gradient_checkpointing and model_args.dtype == "bfloat16"
    # the paper's rollout steps (Table 4: 120 for 4B, 320 for 8B) and evaluation every 20 rollouts; TRL counts
    # optimizer steps, 4 per rollout
    rollouts = 120 if "4B" in model_args.model_name_or_path else 320
    assert (args.max_steps, args.eval_steps, args.save_steps) == (rollouts * 4, 20 * 4, 20 * 4)
    assert script_args.eval_benchmark == "math500" and args.eval_strategy == "steps"
    assert args.steps_per_generation % args.gradient_accumulation_steps == 0


def test_grpo_recipe_differs_from_pacs_only_in_the_loss(train_qwen):
    from pacs import PACSConfig

    pacs = parse_recipe(train_qwen, RECIPES / "qwen3_4b_pacs.yaml")
    grpo = parse_recipe(train_qwen, RECIPES / "qwen3_4b_grpo.yaml")
    assert (pacs[0].algorithm, grpo[0].algorithm) == ("pacs", "grpo")
    assert dataclasses.replace(grpo[0], algorithm="pacs") == pacs[0]
    assert grpo[2] == pacs[2]
    # the baseline is parsed as TRL's own GRPOConfig, with the authors' GRPO loss (verl seq-mean-token-sum-norm)
    assert isinstance(pacs[1], PACSConfig) and not isinstance(grpo[1], PACSConfig)
    assert (grpo[1].loss_type, grpo[1].epsilon, grpo[1].scale_rewards) == ("dr_grpo", 0.2, "group")
    pacs_args, grpo_args = pacs[1].to_dict(), grpo[1].to_dict()
    pacs_only = {"pacs_beta", "pacs_reward_proxy", "pacs_score", "pacs_class_weight", "pacs_uniform_groups"}
    pacs_only |= {"pacs_label_transform", "pacs_label_temperature", "pacs_label_offset"}
    pacs_only |= {"pacs_anchor", "pacs_reference_reset_generations", "pacs_reset_optimizer", "pacs_reset_warmup_steps"}
    assert set(pacs_args) - set(grpo_args) == pacs_only
    assert pacs_args["pacs_max_skipped_steps"] == grpo_args["pacs_max_skipped_steps"]  # the hardened layer's guard
    differing = {k for k in grpo_args if pacs_args[k] != grpo_args[k]}
    # the loss, and what the authors' two verl actors do differently around it: GRPO's dual clip (delta) and
    # gradient clipping (PACS's actor never clips; verl's GRPO clips at 1.0, rescaled for TRL's dr_grpo mean)
    allowed = {"loss_type", "delta", "max_grad_norm", "output_dir", "logging_dir", "run_name", "hub_model_id"}
    assert differing <= allowed, differing
    assert (pacs[1].max_grad_norm, grpo[1].delta) == (0.0, 3.0)


def test_algorithm_override_picks_the_config_class(train_qwen):
    from trl import GRPOConfig

    from pacs import PACSConfig

    _, args, _ = parse_recipe(train_qwen, TINY_RECIPE)
    assert isinstance(args, PACSConfig) and args.pacs_uniform_groups == "keep"
    _, args, _ = parse_recipe(train_qwen, TINY_RECIPE, "--pacs_uniform_groups", "drop")  # a recipe key / flag
    assert args.pacs_uniform_groups == "drop"
    # the PACS recipe as the GRPO baseline: TRL's config under the hardened layer, the PACS settings dropped
    from pacs.grpo import HardenedGRPOConfig

    script_args, args, _ = parse_recipe(train_qwen, TINY_RECIPE, "--algorithm", "grpo")
    assert (
        script_args.algorithm == "grpo" and isinstance(args, HardenedGRPOConfig) and not isinstance(args, PACSConfig)
    )
    assert isinstance(args, GRPOConfig)
    grpo_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    assert {f.name for f in dataclasses.fields(args)} == grpo_fields | {
        "pacs_max_skipped_steps",
        "vllm_server_read_timeout",
        "dynamic_sampling",
        "dynamic_sampling_max_rounds",
        "dynamic_sampling_metric",
        "padding_free",
        "padding_free_max_tokens_per_row",
    }
    with pytest.raises(ValueError, match="not_an_argument"):
        parse_recipe(train_qwen, TINY_RECIPE, "--algorithm", "grpo", "--not_an_argument", "1")


def test_lora_recipe(train_qwen):
    from peft import LoraConfig
    from trl import get_peft_config

    _, _, model_args = parse_recipe(train_qwen, RECIPES / "qwen3_8b_pacs_lora.yaml")
    peft_config = get_peft_config(model_args)
    assert isinstance(peft_config, LoraConfig)
    assert peft_config.r == 32 and peft_config.lora_alpha == 32
    assert set(peft_config.target_modules) == {f"{name}_proj" for name in ("q", "k", "v", "o", "gate", "up", "down")}


def test_world_size_mismatch_is_refused_with_the_rescaling(train_qwen):
    script_args, args, model_args = parse_recipe(train_qwen, RECIPES / "qwen3_4b_pacs.yaml")
    assert args.world_size == 1 and script_args.expected_world_size == 8
    # 8192 completions per generation and 2048 per optimizer step on 1 process: more than vLLM runs at once, so the
    # rescaling is named as refused by the plan (max_num_seqs), the smaller batch as the way out
    with pytest.raises(ValueError, match=r"--gradient_accumulation_steps 256 --steps_per_generation 1024 ") as error:
        check_training_plan(script_args, args, model_args)
    assert "fails this plan's max_num_seqs check" in str(error.value)
    assert "or accept the smaller batch: --expected_world_size 1" in str(error.value)


def test_recipes_and_accelerate_configs_by_name_or_path(train_qwen, tmp_path, monkeypatch):
    from pacs.recipes import resolve_accelerate_config, resolve_recipe

    assert resolve_recipe("qwen3_4b_pacs") == resolve_recipe("qwen3_4b_pacs.yaml") == RECIPES / "qwen3_4b_pacs.yaml"
    assert resolve_accelerate_config("zero3") == ACCELERATE_CONFIGS / "zero3.yaml"
    with pytest.raises(FileNotFoundError, match="Did you mean qwen3_4b_pacs"):
        resolve_recipe("qwen3_4b_pac")
    with pytest.raises(FileNotFoundError, match="Did you mean zero3"):
        resolve_accelerate_config("zero_3")
    # the recipe's accelerate_config key is a launch key, read aside: the command line's wins
    recipe = train_qwen.read_recipe(["--config", "qwen3_4b_pacs", "--use_cpu", "true"])
    assert recipe.accelerate_config == ACCELERATE_CONFIGS / "zero3.yaml" and recipe.launch_args == []
    recipe = train_qwen.read_recipe(
        ["--config", "qwen3_4b_pacs", "--use_cpu", "true", "--accelerate_config", "zero2", "--num_processes", "4"]
    )
    assert recipe.accelerate_config == ACCELERATE_CONFIGS / "zero2.yaml"
    assert recipe.launch_args == ["--num_processes", "4"]
    assert recipe.argv[-4:] == ["--accelerate_config", "zero2", "--num_processes", "4"]  # launched whole
    # a path that exists wins over a name
    monkeypatch.chdir(tmp_path)
    (tmp_path / "qwen3_4b_pacs").write_text((RECIPES / "tiny_cpu.yaml").read_text())
    assert resolve_recipe("qwen3_4b_pacs") == Path("qwen3_4b_pacs")


def test_unknown_keys_name_the_closest_valid_ones(train_qwen, tmp_path):
    with pytest.raises(ValueError, match=r"lerning_rate \(on the command line\): did you mean learning_rate"):
        train_qwen.read_recipe(["--config", "tiny_cpu", "--lerning_rate", "1e-5"])
    recipe = tmp_path / "typo.yaml"
    recipe.write_text((RECIPES / "tiny_cpu.yaml").read_text() + "num_generation: 4\naccelerate_confg: zero3\n")
    with pytest.raises(ValueError, match=r"num_generation \(in the recipe\): did you mean num_generations") as error:
        train_qwen.read_recipe(["--config", str(recipe)])
    assert "did you mean accelerate_config" in str(error.value)
    assert "fail_with_unknown_args" not in str(error.value)
    # on the command line: the message, not a traceback, and exit 2
    from pacs.cli import main as cli_main

    assert cli_main(["train", "--config", str(recipe)]) == 2
    assert cli_main(["train", "--config", "qwen3_4b_pac"]) == 2


def test_a_mistyped_key_is_named_before_any_value_is_checked(tmp_path, capsys):
    from pacs.cli import main as cli_main

    # the 4B recipe is bf16: on a host without a GPU, building its config fails (transformers' bf16 error) unless
    # use_cpu is set; a typo must be named first, on the command line and in the recipe alike
    assert cli_main(["train", "--config", "qwen3_4b_pacs", "--learnig_rate", "1e-4"]) == 2
    err = capsys.readouterr().err
    assert "learnig_rate (on the command line): did you mean learning_rate?" in err and "bf16" not in err
    recipe = tmp_path / "typo.yaml"
    recipe.write_text((RECIPES / "qwen3_4b_pacs.yaml").read_text() + "usecpu: true\n")
    assert cli_main(["train", "--config", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "usecpu (in the recipe): did you mean use_cpu" in err and "bf16" not in err


def test_a_value_error_is_one_line_and_help_opens_with_the_recipe_usage(capsys):
    from pacs.cli import main as cli_main

    assert cli_main(["train", "--config", "tiny_cpu", "--num_generations", "four"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--num_generations" in err and "invalid int value: 'four'" in err
    assert cli_main(["train", "--config", "tiny_cpu", "--algorithm", "ppo"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert cli_main(["train", "--config", "tiny_cpu", "--pacs_uniform_groups", "filter"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--pacs_uniform_groups" in err and "'keep', 'drop'" in err
    with pytest.raises(SystemExit):
        cli_main(["train", "--help"])
    head = " ".join(capsys.readouterr().out[:1000].split())
    assert head.startswith("usage: pacs train --config RECIPE") and "`pacs recipes`" in head
    assert "--config qwen3_4b_pacs" in head and "pacs plan --config" in head


def test_help_lists_every_built_in_reward(capsys):
    from pacs.cli import main as cli_main
    from pacs.rewards import REWARD_FUNCS

    with pytest.raises(SystemExit):
        cli_main(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    reward_help = help_text[help_text.index("--reward_funcs REWARD_FUNCS") :][:400]
    assert "boxed_math" in REWARD_FUNCS
    assert all(f"`{name}`" in reward_help for name in REWARD_FUNCS), reward_help


@pytest.fixture
def no_training(train_qwen, monkeypatch):
    """`pacs train` in this process, with `train` (the trainer, which loads the model) replaced by a recorder."""
    calls = []
    monkeypatch.setattr(train_qwen, "train", lambda *args: calls.append(args))
    monkeypatch.setattr(train_qwen, "launch", lambda recipe: calls.append(recipe))
    return calls


def ordinary_mistakes(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (the overrides of the tiny recipe, what the one line must say)."""
    return {
        "no model": (["--model_name_or_path", ""], "No model given: pass --model_name_or_path"),
        "missing model": (["--model_name_or_path", str(tmp_path / "nope")], "No such model directory"),
        "missing data file": (["--dataset_name", "data/typo.jsonl"], "No such data file: 'data/typo.jsonl'"),
        "missing column": (["--dataset_name", str(tmp_path / "mine.jsonl")], "has no column 'problem'"),
        "reward not importable": (["--reward_funcs", "no_such_module.fn"], "Could not import reward function"),
        "unknown reward": (["--reward_funcs", "maths"], "Unknown reward function 'maths'"),
        "missing checkpoint": (["--resume_from_checkpoint", str(tmp_path / "checkpoint-9")], "9 does not exist"),
        "no checkpoint to resume": (["--resume_from_checkpoint", "true"], "found no complete checkpoint"),
        "reward needs a column": (["--reward_funcs", "cwd_hint_rewards.needs_hint"], "needs the keyword `hint`"),
        "folder not a model": (["--model_name_or_path", str(tmp_path / "not-a-model")], "is not a model folder"),
        "hub dataset unavailable": (
            ["--dataset_name", "some-org/no-such-set"],
            "Could not load 'some-org/no-such-set'",
        ),
    }


@pytest.mark.parametrize("mistake", list(ordinary_mistakes(Path("unused"))))  # (the names only: nothing written)
def test_ordinary_mistakes_end_before_the_model_loads_in_one_line(
    mistake, no_training, tiny_model_dir, tmp_path, monkeypatch, capsys
):
    from pacs.cli import main as cli_main

    (tmp_path / "cwd_hint_rewards.py").write_text("def needs_hint(completions, hint, **kwargs):\n    return [0.0]\n")
    monkeypatch.chdir(tmp_path)  # the reward module sits in the working directory, as a user's would
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])
    (tmp_path / "mine.jsonl").write_text(json.dumps({"question": "1 + 1?", "answer": "2"}) + "\n")
    (tmp_path / "not-a-model").mkdir()  # a folder whose config.json names no model_type
    (tmp_path / "not-a-model" / "config.json").write_text(json.dumps({"hidden_size": 64}))
    overrides, message = ordinary_mistakes(tmp_path)[mistake]
    argv = ["train", "--config", "tiny_cpu", "--model_name_or_path", tiny_model_dir, "--output_dir", "run"]
    assert cli_main([*argv, *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pacs train: error: ") and "\n" not in err and message in err, err
    assert no_training == []  # nothing trained, nothing launched
    # the same mistake with a launch config is answered before accelerate launches, in one line too
    assert cli_main([*argv, *overrides, "--accelerate_config", "ddp", "--num_processes", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pacs train: error: ") and "\n" not in err and message in err, err
    assert no_training == []


def test_a_gpu_recipe_without_a_gpu_names_what_to_run_instead(monkeypatch, capsys):
    import torch

    from pacs.cli import main as cli_main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # this machine, as a laptop without a GPU
    assert cli_main(["train", "--config", "qwen3_4b_pacs"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pacs train: error: qwen3_4b_pacs is written for GPUs") and "\n" not in err, err
    assert "`pacs plan --config qwen3_4b_pacs`" in err and "--config tiny_cpu" in err and "use_cpu" not in err


def test_reward_modules_import_from_the_working_directory(no_training, tiny_model_dir, tmp_path, monkeypatch):
    from pacs.cli import main as cli_main

    (tmp_path / "wd_rewards.py").write_text("def mine(completions, **kwargs):\n    return [1.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])  # as under the `pacs` script
    argv = [
        "train",
        "--config",
        "tiny_cpu",
        "--model_name_or_path",
        tiny_model_dir,
        "--reward_funcs",
        "wd_rewards.mine",
    ]
    assert cli_main(argv) == 0
    ((script_args, _, _, _, _, reward_funcs, resume),) = no_training
    assert [f.__name__ for f in reward_funcs] == ["mine"] and script_args.reward_funcs == ["wd_rewards.mine"]
    assert (resume.checkpoint, resume.finished) == (None, False)  # the resume decision, handed to the trainer


def test_a_zero_recipe_without_deepspeed_names_the_extra(tiny_model_dir):
    # DeepSpeed made unimportable in a fresh interpreter: the launch is refused before accelerate starts
    code = (
        "import sys; sys.modules['deepspeed'] = None\n"
        "from pacs.cli import main\n"
        f"sys.exit(main(['train', '--config', 'tiny_cpu', '--model_name_or_path', {tiny_model_dir!r}, "
        "'--accelerate_config', 'zero3', '--num_processes', '2']))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("pacs train: error: ") and "pip install 'trl-pacs[deepspeed]'" in last
    assert "accelerate launch" not in result.stderr  # refused before the launch, which logs its command


def test_script_requires_a_model_and_an_eval_benchmark(train_qwen, tiny_model_dir):
    script_args, args, model_args = parse_recipe(train_qwen, TINY_RECIPE)
    with pytest.raises(ValueError, match="--model_name_or_path"):
        train_qwen.main(script_args, args, model_args)
    model_args.model_name_or_path = tiny_model_dir
    no_benchmark = dataclasses.replace(script_args, eval_benchmark=None)
    with pytest.raises(ValueError, match="--eval_benchmark math500"):
        train_qwen.main(no_benchmark, args, model_args)


def test_script_rejects_a_missing_model_directory(train_qwen, tmp_path):
    script_args, args, model_args = parse_recipe(train_qwen, TINY_RECIPE)
    for path in (str(tmp_path / "no-such-model"), "./outputs/typo"):
        model_args.model_name_or_path = path
        with pytest.raises(ValueError, match=r"No such model directory or hub id: .*Qwen/Qwen3-4B-Base"):
            train_qwen.main(script_args, args, model_args)


def test_script_checks_the_rewards_against_the_data_before_loading_the_model(train_qwen, tmp_path, monkeypatch):
    # a user's reward from a dotted path that needs a `difficulty` column the training set does not have (its own
    # columns, `answer` and `level` among them, would reach the reward: `pacs train` keeps what the rewards take)
    (tmp_path / "my_rewards.py").write_text(
        "def answer_reward(completions, difficulty, **kwargs):\n    return [0.0] * len(completions)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    script_args, args, model_args = parse_recipe(
        train_qwen, TINY_RECIPE, "--reward_funcs", "my_rewards.answer_reward", "--eval_strategy", "no"
    )
    model_args.model_name_or_path = "Qwen/Qwen3-4B-Base"  # never loaded: the check comes first, offline
    with pytest.raises(ValueError, match=r"answer_reward needs the keyword `difficulty`.*rename_column"):
        train_qwen.main(script_args, args, model_args)


def test_script_loads_users_files_as_they_expect(train_qwen, tmp_path, caplog):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps({"prompt": chat, "answer": "4"}) + "\n" for _ in range(20)))
    # the tiny recipe's dataset_limit (16) cuts the user's file: logged with both counts
    script_args, args, _ = parse_recipe(train_qwen, TINY_RECIPE, "--dataset_name", str(path))
    with caplog.at_level(logging.INFO, logger="pacs.data"):
        train, _ = train_qwen.load_datasets(script_args, args)
    assert len(train) == 16 and "kept the first 16 of 20 problems" in caplog.text
    assert train[0]["prompt"] == chat  # a conversation passes through, system message kept
    # --dataset_limit 0 keeps everything; --prompt_suffix "" drops the instruction from plain-text problems
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"question": "What is 1 + 1?", "final": "2"}) + "\n")
    overrides = ["--dataset_name", str(plain), "--problem_column", "question", "--answer_column", "final"]
    script_args, args, _ = parse_recipe(
        train_qwen, TINY_RECIPE, *overrides, "--prompt_suffix", "", "--dataset_limit", "0"
    )
    train, _ = train_qwen.load_datasets(script_args, args)
    system = {"role": "system", "content": "You are a helpful assistant."}  # the paper's system turn, by default
    assert train[0]["prompt"] == [system, {"role": "user", "content": "What is 1 + 1?"}]
    script_args, args, _ = parse_recipe(train_qwen, TINY_RECIPE, *overrides)
    assert train_qwen.load_datasets(script_args, args)[0][0]["prompt"][-1]["content"].endswith("\\boxed{}.")
    # --system_prompt "" sends the user turn alone, in training and in the evaluation during training
    script_args, args, _ = parse_recipe(train_qwen, TINY_RECIPE, *overrides, "--system_prompt", "")
    train, evaluation = train_qwen.load_datasets(script_args, args)
    assert [t["role"] for t in train[0]["prompt"]] == [t["role"] for t in evaluation[0]["prompt"]] == ["user"]


def test_max_prompt_tokens_drops_long_prompts_counted_with_the_chat_template(train_qwen, caplog):
    from datasets import Dataset

    from pacs.data import make_prompt
    from pacs.testing import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    problems = [f"What is {i} + {i}?" + " Think about it." * (3 * i) for i in range(8)]  # growing lengths
    dataset = Dataset.from_list([{"prompt": make_prompt(p), "solution": str(2 * i)} for i, p in enumerate(problems)])
    rendered = [
        tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, return_dict=True) for row in dataset
    ]
    lengths = [len(r["input_ids"]) for r in rendered]
    content_only = [len(tokenizer(row["prompt"][-1]["content"])["input_ids"]) for row in dataset]
    assert lengths == sorted(lengths) and all(a > b for a, b in zip(lengths, content_only))
    limit = (lengths[4] + lengths[5]) // 2  # rows 0-4 fit, 5-7 do not
    with caplog.at_level(logging.INFO, logger="pacs.data"):
        kept = train_qwen.drop_long_prompts(dataset, tokenizer, limit)
    assert kept["solution"] == ["0", "2", "4", "6", "8"]
    assert f"max_prompt_tokens={limit}: dropped 3 of 8 training prompts" in caplog.text
    # the boundary is inclusive: a prompt of exactly max_prompt_tokens stays; one token less and it goes, although
    # its text alone would fit: the chat template's tokens (system turn, role markers) count too
    assert len(train_qwen.drop_long_prompts(dataset, tokenizer, lengths[4])) == 5
    assert content_only[4] <= lengths[4] - 1
    assert len(train_qwen.drop_long_prompts(dataset, tokenizer, lengths[4] - 1)) == 4
    assert len(train_qwen.drop_long_prompts(dataset, tokenizer, lengths[-1])) == 8
    # plain-text prompts are counted as the trainer tokenizes them, without a template
    plain = Dataset.from_list([{"prompt": p, "solution": "0"} for p in problems])
    assert len(train_qwen.drop_long_prompts(plain, tokenizer, content_only[2])) == 3
    with pytest.raises(ValueError, match="Every training prompt is longer than max_prompt_tokens=1"):
        train_qwen.drop_long_prompts(dataset, tokenizer, 1)
    with pytest.raises(ValueError, match="at least 1"):
        train_qwen.drop_long_prompts(dataset, tokenizer, 0)


def test_max_prompt_tokens_is_applied_before_training(train_qwen, tiny_model_dir, tmp_path, monkeypatch, caplog):
    # main() loads the model's tokenizer and filters the training set before the trainer exists
    seen = {}

    class StopBeforeTraining(Exception):
        pass

    def fake_trainer(**kwargs):
        seen.update(kwargs)
        raise StopBeforeTraining

    monkeypatch.setitem(
        train_qwen.ALGORITHMS, "pacs", dataclasses.replace(train_qwen.ALGORITHMS["pacs"], trainer=fake_trainer)
    )
    monkeypatch.setattr(train_qwen, "check_training_plan", lambda *args, **kwargs: None, raising=False)
    path = tmp_path / "mixed.jsonl"
    rows = [{"problem": "1 + 1?" + " Very long." * (200 if i % 2 else 0), "answer": "2"} for i in range(6)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    script_args, args, model_args = parse_recipe(
        train_qwen, TINY_RECIPE, "--dataset_name", str(path), "--max_prompt_tokens", "200", "--eval_strategy", "no"
    )
    model_args.model_name_or_path = tiny_model_dir
    with caplog.at_level(logging.INFO, logger="pacs.data"), pytest.raises(StopBeforeTraining):
        train_qwen.main(script_args, args, model_args)
    assert len(seen["train_dataset"]) == 3 and "dropped 3 of 6 training prompts" in caplog.text


@pytest.mark.parametrize("name", ["ddp", "zero2", "zero3", "zero3_multinode", "zero3_hostfile"])
def test_accelerate_configs(name):
    from accelerate.commands.config.config_args import load_config_from_file

    path = ACCELERATE_CONFIGS / f"{name}.yaml"
    config = load_config_from_file(str(path))
    assert config.mixed_precision == "bf16" and not config.use_cpu
    assert "pacs train --config" in path.read_text()  # the command that uses it
    expected_stage = {"ddp": None, "zero2": 2}.get(name, 3)
    assert config.deepspeed_config.get("zero_stage") == expected_stage
    assert config.num_processes == 8 * config.num_machines


def test_every_example_starts_with_its_command():
    for path in [SCRIPT, *RECIPES.glob("*.yaml"), *ACCELERATE_CONFIGS.glob("*.yaml")]:
        head = path.read_text()[:2500]
        assert re.search(r"(accelerate launch|python|pacs train) .*(examples/|--config)", head), path.name


# ---------------------------------------------------------------------------------------------------------------------
# End to end on the tiny model
# ---------------------------------------------------------------------------------------------------------------------


def test_tiny_recipe_runs_then_resumes(tiny_model_dir, tmp_path):
    output_dir = tmp_path / "run"
    # 1. plain python, 2 optimizer steps (one generation), evaluated and checkpointed at step 2
    run([sys.executable, *tiny_args(tiny_model_dir, output_dir, "--max_steps", "2", "--eval_steps", "2",
                                    "--save_strategy", "steps", "--save_steps", "2")])  # fmt: skip
    assert (output_dir / "model.safetensors").exists()
    state = json.loads((output_dir / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    logged = {key for entry in state["log_history"] for key in entry}
    assert {"pacs/loss", "pacs/psi_mean", "pacs/critic_brier", "eval_reward"} <= logged

    # 2. a save of step 3 killed half-way through the weights (no trainer_state.json, no completion marker)
    shutil.copytree(output_dir / "checkpoint-2", output_dir / "checkpoint-3")
    (output_dir / "checkpoint-3" / "trainer_state.json").unlink()
    (output_dir / "checkpoint-3" / "pacs_checkpoint_complete.json").unlink()
    weights = output_dir / "checkpoint-3" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:64])

    # 3. resume from the newest complete checkpoint in output_dir (2, not 3) and finish at step 4
    result = run([sys.executable, *tiny_args(tiny_model_dir, output_dir, "--max_steps", "4", "--eval_strategy", "no",
                                             "--save_strategy", "steps", "--save_steps", "2",
                                             "--resume_from_checkpoint", "true")])  # fmt: skip
    assert "Not resuming from" in result.stderr and "checkpoint-3: its save did not finish" in result.stderr
    state = json.loads((output_dir / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    steps = [entry["step"] for entry in state["log_history"] if "pacs/loss" in entry]
    assert steps == [1, 2, 3, 4]  # steps 1-2 come from the checkpoint, not from a rerun


def test_tiny_recipe_with_lora_through_the_shim(tiny_model_dir, tmp_path):
    output_dir = tmp_path / "lora"
    run([sys.executable, *tiny_args(tiny_model_dir, output_dir, "--max_steps", "2", "--eval_strategy", "no",
                                    "--use_peft", "--lora_r", "8", "--lora_target_modules", "q_proj", "v_proj",
                                    command=(str(SCRIPT),))])  # fmt: skip
    adapter = json.loads((output_dir / "adapter_config.json").read_text())
    assert adapter["r"] == 8 and set(adapter["target_modules"]) == {"q_proj", "v_proj"}
    assert not (output_dir / "model.safetensors").exists()  # the adapter only


TARGET_REWARD = """def matches_target(completions, target, **kwargs):
    return [float(str(t) in str(c)) for c, t in zip(completions, target)]
"""


@pytest.mark.distributed
def test_trl_format_data_trains_under_ddp_and_a_missing_column_stops_before_launch(tiny_model_dir, tmp_path):
    # TRL's format: `prompt` and the column the user's reward takes (`target`), launched by `pacs train` on 2 processes
    (tmp_path / "target_rewards.py").write_text(TARGET_REWARD)
    chat = [{"role": "user", "content": "What is 2 + 2?"}]
    (tmp_path / "trl.jsonl").write_text("".join(json.dumps({"prompt": chat, "target": "4"}) + "\n" for _ in range(8)))
    (tmp_path / "no_target.jsonl").write_text(json.dumps({"prompt": chat, "solution": "4"}) + "\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}

    def pacs_train(data: str, *extra: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, *tiny_args(tiny_model_dir, tmp_path / "out", "--dataset_name", data, "--reward_funcs",
                                          "target_rewards.matches_target", "--eval_strategy", "no", *extra)]  # fmt: skip
        return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)

    launch = ["--accelerate_config", "ddp", "--num_processes", "2", "--mixed_precision", "no",
              "--expected_world_size", "2", "--main_process_port", str(free_port())]  # fmt: skip
    result = pacs_train("trl.jsonl", "--max_steps", "2", *launch)
    assert result.returncode == 0, result.stderr[-6000:]
    assert (tmp_path / "out" / "model.safetensors").exists()
    assert "rewards/matches_target/mean" in result.stdout + result.stderr
    # the column missing: one line, exit 2, in the launching process (accelerate never starts)
    result = pacs_train("no_target.jsonl", *launch)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert last.startswith("pacs train: error: The reward function matches_target needs the keyword `target`")
    assert "accelerate launch" not in result.stderr


@pytest.mark.distributed
def test_tiny_recipe_under_accelerate_zero3(tiny_model_dir, tmp_path):
    pytest.importorskip("deepspeed")
    output_dir = tmp_path / "zero3"
    # `pacs train` launches accelerate itself: the shipped GPU config by name, overridden for 2 CPU processes without
    # bf16 (the recipe sets use_cpu)
    launch = ["--accelerate_config", "zero3", "--num_processes", "2", "--mixed_precision", "no",
              "--main_process_port", str(free_port())]  # fmt: skip
    result = run([sys.executable, *tiny_args(tiny_model_dir, output_dir, "--max_steps", "2", "--eval_strategy", "no",
                                             "--expected_world_size", "2", *launch)])  # fmt: skip
    assert "2 process(es), DeepSpeed ZeRO-3: 16 completions per generation" in result.stderr
    assert (output_dir / "model.safetensors").exists()  # gathered from the shards (zero3_save_16bit_model)
