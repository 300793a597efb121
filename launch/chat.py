"""Serve a model with a Tangram profile, then hold a multi-turn chat with it.

    python launch/chat.py                      # SmolLM2 + its FastKVzip profile at the recommended ratio
                                               # (Qwen2.5-0.5B likewise; another model: a uniform 1.0 profile)
    python launch/chat.py --profile p.yaml --turns 4
    python launch/chat.py --url http://127.0.0.1:30000   # talk to a running server

Talks to the server over the OpenAI-compatible API on 127.0.0.1, keeping the
whole conversation in each request: SGLang's radix tree reuses the history.
The recommended ratio and the figures printed with it are read from the fidelity
results (benchmarks/common/report_tables.py: recommended()), never typed here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

QUESTIONS = [
    "Hi! In one sentence, what is a KV cache in a language model?",
    "Why does it grow in a multi-turn chat?",
    "Give one way to make it smaller.",
    "Summarize our conversation in one sentence.",
]


def _report_tables():
    """benchmarks/common/report_tables.py (standard library only), loaded by path."""
    import importlib.util

    path = os.path.join(os.path.dirname(HERE), "benchmarks", "common", "report_tables.py")
    spec = importlib.util.spec_from_file_location("tangram_report_tables", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def default_profile(model_path: str, out_dir: str) -> tuple[str, float | None, str]:
    """(profile, ratio, why): a shipped model's profile at its recommended ratio, with the measured
    figures behind it (from benchmarks/results/), else a uniform 1.0 profile."""
    tables = _report_tables()
    for key, spec in tables.SHIPPED.items():
        shipped = os.path.join(os.path.dirname(HERE), spec["profile"])
        if spec["folder"] in os.path.basename(os.path.normpath(model_path)) and os.path.isfile(shipped):
            rec = tables.recommended(key)
            return shipped, rec["ratio"], rec["why"]
    from tangram_sglang.profile.uniform import main as write_uniform

    path = os.path.join(out_dir, "uniform-1.0.yaml")
    write_uniform(["--model-path", model_path, "--ratio", "1.0", "-o", path])
    return path, None, "no calibrated profile for this model: uniform 1.0 (lossless)"


def chat(url: str, turns: int, max_tokens: int) -> list[dict]:
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="none")
    messages: list[dict] = []
    for question in QUESTIONS[:turns]:
        messages.append({"role": "user", "content": question})
        t0 = time.time()
        resp = client.chat.completions.create(model="default", messages=messages, max_tokens=max_tokens,
                                              temperature=0)
        answer = resp.choices[0].message.content
        messages.append({"role": "assistant", "content": answer})
        cached = getattr(resp.usage.prompt_tokens_details, "cached_tokens", None) if resp.usage.prompt_tokens_details else None
        print(f"\nuser: {question}\nassistant: {answer}\n  [{resp.usage.prompt_tokens} prompt tokens"
              f"{f', {cached} cached' if cached is not None else ''}, {resp.usage.completion_tokens} generated,"
              f" {time.time() - t0:.1f} s]", flush=True)
    return messages


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2", help="a key of launch/models.py, or an HF folder")
    ap.add_argument("--profile", default=None)
    ap.add_argument("--ratio", type=float, default=None, help="profile entry to serve (default: the demo's choice)")
    ap.add_argument("--url", default=None, help="use a running server instead of starting one")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    if args.url:
        chat(args.url, args.turns, args.max_tokens)
        return
    from models import ensure_model

    from tangram_sglang.sglang.server_process import ServerProcess

    model_path = args.model if os.path.isdir(args.model) else ensure_model(args.model)
    cache = os.environ.get("TANGRAM_CACHE", os.path.expanduser("~/.cache/tangram_sglang"))
    if args.profile:
        profile, ratio, why = args.profile, args.ratio, "your profile"
    else:
        profile, ratio, why = default_profile(model_path, cache)
        ratio = args.ratio if args.ratio is not None else ratio
    # --sleep-on-idle: SGLang's idle scheduler otherwise polls in a busy loop, a whole core, while you type
    extra = ["--enable-cache-report", "--sleep-on-idle"] + (["--tangram-ratio", str(ratio)] if ratio is not None else [])
    print(f"[chat] serving {model_path} with --tangram-profile {profile}"
          f"{f' --tangram-ratio {ratio}' if ratio is not None else ''} on port {args.port}\n[chat] why: {why}",
          flush=True)
    server = ServerProcess(model_path, port=args.port, profile=profile, threads=2, extra_args=extra)
    with server:
        print(f"[chat] server ready ({server.url}); log: {server.log_path}", flush=True)
        chat(server.url, args.turns, args.max_tokens)
    print("\n[chat] server stopped.")


if __name__ == "__main__":
    main()
