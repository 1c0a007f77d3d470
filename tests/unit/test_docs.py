"""The documents hold to the code: links, anchors, cross-references, commands, paths.

README.md, CONTRIBUTING.md, CHANGELOG.md and ``docs/*.md`` are read as GitHub renders
them. Each checker is a function of a text that returns its problems, one line each,
and each has a negative test on a small bad text, so that a checker that finds
nothing can be told from a document that has nothing wrong.
"""

from __future__ import annotations

import importlib
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from kirim.cli.group import main
from kirim.config import parse_config

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
DOCUMENTS = [README, ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *DOCS]
#: The documents whose ``kirim`` command lines must hold (CHANGELOG.md is history).
COMMAND_DOCUMENTS = [README, ROOT / "CONTRIBUTING.md", *DOCS]
MAX_README_LINES = 200
SHELLS = {"sh", "bash", "shell", "console"}

# -- reading markdown ------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    body: str


def split(text: str) -> tuple[list[tuple[int, str]], list[Block]]:
    """The prose lines (number, text) outside fenced blocks, and the fenced blocks."""
    prose: list[tuple[int, str]] = []
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^\s*(`{3,}|~{3,})(.*)$", lines[i])
        if fence is None:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        mark, start, body = fence.group(1), i, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(mark):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        blocks.append(Block(start + 1, fence.group(2).strip(), "\n".join(body) + "\n"))
    return prose, blocks


def code_spans(line: str) -> list[str]:
    """The inline code spans of one line of prose."""
    return [m.group(2) for m in re.finditer(r"(`+)(.+?)\1", line)]


def without_code(line: str) -> str:
    """The line with its code spans removed (links inside them are not links)."""
    return re.sub(r"(`+)(.+?)\1", "", line)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation removed, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@dataclass(frozen=True)
class Heading:
    line: int
    level: int
    text: str
    slug: str


def headings(text: str) -> list[Heading]:
    """The ATX headings outside code, each with its anchor (repeats get -1, -2, …)."""
    found: list[Heading] = []
    seen: dict[str, int] = {}
    for number, line in split(text)[0]:
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if m is None:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.append(
            Heading(number, len(m.group(1)), m.group(2), base if n == 0 else f"{base}-{n}")
        )
    return found


def anchors(text: str) -> set[str]:
    return {h.slug for h in headings(text)}


# -- links and anchors -----------------------------------------------------------------

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def links(text: str) -> Iterator[tuple[int, str]]:
    """Every link and image target of the prose, with its line."""
    for number, line in split(text)[0]:
        for m in LINK.finditer(without_code(line)):
            yield number, m.group(1)


def link_problems(text: str, where: Path) -> list[str]:
    """Relative links that lead to no file, and anchors that match no heading.

    ``where`` is the document's path: relative targets are resolved from its folder.
    """
    problems = []
    for number, target in links(text):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = where if not path_part else (where.parent / path_part).resolve()
        if path_part and not dest.exists():
            problems.append(f"{where.name}:{number}: {target}: no such file")
            continue
        if not anchor:
            continue
        if dest.suffix != ".md":
            problems.append(f"{where.name}:{number}: {target}: an anchor into a non-.md file")
            continue
        dest_text = text if dest == where else dest.read_text()
        if anchor not in anchors(dest_text):
            problems.append(f"{where.name}:{number}: {target}: no heading #{anchor}")
    return problems


# -- "the X table above", "see X below" ------------------------------------------------

KINDS = {"table", "section"}
STOP = {
    "a",
    "an",
    "and",
    "as",
    "at",
    "from",
    "in",
    "of",
    "or",
    "see",
    "that",
    "the",
    "these",
    "this",
    "those",
    "to",
    "under",
    "with",
}


def _paragraphs(text: str) -> Iterator[tuple[int, str]]:
    """Paragraphs of prose with their first line; each table row is one of its own."""
    start, previous, lines = 0, 0, []
    for number, line in [*split(text)[0], (0, "")]:
        stripped = line.strip()
        if lines and (not stripped or stripped.startswith(("#", "|")) or number != previous + 1):
            yield start, "\n".join(lines)
            lines = []
        previous = number
        if stripped.startswith(("#", "|")):
            if stripped.startswith("|"):
                yield number, line
            continue
        if stripped:
            if not lines:
                start = number
            lines.append(line)


def _plain(paragraph: str) -> str:
    """Links as their text; code spans out (an example in code is no reference)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", paragraph)
    return re.sub(r"(`+)(.+?)\1", "", text)


def _section_has_table(text: str, heading: Heading, all_headings: list[Heading]) -> bool:
    after = [h.line for h in all_headings if h.line > heading.line and h.level <= heading.level]
    end = after[0] if after else 10**9
    return any(
        heading.line < number < end and line.strip().startswith("|")
        for number, line in split(text)[0]
    )


def direction_problems(text: str, name: str = "text") -> list[str]:
    """'The X table above' and 'see X below' that point the wrong way, or nowhere.

    A reference that names its kind (``the Metrics table above``, ``the HTTP section
    below``) must name a heading of this document on that side, and a table's
    heading must have a table in its section; ``the table below`` must have a table
    on that side. A bare ``X above`` is checked when X is a heading of this document.
    A reference to another document is a link, never "above" or "below".
    """
    all_headings = headings(text)
    by_slug = {h.slug: h for h in all_headings}
    tables = [n for n, line in split(text)[0] if line.strip().startswith("|")]
    problems = []
    for start, paragraph in _paragraphs(text):
        plain = _plain(paragraph)
        for m in re.finditer(r"\b(above|below)\b", plain):
            line = start + plain.count("\n", 0, m.start())
            direction = m.group(1)
            before = re.split(r"[.;:()|]", plain[: m.start()])[-1]
            quoted = re.search(r"[\"“]([^\"”]+)[\"”]\s*(\w+)?\s*$", before)
            words = re.findall(r"[\w'’-]+", before)
            kind = words[-1].lower() if words and words[-1].lower() in KINDS else None
            if quoted and (quoted.group(2) is None or quoted.group(2).lower() in KINDS):
                target = quoted.group(1)
            else:
                name_words: list[str] = []
                for word in reversed(words[:-1] if kind else words):
                    if word.lower() in STOP or len(name_words) == 4:
                        break
                    name_words.insert(0, word)
                target = " ".join(name_words)

            def wants(n: int, line: int = line, direction: str = direction) -> bool:
                return n < line if direction == "above" else n > line

            what = f"{name}:{line}: {(target + ' ' + (kind or '')).strip()} {direction}"
            if not target:
                if kind == "table" and not any(wants(n) for n in tables):
                    problems.append(f"{what}: there is no table {direction} it")
                if kind == "section" and not any(wants(h.line) for h in all_headings):
                    problems.append(f"{what}: there is no section {direction} it")
                continue
            heading = by_slug.get(slug(target))
            if heading is None:
                if kind is not None:
                    problems.append(f"{what}: no heading of this document is named {target!r}")
                continue
            if not wants(heading.line):
                side = "below" if direction == "above" else "above"
                problems.append(f"{what}: {heading.text!r} is {side} it (line {heading.line})")
            elif kind == "table" and not _section_has_table(text, heading, all_headings):
                problems.append(f"{what}: the section {heading.text!r} has no table")
    return problems


# -- kirim command lines ---------------------------------------------------------------

OPERATORS = set("();<>|&")


def _tokens(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError:  # an unbalanced quote: the line as words
        return line.split()


def _commands(tokens: list[str]) -> Iterator[tuple[str, list[str]]]:
    """Each ``kirim …`` or ``python -m kirim.receiver …`` of a shell line, to its end."""
    at_start = True
    for i, token in enumerate(tokens):
        if token and set(token) <= OPERATORS:
            at_start = True
            continue
        if at_start and (token == "kirim" or token.endswith("/kirim")):
            yield "kirim", _until_operator(tokens[i + 1 :])
        elif at_start and tokens[i : i + 3] in (
            ["python", "-m", "kirim.receiver"],
            ["python3", "-m", "kirim.receiver"],
        ):
            yield "receiver", _until_operator(tokens[i + 3 :])
        at_start = "=" in token and token.endswith("$")  # TOKEN=$( kirim …


def _until_operator(tokens: list[str]) -> list[str]:
    out = []
    for token in tokens:
        if token and set(token) <= OPERATORS:
            break
        out.append(token)
    return out


@dataclass(frozen=True)
class CommandLine:
    line: int
    program: str  # "kirim" or "receiver"
    argv: list[str]


def command_lines(text: str) -> list[CommandLine]:
    """The kirim command lines of shell blocks and of inline code spans."""
    prose, blocks = split(text)
    found = []
    for block in blocks:
        if block.lang not in SHELLS:
            continue
        logical, first = "", None
        for offset, raw in enumerate(block.body.splitlines(), start=1):
            if first is None:
                first = block.line + offset
            if raw.rstrip().endswith("\\"):
                logical += raw.rstrip()[:-1] + " "
                continue
            logical += raw
            for program, argv in _commands(_tokens(logical)):
                found.append(CommandLine(first, program, argv))
            logical, first = "", None
    for number, line in prose:
        for span in code_spans(line):
            if not re.match(r"^(kirim|python3? -m kirim\.receiver)(\s|$)", span):
                continue
            # In a span, `a|b` (or a table's `a\|b`) is a choice, [ ] marks what is optional.
            span = span.replace("\\|", "¦")
            span = re.sub(r"(?<=\S)\|(?=\S)", "¦", span).replace("[", " ").replace("]", " ")
            for program, argv in _commands(_tokens(span)):
                found.append(CommandLine(number, program, argv))
    return found


def _options(command: click.Command, ctx: click.Context) -> dict[str, bool]:
    """The options that ``--help`` lists, each with whether it takes a value."""
    options: dict[str, bool] = {}
    params = list(command.get_params(ctx))
    for param in params:
        if not isinstance(param, click.Option) or param.hidden:
            continue
        takes_value = not (param.is_flag or param.count)
        for opt in [*param.opts, *param.secondary_opts]:
            options[opt] = takes_value
    return options


def _placeholder(word: str) -> bool:
    return word.isupper() or word.endswith("...") or word.startswith("<")


def kirim_problems(argv: list[str], where: str = "") -> list[str]:
    """What is wrong with ``kirim ARGV``: an unknown command, or a flag --help lacks."""
    return _check(main, argv, "kirim", where)


def _check(command: click.Command, argv: list[str], path: str, where: str) -> list[str]:
    ctx = click.Context(command, info_name=path.rsplit(" ", 1)[-1])
    options = _options(command, ctx)
    problems = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return problems
        if token.startswith("-") and token != "-":
            flag = token.split("=", 1)[0]
            if flag not in options:
                problems.append(f"{where}`{path}` has no option {flag} (see {path} --help)")
            elif options[flag] and "=" not in token:
                i += 1  # its value
            i += 1
            continue
        if isinstance(command, click.Group):
            if _placeholder(token):
                return problems  # `kirim [OPTIONS] COMMAND`
            for name in token.split("¦"):
                sub = command.get_command(ctx, name)
                if sub is None:
                    problems.append(f"{where}`{path}` has no command {name!r}")
                else:
                    problems += _check(sub, argv[i + 1 :], f"{path} {name}", where)
            return problems
        i += 1  # an argument, or a choice of values
    return problems


def receiver_flags() -> set[str]:
    """The flags that ``python -m kirim.receiver --help`` lists."""
    done = subprocess.run(
        [sys.executable, "-m", "kirim.receiver", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return set(re.findall(r"(?<![\w-])--?[a-zA-Z][\w-]*", done.stdout))


def command_problems(text: str, name: str = "text", receiver: set[str] | None = None) -> list[str]:
    """Every kirim command line of ``text`` that names no command, or a flag it lacks."""
    problems = []
    for cl in command_lines(text):
        where = f"{name}:{cl.line}: "
        if cl.program == "kirim":
            problems += kirim_problems(cl.argv, where)
        elif receiver is not None:
            for token in cl.argv:
                flag = token.split("=", 1)[0]
                if flag.startswith("-") and flag != "-" and flag not in receiver:
                    problems.append(f"{where}`python -m kirim.receiver` has no option {flag}")
    return problems


# -- repository paths and module names in code spans -----------------------------------

REPO_PATH = re.compile(r"^(src|tests|bench|ops|docs)/[\w./-]*$")
#: ``kirim.``-names in the documents that are not modules: files and span names.
NOT_MODULES = {"kirim.toml", "kirim.delivery", "kirim.provider_request"}


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:n]))
        except ImportError:
            continue
        try:
            for attr in parts[n:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def reference_problems(text: str, name: str = "text", root: Path = ROOT) -> list[str]:
    """Repository paths that do not exist and ``kirim.`` names that do not import."""
    prose, blocks = split(text)
    spans = [(number, span) for number, line in prose for span in code_spans(line)]
    for block in blocks:
        if block.lang in SHELLS:
            spans += [(block.line, token) for token in _tokens(block.body.replace("\\\n", " "))]
    problems = []
    for number, span in spans:
        span = span.strip().rstrip(",.;:")
        if REPO_PATH.match(span) and not (root / span).exists():
            problems.append(f"{name}:{number}: {span}: no such path in the repository")
        if (
            re.fullmatch(r"kirim(\.[A-Za-z_]\w*)+", span)
            and span not in NOT_MODULES
            and not _resolves(span)
        ):
            problems.append(f"{name}:{number}: {span}: no such module or attribute")
    return problems


# -- the documents ---------------------------------------------------------------------


def test_the_readme_is_under_200_lines() -> None:
    """README.md is something a newcomer reads in five minutes: under 200 lines."""
    lines = len(README.read_text().splitlines())
    assert lines < MAX_README_LINES, f"README.md has {lines} lines; move some to docs/"


def test_the_documents_exist() -> None:
    """The documents the other tests read are there (a glob that finds none fails)."""
    assert len(DOCS) >= 8, DOCS
    for path in DOCUMENTS:
        assert path.exists(), path


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_leads_somewhere(path: Path) -> None:
    """Every relative link leads to a file, and every #anchor to a heading there."""
    assert link_problems(path.read_text(), path) == []


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_above_and_below_point_the_right_way(path: Path) -> None:
    """'The X table above' and 'see X below' name a heading on that side."""
    assert direction_problems(path.read_text(), path.name) == []


def test_the_readme_links_every_docs_page() -> None:
    """No page of docs/ is an orphan: the README links each one."""
    targets = {target.partition("#")[0] for _, target in links(README.read_text())}
    missing = [p.name for p in DOCS if f"docs/{p.name}" not in targets]
    assert missing == []


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_each_docs_page_starts_with_a_summary_and_a_link_back(path: Path) -> None:
    """A page of docs/: its title, one line of summary, a link back to the README."""
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# "), lines[0]
    assert lines[1] == "", "a blank line after the title"
    assert lines[2].strip(), "a one-line summary after the title"
    assert len(lines) < 4 or lines[3] == "", "the summary is one line"
    assert "](../README.md)" in lines[2], "the summary line links back to ../README.md"


@pytest.fixture(scope="module")
def receiver() -> set[str]:
    return receiver_flags()


@pytest.mark.parametrize("path", COMMAND_DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_kirim_command_line_names_real_commands_and_flags(
    path: Path, receiver: set[str]
) -> None:
    """Each `kirim …` line names a command and only flags that its --help lists."""
    assert command_problems(path.read_text(), path.name, receiver) == []


def test_the_readme_command_table_has_every_top_level_command() -> None:
    """The README's command table: every top-level command, one line each, no other."""
    text = README.read_text()
    section = text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `kirim ")]
    named = [re.match(r"\| `kirim ([\w-]+)", row).group(1) for row in rows]  # type: ignore[union-attr]
    ctx = click.Context(main, info_name="kirim")
    assert sorted(named) == sorted(main.list_commands(ctx))
    assert len(named) == len(set(named)), "one line each"


def test_the_readme_first_run_is_the_help_text_first_run() -> None:
    """The first run of the README is the one of `kirim --help` (same commands)."""
    help_text = main.get_help(click.Context(main, info_name="kirim"))
    text = README.read_text()
    for command in ["kirim init", "python -m kirim.receiver &", "kirim worker --burst"]:
        assert command in text, command
        assert command in help_text, command


@pytest.mark.parametrize("path", COMMAND_DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_repository_paths_and_module_names_exist(path: Path) -> None:
    """Paths (src/…, tests/…) and kirim.* module names in code spans are real."""
    assert reference_problems(path.read_text(), path.name) == []


def test_every_toml_example_loads() -> None:
    """Each TOML block of the README and docs/ parses into a Config whose channels build."""
    count = 0
    for path in [README, *DOCS]:
        for block in split(path.read_text())[1]:
            if block.lang != "toml":
                continue
            config = parse_config(tomllib.loads(block.body), source=f"{path.name}:{block.line}")
            for spec in config.channels.values():
                spec.build()
            count += 1
    assert count >= 5


def test_the_channel_examples_cover_the_built_in_providers() -> None:
    """docs/channels.md has one TOML example per built-in provider that needs no key
    file (and one of delivery callbacks, one of a request rate, one of failover), each
    builds; the push services' examples, which name key files, are ini blocks."""
    blocks = [b for b in split((ROOT / "docs" / "channels.md").read_text())[1] if b.lang == "toml"]
    assert len(blocks) == 8
    kinds = set()
    for block in blocks:
        for spec in parse_config(tomllib.loads(block.body)).channels.values():
            kinds.add(spec.provider)
            spec.build()
    assert kinds == {"webhook", "smtp", "apprise", "twilio", "slack"}


# -- the checkers fail when they should ------------------------------------------------


def test_slug_follows_github() -> None:
    """Headings become GitHub's anchors: lowercase, punctuation out, spaces to '-'."""
    assert slug("The promise, stated plainly") == "the-promise-stated-plainly"
    assert slug('Webhook: `provider = "webhook"`') == "webhook-provider--webhook"
    assert slug("~100 services through Apprise") == "100-services-through-apprise"
    assert slug("kirim `in_doubt`") == "kirim-in_doubt"
    assert [h.slug for h in headings("# A\n\n## A\n\n```\n# not a heading\n```\n")] == [
        "a",
        "a-1",
    ]


def test_a_link_to_a_missing_file_is_found(tmp_path: Path) -> None:
    """A relative link to a file that does not exist is a problem; one that does is not."""
    (tmp_path / "there.md").write_text("# There\n")
    doc = tmp_path / "doc.md"
    text = "# Doc\n\nSee [there](there.md), [gone](gone.md) and [web](https://example.com/x).\n"
    assert link_problems(text, doc) == ["doc.md:3: gone.md: no such file"]


def test_a_link_to_a_missing_anchor_is_found(tmp_path: Path) -> None:
    """An anchor that matches no heading, here or in another file, is a problem."""
    (tmp_path / "other.md").write_text("# Other\n\n## Real part\n")
    doc = tmp_path / "doc.md"
    text = (
        "# Doc\n\n## Local\n\n[ok](#local) [ok](other.md#real-part) [bad](#nowhere) "
        "[bad](other.md#real) `[code](#not-a-link)`\n"
    )
    assert link_problems(text, doc) == [
        "doc.md:5: #nowhere: no heading #nowhere",
        "doc.md:5: other.md#real: no heading #real",
    ]


BAD_DIRECTION = """# Doc

## HTTP

`GET /metrics` serves the Metrics table above.

## Metrics

| name | type |
|---|---|
| `kirim_queue_depth` | gauge |

## Tracing

Spans, named in the Tracing table above (there is none), and see HTTP below.
"""


def test_a_table_said_to_be_above_that_is_below_is_found() -> None:
    """'The Metrics table above' for a table below is a problem; so are the others."""
    problems = direction_problems(BAD_DIRECTION, "doc.md")
    assert problems == [
        "doc.md:5: Metrics table above: 'Metrics' is below it (line 7)",
        "doc.md:15: Tracing table above: the section 'Tracing' has no table",
        "doc.md:15: HTTP below: 'HTTP' is above it (line 3)",
    ]


def test_references_that_point_the_right_way_pass() -> None:
    """The same references the right way round are no problem."""
    good = (
        BAD_DIRECTION.replace("the Metrics table above", "the Metrics table below")
        .replace("the Tracing table above (there is none)", "the Metrics table above")
        .replace("see HTTP below", "see HTTP above")
    )
    assert direction_problems(good, "doc.md") == []


def test_a_reference_to_no_heading_or_to_a_missing_table_is_found() -> None:
    """A named table that is no heading here, and 'the table below' with none below."""
    text = "# Doc\n\n| a |\n|---|\n| 1 |\n\nSee the Retention table above, and the table below.\n"
    assert direction_problems(text, "doc.md") == [
        "doc.md:7: Retention table above: no heading of this document is named 'Retention'",
        "doc.md:7: table below: there is no table below it",
    ]


def test_a_wrong_flag_or_command_is_found() -> None:
    """A flag that --help does not list, or a command that does not exist, is a problem."""
    text = (
        "# Doc\n\nRun `kirim worker --burst --concurency 5` or `kirim sned`.\n\n"
        "```sh\nkirim --log-format json worker \\\n    --lease 2 --verbose | head -1\n"
        "kirim dead-letter list --json && kirim token create --name ci --force\n```\n\n"
        "| `kirim simulate [--strategy kirim\\|naive] [--chaos]` | x |\n"
    )
    assert command_problems(text, "doc.md") == [
        "doc.md:6: `kirim worker` has no option --verbose (see kirim worker --help)",
        "doc.md:8: `kirim token create` has no option --force (see kirim token create --help)",
        "doc.md:3: `kirim worker` has no option --concurency (see kirim worker --help)",
        "doc.md:3: `kirim` has no command 'sned'",
        "doc.md:11: `kirim simulate` has no option --chaos (see kirim simulate --help)",
    ]


def test_hidden_options_and_alternatives_are_checked() -> None:
    """A hidden option is not in --help, so naming one is a problem; each choice is checked."""
    assert kirim_problems(["worker", "--clock-offset", "3"]) == [
        "`kirim worker` has no option --clock-offset (see kirim worker --help)"
    ]
    assert kirim_problems(["dead-letter", "list¦retry¦purge"]) == [
        "`kirim dead-letter` has no command 'purge'"
    ]
    assert kirim_problems(["--config", "FILE", "COMMAND"]) == []


def test_a_wrong_receiver_flag_is_found(receiver: set[str]) -> None:
    """`python -m kirim.receiver` lines are checked against its own --help."""
    text = "Run `python -m kirim.receiver --port 9000 --honour-keys --tls`.\n"
    assert command_problems(text, "doc.md", receiver) == [
        "doc.md:1: `python -m kirim.receiver` has no option --tls"
    ]


def test_a_missing_path_or_module_is_found() -> None:
    """A path under src/ that is gone, or a kirim.* name that does not import, is found."""
    text = (
        "See `src/kirim/worker/loop.py`, `src/kirim/worker.py`, `kirim.worker.loop`, "
        "`kirim.receiver.Receiver` and `kirim.toml`.\n"
    )
    assert reference_problems(text, "doc.md") == [
        "doc.md:1: src/kirim/worker.py: no such path in the repository",
        "doc.md:1: kirim.receiver.Receiver: no such module or attribute",
    ]


RUNS = re.compile(r"<!-- runs -->\n```python\n(.*?)\n```\n\nIt prints `(.*?)`\.", re.S)


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_python_examples_marked_runs_run(path: Path, tmp_path: Path) -> None:
    """A Python block under ``<!-- runs -->`` runs in an empty directory and prints what
    the line after it says."""
    import subprocess
    import sys

    for code, printed in RUNS.findall(path.read_text()):
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == printed


def test_docs_mark_at_least_one_python_example_that_runs() -> None:
    """The marker is used: python-api.md's worker example is run by the test above."""
    assert RUNS.search((ROOT / "docs" / "python-api.md").read_text())
