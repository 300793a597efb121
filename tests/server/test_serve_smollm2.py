"""`python -m sglang.launch_server --tangram-profile` serves SmolLM2 over the OpenAI API."""

import json
import subprocess
import sys
import urllib.request

import pytest
from served import IDLE_ARGS

from tangram_sglang.profile.uniform import main as write_uniform
from tangram_sglang.sglang.server_process import ServerProcess

PORT = 31731


@pytest.fixture(scope="module")
def profile(smollm2_path, tmp_path_factory):
    path = tmp_path_factory.mktemp("profiles") / "smollm2-uniform.yaml"
    write_uniform(["--model-path", smollm2_path, "--ratio", "1.0", "-o", str(path)])
    return str(path)


@pytest.fixture(scope="module")
def server(smollm2_path, profile):
    with ServerProcess(smollm2_path, port=PORT, profile=profile, extra_args=["--enable-cache-report", "--enable-metrics", *IDLE_ARGS]) as srv:
        yield srv


def post(url, payload):
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def test_chat_completion_multi_turn(server):
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="none")
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    first = client.chat.completions.create(model="m", messages=messages, max_tokens=16, temperature=0)
    assert "Paris" in first.choices[0].message.content
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And of Italy?"}]
    second = client.chat.completions.create(model="m", messages=messages, max_tokens=16, temperature=0)
    assert second.choices[0].message.content.strip()
    # Turn 2 re-sends turn 1: the radix tree serves its prefix from cache.
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1


def test_streaming_chat(server):
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="none")
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Count: 1, 2, 3,"}],
                                            max_tokens=8, temperature=0, stream=True)
    pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    assert len(pieces) >= 2


def test_server_info_reports_profile(server, profile):
    with urllib.request.urlopen(server.url + "/server_info", timeout=30) as r:
        info = json.loads(r.read())["internal_states"][0]["tangram"]
    assert info["profile"] == profile and info["ratio"] == 1.0 and info["virtual_layers"] == 90


def test_generate_endpoint(server):
    out = post(server.url + "/generate", {"text": "The capital of France is",
                                          "sampling_params": {"temperature": 0, "max_new_tokens": 4}})
    assert "Paris" in out["text"]


def scrape(url: str) -> dict[str, float]:
    """{metric name with labels: value} of a Prometheus text page."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def _one(metrics: dict[str, float], name: str) -> float:
    (value,) = [v for k, v in metrics.items() if k.split("{")[0] == name]
    return value


def test_pool_gauges_on_sglang_metrics_endpoint(server):
    post(server.url + "/generate", {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 4}})
    metrics = scrape(server.url)
    with urllib.request.urlopen(server.url + "/server_info", timeout=30) as r:
        info = json.loads(r.read())["internal_states"][0]["tangram"]["pool_info"]
    assert _one(metrics, "tangram:pages_total") == info["pages_total"] > 0
    assert _one(metrics, "sglang:num_running_reqs") >= 0  # beside stock SGLang's own gauges
    # Set at the last prefill log: at least this request was admitted, none refused.
    assert 1 <= _one(metrics, "tangram:admitted") <= info["admitted"]
    assert _one(metrics, "tangram:too_large") == info["too_large"] == 0
    assert 0 < _one(metrics, "tangram:pages_used") <= info["pages_total"]
    labels = [k for k in metrics if k.startswith("tangram:pages_total")][0]
    assert 'model_name="' in labels  # SGLang's labels


def test_bad_profile_stops_launch(smollm2_path, profile, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(open(profile).read().replace("head_dim: 64", "head_dim: 128"))
    proc = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--model-path", smollm2_path,
                           "--port", str(PORT + 1), "--tangram-profile", str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "field 'model.head_dim': profile has 128, the served model has 64" in proc.stderr
