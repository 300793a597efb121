"""The CPU rehearsal's driver (run by launch/gpu_kit/rehearse.sh, inside the kit's environment).

Proves the kit alone supplies what the server imports: every kit package resolves to the unpacked
kit, then a tiny random Llama is served by stock SGLang and by SGLang with a ratio-1.0 tangram
profile, side by side; /generate with input_ids, then a second turn that extends each first turn's
prompt and answer. Both servers must give Hugging Face's greedy tokens, the tangram one must
report its pool, and the second turn must hit the radix cache. Exits non-zero otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import json
import os
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, ROOT]

from build import norm, read_pins  # noqa: E402

# The architectures the project serves (launch/gpu_kit/slim.py KEEP_MODELS): the slimmed sglang resolves each
SERVED_ARCHS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
                "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration", "GptOssForCausalLM",
                "Mistral3ForConditionalGeneration")
SAMPLING = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}
SERVER_ARGS = ["--skip-tokenizer-init", "--sleep-on-idle"]


def say(msg: str) -> None:
    print(f"[rehearse] {msg}", flush=True)


def check_provenance(kit_site: str) -> None:
    """Every kit wheel (and sglang) is found in the unpacked kit, at its pinned version."""
    wrong = []
    for name, version in [("sglang", "0.5.23")] + read_pins():
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            wrong.append(f"{name}: not found")
            continue
        where = os.path.realpath(str(dist.locate_file("")))
        if where != os.path.realpath(kit_site) or norm(dist.version) != norm(version):
            wrong.append(f"{name}: {dist.version} at {where}")
    plugins = [ep for ep in md.entry_points(group="sglang.srt.plugins") if ep.name == "tangram"]
    if len(plugins) != 1 or os.path.realpath(str(plugins[0].dist.locate_file(""))) != os.path.realpath(kit_site):
        wrong.append(f"the tangram plugin entry point: {[(ep.value, ep.dist.locate_file('')) for ep in plugins]}")
    if wrong:
        raise SystemExit("packages not from the kit:\n  " + "\n  ".join(wrong))
    say(f"{len(read_pins()) + 1} packages and the tangram plugin entry point resolve to the kit at {kit_site}")


def check_architectures() -> None:
    from sglang.srt.models.registry import ModelRegistry

    missing = [a for a in SERVED_ARCHS if a not in set(ModelRegistry.get_supported_archs())]
    if missing:
        raise SystemExit(f"the kit's sglang lacks {missing}")
    say(f"the model registry resolves {', '.join(SERVED_ARCHS)}")


def server_info(url: str) -> dict:
    with urllib.request.urlopen(url + "/server_info", timeout=30) as r:
        return json.loads(r.read())["internal_states"][0]


def generate(url: str, input_ids: list[list[int]]) -> list[dict]:
    body = json.dumps({"input_ids": input_ids, "sampling_params": SAMPLING}).encode()
    req = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def two_turns(url: str, prompts: list[list[int]]) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """(first-turn tokens, second-turn tokens, second-turn cached_tokens)."""
    first = [r["output_ids"] for r in generate(url, prompts)]
    turn2 = [p + o + [5, 6, 7] for p, o in zip(prompts, first)]
    second = generate(url, turn2)
    return first, [r["output_ids"] for r in second], [r["meta_info"]["cached_tokens"] for r in second]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", default="/tmp/gpu_kit_rehearsal")
    ap.add_argument("--port", type=int, default=31060, help="stock server; the tangram one gets port + 1")
    args = ap.parse_args()
    t0 = time.time()
    check_provenance(os.environ["TANGRAM_GPU_KIT"])
    mods = ("sglang.launch_server", "sglang.bench_serving", "sglang.benchmark.serving", "datasets", "torchvision")
    for mod in mods:
        importlib.import_module(mod)
    say(f"imports: {', '.join(mods)}")
    check_architectures()

    from tangram_sglang.profile.uniform import main as write_uniform
    from tangram_sglang.sglang.server_process import ServerProcess, start_all
    from tests.tiny_model import PROMPTS, build_tiny_llama, hf_greedy

    os.makedirs(args.workdir, exist_ok=True)
    model_path, profile = os.path.join(args.workdir, "llama"), os.path.join(args.workdir, "profile.yaml")
    hf = hf_greedy(build_tiny_llama(model_path), PROMPTS)
    write_uniform(["--model-path", model_path, "--ratio", "1.0", "-o", profile])
    servers = [ServerProcess(model_path, port=args.port, extra_args=SERVER_ARGS,
                             log_path=os.path.join(args.workdir, "stock.log")),
               ServerProcess(model_path, port=args.port + 1, profile=profile, extra_args=SERVER_ARGS,
                             log_path=os.path.join(args.workdir, "tangram.log"))]
    t_start = time.time()
    start_all(servers)
    say(f"both servers ready in {time.time() - t_start:.1f} s (logs in {args.workdir})")
    try:
        stock, tangram = (two_turns(s.url, PROMPTS) for s in servers)
        info = server_info(servers[1].url).get("tangram")
        stock_info = server_info(servers[0].url).get("tangram")
    finally:
        for s in servers:
            s.stop()
    say(f"stock   turn 1: {stock[0]}")
    say(f"tangram turn 1: {tangram[0]}")
    say(f"turn 2 cached tokens: stock {stock[2]}, tangram {tangram[2]}")
    say(f"tangram pool: {info and info['pool_info']}")
    expected_cached = [len(p) + len(o) - 1 for p, o in zip(PROMPTS, hf)]
    checks = {
        "stock turn 1 == HF greedy": stock[0] == hf,
        "tangram turn 1 == HF greedy": tangram[0] == hf,
        "tangram turn 2 == stock turn 2": tangram[1] == stock[1],
        "tangram turn 2 reads its history from the tree": tangram[2] == expected_cached,
        "tangram active on its server only": info is not None and stock_info is None,
        "tangram pool integrity ok": bool(info) and info["pool_info"].get("integrity") == "ok",
    }
    for what, ok in checks.items():
        say(f"{'PASS' if ok else 'FAIL'} {what}")
    say(f"wall time {time.time() - t0:.1f} s")
    sys.exit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
