"""`pacs plan`'s padding section (issue 54): every shipped GPU recipe passes its plan with `padding_free` switched on
(as its commented lines give it), the section shows the padded worst case, what packing computes and the packed mask
on sdpa / eager; and every GPU recipe carries the option, commented out."""

import re

import pytest
import yaml

from pacs.plan import plan_recipe
from pacs.plan.padding import packed_row_tokens
from pacs.recipes import RECIPES_DIR as RECIPES


GPU_RECIPES = sorted(p.name for p in RECIPES.glob("qwen3_*.yaml"))


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def section(plan, title="Padding (per micro-batch forward)") -> dict:
    return dict(next(rows for name, rows in plan.sections if name == title))


def commented_options(recipe: str) -> dict:
    """The recipe's commented-out padding-free lines, as the YAML they become when uncommented."""
    keys = ("# padding_free:", "# padding_free_max_tokens_per_row:")
    lines = [ln[2:] for ln in (RECIPES / recipe).read_text().splitlines() if ln.startswith(keys)]
    return yaml.safe_load("\n".join(lines)) or {}


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_gpu_recipe_passes_its_plan_with_padding_free_on(recipe):
    options = commented_options(recipe)
    assert options == {"padding_free": True}, recipe  # the row budget left to padding_free's default
    assert "padding_free" not in yaml.safe_load((RECIPES / recipe).read_text())  # commented out until a GPU ran it
    overrides = [f"--{key}={value}" for key, value in options.items()]
    plan = plan_recipe(recipe.removesuffix(".yaml"), overrides=overrides)
    assert not plan.errors and not plan.warnings, plan.render()
    rows = section(plan)
    settings = yaml.safe_load((RECIPES / recipe).read_text())
    S = settings["max_prompt_tokens"] + settings["max_completion_length"]
    # sdpa: packed rows no longer than the longest sequence, whose mask the padded forward builds too
    assert (
        rows["padding_free"].startswith("on")
        and f"{S:,} tokens at most (the micro-batch's longest" in rows["padding_free"]
    )
    assert rows["packed mask"].startswith(f"{S:,}^2")
    # one row per micro-batch on sdpa (a budget as large as the micro-batch): still exit 0, warning of a mask over
    # 1 GiB and naming the way out
    row = settings["per_device_train_batch_size"] * S
    plan = plan_recipe(recipe.removesuffix(".yaml"), overrides=["--padding_free=true",
                                                               f"--padding_free_max_tokens_per_row={row}"])  # fmt: skip
    assert not plan.errors, plan.render()
    expected = ["padding_free_max_tokens_per_row"] if row * row > 2**30 else []
    assert [f.setting for f in plan.warnings] == expected, plan.render()


def test_padding_section_counts_positions_and_the_mask(monkeypatch):
    plan = plan_recipe("qwen3_4b_pacs", overrides=["--padding_free=true"])
    rows = section(plan)
    # 8 rows x (1,024 prompt + 8,192 completion) padded; packed at a mean completion of 20%: 8 x (1,024 + 1,638)
    assert rows["padded (TRL)"].startswith("8 x 9216 = 73,728 positions")
    assert rows["packed"].startswith("8 x (1024 + 1638) = 21,296 real tokens") and "(29% of padded)" in rows["packed"]
    assert rows["packed mask"].startswith("9,216^2") and not plan.warnings  # sdpa: rows <= the longest sequence
    # one packed row per micro-batch on sdpa: a 5.1 GiB mask, a warning naming the way out
    plan = plan_recipe("qwen3_4b_pacs", overrides=["--padding_free=true", "--padding_free_max_tokens_per_row=73728"])
    assert section(plan)["packed mask"].startswith("73,728^2 = 5.1 GiB")
    warning = plan.warnings[0].message
    assert "leave padding_free_max_tokens_per_row unset" in warning and "flash_attention_2" in warning
    # flash-attention builds no mask
    plan = plan_recipe("qwen3_4b_pacs", overrides=["--padding_free=true", "--attn_implementation=flash_attention_2"])
    assert section(plan)["packed mask"].startswith("none") and not plan.warnings
    # off: the waste is shown, nothing packed
    rows = section(plan_recipe("qwen3_4b_pacs"))
    assert rows["padding_free"].startswith("off") and "packed mask" not in rows
    assert re.search(r"\(29% of padded\)", rows["packed"])


def test_packed_row_is_the_budget_or_a_longer_sequence():
    class Run:
        per_device_train_batch_size, seq_tokens, padding_free_max_tokens_per_row = 8, 1000, None
        attn_implementation = "flash_attention_2"

    assert packed_row_tokens(Run) == 8000  # flash-attention: one row per micro-batch
    Run.attn_implementation = None  # sdpa: rows no longer than the longest sequence
    assert packed_row_tokens(Run) == 1000
    Run.padding_free_max_tokens_per_row = 2500
    assert packed_row_tokens(Run) == 2500
    Run.padding_free_max_tokens_per_row = 600  # a sequence longer than the budget gets a row of its own
    assert packed_row_tokens(Run) == 1000
    Run.padding_free_max_tokens_per_row = 50_000  # never more than the micro-batch
    assert packed_row_tokens(Run) == 8000
