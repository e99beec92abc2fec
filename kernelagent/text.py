"""Text that came from a candidate, made safe to print.

A candidate controls its exception messages, its log and the strings in what it sends. Printed
as they are, escape sequences in them move the caller's cursor, erase the screen or write the
clipboard (OSC 52), bidi overrides reorder what a reader sees, and a lone surrogate makes the
print itself raise. `clean_text` keeps newlines and tabs, drops every other control and format
character, and replaces what UTF-8 cannot encode."""

from __future__ import annotations

import re
from typing import Any

# C0 controls but tab and newline, DEL, C1 controls, and the bidi/zero-width format characters.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")
# An escape sequence as a whole (CSI ... final byte, OSC ... BEL/ST), so its parameters go with it.
_SEQUENCE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x9b[0-?]*[ -/]*[@-~]")


def clean_text(text: str) -> str:
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
