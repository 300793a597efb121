"""Shared test set-up: one torch thread per process (the two cores are shared), Triton interpreter on CPU."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TANGRAM_INTEGRITY_CHECK", "1")  # servers the tests start check their pool on /server_info

import torch  # noqa: E402

torch.set_num_threads(1)

# Triton reads TRITON_INTERPRET when it is first imported (sglang imports it
# early): without a GPU, Triton kernels can only run in the interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from triton_interpreter import skip_nested_relanguage_patching  # noqa: E402

    skip_nested_relanguage_patching()  # in this process; spawned schedulers run the interpreter as is

import importlib.util  # noqa: E402
import pathlib  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
TESTS = pathlib.Path(__file__).resolve().parent
# Tiers, one folder each; the folder is the test's marker (`bash launch/test.sh -m unit` is the fast tier).
TIERS = ("unit", "model", "server", "upstream", "soak")


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = pathlib.Path(str(item.fspath)).resolve().relative_to(TESTS).parts[0]
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: tests live in one of the tier folders {TIERS}")
        item.add_marker(tier)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    """(model folder, prompts, HF greedy outputs) of a tiny random Llama (float32)."""
    from tiny_model import PROMPTS, build_tiny_llama, hf_greedy

    path = tmp_path_factory.mktemp("tiny-llama")
    model = build_tiny_llama(str(path))
    return str(path), PROMPTS, hf_greedy(model)


@pytest.fixture(scope="session")
def smollm2_path():
    """The converted SmolLM2-135M-Instruct folder (installed and converted on first use)."""
    spec = importlib.util.spec_from_file_location("tangram_launch_models", REPO / "launch" / "models.py")
    models = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = models  # dataclasses look their module up by name
    spec.loader.exec_module(models)
    return models.ensure_model("smollm2")


@pytest.fixture(params=["native", "numpy"])
def control_plane(request, monkeypatch):
    """Runs a test with the native control-plane loops (pool/native.py; a failure, not a skip, when the
    library is not built) and again with their numpy references."""
    from tangram_sglang.pool import native

    if request.param == "native":
        assert native.enabled(), "the native control plane is not built: run launch/setup.sh"
    else:
        monkeypatch.setattr(native, "_LIB", None)
    return request.param
