"""The plan as printed: titled sections of (key, value) rows, then every problem found, each naming its setting."""

from __future__ import annotations

from dataclasses import dataclass, field


GiB = 2**30
GB = 1e9


@dataclass
class Finding:
    """A problem: `error` stops the run, `warning` is a risk. `setting` names what to change."""

    level: str
    setting: str
    message: str

    def __str__(self) -> str:
        return f"{self.level.upper()} [{self.setting}] {self.message}"


@dataclass
class Plan:
    sections: list[tuple[str, list[tuple[str, str]]]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    vllm: dict = field(default_factory=dict)  # the colocated engine's figures: max_num_seqs, concurrent, kv_tokens

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "warning"]

    def section(self, title: str) -> list[tuple[str, str]]:
        rows: list[tuple[str, str]] = []
        self.sections.append((title, rows))
        return rows

    def error(self, setting: str, message: str) -> None:
        self.findings.append(Finding("error", setting, message))

    def warning(self, setting: str, message: str) -> None:
        self.findings.append(Finding("warning", setting, message))

    def render(self) -> str:
        lines = []
        for title, rows in self.sections:
            lines.append(title)
            width = max((len(k) for k, _ in rows), default=0)
            lines.extend(f"  {key:<{width}}  {value}" for key, value in rows)
            lines.append("")
        if self.findings:
            lines.append(f"Problems: {len(self.errors)} error(s), {len(self.warnings)} warning(s)")
            lines.extend(f"  {finding}" for finding in self.findings)
        else:
            lines.append("Problems: none")
        return "\n".join(lines)


def gib(x: float) -> str:
    return f"{x / GiB:.1f} GiB"


def human_s(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
