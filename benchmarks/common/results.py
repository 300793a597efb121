"""Writing results files, each stamped (benchmarks/common/stamp.py): JSON with a top-level ``"stamp"``,
Markdown with the stamp as the line under its title."""

from __future__ import annotations

import json
import os

from benchmarks.common.stamp import markdown_line


def _parent(path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)


def write_json(path: str, data: dict, stamp: dict, row_per_line: str | None = None) -> None:
    """``{"stamp": stamp, **data}`` at ``path``; ``row_per_line``: the key of a list written one element a
    line (compact rows that diff line by line), the rest indented."""
    _parent(path)
    out = {"stamp": stamp, **data}
    if row_per_line is None:
        text = json.dumps(out, indent=1) + "\n"
    else:
        rows = out.pop(row_per_line)
        head = json.dumps(out, indent=1)[:-2]  # without the closing "\n}"
        text = (head + f',\n "{row_per_line}": [\n' + ",\n".join("  " + json.dumps(r) for r in rows)
                + "\n ]\n}\n")
    with open(path, "w") as f:
        f.write(text)


def write_markdown(path: str, title: str, lines: list[str], stamp: dict) -> str:
    """``# title``, the stamp line, then ``lines``; returns the text written."""
    _parent(path)
    text = "\n".join([f"# {title}", "", markdown_line(stamp), "", *lines]).rstrip("\n") + "\n"
    with open(path, "w") as f:
        f.write(text)
    return text
