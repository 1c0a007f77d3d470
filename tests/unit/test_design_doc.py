"""The code's citations of its design: every one names docs/design.md and something it
has (a step of the worker protocol, a section), and every docs/ file a docstring names
exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
SOURCES = sorted((ROOT / "src" / "kirim").rglob("*.py"))


def _steps() -> set[int]:
    """The numbers of the worker protocol's steps in docs/design.md."""
    text = DESIGN.read_text().split("## The worker protocol", 1)[1].split("\n## ", 1)[0]
    return {int(n) for n in re.findall(r"^(\d+)\. \*\*", text, re.M)}


def _sections() -> set[str]:
    return set(re.findall(r"^## (.+)$", DESIGN.read_text(), re.M))


def citation_problems(path: Path, text: str, steps: set[int], sections: set[str]) -> list[str]:
    """What is wrong with the citations of ``text`` (a source file's)."""
    problems = []
    if re.search(r"\bDESIGN(\.md)?\b", text):
        problems.append(f"{path.name}: cites DESIGN, which the repository does not have")
    for m in re.finditer(r"docs/design\.md[',]*\s*(?:'s\s+)?steps?\s+([\d\s,–\-toand]+)", text):
        for n in re.findall(r"\d+", m.group(1)):
            if int(n) not in steps:
                problems.append(f"{path.name}: cites step {n} of docs/design.md, which has none")
    for m in re.finditer(r'docs/design\.md, "([^"]+)"', text):
        if m.group(1) not in sections:
            problems.append(f"{path.name}: cites the section {m.group(1)!r}, not in docs/design.md")
    for m in re.finditer(r"\bdocs/([\w-]+\.md)", text):
        if not (ROOT / "docs" / m.group(1)).exists():
            problems.append(f"{path.name}: names docs/{m.group(1)}, which does not exist")
    return problems


def test_every_citation_of_the_design_names_what_it_has() -> None:
    """No source file cites DESIGN.md, a step or a section docs/design.md lacks, or a
    docs/ page that does not exist."""
    steps, sections = _steps(), _sections()
    assert steps == set(range(1, 10))
    problems = [
        p for path in SOURCES for p in citation_problems(path, path.read_text(), steps, sections)
    ]
    assert problems == []


def test_a_wrong_citation_is_found() -> None:
    """A step past the protocol, a missing section, the old DESIGN.md and a missing page
    are each named."""
    steps, sections = _steps(), _sections()
    text = (
        'See DESIGN.md. docs/design.md, step 12. docs/design.md, "Nowhere".'
        " Also docs/no-such-page.md."
    )
    found = citation_problems(Path("x.py"), text, steps, sections)
    assert len(found) == 4, found


def test_the_code_cites_the_design() -> None:
    """The worker and the store cite docs/design.md (the test above checks something)."""
    cited = [p.name for p in SOURCES if "docs/design.md" in p.read_text()]
    assert {"transitions.py", "decisions.py", "machine.py"} <= set(cited)
