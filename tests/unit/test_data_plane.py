"""--tangram-data-plane: what each choice selects, and the clear errors."""

import pytest

from tangram_sglang.profile import ProfileError
from tangram_sglang.serving.data_plane import DataPlaneError, choose_data_plane
from tangram_sglang.sglang.server_args import attach_profile, read_profile


def test_auto_is_torch_on_cpu_and_triton_on_cuda(monkeypatch):
    assert choose_data_plane("auto", "cpu") == "torch"
    assert choose_data_plane("auto", "cuda:0") == "triton"
    assert choose_data_plane("torch", "cuda:0") == "torch"


def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(DataPlaneError, match="need a GPU"):
        choose_data_plane("triton", "cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert choose_data_plane("triton", "cpu") == "triton"


def test_cuda_kernel_needs_a_gpu_and_nvcc(monkeypatch):
    """--tangram-data-plane cuda: the CUDA decode kernel, compiled at start; never chosen by auto."""
    import tangram_sglang.serving.data_plane as dp

    with pytest.raises(DataPlaneError, match="cuda on cpu: the CUDA decode kernel needs a GPU"):
        choose_data_plane("cuda", "cpu")
    monkeypatch.setattr(dp.shutil, "which", lambda name: None)
    with pytest.raises(DataPlaneError, match="nvcc is not on the PATH"):
        choose_data_plane("cuda", "cuda:0")
    monkeypatch.setattr(dp.shutil, "which", lambda name: "/usr/bin/" + name)
    assert choose_data_plane("cuda", "cuda:0") == "cuda"


def test_bad_choice_and_choice_without_profile_are_refused():
    class Args:
        model_path = None

    with pytest.raises(ProfileError, match="tangram_data_plane"):
        attach_profile(Args(), None, None, None, "triton")
    with pytest.raises(ProfileError, match="'gpu' is not one of"):
        attach_profile(Args(), None, None, None, "gpu")
    args = Args()
    attach_profile(args, None, None, None, "auto")  # nothing asked, nothing recorded
    assert not hasattr(args, "_tangram")


def test_triton_without_a_gpu_stops_the_launch(monkeypatch):
    """Checked in the launching process, before any scheduler is spawned."""
    from pathlib import Path
    from types import SimpleNamespace

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    profile = str(Path(__file__).resolve().parents[2] / "configs" / "smollm2-snapkv.yaml")
    with pytest.raises(ProfileError, match="tangram_data_plane.*need a GPU"):
        attach_profile(SimpleNamespace(model_path=None, device="cpu"), *read_profile(profile), None, "triton")
    args = SimpleNamespace(model_path=None, device="cpu")
    attach_profile(args, *read_profile(profile), None, "torch")
    assert args._tangram.data_plane == "torch"
