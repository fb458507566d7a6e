"""Checks of a user's own data, reward functions, model path and settings, run before anything loads or generates.

A training run that fails after the model has loaded and generated, with `KeyError: 'prompt'` from deep inside TRL or
`TypeError: missing 1 required positional argument`, costs a user far more than an error at start-up that names the
fix. The functions here are pure (no trainer needed) so that `HardenedGRPOTrainer` (and so `PACSTrainer`), `pacs train`
and `pacs eval` share them; what a run checks while it runs (reward outputs, batches without a reward, gradients) is in
`pacs.grpo.guards`.

- [`check_train_dataset`]: the dataset has a `prompt` column (unless an environment supplies the prompts) and rows,
  and every reward function can be called with the keywords TRL will pass it (its own, see
  `_compat.TRL_REWARD_KWARGS`, plus the dataset's columns). It refuses only what `GRPOTrainer` cannot train on;
  where it cannot tell (a rollout function adding fields, a stream of unknown columns), it lets the data through.
- [`check_trainer_datasets`]: the same for every dataset a trainer is given.
- [`check_model_path`]: a model argument that is meant as a local directory exists (hub ids by `huggingface_hub`'s
  own rules).
- [`check_trainer_args`], [`check_eval_batch`]: a trainer's `args` (a default config for `None`, an error naming the
  fix for the wrong class), and its evaluation batch.

>>> def my_reward(completions, answer, **kwargs):
...     return [1.0 for _ in completions]
>>> from datasets import Dataset
>>> ds = Dataset.from_dict({"prompt": ["1+1?"], "solution": ["2"]})
>>> check_train_dataset(ds, my_reward)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: The reward function my_reward needs the keyword `answer`, but train_dataset has no column 'answer' ...
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._compat import TRL_REWARD_KWARGS
from .model_checks import check_model_folder, check_model_path  # noqa: F401 (re-exported: this module's public names)


logger = logging.getLogger(__name__)

__all__ = [
    "check_dynamic_sampling",
    "check_eval_batch",
    "check_importance_sampling",
    "check_model_folder",
    "check_model_path",
    "check_padding_free",
    "check_train_dataset",
    "check_trainer_datasets",
    "check_trainer_args",
    "reward_keywords",
]

_NOT_FORWARDED = frozenset({"prompt", "completion", "completion_ids"})
"""Dataset columns TRL does not forward to reward functions as they are (it passes `prompts` and `completions`)."""


# ---------------------------------------------------------------------------------------------------------------------
# The training set and the reward functions' signatures
# ---------------------------------------------------------------------------------------------------------------------


def _callable_name(func: Callable) -> str:
    while isinstance(func, functools.partial):
        func = func.func
    return getattr(func, "__name__", type(func).__name__)


def _column_names(dataset) -> list[str] | None:
    names = getattr(dataset, "column_names", None)
    if names is None and getattr(dataset, "features", None) is not None:  # IterableDataset with known features
        names = list(dataset.features)
    return list(names) if names is not None else None


def _rename_hint(missing: str, columns: Sequence[str]) -> str:
    source = next((c for c in columns if c not in ("prompt", "id", "problem")), "<column>")
    return (
        f'dataset.rename_column("{source}", "{missing}") (or, to keep both, '
        f'dataset.add_column("{missing}", dataset["{source}"]))'
    )


def check_train_dataset(
    dataset,
    reward_funcs: Callable | str | Sequence[Callable | str] | None = None,
    reward_func_names: Sequence[str] | None = None,
    name: str = "train_dataset",
    remove_unused_columns: bool = False,
    rollout_func: Callable | None = None,
    environment_factory: Callable | Mapping[str, Callable] | None = None,
) -> None:
    """Fail early, with the fix, when `dataset` cannot be trained on with `reward_funcs`.

    Checks that `dataset` has a `prompt` column and at least one row, and that every callable reward function can be
    called the way TRL calls it: with keywords only, namely `_compat.TRL_REWARD_KWARGS` and every dataset column except
    `prompt`/`completion`/`completion_ids`. A required parameter (no default) that is none of these is a missing
    column; a function without `**kwargs` must name every keyword TRL passes. Reward models (`nn.Module`s or
    hub ids) are not checked. For an `IterableDataset` whose columns are unknown (no `features`), the column checks are
    skipped rather than reading from a possibly streaming source; its length is never checked.

    With an `environment_factory` (TRL 1.16), the environment owns the data: `prompt` may be missing (each rollout's
    `reset()` supplies it), and with several environments (a dict) each row names its environment in an `environment`
    column, which is required. With a `rollout_func`, a reward parameter that is no dataset column may be one of the
    rollout's extra fields, so it is not an error. Tools change nothing here. TRL calls each environment's
    `reset(**row)`; where the factory is a class, its `reset` is checked against the columns that reach it (see
    `_check_environments`).

    Args:
        dataset (`datasets.Dataset`, `datasets.IterableDataset` or `None`):
            The training (or evaluation) set; `None` is not checked.
        reward_funcs (`Callable`, `str` or a list of them, *optional*):
            The trainer's reward functions.
        reward_func_names (`Sequence[str]`, *optional*):
            Their display names (the trainer's `reward_func_names`); defaults to each function's `__name__`.
        name (`str`, *optional*, defaults to `"train_dataset"`):
            What to call the dataset in messages (e.g. `"eval_dataset"`).
        remove_unused_columns (`bool`, *optional*, defaults to `False`):
            The trainer's `args.remove_unused_columns`: when `True`, TRL keeps only `prompt` (and images), so no other
            column reaches the reward functions or the environments.
        rollout_func (`Callable`, *optional*):
            The trainer's `rollout_func`. Its extra fields reach the reward functions too, so with one, a required
            parameter that is no dataset column is not an error (the `**kwargs` check still runs).
        environment_factory (`Callable` or `dict[str, Callable]`, *optional*):
            The trainer's `environment_factory`: one environment for every row, or several selected by each row's
            `environment` column. Reward functions then also receive `environments`.

    Raises:
        `ValueError`: naming the missing column or the empty dataset, the columns present and how to fix it.
    """
    if dataset is None:
        return
    columns = _column_names(dataset)
    if columns is not None and environment_factory is not None:
        _check_environments(columns, environment_factory, remove_unused_columns, name)
    if columns is not None and environment_factory is None:
        _check_prompt_column(columns, name)
    if hasattr(dataset, "__len__") and not _is_iterable_dataset(dataset) and len(dataset) == 0:
        raise ValueError(
            f"{name} is empty (0 rows, columns {columns}), so there is nothing to train on. Check the file or split "
            "you loaded, and any `limit` / `--dataset_limit` or filter applied to it."
        )
    if columns is None or reward_funcs is None:
        return

    funcs = [reward_funcs] if callable(reward_funcs) or isinstance(reward_funcs, str) else list(reward_funcs)
    names = list(reward_func_names) if reward_func_names is not None else [None] * len(funcs)
    # `environments` only with an environment_factory (TRL's `self.environments`)
    trl_kwargs = TRL_REWARD_KWARGS if environment_factory is not None else TRL_REWARD_KWARGS - {"environments"}
    available = trl_kwargs | (set(_kept_columns(columns, remove_unused_columns)) - _NOT_FORWARDED)
    for func, func_name in zip(funcs, names):
        if isinstance(func, str) or not callable(func) or _is_module(func):
            continue  # a reward model: TRL feeds it the text, not keywords
        _check_reward_signature(
            func, func_name or _callable_name(func), name, columns, trl_kwargs, available, rollout_func
        )


def reward_keywords(reward_funcs: Callable | Sequence[Callable | str]) -> list[str]:
    """The keywords the callable `reward_funcs` name in their signatures beyond what TRL passes on its own
    (`_compat.TRL_REWARD_KWARGS`): the dataset columns they can read, in order of first mention.

    >>> def needs_hint(completions, hint, solution=None, **kwargs): ...
    >>> reward_keywords([needs_hint])
    ['hint', 'solution']
    """
    funcs = [reward_funcs] if callable(reward_funcs) else list(reward_funcs)
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    names: list[str] = []
    for func in funcs:
        if isinstance(func, str) or not callable(func) or _is_module(func):
            continue
        try:
            params = inspect.signature(func).parameters.values()
        except (TypeError, ValueError):
            continue
        names += [p.name for p in params if p.kind not in variadic and p.name not in TRL_REWARD_KWARGS]
    return list(dict.fromkeys(names))


def check_trainer_datasets(trainer_kwargs: Mapping[str, Any], reward_funcs, args) -> None:
    """[`check_train_dataset`] on every dataset a trainer is given (`train_dataset`, `eval_dataset`, either a dict of
    datasets), named in the message as the user passed it, with the trainer's `rollout_func` and `environment_factory`;
    and [`check_dynamic_sampling`] on the training set.
    """
    check_dynamic_sampling(
        args, trainer_kwargs.get("train_dataset"), reward_funcs, trainer_kwargs.get("environment_factory")
    )
    for name in ("train_dataset", "eval_dataset"):
        data = trainer_kwargs.get(name)
        for key, dataset in data.items() if isinstance(data, dict) else [(None, data)]:
            check_train_dataset(
                dataset, reward_funcs, name=name if key is None else f"{name}[{key!r}]",
                remove_unused_columns=args.remove_unused_columns, rollout_func=trainer_kwargs.get("rollout_func"),
                environment_factory=trainer_kwargs.get("environment_factory"),
            )  # fmt: skip


def _check_prompt_column(columns: list[str], name: str) -> None:
    if "prompt" in columns:
        return
    source = next((c for c in ("problem", "question", "messages", "query", "input") if c in columns), None)
    fix = (
        f'dataset.rename_column("{source}", "prompt")'
        if source
        else 'dataset.rename_column("<your column>", "prompt")'
    )
    raise ValueError(
        f"{name} has no 'prompt' column (its columns are {columns}); TRL generates from `prompt`, a string or "
        f"a list of {{'role', 'content'}} messages. Rename the column that holds the prompts, e.g. {fix}, "
        "or load the data with `pacs.data.load_train_dataset(path, problem_column=..., answer_column=...)`."
    )


def _check_reward_signature(func, func_name, name, columns, trl_kwargs, available, rollout_func) -> None:
    """One reward function against the keywords TRL will call it with (`available`: TRL's own and the columns)."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # a builtin or C callable without a signature: nothing to check
        return
    params = list(signature.parameters.values())
    unexpected = _unexpected_keywords(params, available)
    if unexpected:
        raise ValueError(
            f"The reward function {func_name}{signature} does not take **kwargs, but TRL calls every reward "
            f"function with the keywords {sorted(trl_kwargs)} and every column of {name} ({columns}), so "
            f"{unexpected} would be unexpected keyword arguments. Add **kwargs to its parameters: "
            f"def {func_name}(completions, ..., **kwargs)."
        )
    for param in _required(params):
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise ValueError(
                f"The reward function {func_name}{signature} has the positional-only parameter {param.name!r}, "
                "but TRL passes everything by keyword; make it a regular parameter (drop the `/`)."
            )
        if param.name not in available and rollout_func is None:
            raise _missing_keyword_error(func_name, param.name, name, columns)


class MissingColumnError(ValueError):
    """A reward function needs a column that the data lacks (the fix in the message is Python's; `pacs train` adds
    its own, for a data file)."""


def _missing_keyword_error(func_name: str, keyword: str, name: str, columns: list[str]) -> ValueError:
    """Why TRL would not pass the required parameter `keyword` to the reward function, and the fix."""
    if keyword == "environments" and "environments" not in columns:
        return ValueError(
            f"The reward function {func_name} needs the keyword `environments`, which TRL passes only to the "
            "rewards of a trainer built with an `environment_factory` (one environment instance per "
            f"completion). Pass environment_factory=..., or give the parameter a default: "
            f"def {func_name}(completions, environments=None, **kwargs)."
        )
    if keyword in ("prompt", "completion"):
        return ValueError(
            f"The reward function {func_name} needs the keyword `{keyword}`, which TRL never passes: it "
            f"passes the prompts as `prompts` and the completions as `completions`. Rename the parameter to "
            f"`{keyword}s`."
        )
    if keyword in columns:  # remove_unused_columns=True dropped it
        return ValueError(
            f"The reward function {func_name} needs the column {keyword!r}, but remove_unused_columns=True "
            "makes TRL drop every column but 'prompt' before the reward functions see it; set "
            "remove_unused_columns=False (GRPOConfig's default)."
        )
    return MissingColumnError(
        f"The reward function {func_name} needs the keyword `{keyword}`, but {name} has no column "
        f"{keyword!r} (its columns are {columns}); TRL passes each dataset column to the reward functions "
        f"under its own name. Rename the column that holds it, e.g. {_rename_hint(keyword, columns)}, or "
        f"map it in the reward function: functools.partial({func_name}, {keyword}=...) for a constant, or "
        f"lambda completions, **kw: {func_name}(completions, {keyword}=kw['<column>'], **kw)."
    )


_KEPT_COLUMNS = ("prompt", "image", "images")
"""The columns TRL's `GRPOTrainer` keeps when `remove_unused_columns=True` (its `_signature_columns`)."""


def _kept_columns(columns: list[str], remove_unused_columns: bool) -> list[str]:
    """The columns of each row that reach the reward functions and environments."""
    return [c for c in columns if c in _KEPT_COLUMNS] if remove_unused_columns else list(columns)


def _unexpected_keywords(params: list[inspect.Parameter], keywords) -> list[str]:
    """The `keywords` a callable with `params` would reject (none when it takes **kwargs)."""
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return []
    return sorted(set(keywords) - {p.name for p in params})


def _required(params: list[inspect.Parameter]) -> list[inspect.Parameter]:
    """The parameters without a default, less *args and **kwargs."""
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p for p in params if p.default is inspect.Parameter.empty and p.kind not in variadic]


def _check_environments(
    columns: list[str], environment_factory: Callable | Mapping[str, Callable], remove_unused_columns: bool, name: str
) -> None:
    """What TRL 1.16 does with each row of an environment's data, checked before anything loads.

    TRL calls `environment.reset(**row)` on every rollout, with the row's columns (less `environment` with several
    environments) as keywords, after `remove_unused_columns=True` has dropped all but `prompt` and images; several
    environments need an `environment` column to route each row (unless one has the key `None`). Each check
    below is a run that `GRPOTrainer` would stop at its first generation, or at `train()`, or silently send rows to the
    wrong environment. A `reset` is checked only where the factory is a class, so that nothing is constructed here; any
    other factory (a function, a `functools.partial`) is not checked.
    """
    multi = isinstance(environment_factory, Mapping)
    if multi and "environment" not in columns and None not in environment_factory:
        raise ValueError(
            f"{name} has no 'environment' column (its columns are {columns}), but environment_factory is a dict of "
            f"several environments ({sorted(map(str, environment_factory))}), so TRL reads each row's `environment` "
            'to pick one. Add the column, e.g. dataset.add_column("environment", [...]) with one of those names '
            "per row, or pass a single factory (environment_factory=MyEnvironment) to use one environment for all."
        )
    kept = _kept_columns(columns, remove_unused_columns)
    fix = "set remove_unused_columns=False (GRPOConfig's default), which hands every column to the environments"
    if remove_unused_columns and not kept:
        raise ValueError(
            f"{name} has the columns {columns}, and remove_unused_columns=True drops every column but "
            f"{list(_KEPT_COLUMNS)}, so nothing of {name} would reach the trainer (transformers stops at train() with "
            f"'No columns in the dataset match'); {fix}."
        )
    if remove_unused_columns and multi and "environment" in columns:
        if None not in environment_factory:
            raise ValueError(
                f"remove_unused_columns=True drops the 'environment' column of {name}, which TRL reads to pick each "
                f"row's environment among {sorted(map(str, environment_factory))}, so the first generation would fail "
                f"with `environment=None`; {fix}."
            )
        logger.warning(
            "remove_unused_columns=True drops the 'environment' column of %s, so every row goes to the environment "
            "of key None; %s.", name, fix,
        )  # fmt: skip
    passed = [c for c in kept if not (multi and c == "environment")]
    factories = environment_factory.items() if multi else [(None, environment_factory)]
    for env_name, factory in factories:
        _check_reset(factory, env_name, name, columns, passed, multi, fix)


def _check_reset(factory, env_name, name: str, columns: list[str], passed: list[str], multi: bool, fix: str) -> None:
    """An environment class's `reset` against the columns that reach it (`passed`): TRL calls `reset(**row)`."""
    if not inspect.isclass(factory) or not callable(getattr(factory, "reset", None)):
        return  # cannot tell without building it (and TRL itself refuses a missing `reset`)
    try:
        params = list(inspect.signature(factory.reset).parameters.values())
    except (TypeError, ValueError):
        return
    if not isinstance(inspect.getattr_static(factory, "reset"), (staticmethod, classmethod)) and params:
        params = params[1:]  # self
    label = f"{factory.__name__}.reset" + ("" if env_name is None else f" (environment {env_name!r})")
    unexpected = _unexpected_keywords(params, passed)
    if unexpected:
        raise ValueError(
            f"{label} does not take **kwargs, but TRL calls reset(**row) with every column of {name} that "
            f"reaches it ({passed}), so {unexpected} would be unexpected keyword arguments at the first "
            f"generation. Add **kwargs to its parameters: def reset(self, ..., **kwargs)."
        )
    for param in _required(params):
        if param.name in passed:
            continue
        dropped = param.name in columns and param.name != "environment"
        raise ValueError(
            f"{label} needs the keyword `{param.name}`, which TRL takes from each row of {name}, but "
            + (
                f"remove_unused_columns=True drops the column {param.name!r}; {fix}."
                if dropped
                else f"{name} has no such column (its columns are {columns}"
                + ("; TRL keeps `environment` to itself" if param.name == "environment" and multi else "")
                + f"). Add the column, or give the parameter a default: def reset(self, {param.name}=None, "
                "**kwargs)."
            )
        )


def _is_module(obj: Any) -> bool:
    try:
        from torch import nn
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return isinstance(obj, nn.Module)


def _is_iterable_dataset(dataset: Any) -> bool:
    try:
        from datasets import IterableDataset
    except ImportError:  # pragma: no cover - datasets is a dependency
        return False
    return isinstance(dataset, IterableDataset)


# ---------------------------------------------------------------------------------------------------------------------
# The trainer's settings and the labels
# ---------------------------------------------------------------------------------------------------------------------


def check_trainer_args(model, args, config_cls: type, trainer_name: str, algorithm: str):
    """`args` for a trainer that needs a `config_cls`: a default one for `None` (output folder `<model>-<algorithm>`, as
    TRL names it), a `TypeError` naming the fix for any other config (e.g. TRL's `GRPOConfig` for `PACSTrainer`)."""
    from transformers import TrainingArguments
    from trl.trainer.utils import get_config_model_id

    if args is None:
        model_name = model if isinstance(model, str) else get_config_model_id(model.config)
        return config_cls(f"{model_name.split('/')[-1]}-{algorithm}")
    if not isinstance(args, config_cls):
        name = config_cls.__name__
        hint = (
            f" Build one with {name}(**{{k: v for k, v in args.to_dict().items() if not k.startswith('_')}})"
            f" or construct {name} directly."
            if isinstance(args, TrainingArguments)
            else ""
        )
        raise TypeError(f"{trainer_name} needs args={name}(...), got {type(args).__name__}.{hint}")
    return args


def check_padding_free(model, args) -> None:
    """With `args.padding_free`, before the model loads: refuse in one line what packed forwards cannot serve exactly,
    `use_liger_kernel` (its loss takes the padded batch), vision-language models (their image inputs are laid out per
    padded row) and attention implementations that do not isolate packed sequences (`pacs.grpo.padding_free`)."""
    if not getattr(args, "padding_free", False):
        return
    from .padding_free import PACKED_ATTENTION

    way_out = "set padding_free: false"
    if args.use_liger_kernel:
        raise ValueError(f"padding_free does not support use_liger_kernel; {way_out} or use_liger_kernel: false.")
    init_kwargs = args.model_init_kwargs if isinstance(args.model_init_kwargs, dict) else {}
    config, attn = None, init_kwargs.get("attn_implementation")
    if isinstance(model, str):
        try:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(model)
        except (OSError, ValueError):  # unreadable here: transformers says why when it loads the model
            config = None
    else:
        config = getattr(model, "config", None)
        attn = getattr(config, "_attn_implementation", None)
    if config is not None and config.get_text_config() is not config:
        raise ValueError(f"padding_free does not support vision-language models ({type(config).__name__}); {way_out}.")
    if attn is not None and attn not in PACKED_ATTENTION:
        raise ValueError(
            f"padding_free needs an attention implementation that isolates packed sequences "
            f"({', '.join(PACKED_ATTENTION)}), got attn_implementation={attn!r}; use one of them or {way_out}."
        )


def check_dynamic_sampling(args, train_dataset, reward_funcs, environment_factory=None) -> None:
    """With `args.dynamic_sampling`: the top-ups need a map-style training set (the layer draws rows by index) of text
    prompts (a top-up batch is assembled from per-row tensors: image columns cannot be), an `environment_factory` needs
    a training set whose rows the top-ups draw (TRL's stand-in without one repeats a single prompt: nothing fresh to
    draw), and a `dynamic_sampling_metric` other than "reward" must name a reward function (TRL's `reward_func_names`:
    a function's `__name__`, a reward model's name after its last `/`). Raises `ValueError` naming the fix, before the
    model loads.
    """
    if not getattr(args, "dynamic_sampling", False):
        return
    if train_dataset is None and environment_factory is not None:
        raise ValueError(
            "dynamic_sampling tops a generation batch up with fresh rows of train_dataset, but this environment_factory "
            "has none (TRL then repeats one placeholder prompt); pass train_dataset with one row per episode (e.g. a "
            "`seed` or `level` column that reset() reads), or turn dynamic_sampling off."
        )
    images = [c for c in ("image", "images") if c in (getattr(train_dataset, "column_names", None) or [])]
    if images:
        raise ValueError(
            f"dynamic_sampling assembles batches from per-row tensors, which image inputs are not (train_dataset has "
            f"the column {images[0]!r}); turn dynamic_sampling off for multimodal data."
        )
    if train_dataset is not None and (_is_iterable_dataset(train_dataset) or not hasattr(train_dataset, "__len__")):
        raise ValueError(
            f"dynamic_sampling draws its top-up prompts by index, so train_dataset must be a map-style dataset (a "
            f"`datasets.Dataset`), not {type(train_dataset).__name__}; load it without streaming=True, or turn "
            "dynamic_sampling off."
        )
    metric = args.dynamic_sampling_metric
    if metric == "reward" or reward_funcs is None:
        return
    funcs = [reward_funcs] if callable(reward_funcs) or isinstance(reward_funcs, str) else list(reward_funcs)
    names = [f.split("/")[-1] if isinstance(f, str) else _callable_name(f) for f in funcs]
    if metric not in names:
        raise ValueError(
            f"dynamic_sampling_metric={metric!r} is neither 'reward' (the weighted reward sum) nor the name of a "
            f"reward function; the reward functions are {names}."
        )


def check_importance_sampling(args) -> None:
    """TRL's vLLM importance-sampling correction (`vllm_importance_sampling_correction`, on by default) compares the
    trainer's log-probs with vLLM's; under truncated sampling (`top_p < 1`, `top_k > 0`, `min_p > 0`, in the config or
    in `generation_kwargs`) vLLM's are those of the truncated distribution, so the ratio is biased
    (https://github.com/huggingface/trl/issues/6789, open). Warns naming the settings and the ways out."""
    if not (getattr(args, "use_vllm", False) and getattr(args, "vllm_importance_sampling_correction", False)):
        return
    settings = {"top_p": args.top_p, "top_k": args.top_k, "min_p": args.min_p, **(args.generation_kwargs or {})}
    truncating = [
        f"{key}={value}"
        for key, value, active in (
            ("top_p", settings.get("top_p"), lambda v: v < 1),
            ("top_k", settings.get("top_k"), lambda v: v > 0),
            ("min_p", settings.get("min_p"), lambda v: v > 0),
        )
        if value is not None and active(value)
    ]
    if truncating:
        logger.warning(
            "Sampling with %s truncates the distribution vLLM samples from, so TRL's vLLM importance-sampling ratio "
            "(vllm_importance_sampling_correction, on) compares the trainer's full-distribution log-probs with the "
            "truncated ones and is biased (TRL issue #6789). Sample with top_p=1, top_k=0 and min_p=0 (the recipes "
            "do), or set vllm_importance_sampling_correction=False.", ", ".join(truncating),
        )  # fmt: skip


def check_eval_batch(per_device_eval_batch_size: int, world_size: int, num_generations_eval: int) -> None:
    """GRPOTrainer computes its group advantages in evaluation too: the eval batch over all processes must hold whole
    groups of `num_generations_eval` (a loss that replaces GRPO's may need none; TRL's advantages still do)."""
    G, W, batch = num_generations_eval, world_size, per_device_eval_batch_size
    if (W * batch) % G != 0:
        valid = [b for b in range(1, 4 * G + 1) if (W * b) % G == 0][:3]
        raise ValueError(
            f"per_device_eval_batch_size ({batch}) x {W} process(es) must be a multiple of num_generations_eval "
            f"({G}) so that TRL's evaluation sees whole groups; use per_device_eval_batch_size in {valid} or "
            "set num_generations_eval."
        )
