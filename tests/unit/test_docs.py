"""The docs, README.md and docs/ (`make docs`, part of `make test`): every relative link and anchor resolves, every
command a page shows exists with its flags or is run here, the settings page is the one the settings object gives,
the data-flow picture is drawn from its source as it stands, the README stays short, the billing rules name tests
and code that exist, and no page cites a file outside the repository. The README's tour, which changes a price in the
catalog's database, is run by tests/integration/test_readme_tour.py."""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from billing.store.export_files import export_folder, write_export
from billing.store.redis_keys import RedisKeys
from ops import docs
from ops.cli import _parser
from ops.kafka_service import TOOLS as KAFKA_TOOLS
from ops.settings import PROJECT_ROOT, Settings, setting_names

README = PROJECT_ROOT / "README.md"
DOCS = PROJECT_ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
"""The pages whose commands are checked: the README and every page of docs/."""
LINKED = [*PAGES, PROJECT_ROOT / "ARCHITECTURE.md", *sorted(PROJECT_ROOT.glob("*/README.md"))]
"""The pages whose links are checked: those, the architecture and each package's README."""

WEB = "http://127.0.0.1:8000"
PYPROJECT = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
MODULE_OF_ARGS = {"BENCH_ARGS": "ops.bench", "CHAOS_ARGS": "ops.chaos"}
"""Make variables whose value is passed on as flags to a module, checked against that module's --help."""


def rel(page: Path) -> str:
    return str(page.relative_to(PROJECT_ROOT))


# Reading Markdown -----------------------------------------------------------------------------------------------
FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.S | re.M)
SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced code block, its indentation removed."""
    blocks = []
    for indent, lang, body in FENCE.findall(text):
        lines = [line.removeprefix(indent) for line in body.splitlines()]
        blocks.append((lang, "\n".join(lines) + "\n"))
    return blocks


def prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return FENCE.sub("", text)


def spans(text: str) -> list[str]:
    """Inline code spans of the prose, a line break inside one as a space; `\\|` inside a table's cell is a `|`."""
    return [" ".join(span.replace("\\|", "|").split()) for span in SPAN.findall(prose(text))]


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text lower-cased, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", prose(page.read_text()), re.M):
        base = slug(heading)
        name, n = base, 0
        while name in found:
            n += 1
            name = f"{base}-{n}"
        found.add(name)
    return found


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def links(page: Path) -> list[str]:
    text = prose(page.read_text())
    return LINK.findall(SPAN.sub("", text))


# Commands ---------------------------------------------------------------------------------------------------------
def shell_commands(lang: str, body: str) -> Iterator[list[str]]:
    """Each simple command of a block: a shell block's lines (continuations joined, comments dropped), a text
    block's `$ ` lines; pipelines and lists split into their commands."""
    if lang in ("sh", "bash", "shell"):
        lines = body.replace("\\\n", " ").splitlines()
    elif lang in ("text", "console", ""):
        lines = [line[2:] for line in body.splitlines() if line.startswith("$ ")]
    else:
        return
    for line in lines:
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        command: list[str] = []
        for token in lexer:
            if token in (";", "&&", "||", "|", "&"):
                if command:
                    yield command
                command = []
            else:
                command.append(token)
        if command:
            yield command


def page_commands(page: Path) -> list[list[str]]:
    return [cmd for lang, body in fenced_blocks(page.read_text()) for cmd in shell_commands(lang, body)]


def all_commands() -> list[tuple[str, list[str]]]:
    return [(rel(page), cmd) for page in PAGES for cmd in page_commands(page)]


@cache
def subcommands() -> dict[str, argparse.ArgumentParser]:
    """`adbill`'s subcommands, aliases included, by name."""
    action = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def options_of(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of a parser and of its own subcommands (`adbill users add --role`)."""
    found = {option for action in parser._actions for option in action.option_strings}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= options_of(sub)
    return found


def flags(words: list[str] | str) -> set[str]:
    text = " ".join(words) if isinstance(words, list) else words
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))


@cache
def make_targets() -> set[str]:
    """The targets `make help` lists: those with a `## ` description."""
    return set(re.findall(r"^([a-zA-Z_-]+):.*## ", (PROJECT_ROOT / "Makefile").read_text(), re.M))


@cache
def make_variables() -> set[str]:
    """The variables the Makefile sets a default for or reads."""
    makefile = (PROJECT_ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Z_]+) \?=", makefile, re.M)) | set(re.findall(r"\$\(([A-Z_]+)\)", makefile))


@cache
def module_help(module: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120, cwd=PROJECT_ROOT
    )
    assert done.returncode == 0, f"python -m {module} --help failed: {done.stderr[-2000:]}"
    return done.stdout


def check_module(module: str, args: list[str]) -> None:
    assert importlib.util.find_spec(module) is not None, f"no module {module}"
    if not flags(args):
        return
    unknown = flags(args) - flags(module_help(module))
    assert not unknown, f"python -m {module} has no {sorted(unknown)}"


def check_adbill(args: list[str]) -> None:
    """A concrete command: parsed as `adbill` parses it, every flag spelt out (argparse takes a prefix too)."""
    try:
        _parser().parse_args(args)
    except SystemExit as exc:
        raise AssertionError(f"`adbill {shlex.join(args)}` does not parse (exit {exc.code})") from None
    if args[0] != "kafka":  # Kafka's own tools take their own flags
        check_adbill_outline(f"adbill {' '.join(args)}")


def check_adbill_outline(text: str) -> None:
    """An outline such as `adbill catalog set-budget CAMPAIGN --daily-micros N | --unlimited [--at TIME]`: the
    subcommand exists and so does every flag."""
    words = text.split()
    assert len(words) >= 2 and words[1] in subcommands(), f"`{text}`: no subcommand {words[1:2]}"
    if words[1] == "kafka":  # Kafka's own tools take their own flags
        assert len(words) < 3 or words[2] == "TOOL" or words[2] in KAFKA_TOOLS, f"`{text}`: no such tool"
        return
    unknown = flags(text) - options_of(subcommands()[words[1]])
    assert not unknown, f"`{text}`: adbill {words[1]} has no {sorted(unknown)}"


def check_make(args: list[str]) -> None:
    target, *assignments = args
    assert target in make_targets(), f"no make target {target} (make help)"
    for assignment in assignments:
        name, sep, value = assignment.partition("=")
        assert sep and name in make_variables(), f"make {target}: no variable {name} in the Makefile"
        if name in MODULE_OF_ARGS:
            check_module(MODULE_OF_ARGS[name], shlex.split(value))


def check_pytest(args: list[str]) -> None:
    """The tests named exist (and the `-k` words are in them); the markers a `-m` selects are declared."""
    if "-m" in args:
        declared = {line.split(":")[0] for line in PYPROJECT["tool"]["pytest"]["ini_options"]["markers"]}
        selected = set(re.findall(r"\w+", args[args.index("-m") + 1])) - {"and", "or", "not"}
        assert selected <= declared, f"pytest {args}: no marker {sorted(selected - declared)}"
    paths = [arg for arg in args if arg.startswith("tests/")]
    if "-m" in args and not paths:
        return
    assert paths and all((PROJECT_ROOT / p.split("::")[0]).exists() for p in paths), f"pytest {args}: no such test"
    if "-k" in args:
        expression = args[args.index("-k") + 1]
        source = "".join((PROJECT_ROOT / p.split("::")[0]).read_text() for p in paths)
        assert all(word in source for word in re.findall(r"\w+", expression) if word not in ("and", "or", "not"))


def known_redis_keys() -> set[str]:
    """The keys the docs' `redis-cli` examples read, spelled by the one owner of the keyspace."""
    keys = RedisKeys(Settings().redis_prefix)
    return {keys.periods(), keys.totals("20261120T1500Z", "adv", "adv-0001"), keys.health_query("billing")}


def check_redis_cli(args: list[str]) -> None:
    port = args[args.index("-p") + 1]
    assert int(port) == Settings().redis_port
    key = args[args.index("-p") + 3]
    assert key in known_redis_keys(), f"redis-cli reads {key}, a key RedisKeys does not spell so"


def check_curl(args: list[str]) -> None:
    for url in (arg for arg in args if re.match(r"(https?://)?127\.0\.0\.1:\d+/", arg)):
        port, path = re.match(r"(?:https?://)?127\.0\.0\.1:(\d+)(/\S*)", url).groups()  # type: ignore[union-attr]
        if int(port) == Settings().metrics_port:
            assert path == "/metrics"
        else:
            assert int(port) == Settings().web_port
            check_route(path)


CHECKED_ELSEWHERE = {"cd", "grep", "sha256sum"}
"""`cd` and `grep` need no check; `sha256sum -c SHA256SUMS` is run on a real export below."""


def check_command(command: list[str]) -> None:
    program, *args = command
    name = Path(program).name
    if name == "adbill":
        check_adbill(args)
    elif name == "make":
        check_make(args)
    elif name.startswith("python") and args[:1] == ["-m"]:
        check_module(args[1], args[2:])
    elif name == "pytest":
        check_pytest(args)
    elif name == "redis-cli":
        check_redis_cli(args)
    elif name == "curl":
        check_curl(args)
    else:
        assert name in CHECKED_ELSEWHERE, f"{shlex.join(command)}: a command this test does not know how to check"


# Web routes -------------------------------------------------------------------------------------------------------
WEB_HOME: list[Path] = []
"""A data folder for the app whose routes are read (it writes its secret key there); set by `web_home`."""


@pytest.fixture(autouse=True, scope="module")
def web_home(tmp_path_factory: pytest.TempPathFactory) -> None:
    WEB_HOME.append(tmp_path_factory.mktemp("web-home"))


@cache
def web_routes() -> object:
    """The web UI's routes."""
    from web.app import create_app

    return create_app(Settings.from_env({}, home=WEB_HOME[0])).url_map.bind("127.0.0.1")


def check_route(path: str, method: str = "GET") -> None:
    """A path of the web UI as the docs write it, placeholders (ID, AD, MONTH, CLICK_ID ...) standing for a value."""
    from werkzeug.exceptions import HTTPException
    from werkzeug.routing import RequestRedirect

    concrete = "/".join("x" if re.fullmatch(r"[A-Z][A-Z_]*", part) else part for part in path.split("?")[0].split("/"))
    adapter = web_routes()
    try:
        adapter.match(concrete, method=method)  # type: ignore[attr-defined]
    except RequestRedirect:
        pass
    except HTTPException as exc:
        raise AssertionError(f"{method} {path}: no such route of the web UI ({exc.code})") from None


def web_paths(page: Path) -> list[tuple[str, str]]:
    """(method, path) of each web UI path the page names: full addresses anywhere, and code spans that are a path."""
    text = page.read_text()
    found = [("GET", path) for path in re.findall(re.escape(WEB) + r"(/[^\s>)`'\"]*)", text)]
    for span in spans(text):
        match = re.fullmatch(r"(?:(GET|POST) )?(/[a-z][\w./-]*(?:\?\S*)?)", span)
        if match and not match.group(2).endswith("/") and "..." not in match.group(2):
            found.append((match.group(1) or "GET", match.group(2)))
    return found


# Tests: the README ------------------------------------------------------------------------------------------------
def test_the_readme_reads_in_ten_minutes() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move the details to a page of docs/"
    first_screen = "\n".join(lines[:40])
    for must in ("make up", "make test", "](docs/getting-started.md)"):
        assert must in first_screen, f"the README's first screen lacks {must!r}"


def test_the_readme_shows_the_picture_of_the_way_the_data_goes() -> None:
    assert "](docs/dataflow.svg)" in README.read_text()


def test_the_readme_links_every_page_of_the_docs() -> None:
    linked = set(links(README))
    missing = [rel(page) for page in PAGES[1:] if rel(page) not in linked]
    assert not missing, f"pages the README does not link: {missing}"


# Tests: links -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("page", LINKED, ids=rel)
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):
            continue  # an address of another site
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved)):
            broken.append(f"{target}: no such heading in {rel(resolved)}")
    assert not broken, f"{rel(page)}: {broken}"


REPORT_FOLDER = re.compile(r"\bvar/bench\b")
"""Where the benchmarks write their reports: on the machine that ran them, not in the repository."""


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_no_page_links_to_or_names_a_benchmark_report_folder(page: Path) -> None:
    """A clean clone has no `var/bench/`: a page names a run's report as plain text (network-20261202T055041Z), never
    by its folder, in a link, a code span or a code block."""
    text = page.read_text()
    named = [target for target in links(page) if REPORT_FOLDER.search(target)]
    named += [span for span in spans(text) if REPORT_FOLDER.search(span)]
    named += [line for _lang, body in fenced_blocks(text) for line in body.splitlines() if REPORT_FOLDER.search(line)]
    assert not named, f"{rel(page)} links to or names report folders a clean clone does not have: {named}"


# Tests: commands --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_command_a_page_shows_exists_with_its_flags(page: Path) -> None:
    for command in page_commands(page):
        check_command(command)
    for span in spans(page.read_text()):
        words = span.split()
        if len(words) < 2:
            continue
        program = Path(words[0]).name
        if program == "adbill" and re.fullmatch(r"[a-z][a-z-]*", words[1]):
            check_adbill_outline(f"adbill {' '.join(words[1:])}")
        elif program == "make" and re.fullmatch(r"[a-z-]+", words[1]):
            check_make([w for w in words[1:] if "=" in w or w == words[1]])
        elif program.startswith("python") and words[1] == "-m" and len(words) > 2:
            check_module(words[2], words[3:])
        elif program == "pytest":
            check_pytest(shlex.split(span)[1:])


def test_the_command_table_names_every_subcommand() -> None:
    table = (DOCS / "getting-started.md").read_text().split("## The command line", 1)[1]
    action = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = [name for name in action._name_parser_map if f"`adbill {name}" not in table and f"`{name}`" not in table]
    assert not missing, f"subcommands missing from docs/getting-started.md's command table: {missing}"


def test_every_make_target_is_in_the_docs() -> None:
    text = "\n".join(page.read_text() for page in PAGES)
    missing = sorted(t for t in make_targets() if not re.search(rf"make {re.escape(t)}(?![\w-])", text))
    assert not missing, f"make targets no page names: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_web_ui_path_a_page_shows_is_a_route(page: Path) -> None:
    for method, path in web_paths(page):
        check_route(path, method)


def test_the_export_checksums_check_as_the_finance_page_says(tmp_path: Path) -> None:
    from billing.export import build_export
    from billing.store.export_files import export_table
    from tests.unit.test_export import CLOSED_AT, END, PERIOD, START, scenario

    write_export(tmp_path, PERIOD, export_table(build_export(PERIOD, *scenario())), START, END, CLOSED_AT)
    block = next(body for lang, body in fenced_blocks((DOCS / "finance.md").read_text()) if "sha256sum" in body)
    line = block.replace(f"var/exports/{PERIOD}", str(export_folder(tmp_path, PERIOD)))
    done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == sorted(["billing.parquet:", "billing.csv:", "manifest.json:"] + ["OK"] * 3)


# Tests: settings --------------------------------------------------------------------------------------------------
def test_the_settings_page_is_generated_from_the_settings_object() -> None:
    assert docs.SETTINGS_PAGE.read_text() == docs.settings_page(), (
        "docs/settings.md differs from ops/settings.py: run `make docs-generate`"
    )


def test_the_settings_page_documents_every_setting() -> None:
    page = docs.SETTINGS_PAGE.read_text()
    undocumented = {name for name in setting_names() if f"`{name}`" not in page}
    assert not undocumented, f"settings missing from docs/settings.md: {sorted(undocumented)}"


@pytest.mark.parametrize("page", LINKED, ids=rel)
def test_every_setting_a_page_names_exists(page: Path) -> None:
    named = set(re.findall(r"\bADBILL_[A-Z0-9_]*[A-Z0-9]\b", page.read_text()))
    assert not named - setting_names(), (
        f"{rel(page)} names settings that do not exist: {sorted(named - setting_names())}"
    )


# Tests: the picture -----------------------------------------------------------------------------------------------
def test_the_picture_is_drawn_from_its_source_as_it_stands() -> None:
    assert docs.drawn_from(docs.PICTURE.read_text()) == docs.source_digest(docs.PICTURE_SOURCE.read_text()), (
        "docs/dataflow.svg is older than docs/dataflow.dot: run `make docs-generate`"
    )


def test_the_picture_is_what_dot_draws_from_its_source() -> None:
    """Drawn again and compared, comments aside (dot names its version in one): a hand-edited picture fails too."""
    dot = docs.dot_binary()
    if dot is None:
        pytest.skip("dot is not installed (Debian's graphviz, which `adbill deps` installs)")
    drawn = docs.draw_picture(docs.PICTURE_SOURCE.read_text(), dot)
    without_comments = [re.sub(r"<!--.*?-->", "", svg, flags=re.S) for svg in (docs.PICTURE.read_text(), drawn)]
    assert without_comments[0] == without_comments[1], (
        "docs/dataflow.svg is not what dot draws from docs/dataflow.dot: run `make docs-generate`"
    )


def test_the_generator_says_when_nothing_is_out_of_date() -> None:
    assert docs.out_of_date() == []
    assert docs.main(["--check"]) == 0


# Tests: versions --------------------------------------------------------------------------------------------------
def test_the_versions_table_says_what_is_pinned() -> None:
    table = (DOCS / "versions.md").read_text()
    pyproject = PYPROJECT["project"]
    pins = dict(
        requirement.split("==")
        for requirement in [*pyproject["dependencies"], *sum(pyproject["optional-dependencies"].values(), [])]
    )
    for package, name in [("pyspark", "pyspark"), ("crawler-user-agents", "crawler-user-agents"),
                          ("gunicorn", "gunicorn"), ("matplotlib", "matplotlib")]:  # fmt: skip
        assert re.search(rf"^\| {re.escape(name)} \| {re.escape(pins[package])} \|", table, re.M), package
    assert f"Selenium {pins['selenium']}" in table
    kafka = re.search(
        r"<kafka.version>(.+?)</kafka.version>", (PROJECT_ROOT / "ops/maven/kafka-broker.xml").read_text()
    )
    assert kafka and re.search(rf"^\| Apache Kafka broker \| {re.escape(kafka.group(1))} \|", table, re.M)


# Tests: the tests a page names ------------------------------------------------------------------------------------
@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_test_a_page_names_exists(page: Path) -> None:
    """`tests/...py` and `tests/...py::test_name`, and the security table's `S::test_name` by its legend's letters."""
    text = " ".join(page.read_text().split())
    legend = dict(re.findall(r"`([A-Z])` (?:is )?`(tests/[\w/]+\.py)`", text))
    named = [(path, test) for path, test in re.findall(r"(tests/[\w/]+\.py)(?:::(\w+))?", text)]
    named += [(legend[letter], test) for letter, test in re.findall(r"\b([A-Z])::(\w+)", text) if letter in legend]
    for path, test in named:
        assert (PROJECT_ROOT / path).exists(), f"{rel(page)} names {path}, which does not exist"
        if test:
            assert f"def {test}(" in (PROJECT_ROOT / path).read_text(), (
                f"{rel(page)} names {path}::{test}: no such test"
            )


# Tests: the billing rules -----------------------------------------------------------------------------------------
RULES = DOCS / "billing-rules.md"
"""The rules the product bills by, each with the code that applies it and the tests that prove it."""
SKIPPED_FOLDERS = {"var", "build", "node_modules"}
"""Folders whose Markdown is not the project's (besides hidden ones: .venv, .deps, .git, the tools' caches)."""
OUTSIDE = re.compile(r"\.\./shared|\bshared/DOMAIN\.md|(?<![\w/.-])DOMAIN\.md\b")
"""How the project's pages once cited a contract kept outside the repository."""
TESTS_OF = re.compile(r"^( *)- `(tests/[\w/]+\.py)`:(.*(?:\n\1  (?! *- ).*)*)", re.M)
"""A list item naming the tests of one file: `- `tests/FILE.py`: `test_name`, `test_name[case-id]`, ...`."""
TEST_NAME = re.compile(r"`(test_\w+)(?:\[([\w.-]+)\])?`")
CODE = re.compile(r"(?:attribution|billing|ops|producers|web)(?:\.\w+)+")
FILE_SUFFIXES = {"avsc", "csv", "json", "lock", "md", "parquet", "py"}
"""A span such as `billing.parquet` names a file, not code."""


def project_markdown() -> list[Path]:
    """Every Markdown file of the repository, outside hidden folders and those of `SKIPPED_FOLDERS`."""
    found = []
    for page in sorted(PROJECT_ROOT.rglob("*.md")):
        parts = page.relative_to(PROJECT_ROOT).parts[:-1]
        if not any(part.startswith(".") or part in SKIPPED_FOLDERS for part in parts):
            found.append(page)
    return found


def named_tests(text: str) -> list[tuple[str, str, str | None]]:
    """(file, test function, case id or None) of each test a page names in the notation of `TESTS_OF`."""
    return [
        (path, name, case or None)
        for _indent, path, names in TESTS_OF.findall(text)
        for name, case in TEST_NAME.findall(names)
    ]


def test_no_markdown_file_cites_a_file_outside_the_repository() -> None:
    pages = project_markdown()
    assert README in pages and RULES in pages
    cited = []
    for page in pages:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            cited += [f"{rel(page)}:{number}: {match}" for match in OUTSIDE.findall(line)]
        for target in links(page):
            path = target.partition("#")[0]
            if path and not re.match(r"[a-z]+:", path):
                resolved = (page.parent / path).resolve()
                if not resolved.is_relative_to(PROJECT_ROOT.resolve()):
                    cited.append(f"{rel(page)}: {target}")
    assert not cited, f"pages that cite files outside the repository (cite docs/billing-rules.md): {cited}"


SOURCE_SUFFIXES = {".py", ".html", ".toml", ".yml", ".yaml", ".cfg", ".sh", ".dot", ".txt"}
"""The project's own text besides its Markdown: code, templates, settings."""


def test_no_source_file_cites_the_contract_outside_the_repository() -> None:
    """Code, tests and templates cite the billing rules where a user of the repository finds them."""
    here = Path(__file__).resolve()
    files = [
        path
        for path in PROJECT_ROOT.rglob("*")
        if path.suffix in SOURCE_SUFFIXES
        and path.is_file()
        and path.resolve() != here
        and not any(part.startswith(".") or part in SKIPPED_FOLDERS for part in path.relative_to(PROJECT_ROOT).parts)
    ]
    assert any(path.suffix == ".html" for path in files) and len(files) > 200
    cited = [
        f"{rel(path)}:{number}: {match}"
        for path in files
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        for match in OUTSIDE.findall(line)
    ]
    assert not cited, f"files that cite the contract outside the repository (cite docs/billing-rules.md): {cited}"


def test_every_test_the_billing_rules_name_exists() -> None:
    text = RULES.read_text()
    named = named_tests(text)
    assert len(named) > 100, "docs/billing-rules.md names its tests as `- `tests/FILE.py`: `test_name`, ...`"
    assert not re.search(r"tests/[\w/]+\.py::", text), "docs/billing-rules.md: name tests in one notation only"
    missing = []
    for path, name, case in named:
        source = PROJECT_ROOT / path
        if not source.exists():
            missing.append(f"{path}: no such file")
        elif not re.search(rf"^\s*def {name}\(", source.read_text(), re.M):
            missing.append(f"{path}: no test {name}")
        elif case and not re.search(rf"""\bid=["']{re.escape(case)}["']""", source.read_text()):
            missing.append(f"{path}: {name} has no case {case}")
    assert not missing, f"docs/billing-rules.md names tests that do not exist: {missing}"


def test_every_section_of_the_billing_rules_names_its_tests() -> None:
    sections = re.split(r"^## ", prose(RULES.read_text()), flags=re.M)[1:]
    assert len(sections) >= 10
    bare = [section.splitlines()[0] for section in sections if not named_tests(section)]
    assert not bare, f"sections of docs/billing-rules.md that name no test: {bare}"


def test_every_piece_of_code_the_billing_rules_name_exists() -> None:
    missing = []
    for span in sorted(set(spans(RULES.read_text()))):
        if not CODE.fullmatch(span) or span.rsplit(".", 1)[1] in FILE_SUFFIXES:
            continue
        parts = span.split(".")
        found: object = importlib.import_module(parts[0])
        for end, attribute in enumerate(parts[1:], 2):
            if hasattr(found, "__path__") and importlib.util.find_spec(".".join(parts[:end])) is not None:
                found = importlib.import_module(".".join(parts[:end]))
            else:
                found = getattr(found, attribute, None)
        if found is None:
            missing.append(span)
    assert not missing, f"docs/billing-rules.md names code that does not exist: {missing}"


def test_the_billing_rules_keep_to_120_characters_a_line() -> None:
    long = [n for n, line in enumerate(RULES.read_text().splitlines(), 1) if len(line) > 120]
    assert not long, f"docs/billing-rules.md: lines over 120 characters: {long}"
