"""The `pacs` command line as one front door (`pacs.cli`, `pacs.options`): one module reads options and reports
mistakes for every subcommand, `pacs train` reads its command line once, one algorithm table, and a house without
import circles."""

import argparse
import ast
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "pacs"


# ---------------------------------------------------------------------------------------------------------------------
# The house: no import circle among the modules of src/pacs
# ---------------------------------------------------------------------------------------------------------------------


def _nodes(tree: ast.AST):
    """Every node of `tree`, the bodies of `if TYPE_CHECKING:` left out."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in [child, *_nodes(child)])
            continue
        yield node
        yield from _nodes(node)


def import_graph(package: Path) -> dict[str, set[str]]:
    """module -> the modules of `package` it imports, read with `ast`: imports at module level and inside functions
    (a function-level import is still an arrow of the house; it only runs later) alike; imports under
    `if TYPE_CHECKING:` are left out (they never run). `from . import x` is an arrow to the module `x` where there is
    one, else to the package whose name it reads."""
    root = package.parent
    modules = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def owner(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for module, path in modules.items():
        here = module if path.name == "__init__.py" else module.rpartition(".")[0]
        arrows = set()
        for node in _nodes(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                arrows |= {owner(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = here.split(".")[: len(here.split(".")) - node.level + 1] if node.level else []
                name = ".".join([*base, *([node.module] if node.module else [])])
                arrows |= {f"{name}.{a.name}" if f"{name}.{a.name}" in modules else owner(name) for a in node.names}
        graph[module] = {target for target in arrows if target and target != module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan): each is a circle of imports."""
    index, low, stack, found = {}, {}, [], []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while component[-1:] != [node]:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in list(graph):
        if node not in index:
            visit(node)
    return found


def test_src_has_no_import_circle():
    graph = import_graph(SRC)
    assert {"pacs.cli", "pacs.options", "pacs.train", "pacs.grpo.trainer"} <= set(graph)
    assert "pacs.options" in graph["pacs.recipes.reader"]  # the graph sees module-level arrows...
    assert "pacs.train" in graph["pacs.cli"]  # ... and function-level ones (`pacs train` imports it when it runs)
    assert circles(graph) == []


def test_the_circle_check_finds_a_circle_through_a_function_level_import(tmp_path):
    # the shape of the circle this test was written for: a module low in the house importing the command line's
    package = tmp_path / "house"
    (package / "plan").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "cli.py").write_text("def main():\n    from .plan import run\n")
    (package / "plan" / "__init__.py").write_text("from .entry import run\n")
    (package / "plan" / "entry.py").write_text("from ..cli import did_you_mean\n")
    assert circles(import_graph(package)) == [["house.cli", "house.plan", "house.plan.entry"]]
    (package / "plan" / "entry.py").write_text("if TYPE_CHECKING:\n    from ..cli import did_you_mean\n")
    assert circles(import_graph(package)) == []


# ---------------------------------------------------------------------------------------------------------------------
# One module owns the command line
# ---------------------------------------------------------------------------------------------------------------------


def test_one_module_names_close_matches_and_reports_errors():
    # every "did you mean", every unknown-option message and every `<prog>: error:` line of every subcommand comes from
    # `pacs.options`; no module reads argparse's private tables but the one place accelerate offers no other way
    sources = {str(p.relative_to(SRC)): p.read_text() for p in SRC.rglob("*.py")}

    def files(pattern: str) -> list[str]:
        return sorted(name for name, text in sources.items() if re.search(pattern, text))

    assert files("get_close_matches") == files(r"def did_you_mean\b") == ["options.py"]
    assert files(r"def unknown_options_error\b|Unknown key\(s\)") == ["options.py"]
    assert files(r"error: \{") == ["options.py"]
    assert files(r"\._actions\b|\._option_string_actions\b") == ["recipes/reader.py"]
    assert sources["recipes/reader.py"].count("_option_string_actions") == 1  # accelerate's launch options
    assert files(r"def _subtract_subsequence") == []  # no copy of TRL's helper


def test_importing_the_command_line_imports_no_trl():
    code = (
        "import sys, pacs.cli, pacs.options; pacs.cli.build_parser(); assert 'trl' not in sys.modules; "
        "pacs.options.CommandParser; assert 'trl' in sys.modules; print(pacs.options.CommandParser.__name__)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "CommandParser", result.stderr[-2000:]


def test_unknown_options_error_names_each_key_and_the_closest_ones():
    from pacs.options import did_you_mean, unknown_options_error

    error = unknown_options_error(
        [("--lerning_rate=1", "on the command line"), ("no_progress", "in the --config file", "write `x: false`")],
        ["learning_rate", "progress"],
        "an option",
    )
    assert str(error).splitlines() == [
        "Unknown key(s), not an option:",
        "  lerning_rate (on the command line): did you mean learning_rate?",
        "  no_progress (in the --config file): write `x: false`",
    ]
    assert did_you_mean("zzz", ["learning_rate"]) == ""


@pytest.mark.parametrize(
    "argv, prefix, message",
    [
        (["train", "--config", "tiny_cpu", "--lerning_rate", "1"], "pacs train", "did you mean learning_rate"),
        (["plan", "--config", "tiny_cpu", "--num_procesess", "8"], "pacs plan", "did you mean num_processes"),
        (["eval", "--model", "m", "--output_dir", "o", "--temprature", "1"], "pacs eval", "did you mean temperature"),
        (["demo", "--algorithm", "grpo"], "pacs demo", "invalid choice: 'grpo'"),
        (["train", "--config", "tiny_cp"], "pacs train", "Did you mean tiny_cpu"),
    ],
)
def test_every_subcommand_reports_a_mistake_the_same_way(argv, prefix, message, capsys):
    from pacs.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{prefix}: error: ") and message in err and "Traceback" not in err, err


# ---------------------------------------------------------------------------------------------------------------------
# `pacs train`: read once; the launcher launches, the script trains
# ---------------------------------------------------------------------------------------------------------------------


def test_pacs_train_reads_its_command_line_once(tiny_model_dir, monkeypatch):
    import pacs.train

    calls = []
    parse_known_args = argparse.ArgumentParser.parse_known_args

    def counting(self, *args, **kwargs):
        calls.append(type(self).__name__)
        return parse_known_args(self, *args, **kwargs)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", counting)
    ran = []
    monkeypatch.setattr(pacs.train, "main", lambda *arguments: ran.append(arguments))
    from pacs.cli import main

    assert main(["train", "--config", "tiny_cpu", "--model_name_or_path", tiny_model_dir, "--max_steps", "3"]) == 0
    # argparse's dispatch to the subcommand (the top parser and its `train` subparser), then the recipe and its
    # overrides, once
    assert calls == ["ArgumentParser", "ArgumentParser", "CommandParser"]
    ((script_args, training_args, model_args),) = ran  # nothing to launch: the script's main, in this process
    assert training_args.max_steps == 3 and model_args.model_name_or_path == tiny_model_dir


def test_main_releases_the_output_folder_once(monkeypatch, tmp_path):
    import pacs.train

    released = []
    monkeypatch.setattr(pacs.train, "release_output_dir", released.append)
    monkeypatch.setattr(pacs.train, "prepare", lambda *arguments: (None,) * 4)
    monkeypatch.setattr(pacs.train, "train", lambda *arguments: None)
    training_args = argparse.Namespace(output_dir=str(tmp_path))
    pacs.train.main(None, training_args, None)
    assert released == [str(tmp_path)]

    def failing(*arguments):
        raise RuntimeError("boom")

    monkeypatch.setattr(pacs.train, "train", failing)
    with pytest.raises(RuntimeError, match="boom"):
        pacs.train.main(None, training_args, None)
    assert released == [str(tmp_path)] * 2


def test_the_launch_passes_the_command_line_whole(monkeypatch, tiny_model_dir):
    # TRL's convention: the launched script reads the launch keys itself and sets them aside
    import accelerate.commands.launch

    import pacs.train

    launched = []
    monkeypatch.setattr(accelerate.commands.launch, "launch_command", launched.append)
    monkeypatch.setattr(pacs.train, "load_inputs", lambda *arguments: None)
    monkeypatch.setattr(pacs.train, "_check_before_launch", lambda recipe: None)
    argv = ["--config", "tiny_cpu", "--model_name_or_path", tiny_model_dir, "--num_processes", "2"]
    assert pacs.train.train_command(argv) == 0
    (args,) = launched
    assert args.module and args.num_processes == 2
    assert args.training_script_args[-2:] == ["--num_processes", "2"]
    script_args, training_args, model_args = pacs.train.parse_args(args.training_script_args)
    assert model_args.model_name_or_path == tiny_model_dir


def test_python_m_pacs_train_answers_a_mistake_in_one_line(tmp_path):
    # what every rank of a launch runs: the same message and exit 2, no traceback on each rank
    argv = ["--config", "tiny_cpu", "--model_name_or_path", str(tmp_path / "nope")]
    result = subprocess.run(
        [sys.executable, "-m", "pacs.train", *argv], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    err = result.stderr.strip()
    assert result.returncode == 2 and "Traceback" not in err, err[-3000:]
    assert err.splitlines()[-1].startswith("python -m pacs.train: error: No such model directory")


# ---------------------------------------------------------------------------------------------------------------------
# One algorithm table
# ---------------------------------------------------------------------------------------------------------------------


def test_one_algorithm_table_and_the_demos_trainers_named_for_what_they_are():
    from pacs.demo import TRAINERS, DemoArguments
    from pacs.recipes.reader import ALGORITHMS, ScriptArguments, make_parser

    choices = next(f for f in dataclasses.fields(ScriptArguments) if f.name == "algorithm").metadata["choices"]
    assert choices == list(ALGORITHMS) == ["pacs", "grpo"]
    for name, algorithm in ALGORITHMS.items():
        assert algorithm.config in make_parser(name).dataclass_types
        assert algorithm.trainer_class().__name__ == {"pacs": "PACSTrainer", "grpo": "HardenedGRPOTrainer"}[name]
    # the demo runs TRL's own GRPOTrainer / RLOOTrainer: never under `pacs train`'s name for the hardened one
    demo_choices = next(f for f in dataclasses.fields(DemoArguments) if f.name == "algorithm").metadata["choices"]
    assert demo_choices == list(TRAINERS) == ["pacs", "trl_grpo", "trl_rloo"]
    assert set(TRAINERS) & set(ALGORITHMS) == {"pacs"}
    assert sum("ALGORITHMS = " in p.read_text() for p in SRC.rglob("*.py")) == 1


# ---------------------------------------------------------------------------------------------------------------------
# `pacs train`'s refusals, tried as a new user would: one line each, as early as what they need is known
# ---------------------------------------------------------------------------------------------------------------------


def test_a_reward_outside_0_1_stops_in_one_line(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from pacs.cli import main

    (tmp_path / "two_rewards.py").write_text("def two(completions, **kwargs):\n    return [2.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--config", "tiny_cpu", "--model_name_or_path", tiny_model_dir, "--output_dir", "run",
            "--reward_funcs", "two_rewards.two", "--max_steps", "1", "--eval_strategy", "no"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # (after the progress bar of the step it stopped, on the bar's line)
    assert "pacs train: error: PACS uses the reward as a label and needs it in [0, 1]" in err[-1], err[-5:]
    assert "pacs_label_transform='sigmoid'" in err[-1] and not any("Traceback" in line for line in err)


def test_an_unknown_dynamic_sampling_metric_is_refused_before_the_data_loads(tiny_model_dir, tmp_path, capsys):
    import pacs.train
    from pacs.cli import main

    loaded = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pacs.train, "load_train_dataset", lambda *args, **kwargs: loaded.append(args))
        argv = ["train", "--config", "tiny_cpu", "--model_name_or_path", tiny_model_dir,
                "--output_dir", str(tmp_path / "run"), "--dynamic_sampling", "true",
                "--dynamic_sampling_metric", "maths"]  # fmt: skip
        assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pacs train: error: dynamic_sampling_metric='maths' is neither 'reward'") and "\n" not in err
    assert "['math_reward']" in err
    assert loaded == [] and not (tmp_path / "run").exists()  # no data loaded, no (empty) output folder left behind


def test_a_missing_reward_column_names_the_command_line_fix(tiny_model_dir, tmp_path, capsys):
    from pacs.cli import main

    chat = [{"role": "user", "content": "What is 2 + 2?"}]
    data = tmp_path / "mine.jsonl"
    data.write_text(json.dumps({"prompt": chat, "final": "4"}) + "\n")  # TRL's format; the answer under `final`
    argv = ["train", "--config", "tiny_cpu", "--model_name_or_path", tiny_model_dir, "--dataset_name", str(data),
            "--output_dir", str(tmp_path / "run"), "--eval_strategy", "no"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pacs train: error: The reward function math_reward needs the keyword `solution`")
    assert f"add that key to every row of {data}" in err and "--answer_column COLUMN" in err and "\n" not in err
