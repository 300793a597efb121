"""SGLang options a profile cannot be served with are refused at launch with one line naming the option."""

import json
from types import SimpleNamespace

import pytest
import sglang.srt.entrypoints.engine  # noqa: F401 - before load_plugins: the plugin patches Engine
from sglang.srt.plugins import load_plugins
from sglang.srt.server_args import prepare_server_args

from tangram_sglang.profile.uniform import main as write_uniform
from tangram_sglang.sglang.compatibility import UnsupportedOption, check_server_args

load_plugins()


@pytest.fixture
def profile(tiny_llama, tmp_path):
    path = tmp_path / "u.yaml"
    write_uniform(["--model-path", tiny_llama[0], "--ratio", "1.0", "-o", str(path)])
    return str(path)


@pytest.mark.parametrize("extra,named", [
    (["--tp-size", "3"], "profile's groups were made for TP=1; --tp-size 3 cannot shard the model's 2 KV heads"),
    (["--dp-size", "2"], "--dp-size 2"),
    (["--speculative-algorithm", "NGRAM"], "--speculative-algorithm NGRAM"),
    (["--enable-hierarchical-cache"], "--enable-hierarchical-cache: not supported"),
    (["--disaggregation-mode", "prefill"], "--disaggregation-mode prefill"),
    (["--enable-streaming-session"], "--enable-streaming-session"),
    (["--kv-cache-dtype", "nvfp4"], "--kv-cache-dtype nvfp4: not supported with --tangram-profile (block-scaled"),
    (["--kv-cache-dtype", "fp4_mx_block16"], "--kv-cache-dtype fp4_mx_block16"),
    (["--kv-cache-dtype", "mxfp8"], "--kv-cache-dtype mxfp8"),
    (["--enable-torch-compile"], "--enable-torch-compile"),
    (["--cuda-graph-backend-decode", "breakable"], "--cuda-graph-backend-decode breakable"),
    (["--cuda-graph-backend-prefill", "full"], "--cuda-graph-backend-prefill full"),
    (["--pp-size", "2"], "--pp-size 2: not supported"),
    (["--attn-dp-size", "2"], "--attn-dp-size 2: not supported"),
    (["--attn-cp-size", "2"], "--attn-cp-size 2: not supported"),
    (["--enable-lora"], "--enable-lora: not supported"),
    (["--radix-eviction-policy", "lfu"], "--radix-eviction-policy lfu: not supported"),
    (["--enable-two-batch-overlap"], "--enable-two-batch-overlap: not supported"),
    (["--enable-pdmux"], "--enable-pdmux: not supported"),
    (["--enable-mixed-chunk"], "--enable-mixed-chunk: not supported"),
    (["--enable-multimodal"], "--enable-multimodal: not supported"),
    (["--enable-lmcache"], "--enable-lmcache: not supported"),
    (["--decoupled-spec-role", "verifier"], "--decoupled-spec-role verifier: not supported"),
    (["--dllm-algorithm", "LowConfidence"], "--dllm-algorithm LowConfidence: not supported"),
])
def test_unsupported_option_stops_the_launch(tiny_llama, profile, capsys, extra, named):
    with pytest.raises(SystemExit) as info:
        prepare_server_args(["--model-path", tiny_llama[0], "--tangram-profile", profile, *extra])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0]


def test_kvzip_profile_with_tensor_parallelism_is_refused(tiny_llama, tmp_path, capsys):
    import dataclasses

    from tangram_sglang.profile import load_profile

    write_uniform(["--model-path", tiny_llama[0], "--ratio", "1.0", "-o", str(tmp_path / "u.yaml")])
    prof = load_profile(str(tmp_path / "u.yaml"))
    meta = dataclasses.replace(prof.calibration, method="kvzip", scorer_args={"prefix_ids": [1, 2, 3]})
    dataclasses.replace(prof, calibration=meta).save(str(tmp_path / "k.yaml"))
    with pytest.raises(SystemExit):
        prepare_server_args(["--model-path", tiny_llama[0], "--tangram-profile", str(tmp_path / "k.yaml"),
                             "--tp-size", "2"])
    assert "--tp-size 2: not supported with --tangram-profile (a KVzip profile" in capsys.readouterr().err


def test_fp8_kv_is_served_with_a_profile(tiny_llama, profile):
    for flags in (["--kv-cache-dtype", "fp8_e5m2", "--device", "cpu"], ["--kv-cache-dtype", "fp8_e4m3",
                                                                        "--device", "cpu"]):
        args = prepare_server_args(["--model-path", tiny_llama[0], "--tangram-profile", profile, *flags])
        assert args.kv_cache_dtype == flags[1] and args._tangram.path == profile


def test_same_options_without_a_profile_are_sglangs_business(tiny_llama):
    args = prepare_server_args(["--model-path", tiny_llama[0], "--kv-cache-dtype", "fp8_e4m3"])
    assert args.kv_cache_dtype == "fp8_e4m3"


def test_lru_eviction_is_the_segment_trees_own(tiny_llama, profile):
    args = prepare_server_args(["--model-path", tiny_llama[0], "--tangram-profile", profile,
                                "--radix-eviction-policy", "lru"])
    assert args.radix_eviction_policy == "lru"


def test_mixed_chunked_prefill_is_refused():
    """SGLang turns --enable-mixed-chunk off itself for the Tangram backend on CPU; wherever it would
    stay on, decode tokens would enter an extend batch outside the chunk schedule: refused."""
    with pytest.raises(UnsupportedOption, match="--enable-mixed-chunk: not supported"):
        check_server_args(SimpleNamespace(enable_mixed_chunk=True, device="cpu"))
    check_server_args(SimpleNamespace(enable_mixed_chunk=False, device="cpu"))


@pytest.mark.parametrize("device,plane,graphs", [
    ("cpu", "auto", False), ("cuda", "auto", True), ("cuda", "triton", True), ("cuda", "torch", False)])
def test_decode_cuda_graphs_stay_on_only_where_they_can_run(tiny_llama, profile, device, plane, graphs):
    """A profile keeps SGLang's decode CUDA graphs on CUDA with the Triton data plane; prefill graphs
    never (compression plans each chunk on the host)."""
    from tangram_sglang.sglang.server_args import read_profile, serving_overrides

    out = serving_overrides(read_profile(profile)[1], plane, device)
    assert out["disable_prefill_cuda_graph"] is True
    assert out.get("disable_cuda_graph", False) is (not graphs)


@pytest.mark.parametrize("config", [
    {"architectures": ["Gemma3ForCausalLM"], "num_hidden_layers": 6,
     "layer_types": ["sliding_attention"] * 5 + ["full_attention"], "sliding_window": 512},
    {"architectures": ["Gemma3ForConditionalGeneration"],  # multimodal: the text model's config
     "text_config": {"num_hidden_layers": 12, "sliding_window": 1024, "sliding_window_pattern": 6}},
])
def test_dense_memory_window_models_pass(tmp_path, config):
    """Gemma 3's window layers (SGLang serves them at dense memory too) are served with a profile."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    check_server_args(SimpleNamespace(model_path=str(tmp_path), device="cpu"))


@pytest.mark.parametrize("config,named,why", [
    ({"architectures": ["Gemma4ForCausalLM"], "num_hidden_layers": 4, "sliding_window": 128,
      "layer_types": ["sliding_attention", "full_attention"] * 2}, "model Gemma4ForCausalLM",
     "hybrid SWA pool"),
    ({"architectures": ["Llama4ForCausalLM"], "num_hidden_layers": 4,
      "layer_types": ["chunked_attention", "full_attention"] * 2},
     r"Llama4ForCausalLM \(2 of 4 layers: chunked_attention\)", "full-attention and sliding-window layers only"),
])
def test_other_hybrids_are_refused(tmp_path, config, named, why):
    """What SGLang serves from its hybrid SWA pool (gpt-oss: with learned sinks too) and layers of other
    kinds are refused, not served with every layer reading the whole history."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedOption, match=named + ".*" + why):
        check_server_args(SimpleNamespace(model_path=str(tmp_path), device="cpu"))


def test_gpt_oss_is_served_with_sglangs_swa_pool_off(tmp_path):
    """gpt-oss (SGLang's hybrid SWA pool, learned sinks) passes the check; under a profile SGLang's SWA
    pool is off (its window layers live in the ragged pool)."""
    from tangram_sglang.sglang.server_args import serving_overrides
    from tangram_sglang.profile.uniform import uniform_profile
    from tangram_sglang.profile import ModelShape

    config = {"architectures": ["GptOssForCausalLM"], "num_hidden_layers": 4, "sliding_window": 128,
              "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 16, "hidden_size": 64,
              "layer_types": ["sliding_attention", "full_attention"] * 2}
    (tmp_path / "config.json").write_text(json.dumps(config))
    check_server_args(SimpleNamespace(model_path=str(tmp_path), device="cpu"))
    profile = uniform_profile(ModelShape.from_hf_config(config), [1.0], parallel_capacity=4)
    assert profile.model.window_layers == (0, 2) and profile.model.window == 128
    assert serving_overrides(profile, "torch", "cpu")["disable_hybrid_swa_memory"] is True


def test_qwen2_sliding_window_field_unused_is_not_a_window_model(tmp_path):
    """Qwen2's config names a sliding_window it does not use (use_sliding_window false, no layer types)."""
    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 24, "sliding_window": 32768,
         "use_sliding_window": False, "max_window_layers": 21}))
    check_server_args(SimpleNamespace(model_path=str(tmp_path), device="cpu"))


@pytest.mark.parametrize("arch,seen", [("GptOssForCausalLM", ("triton", "triton")), ("LlamaForCausalLM", ("tangram", "tangram"))])
def test_gpt_oss_backend_assertion_sees_a_sinks_backend(monkeypatch, arch, seen):
    """SGLang asserts gpt-oss runs on a backend with sinks: while that step runs, tangram reads as one
    (for the served hybrids only), and the step's own function is back afterwards."""
    from sglang.srt.arg_groups import model_hook

    from tangram_sglang.sglang.server_args import sinks_backend_check

    real = model_hook.attention_backends_of
    monkeypatch.setattr(model_hook, "model_config_of",
                        lambda args: SimpleNamespace(hf_config=SimpleNamespace(architectures=[arch])))
    cfg = SimpleNamespace(attention_backend="tangram", prefill_attention_backend=None, decode_attention_backend=None)
    got = []
    sinks_backend_check(cfg, lambda args: got.append(model_hook.attention_backends_of(args)))
    assert got == [seen] and model_hook.attention_backends_of is real


def test_outside_vocabulary_names_the_first_bad_id():
    from tangram_sglang.sglang.scheduling import outside_vocabulary

    assert outside_vocabulary([0, 5, 99], 100) is None and outside_vocabulary([], 100) is None
    why = outside_vocabulary([3, 100, -2, 7], 100)
    assert "100" in why and "[0, 100)" in why and "2 such ids" in why
    assert "-1" in outside_vocabulary([-1], 100)


def test_a_multimodal_model_is_refused_by_default(tmp_path):
    """SGLang turns multimodal on by default for a model with an encoder config: refused unless it is off."""
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2VLForConditionalGeneration"], "vision_config": {"depth": 2},
        "num_hidden_layers": 2}))
    with pytest.raises(UnsupportedOption, match=r"Qwen2VLForConditionalGeneration \(multimodal\): not supported"):
        check_server_args(SimpleNamespace(model_path=str(tmp_path), enable_multimodal=None))
    check_server_args(SimpleNamespace(model_path=str(tmp_path), enable_multimodal=False))
    # Gemma 3's multimodal checkpoints: SGLang serves them as text unless asked (the 12B row of the docs)
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Gemma3ForConditionalGeneration"], "vision_config": {}, "text_config": {"num_hidden_layers": 2}}))
    check_server_args(SimpleNamespace(model_path=str(tmp_path), enable_multimodal=None))


def test_replaced_page_and_chunk_sizes_are_logged(tiny_llama, profile, monkeypatch):
    """A profile sets SGLang's logical page (1): a user's other page size is replaced with a warning naming
    both, never silently. --chunked-prefill-size is the prefill pass, kept as given (or SGLang's default)
    when it holds a whole compression chunk, else raised to the chunk with a warning."""
    from tangram_sglang.profile import load_profile
    from tangram_sglang.serving.context import chunk_size_of
    from tangram_sglang.sglang import server_args

    chunk = chunk_size_of(load_profile(profile))
    said = []
    monkeypatch.setattr(server_args.logger, "warning", lambda msg, *a: said.append(msg % a))
    args = prepare_server_args(["--model-path", tiny_llama[0], "--tangram-profile", profile, "--page-size", "16",
                                "--chunked-prefill-size", "4096"])
    assert args.page_size == 1 and args.chunked_prefill_size == 4096
    assert "--page-size 16 replaced by 1" in "\n".join(said) and "chunked-prefill-size" not in "\n".join(said)
    said.clear()
    args = prepare_server_args(["--model-path", tiny_llama[0], "--tangram-profile", profile,
                                "--chunked-prefill-size", str(chunk - 1)])
    assert args.chunked_prefill_size == chunk
    assert f"--chunked-prefill-size {chunk - 1} replaced by {chunk}" in "\n".join(said)
    stock = prepare_server_args(["--model-path", tiny_llama[0]]).chunked_prefill_size
    assert prepare_server_args(["--model-path", tiny_llama[0], "--tangram-profile", profile]).chunked_prefill_size == stock


def test_refusal_fires_through_sglangs_launcher_and_engine(tiny_llama, profile):
    """The real entry points: `python -m sglang.launch_server` exits 2 with the one line before anything is
    spawned, and sglang.Engine raises it."""
    import subprocess
    import sys

    import sglang

    out = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--model-path", tiny_llama[0],
                          "--tangram-profile", profile, "--enable-mixed-chunk"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 2 and "--enable-mixed-chunk: not supported with --tangram-profile" in out.stderr, out.stderr
    with pytest.raises(UnsupportedOption, match="--attn-cp-size 2: not supported"):
        sglang.Engine(model_path=tiny_llama[0], tangram_profile=profile, attn_cp_size=2)


def test_a_profile_serves_multi_turn_with_lpm_unless_a_policy_is_given(tiny_llama, profile):
    """With a profile and no --schedule-policy, lpm (returning turns whose history is cached go first); a
    policy the user gives is kept; without a profile SGLang's own default (fcfs) stays."""
    from sglang.srt.entrypoints.engine import Engine

    def cli(*extra):
        return prepare_server_args(["--model-path", tiny_llama[0], *extra]).schedule_policy

    assert cli("--tangram-profile", profile) == "lpm"
    assert cli("--tangram-profile", profile, "--schedule-policy", "fcfs") == "fcfs"
    assert cli() == "fcfs" and cli("--schedule-policy", "lpm") == "lpm"
    build = Engine.server_args_class
    assert build(model_path=tiny_llama[0], tangram_profile=profile).schedule_policy == "lpm"
    assert build(model_path=tiny_llama[0], tangram_profile=profile, schedule_policy="fcfs").schedule_policy == "fcfs"
    assert build(model_path=tiny_llama[0]).schedule_policy == "fcfs"
