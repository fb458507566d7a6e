"""pyproject.toml against what it promises: the `vllm` extra stays inside the vLLM range that the installed TRL
supports (`trl.import_utils.is_vllm_available`), so `pip install pacs[vllm]` never resolves to a vLLM TRL warns about."""

import inspect
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version


tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]


def _trl_vllm_range() -> tuple[Version, Version]:
    from trl import import_utils

    source = inspect.getsource(import_utils.is_vllm_available)
    found = re.search(r'Version\("([\d.]+)"\)\s*<=\s*\w+\s*<=\s*Version\("([\d.]+)"\)', source)
    assert found, f"TRL's vLLM range check changed shape; update this test:\n{source}"
    return Version(found.group(1)), Version(found.group(2))


def test_vllm_extra_matches_trl_supported_range():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (requirement,) = [Requirement(r) for r in extras["vllm"]]
    assert requirement.name == "vllm"
    low, high = _trl_vllm_range()
    spec = requirement.specifier
    assert low in spec and high in spec, f"pacs[vllm] ({spec}) must admit TRL's range {low}..{high}"
    below = Version(f"{low.major}.{low.minor - 1}.0") if low.minor else Version(f"{low.major - 1}.99.0")
    above = [Version(f"{high.major}.{high.minor}.{high.micro + 1}"), Version(f"{high.major}.{high.minor + 1}.0")]
    outside = [v for v in [below, *above] if v in spec]
    assert not outside, f"pacs[vllm] ({spec}) admits {outside}, outside TRL's supported range {low}..{high}"


def test_one_room_per_concern_sizes():
    """The layout's size rules (docs/CONTRIBUTING.md): the trainer stays thin glue, no function in the package grows
    past what a reader holds in view."""
    import ast

    src = Path(__file__).resolve().parent.parent / "src" / "pacs"
    assert len((src / "trainer.py").read_text().splitlines()) <= 350
    long = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 80:
                    long.append(f"{path.relative_to(src)}:{node.name} ({lines} lines)")
    assert not long, long
