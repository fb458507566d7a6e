"""`pacs plan`: every shipped GPU recipe passes on the hardware it documents; the launches that cannot work are refused
with the setting to change (a vLLM engine that cannot start, bf16 weights that cannot learn, a vLLM share below the
weights, a data-parallel vLLM server on a dense model, a world size the recipe's batch was not written for); the model
shapes it uses are exact; offline and deterministic; recipes by name with the accelerate config they name; `pacs train`
runs the same checks before any model loads."""

import dataclasses
import logging
import re
import shlex
from pathlib import Path

import pytest

from pacs import plan as pacs_plan
from pacs.cli import main as cli_main
from pacs.plan import Launch, model_shape, plan_recipe
from pacs.recipes import ACCELERATE_CONFIGS_DIR as ACCELERATE
from pacs.recipes import RECIPES_DIR as RECIPES


ROOT = Path(__file__).resolve().parents[1]
DOCS_RECIPES = ROOT / "docs" / "recipes.md"
GPU_RECIPES = sorted(p.name for p in RECIPES.glob("qwen3_*.yaml"))


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def plan_of(recipe: str, *overrides: str, **kwargs):
    """The plan of a shipped recipe, launched with the accelerate config it names (unless `accelerate_config=`)."""
    return plan_recipe(recipe.removesuffix(".yaml"), overrides=list(overrides), **kwargs)


def settings(plan, level="error"):
    return {f.setting for f in plan.findings if f.level == level}


# ---------------------------------------------------------------------------------------------------------------------
# Model shapes
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, total, non_embedding",
    [  # Qwen's published sizes (billions of parameters): total, non-embedding
        ("Qwen/Qwen3-0.6B", 0.6, 0.44),
        ("Qwen/Qwen3-1.7B-Base", 1.7, 1.4),
        ("Qwen/Qwen3-4B-Base", 4.0, 3.6),
        ("Qwen/Qwen3-8B-Base", 8.2, 6.95),
        ("Qwen/Qwen3-14B", 14.8, 13.2),
        ("Qwen/Qwen3-32B", 32.8, 31.2),
        ("Qwen/Qwen3-30B-A3B-Base", 30.5, None),
    ],
)
def test_qwen3_table_matches_the_published_sizes(name, total, non_embedding):
    shape = model_shape(name)
    assert shape.num_params / 1e9 == pytest.approx(total, rel=0.03)
    if non_embedding is not None:
        embeddings = shape.embedding_params * (1 if shape.tie_word_embeddings else 2)
        assert (shape.num_params - embeddings) / 1e9 == pytest.approx(non_embedding, rel=0.03)


def test_qwen3_4b_and_8b_shapes():
    s4, s8 = model_shape("Qwen/Qwen3-4B-Base"), model_shape("Qwen/Qwen3-8B-Base")
    assert (s4.hidden_size, s4.num_layers, s4.num_heads, s4.num_kv_heads, s4.head_dim) == (2560, 36, 32, 8, 128)
    assert (s4.intermediate_size, s4.vocab_size, s4.tie_word_embeddings) == (9728, 151936, True)
    assert (s8.hidden_size, s8.num_layers, s8.num_heads, s8.num_kv_heads, s8.head_dim) == (4096, 36, 32, 8, 128)
    assert (s8.intermediate_size, s8.vocab_size, s8.tie_word_embeddings) == (12288, 151936, False)
    assert s8.kv_bytes_per_token() == 2 * 36 * 8 * 128 * 2  # K and V, bf16
    assert s8.kv_bytes_per_token(tensor_parallel_size=2) == s8.kv_bytes_per_token() // 2


def test_shape_from_a_local_config_counts_the_real_parameters(tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    shape = model_shape(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert shape.num_params == sum(p.numel() for p in model.parameters())
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=targets))
    assert shape.lora_params(4, targets) == sum(p.numel() for p in peft_model.parameters() if p.requires_grad)


def test_an_unknown_model_offline_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown offline"):
        model_shape("someone/unknown-model")


@pytest.mark.parametrize("tied", [True, False])
def test_parameters_counted_on_the_meta_device_are_the_real_models(tiny_model_dir, tmp_path, tied):
    import json

    from transformers import AutoConfig, AutoModelForCausalLM

    directory = tiny_model_dir
    if not tied:  # the same model with an LM head of its own
        config = json.loads((Path(tiny_model_dir) / "config.json").read_text())
        (tmp_path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
        directory = str(tmp_path)
    counted = pacs_plan.count_parameters(directory)
    if tied:
        model = AutoModelForCausalLM.from_pretrained(directory)
    else:
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory))
    unique = {id(p): p for p in model.parameters()}.values()
    assert counted.total == sum(p.numel() for p in unique)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    assert counted.lm_head == model.lm_head.weight.numel()
    assert counted.layer == sum(p.numel() for p in model.model.layers[0].parameters())
    # a local model's shape carries the counts; the formula the Qwen3 table relies on gives the same
    shape = model_shape(directory)
    assert shape.counted == counted and shape.num_params == counted.total
    formula = dataclasses.replace(shape, counted=None)
    assert (formula.num_params, formula.embedding_params, formula.layer_params) == (
        counted.total,
        counted.lm_head,
        counted.layer,
    )


def test_parameters_are_counted_on_the_meta_device_in_a_zero3_process(tiny_model_dir, caplog):
    # a ZeRO-3 rank of `pacs train` holds a live HfDeepSpeedConfig when the planner runs: transformers then wraps
    # from_config in deepspeed.zero.Init, which cannot handle meta tensors, and the count fell back to the formula
    pytest.importorskip("deepspeed")
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled, unset_hf_deepspeed_config

    plain = pacs_plan.count_parameters(tiny_model_dir)
    zero3 = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    try:
        assert is_deepspeed_zero3_enabled()
        with caplog.at_level(logging.INFO, logger="pacs.plan.shape"):
            counted = pacs_plan.count_parameters(tiny_model_dir)
        assert is_deepspeed_zero3_enabled()  # left as it was
    finally:
        unset_hf_deepspeed_config()
        del zero3
    assert "come from the formula" not in caplog.text and counted == plain is not None


def fake_hub_cache(root: Path, repo_id: str, config_file: Path) -> Path:
    """A local HF cache (the hub's layout) holding `repo_id`'s config.json only."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text(config_file.read_text())
    return root


def test_a_hub_id_is_counted_from_the_cache_and_a_qwen3_one_from_the_table(tiny_model_dir, tmp_path, monkeypatch):
    import huggingface_hub.constants

    config = Path(tiny_model_dir) / "config.json"
    cache = fake_hub_cache(tmp_path, "someone/tiny-qwen3", config)
    fake_hub_cache(cache, "Qwen/Qwen3-4B", config)  # the table wins over the cache: the same plan on every machine
    # read at call time by huggingface_hub and transformers (HF_HUB_CACHE is read once, at import)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    cached = model_shape("someone/tiny-qwen3")
    assert cached.source == "the HF cache (someone/tiny-qwen3)"
    assert cached.counted == pacs_plan.count_parameters(tiny_model_dir) and cached.num_params == cached.counted.total
    # offline, a hub id neither cached nor local: the table for the Qwen3 family (its formula), an error otherwise
    table = model_shape("Qwen/Qwen3-4B")
    assert table.source == "pacs.plan's Qwen3 table" and table.counted is None
    assert round(table.num_params / 1e9, 2) == 4.02
    assert pacs_plan.count_parameters("Qwen/Qwen3-8B") is None  # not in this cache
    with pytest.raises(ValueError, match="unknown offline"):
        model_shape("someone/unknown-model")


def test_docstring_examples_run():
    import doctest

    import pacs.plan.shape

    for module in (pacs_plan, pacs.plan.shape):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


# ---------------------------------------------------------------------------------------------------------------------
# The shipped recipes on their documented hardware
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_shipped_recipe_passes_on_its_documented_hardware(recipe):
    plan = plan_of(recipe)
    assert not plan.errors, plan.render()
    text = plan.render()
    # the documented hardware is the recipe's own: its accelerate config (one process needs none), its GPU memory
    import yaml

    recipe_yaml = yaml.safe_load((RECIPES / recipe).read_text())
    if recipe_yaml["expected_world_size"] > 1:
        assert f"(accelerate config {recipe_yaml['accelerate_config']})" in text
        assert f"pacs train --config {recipe.removesuffix('.yaml')}" in (RECIPES / recipe).read_text()
    assert recipe_yaml.get("expected_gpu_memory_gb"), f"{recipe} must state the GPU memory it assumes"
    assert f"{recipe_yaml['expected_gpu_memory_gb']:g} GiB per GPU" in text
    # no risk left unaddressed: checkpoints bounded, memory not near the limit
    assert not {"save_total_limit", "per_device_train_batch_size"} & settings(plan, "warning"), plan.render()
    # and on a GPU that reports a little less than its nominal size (an 80 GB H100 reports 79.2 GiB)
    nominal = recipe_yaml["expected_gpu_memory_gb"]
    assert not plan_of(recipe, gpu_memory_gb=0.99 * nominal).errors


def test_plan_prints_every_part():
    text = plan_of("qwen3_4b_pacs.yaml", gpu_memory_gb=80).render()
    for part in (
        "completions per generation",
        "completions per optimizer step",
        "optimizer steps per generation",
        "max_num_seqs",
        "max_num_batched_tokens       4096",
        "max_model_len",
        "gpu_memory_utilization",
        "KV cache",
        "concurrency",
        "optimizer states",
        "activations",
        "LM head",
        "while generating",
        "one checkpoint",
        "one evaluation",
    ):
        assert part in text, part


def test_the_plan_printed_in_the_docs_is_the_current_one(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # the shipped recipe by name, from anywhere
    assert cli_main(["plan", "--config", "qwen3_4b_pacs"]) == 0
    assert capsys.readouterr().out.strip() in DOCS_RECIPES.read_text(), "rerun the command and paste its output"


def test_a_launch_on_another_world_size_is_refused_naming_the_fix(capsys):
    assert cli_main(["plan", "--config", "qwen3_4b_pacs", "--num-processes", "1"]) == 1
    out = capsys.readouterr().out
    assert "ERROR [expected_world_size] the recipe assumes 8 processes, this launch has 1" in out
    # the paper's batch on 1 process needs max_num_seqs 8192: named as refused, never offered as the way out
    assert "or keep the recipe's batch" not in out and "or accept the smaller batch: --expected_world_size 1" in out
    assert (
        "The recipe's batch does not fit 1 process(es): --gradient_accumulation_steps 256 --steps_per_generation 1024 "
        "--expected_world_size 1 fails this plan's max_num_seqs check." in out
    )
    # `pacs train`'s launch keys work on `pacs plan`'s command line too
    assert cli_main(["plan", "--config", "qwen3_4b_pacs", "--num_processes", "1"]) == 1
    assert "ERROR [expected_world_size]" in capsys.readouterr().out
    assert cli_main(["plan", "--config", "qwen3_4b_pacs", "--accelerate_config", "zero3_multinode"]) == 1
    assert "this launch has 16" in capsys.readouterr().out


@pytest.mark.parametrize("num_processes", [1, 2, 4, 16])
def test_every_fix_the_world_size_check_suggests_passes_its_own_plan(num_processes):
    # the loop: the plan suggested values that the same plan then refused
    plan = plan_of("qwen3_4b_pacs.yaml", num_processes=num_processes)
    (finding,) = [f for f in plan.errors if f.setting == "expected_world_size"]
    fixes = re.findall(
        r"(?:keep the recipe's batch on \d+|accept the smaller batch): ((?:--\w+ \d+ ?)+)", finding.message
    )
    assert fixes and all("--expected_world_size" in fix for fix in fixes), finding.message
    left = settings(plan) - {"expected_world_size"}  # what the launch fails anyway, each with its own fix
    for fix in fixes:
        fixed = plan_of("qwen3_4b_pacs.yaml", *fix.split(), num_processes=num_processes)
        assert settings(fixed) <= left, (fix, fixed.render())
    assert (num_processes == 1) == ("does not fit" in finding.message)  # 8192 sequences at once: vLLM refuses


def test_plan_refuses_what_pacs_train_refuses(capsys, tmp_path):
    # the tiny recipe names no model: `pacs train` refuses it, so the plan does (it said "Problems: none")
    assert cli_main(["plan", "--config", "tiny_cpu"]) == 2
    err = capsys.readouterr().err
    assert "pacs plan: error: No model given: pass --model_name_or_path" in err
    for overrides, message in (
        (["--model_name_or_path", str(tmp_path / "nope")], "No such model directory"),
        (["--dataset_name", "data/typo.jsonl"], "No such data file"),
        (["--reward_funcs", "no_such_module.fn"], "Could not import reward function"),
    ):
        assert cli_main(["plan", "--config", "qwen3_4b_pacs", *overrides]) == 2, overrides
        assert message in capsys.readouterr().err
    # a resumed launch is planned before its checkpoints exist
    assert cli_main(["plan", "--config", "qwen3_4b_pacs", "--resume_from_checkpoint", "true"]) == 0


def test_plan_is_deterministic_and_offline():
    assert plan_of("qwen3_8b_pacs.yaml").render() == plan_of("qwen3_8b_pacs.yaml").render()


# ---------------------------------------------------------------------------------------------------------------------
# Refused launches, each naming the setting to change
# ---------------------------------------------------------------------------------------------------------------------


def test_single_gpu_paper_batch_is_refused_for_max_num_seqs():
    # docs/recipes.md once showed the paper's batch on one GPU: max_num_seqs = 8 x 1024 = 8192 > 4096
    plan = plan_of(
        "qwen3_8b_pacs_lora.yaml",
        "--gradient_accumulation_steps", "256", "--steps_per_generation", "1024", "--expected_world_size", "1",
        accelerate_config=None, num_processes=1,
    )  # fmt: skip
    assert "max_num_seqs" in settings(plan)
    (finding,) = [f for f in plan.errors if f.setting == "max_num_seqs"]
    assert "8192" in finding.message and "steps_per_generation <= 512" in finding.message
    # the value it names works
    fixed = plan_of(
        "qwen3_8b_pacs_lora.yaml",
        "--gradient_accumulation_steps", "128", "--steps_per_generation", "512", "--expected_world_size", "1",
        accelerate_config=None, num_processes=1,
    )  # fmt: skip
    assert "max_num_seqs" not in settings(fixed)


def test_bf16_weights_under_ddp_at_small_lr_are_refused_for_dtype():
    plan = plan_of("qwen3_4b_pacs.yaml", accelerate_config=str(ACCELERATE / "ddp.yaml"))
    (finding,) = [f for f in plan.errors if f.setting == "dtype"]
    assert "dtype: float32" in finding.message and "1e-06" in finding.message
    assert "dtype" not in settings(
        plan_of("qwen3_4b_pacs.yaml", "--dtype", "float32", accelerate_config=str(ACCELERATE / "ddp.yaml"))
    )
    # DeepSpeed keeps fp32 master weights; LoRA adapters are float32 under DDP; a large lr moves bf16 weights
    assert "dtype" not in settings(plan_of("qwen3_4b_pacs.yaml"))
    assert "dtype" not in settings(plan_of("qwen3_8b_pacs_lora_1gpu.yaml"))
    assert "dtype" not in settings(
        plan_of("qwen3_4b_pacs.yaml", "--learning_rate", "1e-3", accelerate_config=str(ACCELERATE / "ddp.yaml"))
    )


@pytest.mark.parametrize("gpu_gb, share", [(48, 0.25), (24, 0.35)])
def test_a_vllm_share_below_the_weights_is_refused(gpu_gb, share):
    # the 1-GPU LoRA recipe once suggested 0.25 for 24-48 GB GPUs: 12 GiB for 15 GiB of Qwen3-8B weights
    plan = plan_of("qwen3_8b_pacs_lora_1gpu.yaml", "--vllm_gpu_memory_utilization", str(share), gpu_memory_gb=gpu_gb)
    findings = [f for f in plan.errors if f.setting == "vllm_gpu_memory_utilization"]
    assert findings and "cannot hold" in findings[0].message
    match = re.search(r"between (\d\.\d+) and (\d\.\d+) works", findings[0].message)
    if match:  # the share it names works
        fixed = plan_of(
            "qwen3_8b_pacs_lora_1gpu.yaml", "--vllm_gpu_memory_utilization", match[1], gpu_memory_gb=gpu_gb
        )
        assert "vllm_gpu_memory_utilization" not in settings(fixed)
    else:
        assert "No vllm_gpu_memory_utilization fits" in findings[0].message


def test_a_data_parallel_vllm_server_on_a_dense_model_is_refused():
    serve = "--model Qwen/Qwen3-4B-Base --data_parallel_size 4 --max_model_len 5120"
    overrides = ["--vllm_mode", "server", "--gradient_accumulation_steps", "64", "--steps_per_generation", "256"]
    plan = plan_of("qwen3_4b_pacs.yaml", *overrides, "--expected_world_size", "4", num_processes=4, vllm_serve=serve)
    (finding,) = [f for f in plan.errors if f.setting == "tensor_parallel_size"]
    assert "--tensor_parallel_size 4" in finding.message and "--data_parallel_size 1" in finding.message
    fixed = plan_of(
        "qwen3_4b_pacs.yaml", *overrides, "--expected_world_size", "4", num_processes=4,
        vllm_serve="--model Qwen/Qwen3-4B-Base --tensor_parallel_size 4 --max_model_len 5120",
    )  # fmt: skip
    assert not fixed.errors, fixed.render()


def test_every_problem_is_reported_not_only_the_first():
    plan = plan_of(
        "qwen3_8b_pacs_lora_1gpu.yaml",
        "--steps_per_generation", "4096", "--gradient_accumulation_steps", "1024",
        "--vllm_gpu_memory_utilization", "0.2", "--use_peft", "false",
        accelerate_config=str(ACCELERATE / "ddp.yaml"), num_processes=1, gpu_memory_gb=80,
    )  # fmt: skip
    assert {"max_num_seqs", "dtype", "vllm_gpu_memory_utilization"} <= settings(plan)


def test_colocated_tensor_parallelism_must_divide_the_world_size():
    plan = plan_of("qwen3_4b_pacs.yaml", "--vllm_tensor_parallel_size", "3")
    assert "vllm_tensor_parallel_size" in settings(plan)
    plan = plan_of("qwen3_4b_pacs.yaml", "--vllm_tensor_parallel_size", "2")
    assert "vllm_tensor_parallel_size" not in settings(plan) and "x 2 x 128 = 2048" in plan.render()


def test_risks_are_warnings():
    plan = plan_of("qwen3_4b_pacs.yaml", "--save_total_limit", "0")  # transformers: 0 / None keep every checkpoint
    assert "save_total_limit" in settings(plan, "warning") and not plan.errors
    plan = plan_of("qwen3_8b_pacs_lora_1gpu.yaml", "--per_device_eval_batch_size", "8", "--eval_limit", "500",
                   "--eval_steps", "20", "--eval_strategy", "steps", "--eval_benchmark", "math500")  # fmt: skip
    (finding,) = [f for f in plan.warnings if f.setting == "per_device_eval_batch_size"]
    assert "sequential vLLM calls" in finding.message


# ---------------------------------------------------------------------------------------------------------------------
# The command line and the training script
# ---------------------------------------------------------------------------------------------------------------------


def test_cli_exit_codes_and_overrides(capsys):
    recipe = str(RECIPES / "qwen3_4b_pacs.yaml")  # by path
    zero3 = str(ACCELERATE / "zero3.yaml")
    assert cli_main(["plan", "--config", recipe, "--accelerate-config", zero3]) == 0
    assert "Problems:" in capsys.readouterr().out
    assert cli_main(["plan", "--config", recipe, "--accelerate-config", "zero3"]) == 0  # by name
    assert "(accelerate config zero3)" in capsys.readouterr().out
    # an override on the recipe, as on train_qwen.py's command line
    code = cli_main(["plan", "--config", recipe, "--num-processes", "1", "--steps_per_generation", "1024",
                     "--gradient_accumulation_steps", "256"])  # fmt: skip
    assert code == 1 and "ERROR [max_num_seqs]" in capsys.readouterr().out
    assert cli_main(["plan", "--config", "qwen3_4b_pacs", "--num_procesess", "8"]) == 2  # an unknown key: named
    assert "num_procesess (on the command line): did you mean num_processes" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a subcommand without options refuses any
        cli_main(["recipes", "--no-such-option"])


def test_every_subcommand_reads_its_options_from_dataclasses_with_one_parser(capsys):
    # train, plan, eval and demo: `pacs.options.CommandParser` over dataclasses; help in the underscore spelling
    from pacs.demo import make_parser as demo_parser
    from pacs.eval.cli import make_parser as eval_parser
    from pacs.options import CommandParser
    from pacs.plan.entry import make_parser as plan_parser
    from pacs.recipes.reader import make_parser as train_parser

    for make in (train_parser, plan_parser, eval_parser, demo_parser):
        parser = make()
        assert type(parser) is CommandParser and parser.dataclass_types, make
        for action in parser._actions:
            long = [s for s in action.option_strings if s.startswith("--")]
            assert not long or "-" not in long[0][2:], (make.__module__, long)  # underscores first
    with pytest.raises(SystemExit):
        cli_main(["plan", "--help"])
    text = capsys.readouterr().out
    assert "--gpu_memory_gb" in text and "--accelerate_config" in text and "usage: pacs plan" in text


@pytest.fixture(scope="module")
def train_qwen():
    import pacs.train

    return pacs.train


def test_train_script_stops_before_the_model_loads(train_qwen, tiny_model_dir, monkeypatch):
    class Loaded(Exception):
        pass

    def trainer(*args, **kwargs):
        raise Loaded

    monkeypatch.setitem(
        train_qwen.ALGORITHMS, "pacs", dataclasses.replace(train_qwen.ALGORITHMS["pacs"], trainer=trainer)
    )
    base = ["--config", str(RECIPES / "tiny_cpu.yaml"), "--model_name_or_path", tiny_model_dir]
    # bf16 weights in one process at lr 1e-6: refused before the trainer (and the model) is built
    with pytest.raises(ValueError, match=r"\[dtype\].*dtype: float32"):
        train_qwen.main(*train_qwen.parse_args([*base, "--dtype", "bfloat16", "--learning_rate", "1e-6"]))
    # check_plan false only logs it; the shipped tiny recipe passes
    with pytest.raises(Loaded):
        train_qwen.main(
            *train_qwen.parse_args([*base, "--dtype", "bfloat16", "--learning_rate", "1e-6", "--check_plan", "false"])
        )
    with pytest.raises(Loaded):
        train_qwen.main(*train_qwen.parse_args(base))


def test_runtime_check_reads_the_run(train_qwen, tiny_model_dir, monkeypatch):
    script_args, args, model_args = train_qwen.parse_args(
        ["--config", str(RECIPES / "tiny_cpu.yaml"), "--model_name_or_path", tiny_model_dir]
    )
    plan = pacs_plan.check_training_plan(script_args, args, model_args)
    assert "1 processes" in plan.render() and "no DeepSpeed" in plan.render() and not plan.errors


def test_the_run_is_resolved_once_into_one_frozen_object():
    from pacs.plan.launch import recipe_launch
    from pacs.train import read_recipe

    recipe = read_recipe(["--config", "qwen3_8b_pacs_lora_1gpu", "--use_cpu", "true"])
    args, model_args = recipe.training_args, recipe.model_args
    launch, shape = recipe_launch(recipe, gpu_memory_gb=80), model_shape(model_args.model_name_or_path)
    run = pacs_plan.resolve_run(recipe.script_args, args, model_args, launch, shape)
    assert run.use_peft and run.dtype == str(model_args.dtype) and run.world_size == 1
    assert run.trainable == shape.lora_params(model_args.lora_r, model_args.lora_target_modules) < shape.num_params
    arithmetic = pacs_plan.batch_arithmetic(args, 1)
    assert run.completions_per_generation == arithmetic["completions_per_generation"]
    assert run.optimizer_steps_per_generation == arithmetic["optimizer_steps_per_generation"] == 4
    assert pacs_plan.batch_arithmetic(run, 1) == arithmetic  # the run answers TRL's arithmetic as its config does
    assert run.seq_tokens == run.prompt_tokens + args.max_completion_length
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.use_peft = False
    plan = pacs_plan.plan_run(run)
    assert plan.render() == plan_of("qwen3_8b_pacs_lora_1gpu.yaml", gpu_memory_gb=80).render()


def test_launch_from_accelerate_configs():
    zero3 = pacs_plan.read_accelerate_config(ACCELERATE / "zero3_multinode.yaml")
    assert (zero3.world_size, zero3.num_machines, zero3.zero_stage) == (16, 2, 3)
    assert pacs_plan.read_accelerate_config("zero3_multinode") == dataclasses.replace(
        zero3, source="accelerate config zero3_multinode"
    )
    ddp = pacs_plan.read_accelerate_config(ACCELERATE / "ddp.yaml")
    assert ddp.zero_stage is None and not ddp.deepspeed and isinstance(ddp, Launch)


# ---------------------------------------------------------------------------------------------------------------------
# The docs' commands
# ---------------------------------------------------------------------------------------------------------------------


def bash_blocks(path: Path) -> list[tuple[str, str]]:
    """(marker, code) of every ```bash block; the marker is the `<!-- pacs-plan: ... -->` comment right above it."""
    pattern = re.compile(r"(?:<!-- pacs-plan: (?P<marker>[^>]*?) -->\n)?```bash\n(?P<code>.*?)```", re.S)
    return [(m["marker"] or "", m["code"].replace("\\\n", " ")) for m in pattern.finditer(path.read_text())]


def launches(code: str):
    """(recipe, overrides and launch keys, vllm-serve options) of each `pacs train` launch of a GPU recipe."""
    serve = re.search(r"trl vllm-serve (.*?)(?:&|$)", code, re.M)
    code = code.replace("$((8 * SLURM_NNODES))", "16").replace("$SLURM_NNODES", "2")  # the SLURM job's 2 nodes
    for line in code.splitlines():
        match = re.search(r"pacs train --config (qwen3_\S+)(.*)", line)
        if match:
            overrides = shlex.split(match[2].split("'")[0], comments=True)
            if "--model_name_or_path" in overrides and overrides[
                overrides.index("--model_name_or_path") + 1
            ].startswith(
                "outputs/"
            ):  # a run's saved model (a weights-only restart): not there yet; plan the recipe's model
                del overrides[overrides.index("--model_name_or_path") : overrides.index("--model_name_or_path") + 2]
            yield match[1], overrides, serve[1].strip() if serve else None


def test_every_recipe_launch_in_the_docs_passes_its_plan():
    checked = 0
    for marker, code in bash_blocks(DOCS_RECIPES):
        for recipe, overrides, serve in launches(code):
            plan = plan_recipe(
                recipe, overrides=overrides, vllm_serve=serve,
                gpu_memory_gb=float(marker.split("--gpu-memory-gb ")[1].split()[0]) if "--gpu-memory-gb" in marker else None,
            )  # fmt: skip
            assert not plan.errors, f"`{code.strip()}`:\n{plan.render()}"
            checked += 1
    assert checked >= 8


def test_every_pacs_plan_command_in_the_docs_runs(capsys, monkeypatch, tiny_model_dir):
    monkeypatch.chdir(ROOT)
    commands = [
        (marker, line.strip())
        for marker, code in bash_blocks(DOCS_RECIPES)
        for line in code.splitlines()
        if line.strip().startswith("pacs plan ")
    ]
    assert len(commands) >= 9
    assert any(marker.startswith("fails") for marker, _ in commands)  # a refused launch is shown, and checked
    for marker, command in commands:
        code = cli_main(shlex.split(command.split("#")[0].replace("/tmp/tiny-qwen3", tiny_model_dir))[1:])
        output = capsys.readouterr().out
        expected = 1 if marker.startswith("fails") else 0
        assert code == expected, f"`{command}` exited {code}:\n{output}"


def test_the_readmes_commands_run_as_written(capsys, monkeypatch, tmp_path):
    """README.md's `pacs plan` lines exit 0 from any directory, and its `pacs train` lines parse, launch keys and all,
    into a launch whose plan passes (the training itself needs the GPUs the recipe names)."""
    from pacs.train import read_recipe

    monkeypatch.chdir(tmp_path)  # the shipped recipes by name, as an installed package finds them
    lines = [line.strip() for _, code in bash_blocks(ROOT / "README.md") for line in code.splitlines()]
    plans = [line for line in lines if line.startswith("pacs plan ")]
    trains = [line for line in lines if line.startswith("pacs train ")]
    assert plans and len(trains) >= 2
    for line in plans:
        assert cli_main(shlex.split(line)[1:]) == 0, f"`{line}`:\n{capsys.readouterr().out}"
    for line in trains:
        argv = shlex.split(line.split("#")[0])[2:]
        recipe = read_recipe([*argv, "--use_cpu", "true"])
        assert recipe.script_args.expected_world_size == 1 or recipe.accelerate_config is not None, line
        assert not plan_recipe(argv[1], overrides=argv[2:]).errors, line


def test_the_plan_shows_dynamic_sampling_and_its_worst_case_generation():
    assert "dynamic sampling                off" in plan_of("qwen3_4b_grpo.yaml", gpu_memory_gb=80).render()
    text = plan_of(
        "qwen3_4b_grpo.yaml", "--dynamic_sampling", "true", "--dynamic_sampling_max_rounds", "3", gpu_memory_gb=80
    ).render()
    # 8192 completions per generation, 4 optimizer steps per generation: 3 rounds = 24576 generated, 6144 per step
    assert "on: up to 3 rounds per generation = 24576 completions generated per generation at most, 6144 per " in text
    assert "(off: 2048)" in text
