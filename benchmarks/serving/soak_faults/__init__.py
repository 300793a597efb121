"""Soak with faults: the shipped profile behind sglang-router, for an hour, with clients that misbehave.

Two replicas of a model's server with its shipped FastKVzip profile at the recommended ratio
(SmolLM2 at 0.4, Qwen2.5-0.5B at 0.5), a small ``--max-total-tokens`` so memory binds, behind
sglang-router (cache_aware). Client threads run multi-turn chat sessions through the router's OpenAI API
(``/v1/chat/completions``, temperature 0): each turn sends the whole history plus a new question about a
passage of the essays, after a random think time. The run ends once ``--sessions`` sessions have started
and ``--minutes`` have passed (the sessions under way then finish). Faults (the first four a share of the
sessions each: ``plan_session``, fixed by ``--seed``):

  abort       one turn sent with a short client timeout: the client gives up mid-request (no
              /abort_request: the closed connection is the abort SGLang sees), then sends the turn again
  hangup      one turn streamed and the connection closed after a few chunks; the client never comes back
  abandon     the session stops after some turn and never comes back (its history stays in the tree)
  pressure    long passages and long ``ignore_eos`` answers: the pool fills in decode, SGLang retracts
  burst       at each of ``--bursts`` (shares of ``--minutes``), ``--burst-size`` such requests at once, outside
              the sessions: the decode room SGLang reserved runs out and it retracts (``retracted``)
  replica     once, at ``--kill-at`` of ``--minutes``, one replica's process group is SIGKILLed and
              started again ``--restart-after`` seconds later (the router's health check is 5 s)

Every request has a timeout and ends as one of ``OUTCOMES``: answered, clear error (an HTTP error with a
message, or an error inside a stream), connection error, timed out, the client's own abort or hang-up; clear
and connection errors while a replica was down count as "replica killed" (a time-out never does). Every
``--sample-s`` seconds each replica's resident memory (RSS summed over its process tree) and pool pages are
sampled (plotted at the end, the kill and restart marked). After the load: the router stops (its health
check, SGLang's /health, is a one-token generate that would leave a token in the tree), the replicas go
idle, ``/flush_cache``, then the pool's integrity check and its pages (0 leaked), RSS against its level
after the warm-up, tracebacks in the logs, and a greedy replay: every session whose turns were all answered
(finished or abandoned, faults on the way included; ``--check-sessions N``: N of them) is sent again, alone,
turn by turn (the same messages, the cache flushed before each session; the sessions dealt to the replicas
serving then, one at a time on each), and each answer compared with the soak's: the chunk rule makes a hit
keep what a recompute keeps, so evictions, retractions, aborts and the other replica must change no answer.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.serving.soak_faults --model smollm2   # 1,000 sessions, >= 60 min
    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.serving.soak_faults --model qwen
    # -> benchmarks/results/serving/soak_<model>.{md,json,png}
    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.serving.soak_faults --model smollm2 --quick
    # -> soak_quick_<model>: 24 sessions, >= 3 min, the same faults, one burst (a smoke test, 8-10 minutes)
"""