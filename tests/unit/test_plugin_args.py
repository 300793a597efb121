"""--tangram-profile parses in the server's CLI and in the Engine, and survives pickling."""

import pickle

import pytest
import sglang.srt.entrypoints.engine as engine_mod  # before load_plugins: the plugin patches Engine
from sglang.srt.plugins import load_plugins
from sglang.srt.server_args import prepare_server_args

from tangram_sglang.profile import ProfileError
from tangram_sglang.profile.uniform import main as write_uniform
from tangram_sglang.sglang.server_args import ServedProfile, served_profile

load_plugins()


@pytest.fixture
def profile(tiny_llama, tmp_path):
    path = tmp_path / "u.yaml"
    write_uniform(["--model-path", tiny_llama[0], "--ratio", "1.0", "--ratio", "0.5", "-o", str(path)])
    return str(path)


def test_cli_flag_parses_and_survives_pickling(tiny_llama, profile):
    args = prepare_server_args(["--model-path", tiny_llama[0], "--tangram-profile", profile,
                                "--tangram-ratio", "0.5"])
    assert served_profile(args) == ServedProfile(profile, 0.5, "auto")
    assert served_profile(pickle.loads(pickle.dumps(args))) == ServedProfile(profile, 0.5, "auto")


def test_cli_without_flag_has_no_profile(tiny_llama):
    args = prepare_server_args(["--model-path", tiny_llama[0]])
    assert served_profile(args) is None


def test_cli_bad_profile_stops_with_its_error(tiny_llama, profile, capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(open(profile).read().replace("num_kv_heads: 2", "num_kv_heads: 4"))
    with pytest.raises(SystemExit) as info:
        prepare_server_args(["--model-path", tiny_llama[0], "--tangram-profile", str(bad)])
    assert info.value.code == 2
    assert "field 'entries[0].budgets'" in capsys.readouterr().err


def test_cli_unknown_ratio(tiny_llama, profile, capsys):
    with pytest.raises(SystemExit):
        prepare_server_args(["--model-path", tiny_llama[0], "--tangram-profile", profile, "--tangram-ratio", "0.3"])
    assert "no entry for ratio 0.3" in capsys.readouterr().err


def test_engine_server_args_accept_profile(tiny_llama, profile):
    build = engine_mod.Engine.server_args_class
    args = build(model_path=tiny_llama[0], tangram_profile=profile)
    assert served_profile(args) == ServedProfile(profile, None, "auto")


def test_engine_bad_profile_raises(tiny_llama, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("format: tangram-profile\nversion: 7\n")
    with pytest.raises(ProfileError, match="unknown version 7"):
        engine_mod.Engine.server_args_class(model_path=tiny_llama[0], tangram_profile=str(bad))


def test_host_ratio_parses_and_bad_values_stop_the_launch(tiny_llama, profile, capsys, tmp_path):
    args = prepare_server_args(["--model-path", tiny_llama[0], "--tangram-profile", profile,
                                "--tangram-host-ratio", "2"])
    assert served_profile(pickle.loads(pickle.dumps(args))) == ServedProfile(profile, None, "auto", 2.0)
    for bad, why in ((["--tangram-profile", profile, "--tangram-host-ratio", "-1"], "is not a ratio >= 0"),
                     (["--tangram-host-ratio", "1"], "given without --tangram-profile")):
        with pytest.raises(SystemExit):
            prepare_server_args(["--model-path", tiny_llama[0], *bad])
        assert why in capsys.readouterr().err
    with pytest.raises(ProfileError, match="sliding-window layers"):
        from tangram_sglang.sglang.server_args import _check_host_ratio

        windowed = type("P", (), {"model": type("M", (), {"windows": (0, 512)})()})()
        _check_host_ratio(1.0, windowed)
    args = engine_mod.Engine.server_args_class(model_path=tiny_llama[0], tangram_profile=profile, tangram_host_ratio=0.5)
    assert served_profile(args).host_ratio == 0.5


def test_replies_parses_and_bad_values_stop_the_launch(tiny_llama, profile, capsys):
    args = prepare_server_args(["--model-path", tiny_llama[0], "--tangram-profile", profile,
                                "--tangram-replies", "compressed"])
    assert served_profile(pickle.loads(pickle.dumps(args))).replies == "compressed"
    assert served_profile(prepare_server_args(["--model-path", tiny_llama[0], "--tangram-profile", profile])).replies \
        == "whole"
    for bad, why in ((["--tangram-profile", profile, "--tangram-replies", "half"], "invalid choice"),
                     (["--tangram-replies", "compressed"], "given without --tangram-profile")):
        with pytest.raises(SystemExit):
            prepare_server_args(["--model-path", tiny_llama[0], *bad])
        assert why in capsys.readouterr().err
    build = engine_mod.Engine.server_args_class
    assert served_profile(build(model_path=tiny_llama[0], tangram_profile=profile,
                                tangram_replies="compressed")).replies == "compressed"
    with pytest.raises(ProfileError, match="'half' is not one of whole, compressed"):
        build(model_path=tiny_llama[0], tangram_profile=profile, tangram_replies="half")
