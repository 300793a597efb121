"""--tangram-data-plane: what each choice selects, and the clear errors."""

import pytest

from tangram_sglang.profile import ProfileError
from tangram_sglang.server_args_ext import attach_profile
from tangram_sglang.serving.data_plane import DataPlaneError, choose_data_plane


def test_auto_is_torch_on_cpu_and_triton_on_cuda(monkeypatch):
    pytest.importorskip("triton")
    assert choose_data_plane("auto", "cpu") == "torch"
    assert choose_data_plane("auto", "cuda:0") == "triton"
    assert choose_data_plane("torch", "cuda:0") == "torch"


def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(DataPlaneError, match="need a GPU"):
        choose_data_plane("triton", "cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert choose_data_plane("triton", "cpu") == "triton"


def test_bad_choice_and_choice_without_profile_are_refused():
    class Args:
        model_path = None

    with pytest.raises(ProfileError, match="tangram_data_plane"):
        attach_profile(Args(), None, None, "triton")
    with pytest.raises(ProfileError, match="'cuda' is not one of"):
        attach_profile(Args(), None, None, "cuda")
    attach_profile(Args(), None, None, "auto")  # nothing asked, nothing recorded
