"""The fidelity benchmark's settings: the profiles it serves, the oracle and kvpress settings, the tags
that name variants of a setting. Shared by the runners, the code versions and the report."""

from __future__ import annotations

import re

from benchmarks.common.paths import result_path

PROFILES = {"smollm2": "configs/smollm2-snapkv.yaml", "qwen2.5-0.5b": "configs/qwen2.5-0.5b-snapkv.yaml",
            "gemma3-270m": "configs/gemma3-270m-fastkvzip.yaml"}  # a base model: plain prompts (launch/models.py)
ORACLE = ("static", "dynamic", "uniform")
KVPRESS = ("kvpress-snapkv", "kvpress-adakv-snapkv", "kvpress-kvzip")
CHUNK = 512
DEFAULT_PROTECT = (4, 64)
RUNS = result_path("fidelity", "fidelity_runs.jsonl")  # fidelity_versions.json lies beside it


def base_setting(setting: str) -> str:
    """'dynamic' of 'dynamic@0,0', 'dynamic~position', 'dynamic[fastkvzip]', 'dynamic+fp8_e4m3' (the tags
    of --protect, --chunking, --profile and --kv-cache-dtype)."""
    return re.split(r"[@~\[+]", setting)[0]


def chunking(setting: str) -> str:
    """The --chunking a setting was run with: 'position' or 'replies' from its '~' tag, else 'turn'."""
    m = re.search(r"~(\w+)", setting)
    return m.group(1) if m else "turn"


def chunk_markers(how: str, tokenizer):
    """The chunk rule's message markers for --chunking ``how``: turn = the chat template's (the served
    rule), position = none (the whole prompt one message), replies = the template's without the
    assistant's role (its messages compressed once closed, as ``--tangram-replies compressed`` serves)."""
    from tangram_sglang.method.chat_markers import detect_markers
    from tangram_sglang.method.chunks import Markers

    markers = None if how == "position" else detect_markers(tokenizer)
    return Markers(start_ids=markers.start_ids) if how == "replies" and markers else markers


def kv_cache_dtype(setting: str) -> str | None:
    """The --kv-cache-dtype of a setting tagged '+fp8_e4m3' (None: the model's dtype)."""
    return setting.rpartition("+")[2] if "+" in setting else None
