"""MkDocs hook: the command-line reference page, generated from the parser at build time.

`workwarden.cli.build_parser()` is the one place the commands, their options
and their help live; this hook walks it and adds `reference/cli.md` to the
site, so the page can never drift from the program. (The prose guide is
`docs/cli.md`; this page is only the generated reference.)
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

PAGE = "reference/cli.md"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _option(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    names = ", ".join(action.option_strings)
    if action.nargs == 0:
        return f"`{names}`"
    metavar = action.metavar or action.dest.upper()
    if isinstance(metavar, tuple):
        metavar = " ".join(metavar)
    return f"`{names} {metavar}`"


def _default(action: argparse.Action) -> str:
    default = action.default
    if action.nargs == 0 or default is None or default is argparse.SUPPRESS:
        return ""
    return f"`{default}`"


def _meaning(action: argparse.Action) -> str:
    text = _cell(action.help or "")
    if action.choices is not None:
        choices = ", ".join(f"`{choice}`" for choice in action.choices)
        text = f"{text} (one of: {choices})" if text else f"one of: {choices}"
    return text


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    # argparse keeps its subcommands in a private action: there is no public walk.
    out: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:  # an alias maps to the same parser
                    seen.add(id(sub))
                    out.append((name, sub))
    return out


def _section(lines: list[str], prog: str, parser: argparse.ArgumentParser, depth: int) -> None:
    lines += [f"{'#' * depth} `{prog}`", ""]
    if parser.description:
        lines += [parser.description.strip(), ""]
    lines += ["```text", parser.format_usage().strip(), "```", ""]
    rows = [
        action
        for action in parser._actions
        if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
        and action.help is not argparse.SUPPRESS
    ]
    if rows:
        lines += ["| argument | default | meaning |", "| --- | --- | --- |"]
        lines += [f"| {_option(a)} | {_default(a)} | {_meaning(a)} |" for a in rows]
        lines.append("")
    for name, sub in _subcommands(parser):
        _section(lines, f"{prog} {name}", sub, min(depth + 1, 4))


def cli_reference() -> str:
    """The reference page: every command of `workwarden`, its usage, arguments and defaults."""
    from workwarden.cli import build_parser

    parser = build_parser()
    lines = [
        "# Command-line reference",
        "",
        "Generated from the program's own parser (`workwarden.cli.build_parser()`) when the",
        "site is built, so it lists exactly what `workwarden --help` and each command's",
        "`--help` print. The guide to using them is [the command line](../cli.md).",
        "",
    ]
    _section(lines, "workwarden", parser, 2)
    _mutants(lines)
    return "\n".join(lines).rstrip() + "\n"


def _mutants(lines: list[str]) -> None:
    """The names `--mutant` takes (`check`, `replay`), from the registry of broken cores."""
    from workwarden.statemachine.check.mutants import MUTANTS

    lines += [
        "## Mutants",
        "",
        "`workwarden check --mutant NAME` and `workwarden replay --mutant NAME` run a",
        "deliberately broken variant, to see the checker catch it",
        "(`workwarden.statemachine.check.mutants.MUTANTS`):",
        "",
        "| name | what it breaks |",
        "| --- | --- |",
    ]
    lines += [f"| `{name}` | {_cell(m.breaks)} |" for name, m in sorted(MUTANTS.items())]
    lines.append("")


#: Where the installed package's layout is mirrored for mkdocstrings (`paths` in mkdocs.yml).
API_SOURCE = Path("build") / "api-src"
#: Package folders that sit at the top of the repository, and the installed name of each.
MAPPED = {"statemachine": "statemachine", "storage": "storage", "specs": "specs"}


@event_priority(100)  # before mkdocstrings reads its `paths`
def on_config(config: Any) -> Any:
    """Lay the installed package out as links into the tree, for the static API finder.

    setuptools installs `statemachine/` as `workwarden.statemachine` (and so on,
    `pyproject.toml`, `package-dir`); griffe finds modules by folder, so it is
    shown `workwarden/` with those folders linked in beside the root package's own.
    """
    root = Path(config["config_file_path"]).parent
    package = root / API_SOURCE / "workwarden"
    if package.exists():
        shutil.rmtree(package)
    package.mkdir(parents=True)
    for entry in (root / "workwarden").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for folder, name in MAPPED.items():
        (package / name).symlink_to(root / folder)
    return config


def on_files(files: Files, config: Any) -> Files:
    """Add the generated command-line reference to the site's files."""
    files.append(File.generated(config, PAGE, content=cli_reference()))
    return files
