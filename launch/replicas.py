"""Two Tangram servers on 127.0.0.1 behind sglang-router (cache-aware), then a chat through the router.

    bash launch/replicas.sh                  # set up, serve, chat 3 turns, keep serving until Ctrl-C
    python launch/replicas.py --once         # chat, then stop everything

The router (sglang-router, pinned in launch/requirements-cpu.txt) sends each request to the
replica whose earlier requests share the longest prefix with it, so a conversation's later turns
land where its compressed history is cached (``cached_tokens`` in each answer's usage). Each
replica gets the demo's profile and --max-total-tokens bytes of KV.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from chat import chat, default_profile  # noqa: E402
from models import ensure_model  # noqa: E402

from tangram_sglang.sglang.server_process import RouterProcess, ServerProcess, start_all  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2", help="a key of launch/models.py, or an HF folder")
    ap.add_argument("--profile", default=None)
    ap.add_argument("--ratio", type=float, default=None)
    ap.add_argument("--port", type=int, default=30000, help="the router's; replicas take the next two")
    ap.add_argument("--policy", default="cache_aware", choices=["cache_aware", "round_robin", "power_of_two"])
    ap.add_argument("--max-total-tokens", type=int, default=8192, help="each replica's KV, in stock tokens' bytes")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--once", action="store_true", help="stop after the chat")
    args = ap.parse_args()
    model_path = args.model if os.path.isdir(args.model) else ensure_model(args.model)
    cache = os.environ.get("TANGRAM_CACHE", os.path.expanduser("~/.cache/tangram_sglang"))
    profile, ratio, why = ((args.profile, args.ratio, "your profile") if args.profile
                           else default_profile(model_path, cache))
    ratio = args.ratio if args.ratio is not None else ratio
    # --sleep-on-idle: an idle SGLang scheduler otherwise polls in a busy loop, a whole core per replica
    extra = ["--enable-cache-report", "--sleep-on-idle", "--max-total-tokens", str(args.max_total_tokens)]
    extra += ["--tangram-ratio", str(ratio)] if ratio is not None else []
    replicas = [ServerProcess(model_path, port=args.port + 1 + i, profile=profile, extra_args=extra)
                for i in range(2)]
    print(f"[replicas] 2 x {model_path} with --tangram-profile {profile} (ratio {ratio}); why: {why}", flush=True)
    try:
        for r in start_all(replicas):
            print(f"[replicas] replica ready: {r.url} (log {r.log_path})", flush=True)
        with RouterProcess([r.url for r in replicas], port=args.port, policy=args.policy) as router:
            print(f"[replicas] sglang-router --policy {args.policy}: {router.url} (OpenAI API at {router.url}/v1)",
                  flush=True)
            chat(router.url, args.turns, 64)
            if not args.once:
                print("\n[replicas] serving until Ctrl-C", flush=True)
                while True:
                    time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        for r in replicas:
            r.stop()
    print("[replicas] stopped.")


if __name__ == "__main__":
    main()
