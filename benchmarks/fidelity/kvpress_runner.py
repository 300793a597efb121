"""NVIDIA kvpress 0.5.5 as an independent peer for the multi-turn fidelity benchmark.

Runs inside the kvpress venv built by ``benchmarks/kvpress_env.py`` (imports only
torch, transformers, kvpress and the standard library):

    OMP_NUM_THREADS=1 "$(.venv/bin/python benchmarks/kvpress_env.py)" benchmarks/kvpress_runner.py \\
        --model-path DIR --conversations IN.jsonl --out OUT.jsonl \\
        --setting full --setting snapkv:0.5 --setting kvzip:0.5 [--threads 1]

Input, one JSON object a line::

    {"id": str, "history_ids": [int...], "question_ids": [int...], "max_new_tokens": int,
     "stop_ids": [int...], "fact_spans": [[start, end), ...]}

history_ids is the chat-templated history (everything before the final user turn),
question_ids the final user turn plus the assistant generation prompt. Ids are used
as given: no chat template, no re-tokenization.

Flow per (conversation, setting), following kvpress's KVPressTextGenerationPipeline
(``_forward`` / ``generate_answer``): the history is prefilled through the model
body (``model.model``, no LM head) inside the press's context manager, so the press
compresses it; the question is then fed with no press active at positions
``len(history) ...`` (the uncompressed positions, as the pipeline does) and the
answer is decoded greedily (argmax). Unlike the pipeline, decoding stops at any of
``stop_ids`` including on the first token, the stop id is not part of the answer,
and at most ``max_new_tokens`` tokens are produced. float32, CPU, eval mode, no grad,
``torch.set_num_threads(--threads)``, SDPA attention (kvpress's masking presses
refuse eager attention).

Settings, ``NAME:KEPT`` where KEPT is the share of the history's KV kept and kvpress's
``compression_ratio = 1 - KEPT``; every press keeps kvpress's defaults:

* ``full``: no press (KEPT ignored, recorded as 1.0);
* ``snapkv``: SnapKVPress (window_size=64, kernel_size=5; the last 64 history tokens
  are the observation window and always kept; the history must be longer than 64);
* ``expected_attention``: ExpectedAttentionPress (n_future_positions=512, n_sink=4,
  use_covariance=True, use_vnorm=True, epsilon=0);
* ``keydiff``: KeyDiffPress (no parameters);
* ``kvzip``: KVzipPress (layerwise=False, i.e. one bottom-k over all layers and heads;
  n_sink=4, chunk_size=2048, no KVzip+ normalization). Its context manager runs the
  context-reconstruction passes itself when it exits (it captures the prefill's
  input_ids and cache), then masks the evicted entries; it reloads the tokenizer from
  --model-path for the repeat prompt and treats the leading tokens of a one-user-turn
  chat template as an unscored prefix;
* ``adakv-snapkv``, ``adakv-expected_attention``: AdaKVPress(alpha_safeguard=0.2)
  around the scorer press above.

SnapKV, Expected Attention and KeyDiff prune (the kept entries are gathered, the same
count for every head); AdaKV and KVzip keep everything and mask evicted keys
(``masked_key_indices``) during later attention: nothing is freed.

Output, appended one JSON object a line per (id, setting, kept)::

    {"id", "setting", "kept", "answer_ids", "seconds", "history_tokens", "fact_kept_share"}

seconds covers the compressed prefill (KVzip's reconstruction included) plus the
question and the decode, not the model load nor the fact_kept_share measurement.
fact_kept_share is the share of (layer, KV head, fact token) entries of the history
still visible to attention after compression: pruned positions are identified by
matching the press's output keys exactly against its input keys, masked ones from
``masked_key_indices``; null when the input has no fact spans or the positions
cannot be identified unambiguously. Triples already in --out are
skipped (resumable). Settings, input lines and --out are validated before the model
is loaded; a problem exits non-zero with a message. One progress line per item goes
to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import torch
from kvpress import AdaKVPress, ExpectedAttentionPress, KeyDiffPress, KVzipPress, SnapKVPress
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.utils import logging as hf_logging

PRESSES = {
    "full": None,
    "snapkv": lambda ratio: SnapKVPress(compression_ratio=ratio),
    "expected_attention": lambda ratio: ExpectedAttentionPress(compression_ratio=ratio),
    "keydiff": lambda ratio: KeyDiffPress(compression_ratio=ratio),
    "kvzip": lambda ratio: KVzipPress(compression_ratio=ratio),
    "adakv-snapkv": lambda ratio: AdaKVPress(SnapKVPress(compression_ratio=ratio)),
    "adakv-expected_attention": lambda ratio: AdaKVPress(ExpectedAttentionPress(compression_ratio=ratio)),
}
ID_LISTS = ("history_ids", "question_ids", "stop_ids")


def parse_setting(spec: str) -> tuple[str, float]:
    """'NAME:KEPT' -> (name, kept); 'full' may omit KEPT and always gets 1.0."""
    name, _, kept_text = spec.partition(":")
    if name not in PRESSES:
        raise ValueError(f"unknown setting {name!r} (known: {', '.join(PRESSES)})")
    if name == "full":
        return name, 1.0
    try:
        kept = float(kept_text)
    except ValueError:
        raise ValueError(f"setting {spec!r}: expected {name}:KEPT with KEPT in (0, 1]") from None
    if not 0 < kept <= 1:
        raise ValueError(f"setting {spec!r}: KEPT must be in (0, 1]")
    return name, kept


def _is_int_list(value) -> bool:
    return isinstance(value, list) and all(type(x) is int and x >= 0 for x in value)


def check_item(item, vocab_size: int) -> str | None:
    """Why an input record is malformed, or None when it is fine."""
    if not isinstance(item, dict) or not isinstance(item.get("id"), str):
        return "expected an object with a string 'id'"
    for key in ID_LISTS:
        if not _is_int_list(item.get(key)):
            return f"'{key}' must be a list of non-negative ints"
        if any(x >= vocab_size for x in item[key]):
            return f"'{key}' has an id >= the vocabulary size {vocab_size}"
    if not item["history_ids"] or not item["question_ids"]:
        return "'history_ids' and 'question_ids' must not be empty"
    if type(item.get("max_new_tokens")) is not int or item["max_new_tokens"] < 1:
        return "'max_new_tokens' must be an int >= 1"
    spans = item.get("fact_spans")
    if not isinstance(spans, list) or not all(_is_int_list(s) and len(s) == 2 for s in spans):
        return "'fact_spans' must be a list of [start, end] int pairs"
    if any(not start < end <= len(item["history_ids"]) for start, end in spans):
        return "every fact span needs start < end <= len(history_ids)"
    return None


def load_conversations(path: Path, vocab_size: int) -> list[dict]:
    """All input records, validated; raises ValueError naming the first bad line."""
    items, seen = [], set()
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON ({exc})") from None
        problem = check_item(item, vocab_size) or (f"duplicate id {item['id']!r}" if item["id"] in seen else None)
        if problem:
            raise ValueError(f"{path}:{number}: {problem}")
        seen.add(item["id"])
        items.append(item)
    return items


def done_keys(path: Path) -> set[tuple[str, str, float]]:
    """(id, setting, kept) triples already written to --out."""
    if not path.exists():
        return set()
    keys = set()
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            keys.add((record["id"], record["setting"], float(record["kept"])))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise ValueError(f"{path}:{number}: not a result line; fix or move the file") from None
    return keys


def surviving_rows(original: torch.Tensor, kept: torch.Tensor) -> torch.Tensor | None:
    """bool [heads, T]: which rows of original [heads, T, d] reappear exactly in kept
    [heads, M, d]; None when original has duplicate rows or kept has foreign ones."""
    heads, length, _ = original.shape
    alive = torch.zeros(heads, length, dtype=torch.bool)
    for head in range(heads):
        rows, inverse = torch.unique(torch.cat([original[head], kept[head]]), dim=0, return_inverse=True)
        if rows.shape[0] != length:
            return None
        alive[head] = torch.isin(inverse[:length], inverse[length:])
    return alive


class VisibilityTracker:
    """Which (layer, KV head, history position) entries a press leaves visible.

    Pruning presses: kvpress's BasePress.forward_hook calls ``press.compress`` with
    the layer's full keys and stores what it returns; the tracker wraps that call
    and keeps both. Masking presses: ``masked_key_indices`` on each attention module.
    """

    def __init__(self, model, press):
        self.attentions = [layer.self_attn for layer in model.model.layers]
        for attention in self.attentions:
            attention.masked_key_indices = None
        self.compressed = {}
        if press is not None:
            self._wrap(press)

    def _wrap(self, press) -> None:
        compress = press.compress

        def recording_compress(module, hidden_states, keys, values, attentions, kwargs):
            kept_keys, kept_values = compress(module, hidden_states, keys, values, attentions, kwargs)
            self.compressed[module.layer_idx] = (keys[0], kept_keys[0])
            return kept_keys, kept_values

        press.compress = recording_compress

    def visible(self, cache: DynamicCache, history_len: int) -> torch.Tensor | None:
        """bool [layers, kv heads, history_len], or None if not identifiable."""
        masks = []
        for index, attention in enumerate(self.attentions):
            keys = cache.layers[index].keys[0]
            original, kept = self.compressed.get(index, (keys, keys))
            alive = surviving_rows(original, kept) if original.shape[1] == history_len else None
            if alive is None:
                return None
            if attention.masked_key_indices is not None:
                _, heads, positions = attention.masked_key_indices
                alive[heads, positions] = False
            masks.append(alive)
        return torch.stack(masks)


def fact_share(visible: torch.Tensor | None, spans: list[list[int]]) -> float | None:
    """Share of (layer, head, fact token) entries visible; None if unmeasurable."""
    if visible is None or not spans:
        return None
    positions = torch.unique(torch.cat([torch.arange(start, end) for start, end in spans]))
    return round(float(visible[:, :, positions].float().mean()), 6)


def generate(model, cache, question_ids, start, max_new_tokens, stop_ids) -> list[int]:
    """Feed the question at positions start..., then decode greedily until a stop id."""
    ids = torch.tensor([question_ids])
    answer = []
    while len(answer) < max_new_tokens:
        positions = torch.arange(start, start + ids.shape[1]).unsqueeze(0)
        logits = model(input_ids=ids, past_key_values=cache, position_ids=positions, logits_to_keep=1).logits
        start += ids.shape[1]
        token = int(logits[0, -1].argmax())
        if token in stop_ids:
            break
        answer.append(token)
        ids = torch.tensor([[token]])
    return answer


def run_one(model, item: dict, name: str, kept: float) -> dict:
    """Compressed prefill of the history, uncompressed question, greedy answer."""
    press = PRESSES[name](1.0 - kept) if name != "full" else None
    tracker = VisibilityTracker(model, press)
    history = torch.tensor([item["history_ids"]])
    cache = DynamicCache()
    began = time.perf_counter()
    with press(model) if press is not None else contextlib.nullcontext():
        model.model(input_ids=history, past_key_values=cache)
    prefill_seconds = time.perf_counter() - began
    visible = tracker.visible(cache, history.shape[1])
    began = time.perf_counter()
    answer = generate(
        model, cache, item["question_ids"], history.shape[1], item["max_new_tokens"], set(item["stop_ids"])
    )
    return {
        "id": item["id"],
        "setting": name,
        "kept": kept,
        "answer_ids": answer,
        "seconds": round(prefill_seconds + time.perf_counter() - began, 4),
        "history_tokens": history.shape[1],
        "fact_kept_share": fact_share(visible, item["fact_spans"]),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", type=Path, required=True, help="HF model folder (float32 safetensors)")
    parser.add_argument("--conversations", type=Path, required=True, help="input JSONL")
    parser.add_argument("--setting", action="append", required=True, help="NAME:KEPT, repeatable")
    parser.add_argument("--out", type=Path, required=True, help="output JSONL (appended, resumable)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        args.settings = [parse_setting(spec) for spec in args.setting]
    except ValueError as exc:
        parser.error(str(exc))
    if len(set(args.settings)) != len(args.settings):
        parser.error("a setting is given twice")
    if args.threads < 1:
        parser.error("--threads must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        vocab_size = json.loads((args.model_path / "config.json").read_text())["vocab_size"]
        items = load_conversations(args.conversations, vocab_size)
        done = done_keys(args.out)
    except (OSError, KeyError, ValueError) as exc:
        print(f"kvpress_runner: error: {exc}", file=sys.stderr)
        return 2
    todo = [(item, name, kept) for item in items for name, kept in args.settings
            if (item["id"], name, kept) not in done]
    skipped = len(items) * len(args.settings) - len(todo)
    print(f"kvpress_runner: {len(todo)} to run, {skipped} already in {args.out}", file=sys.stderr)
    if not todo:
        return 0
    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(args.model_path, dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    with torch.no_grad(), args.out.open("a") as out:
        for number, (item, name, kept) in enumerate(todo, 1):
            record = run_one(model, item, name, kept)
            out.write(json.dumps(record) + "\n")
            out.flush()
            print(
                f"[{number}/{len(todo)}] {item['id']} {name}:{kept} history={record['history_tokens']} "
                f"answer={len(record['answer_ids'])} fact_kept={record['fact_kept_share']} {record['seconds']:.2f}s",
                file=sys.stderr,
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
