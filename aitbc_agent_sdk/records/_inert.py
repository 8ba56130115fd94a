"""Text from another party made inert before anyone sees it: the one place that escapes it.

A worker's error, a provider's hardware name, an audit reason or a metric's name may hold terminal
escape sequences (set the title, clear the screen, move the cursor), bidi overrides that reorder what
is shown, or Rich markup (``[/]`` crashes a view, ``[green]paid in full[/]`` fakes a line). Every view
that shows such text passes it through one of these, once, where it is shown:

- :func:`visible`: control characters written as escapes (``\\x1b``, ``\\u202e``) -- plain text
  outputs (``logs``, chat and MCP answers);
- :func:`terminal_markup`: the same, and Rich markup and emoji codes shown literally -- any string Rich
  renders as markup (``Console.print``, table cells and titles);
- :func:`html_text`: the same, and HTML-escaped -- HTML reports;
- :func:`visible_values`: :func:`visible` over every string (and key) of a JSON value -- answers to a model.

Made visible: C0 controls (newline and tab kept where a multi-line field allows them), DEL, C1
controls, lone surrogates (they cannot even be encoded to a terminal), the line and paragraph
separators, and the bidi controls U+061C, U+200E/F, U+202A-202E and U+2066-2069. The result holds
none of them, and escaping it again changes nothing.
"""

from __future__ import annotations

import html
import re
from typing import Any

_HIDDEN = "\x00-\x1f\x7f-\x9f\ud800-\udfff\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_ONE_LINE = re.compile(f"[{_HIDDEN}]")
_MULTI_LINE = re.compile(f"(?![\n\t])[{_HIDDEN}]")
# Rich turns ":name:" into an emoji wherever it renders markup; an empty style tag after the colon
# splits the code so it reads as typed, and adds nothing to what is shown.
_EMOJI_CODE = re.compile(r":(?=\S*?:)")
_EMPTY_TAG = "[none][/none]"
_BRACKET_OR_END = re.compile(r"(\\*)(\[|\Z)")


def _escaped(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def visible(text: object, *, multiline: bool = False) -> str:
    """``text`` with every control, separator and bidi character written as its Python escape;
    ``multiline`` keeps newlines and tabs (never a carriage return, which overwrites a line)."""
    return (_MULTI_LINE if multiline else _ONE_LINE).sub(_escaped, str(text))


def terminal_markup(text: object, *, multiline: bool = False) -> str:
    """``text`` as Rich markup that shows it literally: :func:`visible`, brackets and emoji codes escaped.

    For strings Rich parses (``console.print``, table cells); never escape the result again."""
    markup = _BRACKET_OR_END.sub(_escaped_bracket, visible(text, multiline=multiline))
    return _EMOJI_CODE.sub(":" + _EMPTY_TAG, markup)


def _escaped_bracket(match: re.Match[str]) -> str:
    # Rich reads "\[" as "[" anywhere, and backslashes before a tag as escapes: so every "[" is escaped, and
    # backslashes before one (or at the end, before the view's next tag) are doubled before an empty tag.
    backslashes, bracket = match.groups()
    return (backslashes * 2 + _EMPTY_TAG if backslashes else "") + ("\\[" if bracket else "")


def html_text(text: object, *, multiline: bool = False) -> str:
    """``text`` for an HTML page: :func:`visible`, then ``&<>"'`` escaped."""
    return html.escape(visible(text, multiline=multiline), quote=True)


def visible_values(value: Any) -> Any:
    """A JSON value (dicts, lists, strings, numbers) with every string and key passed through :func:`visible`
    (newlines kept: JSON carries them safely)."""
    if isinstance(value, str):
        return visible(value, multiline=True)
    if isinstance(value, dict):
        return {visible(k, multiline=True) if isinstance(k, str) else k: visible_values(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [visible_values(v) for v in value]
    return value
