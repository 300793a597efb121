"""The report: checks, the Markdown, the memory plot."""

from __future__ import annotations

import os

from benchmarks.serving.soak_faults.fleet import ROUTER_ARGS


def checks(result: dict) -> list[tuple[str, bool, str]]:
    """(check, passed, figures) of the issue's after-the-run requirements."""
    s, reps = result["summary"], result["replicas"]
    g = result["replay"]
    return [
        ("integrity holds (every sample, and after the flush)",
         result["integrity_samples_not_ok"] == 0 and all(r["after_flush"].get("integrity") == "ok" for r in reps),
         f"{result['integrity_samples_not_ok']} samples not ok of {result['integrity_samples']}; after flush: "
         + ", ".join(str(r["after_flush"].get("integrity")) for r in reps)),
        ("0 pages leaked after the flush", all(r["after_flush"].get("pages_used") == 0 for r in reps),
         ", ".join(f"{r['after_flush'].get('pages_used')} used / {r['after_flush'].get('pages_reserved')} reserved"
                   for r in reps)),
        ("resident memory back to its start level", all(r["rss"] and r["rss"]["within"] for r in reps),
         "; ".join(f"replica {r['replica']}: {r['rss']['start_mb']} -> {r['rss']['end_mb']} MiB "
                   f"({r['rss']['delta_share']:+.1%})" if r["rss"] else f"replica {r['replica']}: -" for r in reps)),
        ("every request got an answer or a clear error (none hung)", s["hung"] == 0,
         f"{s['hung']} timed out of {s['requests']}"),
        ("SGLang retracted requests (pressure reached the pool)", result["retracted"] > 0,
         f"{result['retracted']} retracted"),
        ("finished sessions answer as alone (greedy replay)", g["turns"] > 0 and g["identical"] == g["turns"],
         f"{g['identical']} of {g['turns']} turns identical ({g['sessions']} sessions); with the soak's "
         f"cached tokens: {g['identical_same_cached_tokens']} of {g['turns_same_cached_tokens']}"),
        ("no traceback in the replicas' logs", result["tracebacks_total"] == 0, f"{result['tracebacks_total']}"),
    ]


def report(result: dict, args) -> list[str]:
    s, kill = result["summary"], result["kill"]
    rows = lambda d: [f"| {k} | {v} |" for k, v in d.items()]  # noqa: E731
    lines = [f"Command: `{result['command']}`", "",
             f"Two replicas of {result['model']} with `{result['profile']}` at `--tangram-ratio {result['ratio']}`, "
             f"`--max-total-tokens {result['max_total_tokens']}` ({result['pages_total']} pool pages each), "
             f"`--sleep-on-idle --enable-cache-report`, behind sglang-router (cache_aware, "
             f"`{' '.join(ROUTER_ARGS)}`); {args.clients} client threads through `/v1/chat/completions`, "
             f"temperature 0. Load: {result['load_minutes']} min ({s['sessions']} sessions, {s['requests']} "
             f"requests, {s['sessions'] / max(result['load_minutes'], 0.1):.1f} sessions a minute); the whole run "
             f"with start-up, checks and replay {result['total_minutes']} min.", "",
             "## Checks", "", "| check | passed | figures |", "| --- | --- | --- |"]
    lines += [f"| {name} | {'yes' if ok else '**no**'} | {fig} |" for name, ok, fig in checks(result)]
    lines += ["", "## Sessions", "", "| status | sessions |", "| --- | --- |", *rows(s["sessions_by_status"]), "",
              "| planned fault | sessions |", "| --- | --- |", *rows(s["sessions_by_fault"]), "",
              "## Requests: answers and errors by kind", "",
              "| outcome | requests |", "| --- | --- |", *rows(s["outcomes"]), "",
              f"Answered: {s['answered_share'] or 0:.1%} of the requests the client did not cut itself.", "",
              "## Faults injected", "", "| fault | count |", "| --- | --- |", *rows(s["faults_injected"]),
              f"| retracted by SGLang (pool counters, both replicas, the killed process's last sample included) | "
              f"{result['retracted']} |",
              f"| retracted by SGLang (its logs: \"KV cache pool is full. Retract requests.\") | "
              f"{result['retracted_in_logs']} |", "",
              "An abort is the client's timeout (0.2-2 s) on a non-streamed turn: the closed connection is what "
              "SGLang sees; it took effect when the answer had not come back by then. A pressure burst: "
              f"{args.burst_size} single-turn requests (500-700 words, 250-350 new tokens, ignore_eos) at once, at "
              f"{', '.join(f'{b:.0%}' for b in args.bursts) or 'no point'} of the minimum duration.", "",
              "## Replica kill and restart", ""]
    if kill.get("killed_s") is not None:
        lines += [f"- replica {kill['replica']} (port {kill['port']}, pid {kill['pid']}): process group SIGKILLed "
                  f"at {kill['killed_s']} s into the run, started again at {kill.get('restart_s')} s, serving at "
                  f"{kill.get('ready_s', '- (did not start: ' + str(kill.get('restart_error')) + ')')} s",
                  f"- requests counted as \"replica killed\" (a clear or connection error while it was down, until "
                  f"{args.kill_grace:.0f} s after it served again): {s['outcomes']['replica killed']}"]
    else:
        lines.append("- no replica was killed in this run")
    lines.append("- after the load, a request through the router: "
                 + ("answered" if result["healthy_after"] else "**failed**"))
    lines += ["", "## Errors by message", ""]
    lines += [f"- {n} x `{m}`" for m, n in s["errors"].items()] or ["- none"]
    lines += ["", "## Pool and memory per replica", "",
              "| replica | integrity after flush | pages used / reserved after flush | retracted | evicted segments "
              "| RSS start MiB | RSS at half the load | RSS end MiB | delta | RSS max MiB | tracebacks |",
              "|" + " --- |" * 11]
    for r in result["replicas"]:
        a, rss = r["after_flush"], r["rss"] or {}
        lines.append(f"| {r['replica']}{' (restarted)' if r['restarted'] else ''} | {a.get('integrity')} | "
                     f"{a.get('pages_used')} / {a.get('pages_reserved')} | {r['before_flush'].get('retracted')} | "
                     f"{r['before_flush'].get('evicted_segments')} | {rss.get('start_mb', '-')} | "
                     f"{r['rss_half_load_mb']} | {rss.get('end_mb', '-')} | {rss.get('delta_mb', '-')} MiB "
                     f"({rss.get('delta_share', 0):+.1%}) | "
                     f"{r['rss_max_mb']} | {r['tracebacks']} |")
    lines += ["", "RSS: the server's process tree (each process's resident set summed), sampled every "
              f"{args.sample_s:.0f} s. Start: after the warm-up (8 chats at once) and a flush (the restarted replica: "
              "after its own warm-up, already under load); end: after the load and the flush. Tolerance: "
              f"+{args.rss_tolerance:.0%} of the start.",
              "", f"![memory and pages over time]({os.path.basename(result['plot'])})" if result["plot"]
              else "(no plot: matplotlib is not installed)", "", "## Greedy replay", ""]
    g, after = result["replay"], result["after_replay_flush"]
    lines += [f"{g['identical']} of {g['turns']} turns identical over {g['sessions']} sessions: every session whose "
              "turns were all answered (finished or abandoned), faults on the way included, sent again alone with "
              "the soak's messages, the cache flushed before each session, the sessions dealt to the replicas "
              "serving after the load; of the turns that found as many history tokens cached as in the soak: "
              f"{g['identical_same_cached_tokens']} of {g['turns_same_cached_tokens']} identical.", "",
              "The chunk rule cuts a history by its tokens alone, so a turn whose history was evicted, retracted, "
              "cut by an abort or served by the other replica in the soak keeps the KV a replay alone keeps: its "
              "greedy answer is expected to be the same.", "",
              "| planned fault | sessions | turns | identical |", "| --- | --- | --- | --- |",
              *[f"| {f} | {r['sessions']} | {r['turns']} | {r['identical']} |"
                for f, r in (g.get("by_fault") or {}).items()], "",
              "After the replay and a flush: " + "; ".join(
                  f"{url}: integrity {a.get('integrity')}, {a.get('pages_used')} pages used"
                  for url, a in after.items()) + ".", ""]
    for m in g["mismatches"]:
        lines.append(f"- session {m['session']} turn {m['turn']} (cached tokens: soak {m['soak_cached_tokens']}, "
                     f"alone {m['alone_cached_tokens']}), from character {max(0, m['first_difference_at'] - 40)}: "
                     f"soak {m['soak']!r} / alone {m['alone']!r}")
    lines += ["", "## Logs", ""]
    for path, n in result["tracebacks"].items():
        lines.append(f"- `{path}`: {n} tracebacks")
    for ex in result["traceback_excerpts"]:
        lines += ["", "```", ex.rstrip(), "```"]
    return lines
