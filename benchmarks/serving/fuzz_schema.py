"""Hypothesis strategies for SGLang's HTTP request bodies, drawn from its own OpenAPI schema.

A fuzz case is a small valid request (``BASES``) with a few fields replaced by values drawn from the
endpoint's schema (``Schemas.fields``), each leaf biased to edge values (empty, huge, negative,
non-ASCII, control characters): mostly-valid requests that reach the scheduler, where a profile
changes what happens, rather than bodies FastAPI's validation refuses before anything runs. The
sampling parameters (a free-form object in the schema) are drawn from SGLang's ``SamplingParams``
fields and their annotated types.
"""

from __future__ import annotations

from hypothesis import strategies as st

EDGE_INTS = [0, 1, -1, 2, 7, 64, 2**31 - 1, 2**31, 2**63 - 1, -(2**63), 10**18 * 100]
EDGE_FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-30, 2.0, 1e30, 1e308, -1e308]
EDGE_STRINGS = ["", " ", "\x00", "\n\n", "null", "{", "<|im_end|>", "<|im_start|>assistant", "🙂" * 30,
                "the " * 1500, "Ω≈ç√∫" * 10, "%s%n{0}"]
# The valid request each endpoint's cases start from (SmolLM2's vocabulary has 49,152 ids).
BASES = {
    "/generate": {"text": "The capital of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 8}},
    "/v1/completions": {"model": "m", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0},
    "/v1/chat/completions": {"model": "m", "messages": [{"role": "user", "content": "Name a colour."}],
                             "max_tokens": 8, "temperature": 0},
    "/open_session": {"capacity_of_str_len": 256},
    "/close_session": {"session_id": "no-such-session"},
}
# Cases every run sends first (hypothesis explicit examples): inputs that once took a server down.
_SP = {"temperature": 0, "max_new_tokens": 8}
EXAMPLES = {
    "/generate": [{"text": "", "sampling_params": _SP},                        # stock 0.5.23's scheduler dies
                  {"input_ids": [5, 6, 49152], "sampling_params": _SP},       # past the vocabulary: both die
                  {"input_ids": [5, -1, 7], "sampling_params": _SP},
                  {"text": "Hi", "sampling_params": {**_SP, "n": 2}},
                  {"text": "Hi", "sampling_params": {**_SP, "max_new_tokens": 10**9}},
                  {"text": "Hi", "return_logprob": True, "logprob_start_len": 0, "sampling_params": _SP}],
    "/v1/completions": [{**BASES["/v1/completions"], "prompt": [5, 6, 49152]}],
    "/v1/chat/completions": [{**BASES["/v1/chat/completions"], "n": 2, "logprobs": True, "top_logprobs": 3}],
    "/open_session": [],
    "/close_session": [],
}
# Set by SamplingParams.normalize(), not by a request.
_INTERNAL_SAMPLING = {"stop_strs", "stop_regex_strs", "stop_str_max_len", "stop_regex_max_len",
                      "is_normalized", "ebnf_full_assistant"}


def ints() -> st.SearchStrategy:
    return st.one_of(st.sampled_from(EDGE_INTS), st.integers(-5, 300))


def floats() -> st.SearchStrategy:
    return st.one_of(st.sampled_from(EDGE_FLOATS), st.floats(-3, 3, allow_nan=False))


def texts() -> st.SearchStrategy:
    return st.one_of(st.sampled_from(EDGE_STRINGS), st.text(max_size=24))


def token_ids() -> st.SearchStrategy:
    """Lists of token ids: in the vocabulary, just past it, negative, empty, long."""
    vocab = st.integers(0, 49151)
    past = st.lists(st.one_of(vocab, st.sampled_from([49152, 10**9, -1])), min_size=1, max_size=12)
    short, long = st.lists(vocab, max_size=12), st.lists(vocab, min_size=500, max_size=1500)
    return st.one_of(short, short, short, long, long, past)  # ids past the vocabulary in 1 list of 6


def anything(depth: int = 0) -> st.SearchStrategy:
    """A JSON value of any type (the schema's unconstrained ``{}``)."""
    leaf = st.one_of(st.none(), st.booleans(), ints(), floats(), texts())
    if depth >= 2:
        return leaf
    return st.one_of(leaf, st.lists(anything(depth + 1), max_size=3),
                     st.dictionaries(texts(), anything(depth + 1), max_size=3))


class Schemas:
    """The request-body schemas of one SGLang server's OpenAPI document (``/openapi.json``)."""

    def __init__(self, openapi: dict, max_depth: int = 4):
        self.paths, self.components = openapi["paths"], openapi["components"]["schemas"]
        self.max_depth = max_depth

    def body(self, path: str) -> dict:
        """The JSON schema of ``path``'s POST body (references resolved at the top)."""
        content = self.paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        return self.resolve(content)

    def resolve(self, schema: dict) -> dict:
        while "$ref" in schema:
            schema = self.components[schema["$ref"].rsplit("/", 1)[1]]
        return schema

    def strategy(self, schema: dict, depth: int = 0) -> st.SearchStrategy:
        """Values for ``schema``: its types, bounds ignored (edge values are the point)."""
        schema = self.resolve(schema)
        if depth > self.max_depth:
            return st.none()
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return st.one_of(*[self.strategy(s, depth + 1) for s in schema[key]])
        if "allOf" in schema:
            return self.strategy(schema["allOf"][0], depth + 1)
        if "enum" in schema:
            return st.sampled_from(schema["enum"])
        if "const" in schema:
            return st.just(schema["const"])
        kind = schema.get("type")
        if kind == "object" or "properties" in schema:
            return self.object(schema, depth, max_optional=3)
        if kind == "array":
            return st.lists(self.strategy(schema.get("items", {}), depth + 1), max_size=4)
        leaves = {"string": texts, "integer": ints, "number": floats, "boolean": st.booleans, "null": st.none}
        return leaves[kind]() if kind in leaves else anything()

    def object(self, schema: dict, depth: int, max_optional: int, required: bool = True) -> st.SearchStrategy:
        """Objects with the required properties (when ``required``) and up to ``max_optional`` others."""
        schema = self.resolve(schema)
        props = schema.get("properties")
        if not props:
            return st.dictionaries(texts(), anything(depth + 1), max_size=3)
        must = [k for k in schema.get("required", []) if k in props] if required else []
        optional = [k for k in props if k not in must]

        @st.composite
        def draw_object(draw):
            keys = must + (draw(st.lists(st.sampled_from(optional), max_size=max_optional, unique=True))
                           if optional else [])
            return {k: draw(self.strategy(props[k], depth + 1)) for k in keys}

        return draw_object()

    def fields(self, path: str, max_fields: int = 3) -> st.SearchStrategy:
        """A few of ``path``'s body fields with fuzzed values (to lay over the endpoint's base)."""
        return self.object(self.body(path), 0, max_optional=max_fields, required=False)


def _annotation_strategy(annotation: str) -> st.SearchStrategy:
    """Values for a SamplingParams field of this (string) annotation, its None included when Optional."""
    a = str(annotation)
    parts = []
    if "Dict" in a or "dict" in a or "Watermark" in a:
        parts.append(st.dictionaries(texts(), st.one_of(floats(), ints(), texts()), max_size=3))
    if "List" in a or "Set" in a:
        parts.append(st.lists(st.one_of(ints(), texts()), max_size=4))
    if "str" in a:
        parts.append(texts())
    if "bool" in a:
        parts.append(st.booleans())
    elif "int" in a:
        parts.append(ints())
    if "float" in a:
        parts.append(floats())
    if "Optional" in a or "None" in a or not parts:
        parts.append(st.none())
    return st.one_of(*parts)


def sampling_params(max_fields: int = 3) -> st.SearchStrategy:
    """A few of SGLang's sampling parameters with fuzzed values (names and types from SamplingParams)."""
    from sglang.srt.sampling.sampling_params import SamplingParams

    hints = SamplingParams.__annotations__  # a msgspec Struct: its fields and their annotations
    fields = {n: _annotation_strategy(hints[n]) for n in SamplingParams.__struct_fields__
              if n not in _INTERNAL_SAMPLING}

    @st.composite
    def draw_params(draw):
        keys = draw(st.lists(st.sampled_from(sorted(fields)), max_size=max_fields, unique=True))
        return {k: draw(fields[k]) for k in keys}

    return draw_params()


def case(schemas: Schemas, path: str) -> st.SearchStrategy:
    """One request body for ``path``: its base with fuzzed fields laid over it; on /generate, fuzzed
    sampling parameters and prompts of token ids too."""

    @st.composite
    def draw_case(draw):
        body = {**BASES[path], **draw(schemas.fields(path))}
        if path == "/generate":
            if draw(st.booleans()):
                body.pop("text", None)
                body["input_ids"] = draw(token_ids())
            sp = body.get("sampling_params")
            if isinstance(sp, dict) or sp is None:
                body["sampling_params"] = {**BASES[path]["sampling_params"], **(sp or {}),
                                           **draw(sampling_params())}
        return body

    return draw_case()
