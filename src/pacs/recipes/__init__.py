"""The recipes and accelerate launch configs shipped with the package, addressable by name or by path.

The recipes (`*.yaml` beside this file) are flat YAML files of `pacs train` arguments; the accelerate configs live in
`pacs/accelerate_configs/`, as TRL's in `trl/accelerate_configs/`. Both are package data: an installed wheel finds
them wherever it runs. A value that names an existing file is that file (a path wins over a name); otherwise it is
looked up by name, with or without `.yaml`.

`pacs recipes` lists the recipes with the hardware each is written for:

    pacs recipes
    pacs train --config qwen3_4b_pacs          # the recipe by name
    pacs train --config ./my_recipe.yaml       # or by path

>>> resolve_recipe("tiny_cpu").name
'tiny_cpu.yaml'
>>> resolve_accelerate_config("zero3").name
'zero3.yaml'
"""

from __future__ import annotations

from pathlib import Path


RECIPES_DIR = Path(__file__).resolve().parent
ACCELERATE_CONFIGS_DIR = RECIPES_DIR.parent / "accelerate_configs"


def recipe_names() -> list[str]:
    return sorted(path.stem for path in RECIPES_DIR.glob("*.yaml"))


def accelerate_config_names() -> list[str]:
    return sorted(path.stem for path in ACCELERATE_CONFIGS_DIR.glob("*.yaml"))


def _resolve(value: str, directory: Path, names: list[str], what: str, listing: str) -> Path:
    if Path(value).is_file():
        return Path(value)
    name = value.removesuffix(".yaml")
    if "/" not in name and (directory / f"{name}.yaml").is_file():
        return directory / f"{name}.yaml"
    from ..options import did_you_mean

    close = did_you_mean(Path(name).name, names, cutoff=0.5)
    hint = f" {close[0].upper()}{close[1:]}" if close else ""
    raise FileNotFoundError(
        f"{what} {value!r} is neither a file nor the name of a shipped one.{hint} Shipped: {', '.join(names)} "
        f"({listing})."
    )


def resolve_recipe(value: str | Path) -> Path:
    """The recipe file `value` names: an existing path, else a shipped recipe's name (`qwen3_4b_pacs`)."""
    return _resolve(str(value), RECIPES_DIR, recipe_names(), "Recipe", "`pacs recipes` lists them")


def resolve_accelerate_config(value: str | Path) -> Path:
    """The accelerate config file `value` names: an existing path, else a shipped config's name (`zero3`)."""
    return _resolve(
        str(value),
        ACCELERATE_CONFIGS_DIR,
        accelerate_config_names(),
        "Accelerate config",
        "in pacs/accelerate_configs",
    )


def describe(path: Path) -> dict[str, str]:
    """A recipe's name, algorithm, model, hardware line and first comment line, for `pacs recipes`."""
    import yaml

    recipe = yaml.safe_load(path.read_text()) or {}
    processes = recipe.get("expected_world_size")
    gpu = recipe.get("expected_gpu_memory_gb")
    if recipe.get("use_cpu"):
        hardware = f"CPU, {processes or 1} process(es)"
    else:
        hardware = f"{processes or '?'} GPU(s)" + (f" x {gpu:g} GiB" if gpu else "")
    hardware += f", accelerate config {recipe['accelerate_config']}" if recipe.get("accelerate_config") else ""
    first = next((line.lstrip("# ").strip() for line in path.read_text().splitlines() if line.startswith("#")), "")
    summary = first.split(": ")[0].split("; ")[0].rstrip(".")  # the first clause: what the recipe is
    return {
        "name": path.stem,
        "algorithm": str(recipe.get("algorithm", "pacs")),
        "model": str(recipe.get("model_name_or_path") or "(--model_name_or_path)"),
        "hardware": hardware,
        "summary": summary,
    }


def render_recipes() -> str:
    rows = [describe(RECIPES_DIR / f"{name}.yaml") for name in recipe_names()]
    width = {key: max(len(row[key]) for row in rows) for key in ("name", "model", "hardware")}
    lines = [
        f"{row['name']:<{width['name']}}  {row['model']:<{width['model']}}  {row['hardware']:<{width['hardware']}}  "
        f"{row['summary']}"
        for row in rows
    ]
    lines.append(
        f"\nIn {RECIPES_DIR}. Run one with `pacs train --config NAME`, check it with `pacs plan --config NAME`."
    )
    return "\n".join(lines)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "recipes",
        help="List the shipped training recipes and the hardware each is written for.",
        description="List the recipes shipped with the package (`pacs train --config NAME` runs one).",
    )
    parser.set_defaults(func=run)


def run(args) -> int:
    print(render_recipes())  # the command's output
    return 0
