"""Read multi-turn conversations from the (truncated) ShareGPT V3 json.

The packaged file is a JSON array cut off mid-record, so ``json.load`` fails.
``iter_conversations`` walks it with ``JSONDecoder.raw_decode`` over a
growing buffer, reading only as much of the 125 MB file as the caller
consumes, and stops quietly at the truncation.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant"}
_BLOCK = 1 << 20


def iter_records(path: str) -> Iterator[dict]:
    """Yield the array's objects one by one; stop at end of file or truncation."""
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf, pos, eof = "", 0, False
        while True:
            while pos < len(buf) and buf[pos] in "[, \n\r\t":
                pos += 1
            try:
                obj, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof:
                    return
                more = f.read(_BLOCK)
                eof = not more
                buf, pos = buf[pos:] + more, 0
                continue
            yield obj
            pos = end


def to_messages(record: dict) -> list[dict]:
    """ShareGPT turns -> chat messages, strictly alternating and starting with the user."""
    messages: list[dict] = []
    for turn in record.get("conversations", []):
        role = ROLES.get(str(turn.get("from", "")).lower())
        text = str(turn.get("value", "")).strip()
        if role is None or not text:
            continue
        if not messages and role != "user":
            continue
        if messages and messages[-1]["role"] == role:
            messages[-1] = {"role": role, "content": messages[-1]["content"] + "\n\n" + text}
        else:
            messages.append({"role": role, "content": text})
    return messages


def iter_conversations(path: str, min_turns: int = 4, min_chars: int = 4000) -> Iterator[tuple[str, list[dict]]]:
    """(id, messages) of conversations with >= min_turns messages and >= min_chars of text."""
    for record in iter_records(path):
        messages = to_messages(record)
        if len(messages) >= min_turns and sum(len(m["content"]) for m in messages) >= min_chars:
            yield str(record.get("id", "")), messages
