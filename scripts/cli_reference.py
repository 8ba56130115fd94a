"""The CLI reference in markdown, generated from the ``aitbc`` commands themselves, so it cannot drift.

    python scripts/cli_reference.py                                 # print it
    python scripts/cli_reference.py --write docs/reference/cli.md   # replace the page's section
    python scripts/cli_reference.py --check docs/reference/cli.md   # exit 1 when that section differs

The section is the text between ``<!-- cli-reference:start -->`` and ``<!-- cli-reference:end -->``;
the page's own prose around it is kept. Every command is a ``###`` heading, so the docs site's table
of contents and the links in each group's command table lead to it.
Every visible command and group gets its usage line, description, arguments and options (names
and aliases, type or choices, default, range, environment variable, help). Hidden commands and
options stay out, as they do in ``--help``.

The text must not depend on who runs it: the app is imported with ``HOME`` set to an empty
directory (shown as ``~``) and without the ``AITBC_*``, ``ETH_*`` and ``XDG_*`` variables, so no
user config or environment leaks into a default.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

START = "<!-- cli-reference:start -->"
END = "<!-- cli-reference:end -->"
PROGRAM = "aitbc"
SCRUBBED_PREFIXES = ("AITBC_", "ETH_", "XDG_")
ROOT = Path(__file__).resolve().parents[1]


# -- walking the commands ------------------------------------------------------------------------


def root_command() -> Any:
    """The click command typer builds from ``aitbc_cli.app:app`` (import deferred until the env is fixed)."""
    import typer.main

    from aitbc_cli.app import app

    return typer.main.get_command(app)


def walk(command: Any, ctx: Any) -> Iterator[tuple[Any, Any]]:
    """(command, its context) depth first, in the order ``--help`` lists them; hidden ones left out."""
    yield command, ctx
    if not hasattr(command, "list_commands"):
        return
    for name in command.list_commands(ctx):
        sub = command.get_command(ctx, name)
        if sub is None or getattr(sub, "hidden", False):
            continue
        yield from walk(sub, type(ctx)(sub, info_name=name, parent=ctx))


def _default(param: Any, ctx: Any) -> str:
    # typer's own helpers, so the default reads exactly as in ``--help``.
    show_is_str = isinstance(getattr(param, "show_default", None), str)
    value = param._extract_default_help_str(ctx=ctx)
    if value is None and not show_is_str:
        return ""
    if getattr(param, "show_default", True) is False and not show_is_str:
        return ""
    return param._get_default_string(ctx=ctx, show_default_is_str=show_is_str, default_value=value)


def _names(param: Any) -> str:
    if param.param_type_name == "argument":
        return param.human_readable_name if hasattr(param, "human_readable_name") else param.name.upper()
    names = ", ".join(f"`{o}`" for o in param.opts)
    if param.secondary_opts:
        names += " / " + ", ".join(f"`{o}`" for o in param.secondary_opts)
    return names


def _type(param: Any, ctx: Any) -> str:
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return "flag"
    shown = param.display_type_rich(ctx)
    return str(shown) if shown else ""


def _notes(param: Any) -> list[str]:
    notes = []
    number_range = param._get_number_range_help_str()
    if number_range:
        notes.append(f"range {number_range}")
    envvar = param.envvar
    if envvar:
        names = [envvar] if isinstance(envvar, str) else list(envvar)
        notes.append("env " + ", ".join(f"`{n}`" for n in names))
    if param.required:
        notes.append("required")
    return notes


# -- rendering -----------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def _code_cell(text: str) -> str:
    """A table cell in code font. Choices (``<a|b>``, ``A|B``) become one code span per choice joined
    by an escaped pipe, since renderers disagree about a ``\\|`` inside a code span in a table."""
    text = " ".join(str(text).split())
    if "|" not in text:
        return _code(text)
    if text.startswith("<") and text.endswith(">"):
        text = text[1:-1]
    return " \\| ".join(_code(choice) for choice in text.split("|"))


def _description(help_text: str | None) -> list[str]:
    """Paragraphs as text; a paragraph of commands or indented lines (an example) as a code block."""
    text = inspect.cleandoc(help_text or "")
    out: list[str] = []
    for paragraph in text.split("\n\n"):
        lines = [line for line in paragraph.splitlines() if line.strip() != "\b"]
        if not lines:
            continue
        if all(line.startswith(("  ", "$ ", f"{PROGRAM} ")) for line in lines):
            out += ["```", *(line.strip() if line.startswith("  ") else line for line in lines), "```", ""]
        else:
            out += [" ".join(line.strip() for line in lines), ""]
    return out


def render_command(command: Any, ctx: Any) -> list[str]:
    path = ctx.command_path
    out = [f"### `{path}`", ""]
    if getattr(command, "deprecated", False):
        out += ["*Deprecated.*", ""]
    out += ["```", command.get_usage(ctx).strip(), "```", ""]
    out += _description(command.help or command.short_help)
    params = [p for p in command.get_params(ctx) if not getattr(p, "hidden", False)]
    if params:
        out += ["| Argument / option | Type | Default | Help |", "|---|---|---|---|"]
        for param in params:
            help_text = "; ".join(filter(None, [_cell(getattr(param, "help", "") or ""), *_notes(param)]))
            out.append(f"| {_names(param)} | {_code_cell(_type(param, ctx))} | "
                       f"{_code_cell(_default(param, ctx))} | {help_text} |")
        out.append("")
    if hasattr(command, "list_commands"):
        subs = [(name, command.get_command(ctx, name)) for name in command.list_commands(ctx)]
        visible = [(name, sub) for name, sub in subs if sub is not None and not getattr(sub, "hidden", False)]
        if visible:
            out += ["| Command | Summary |", "|---|---|"]
            for name, sub in visible:
                summary = sub.get_short_help_str(limit=120) if hasattr(sub, "get_short_help_str") else ""
                out.append(f"| [`{name}`](#{_anchor(f'{path} {name}')}) | {_cell(summary)} |")
            out.append("")
    return out


def _anchor(title: str) -> str:
    # GitHub's heading anchors, which the docs site's toc extension also makes: lower case,
    # punctuation dropped, spaces to hyphens.
    kept = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def reference() -> str:
    """The whole reference, with the caller's home shown as ``~``."""
    with tempfile.TemporaryDirectory(prefix="aitbc-cli-reference-") as home:
        saved = dict(os.environ)
        try:
            for name in list(os.environ):
                if name.startswith(SCRUBBED_PREFIXES):
                    del os.environ[name]
            os.environ["HOME"] = home
            os.environ["COLUMNS"] = "100"  # usage lines wrap by the terminal width
            command = root_command()
            ctx_type = _context_type(command)
            lines = ["<!-- generated by scripts/cli_reference.py from the commands; do not edit by hand -->", ""]
            lines += grouped(walk(command, ctx_type(command, info_name=PROGRAM)))
        finally:
            os.environ.clear()
            os.environ.update(saved)
    text = "\n".join(lines).rstrip() + "\n"
    return text.replace(str(Path(home).resolve()), "~").replace(home, "~")


def grouped(commands: Iterator[tuple[Any, Any]]) -> list[str]:
    """The root's page, then each command group and its commands, a rule between groups.

    Plain markdown only (no ``<details>`` folding): the docs site renders markdown inside raw HTML
    blocks as text, and the page's table of contents does the job folding used to do.
    """
    lines: list[str] = []
    for command, ctx in commands:
        if len(ctx.command_path.split()) == 2:
            lines += ["---", ""]
        lines += render_command(command, ctx)
    return lines


def _context_type(command: Any) -> Any:
    return getattr(command, "context_class", None) or sys.modules[type(command).__module__].Context


# -- the page's section --------------------------------------------------------------------------


def section(text: str) -> tuple[int, int]:
    """Where the text between the markers starts and ends; SystemExit when they are missing."""
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"no {START} ... {END} section")
    return start + len(START), end


def replaced(document: str, generated: str) -> str:
    start, end = section(document)
    return document[:start] + "\n" + generated + "\n" + document[end:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", type=Path, metavar="FILE", help="exit 1 when FILE's section differs")
    action.add_argument("--write", type=Path, metavar="FILE", help="replace FILE's section")
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "cli")]  # the checkout's code, installed or not
    generated = reference()
    if args.write:
        args.write.write_text(replaced(args.write.read_text(encoding="utf-8"), generated), encoding="utf-8")
        return 0
    if args.check:
        document = args.check.read_text(encoding="utf-8")
        if replaced(document, generated) != document:
            print(f"{args.check}: the CLI reference differs from the commands; "
                  f"run python scripts/cli_reference.py --write {args.check}", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(generated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
