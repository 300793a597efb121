"""The fuzzer's request strategies (benchmarks/serving/fuzz_schema.py): values of the schema's types,
cases built on each endpoint's base request, against SGLang 0.5.23's own OpenAPI document."""

import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings

from benchmarks.serving.fuzz_schema import BASES, Schemas, case, sampling_params

DOC = {
    "paths": {"/x": {"post": {"requestBody": {"content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/X"}}}}}}},
    "components": {"schemas": {
        "X": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"},
            "n": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "mode": {"enum": ["a", "b"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "inner": {"$ref": "#/components/schemas/Inner"},
            "free": {"additionalProperties": True, "type": "object"},
            "rate": {"type": "number"},
            "on": {"type": "boolean"}}},
        "Inner": {"type": "object", "required": ["k"], "properties": {"k": {"type": "integer"}}},
    }},
}
QUICK = settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
FEW = settings(QUICK, max_examples=20)


def _resolved_schema():
    """X with its reference inlined, for jsonschema."""
    x = json.loads(json.dumps(DOC["components"]["schemas"]["X"]))
    x["properties"]["inner"] = DOC["components"]["schemas"]["Inner"]
    return x


@QUICK
@given(Schemas(DOC).strategy({"$ref": "#/components/schemas/X"}))
def test_drawn_values_have_the_schema_types(value):
    jsonschema.validate(value, _resolved_schema())
    json.dumps(value)  # a JSON body


@QUICK
@given(Schemas(DOC).fields("/x"))
def test_fields_lay_only_known_properties(value):
    assert set(value) <= set(DOC["components"]["schemas"]["X"]["properties"])
    assert len(value) <= 3


@QUICK
@given(sampling_params())
def test_sampling_params_are_sglang_fields(value):
    from sglang.srt.sampling.sampling_params import SamplingParams

    names = set(SamplingParams.__struct_fields__)
    assert set(value) <= names and "is_normalized" not in value and len(value) <= 3


@pytest.fixture(scope="module")
def sglang_schemas():
    from sglang.srt.entrypoints.http_server import app

    return Schemas(app.openapi())


def test_cases_start_from_each_endpoints_base(sglang_schemas):
    for path in BASES:
        assert sglang_schemas.body(path)["type"] == "object"   # the endpoint takes a JSON object in 0.5.23
        bodies = []
        given(case(sglang_schemas, path))(FEW(lambda body: bodies.append(body)))()
        assert len(bodies) >= 10
        for body in bodies:
            json.dumps(body)
            fuzzed = {k for k in body if body[k] != BASES[path].get(k)}
            assert len(fuzzed - {"text", "input_ids", "sampling_params"}) <= 3
            if path == "/generate" and isinstance(body["sampling_params"], dict):
                assert ("text" in body) or ("input_ids" in body)
        assert any(b != BASES[path] for b in bodies)


def test_unconstrained_values_stay_json():
    from benchmarks.serving.fuzz_schema import anything

    seen = []
    given(anything())(QUICK(lambda v: seen.append(json.dumps(v))))()
    assert len(seen) >= 20 and len(set(seen)) > 5
