"""Text that came from a candidate, made safe for wherever it is written.

A candidate controls its exception messages, its log and the strings in what it sends; a
repository under CI controls its kernel names and paths. Printed as they are, escape sequences
in them move the caller's cursor, erase the screen, set the window title or write the clipboard
(OSC 52), bidi overrides reorder what a reader sees, and a lone surrogate makes the print itself
raise; written into a JUnit file, a noncharacter (U+FFFE, U+FFFF) or a C0 control makes the
whole file unparseable, and in an HTML or Markdown report the text could become markup.

`clean_text` is the common base: it keeps newlines and tabs, drops every other control and
format character (whole escape sequences with their parameters) and the noncharacters, and
replaces what UTF-8 cannot encode. Each output format has one function over it, and every writer
of candidate-derived text goes through the one for its format:

- `xml_text`: characters XML 1.0 allows (ElementTree escapes `&<>"` itself);
- `html_text`: escaped with `html.escape`;
- `markdown_text`: one line, HTML and Markdown syntax escaped (for a table cell or a code span);
- `terminal_text`: printable, with rich markup escaped (`rich.markup.escape`) where asked.
"""

from __future__ import annotations

import html
import re
from typing import Any

# C0 controls but tab and newline, DEL, C1 controls, the bidi/zero-width format characters and
# the noncharacters (U+FDD0-U+FDEF, and the last two code points of every plane).
_NONCHARACTERS = "\ufdd0-\ufdef" + "".join(chr(p << 16 | 0xFFFE) + chr(p << 16 | 0xFFFF) for p in range(17))
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff"
                     + _NONCHARACTERS + "]")
# An escape sequence as a whole (CSI ... final byte, OSC ... BEL/ST), so its parameters go with it.
_SEQUENCE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x9b[0-?]*[ -/]*[@-~]")
# What XML 1.0 does not allow at all (its `Char` production), should anything above let it by.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# Markdown syntax that could make a link, an image, emphasis, a code span, math or a table cell.
_MARKDOWN = re.compile(r"([\\`*_\[\]|~$!])")


def clean_text(text: Any) -> str:
    if not isinstance(text, str):
        text = str(text)
    text = text.encode("utf-8", "replace").decode("utf-8")  # lone surrogates become "?"
    text = text.replace("\r\n", "\n")
    return _UNSAFE.sub("", _SEQUENCE.sub("", text))


def clean_tree(value: Any) -> Any:
    """clean_text over every string in nested dicts and lists (keys included)."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_tree(k) if isinstance(k, str) else k: clean_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_tree(v) for v in value]
    return value


def xml_text(text: Any) -> str:
    """For an XML attribute or text node built with ElementTree (which escapes it)."""
    return _NOT_XML.sub("", clean_text(text))


def html_text(text: Any, quote: bool = True) -> str:
    """Escaped for HTML text or a quoted attribute value."""
    return html.escape(clean_text(text), quote=quote)


def markdown_text(text: Any, code: bool = False) -> str:
    """One line for a Markdown table cell: raw HTML and Markdown syntax escaped. With `code`,
    for inside a code span instead, where escapes are literal: backticks become quotes."""
    line = " ".join(clean_text(text).split())
    if code:
        return line.replace("`", "'").replace("|", "\\|")
    return _MARKDOWN.sub(r"\\\1", html.escape(line, quote=False))


def plural(count: int, word: str, words: str | None = None) -> str:
    """'1 kernel', '2 kernels', '0 kernels' (`words` for an irregular plural)."""
    return f"{count} {word if count == 1 else (words or word + 's')}"


def terminal_text(text: Any, markup: bool = False) -> str:
    """For a terminal; with `markup`, for a string rich parses as console markup."""
    text = clean_text(text)
    if markup:
        from rich.markup import escape

        text = escape(text)
    return text
