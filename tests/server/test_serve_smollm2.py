"""`python -m sglang.launch_server --tangram-profile` refuses a profile that does not fit the model.
(What a launched server serves over the OpenAI API, /generate and /metrics: test_serve_tangram.)"""

import subprocess
import sys

import pytest

from tangram_sglang.profile.uniform import main as write_uniform

PORT = 31731


@pytest.fixture(scope="module")
def profile(smollm2_path, tmp_path_factory):
    path = tmp_path_factory.mktemp("profiles") / "smollm2-uniform.yaml"
    write_uniform(["--model-path", smollm2_path, "--ratio", "1.0", "-o", str(path)])
    return str(path)


def test_bad_profile_stops_launch(smollm2_path, profile, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(open(profile).read().replace("head_dim: 64", "head_dim: 128"))
    proc = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--model-path", smollm2_path,
                           "--port", str(PORT + 1), "--tangram-profile", str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "field 'model.head_dim': profile has 128, the served model has 64" in proc.stderr
