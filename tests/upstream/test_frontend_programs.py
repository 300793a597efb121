"""SGLang's frontend-language test programs (sglang.test.test_programs, sglang 0.5.23) against
the Tangram server, through RuntimeEndpoint, as SGLang's own endpoint tests run them. Programs
with a ``check_answer`` switch run with it off (answer quality is this small model's, and
SGLang's CI switches it off for small models too); a program skipped says why.
"""

from __future__ import annotations

import pytest
from sglang.test import test_programs as programs

PROGRAMS = ["few_shot_qa", "mt_bench", "select", "decode_int", "decode_json_regex", "decode_json",
            "expert_answer", "tool_use", "react", "parallel_decoding", "stream",
            "regex", "dtype_gen", "gen_min_new_tokens"]
CHECK_ANSWER = {"select", "expert_answer"}  # take check_answer
# Run greedy: decode_json samples five fields at temperature 1.0 within 64 tokens, and SmolLM2's draw
# now and then leaves a string open or a field malformed, on stock too (5 of 100 sampled runs failed on
# stock SGLang 0.5.23, 1 in a CI run on a 1.0 profile); greedy passes on both, so the outcome is the server's.
GREEDY = {"decode_json"}
# Not run: parallel_encoding posts /concate_and_append_request, which sglang 0.5.23's server does not
# have (404, stock too) and then waits forever; image_qa needs a vision model; completion_speculative and
# chat_completion_speculative read token usage only the OpenAI backend has (AttributeError on
# RuntimeEndpoint, stock too).


@pytest.fixture(scope="module")
def backend(upstream_server):
    import sglang as sgl

    sgl.set_default_backend(sgl.RuntimeEndpoint(upstream_server.url))
    yield
    sgl.set_default_backend(None)


@pytest.mark.parametrize("name", PROGRAMS)
def test_program(backend, name, monkeypatch):
    program = getattr(programs, f"test_{name}")
    if name in GREEDY:
        from sglang.lang.ir import SglFunction

        sampled_run = SglFunction.run
        monkeypatch.setattr(SglFunction, "run",
                            lambda self, *a, **kw: sampled_run(self, *a, **{"temperature": 0.0, **kw}))
    program(check_answer=False) if name in CHECK_ANSWER else program()
