"""A chat template's message markers (method/chunks.py ``Markers``), read from a tokenizer.

The generation prompt a template appends is the assistant's message header: its first token opens
every message (ChatML ``<|im_start|>``, Llama 3 ``<|start_header_id|>``, Gemma ``<start_of_turn>``)
and the tokens after it, less trailing whitespace, name the assistant's role. The start token must
be a special token and open every message of a rendered conversation; otherwise there are no
markers (the whole sequence is one message: chunks.cut_tokens).
"""

from __future__ import annotations

import logging

from tangram_sglang.method.chunks import Markers

logger = logging.getLogger("tangram_sglang")

_PROBE = [{"role": "user", "content": "Bravo"}, {"role": "assistant", "content": "Charlie"},
          {"role": "user", "content": "Delta"}]


def _render(tokenizer, generation: bool) -> list[int]:
    ids = tokenizer.apply_chat_template(_PROBE, tokenize=True, add_generation_prompt=generation)
    if hasattr(ids, "keys"):   # a BatchEncoding
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def detect_markers(tokenizer) -> Markers | None:
    """The markers of ``tokenizer``'s chat template, or None (no template, or one this rule cannot read)."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return None
    try:
        with_gen, without = _render(tokenizer, True), _render(tokenizer, False)
    except Exception as exc:  # a template that fails on a plain conversation: serve without markers
        logger.warning("Tangram: the chat template could not render a probe conversation (%s): chunks ignore "
                       "message boundaries", exc)
        return None
    if with_gen[:len(without)] != without or len(with_gen) < len(without) + 2:
        return None
    header = with_gen[len(without):]
    start, role = header[0], list(header[1:])
    while role and not tokenizer.decode([role[-1]]).strip():
        role.pop()
    special = set(getattr(tokenizer, "all_special_ids", ())) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    if not role or start not in special or with_gen.count(start) < len(_PROBE) + 1:
        return None
    return Markers(start_ids=(start,), assistant=(tuple(role),))
