"""End to end: the calibrate command on the real SmolLM2 with a few short samples."""

import json
import os
import subprocess
import sys

import numpy as np

from tangram_sglang.calibrate import main
from tangram_sglang.profile import load_profile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def smollm2_folder() -> str:
    """The converted model folder (made by launch/models.py at first use, offline)."""
    done = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "models.py"), "smollm2"],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


def test_calibrate_smollm2_end_to_end(tmp_path):
    out = str(tmp_path / "smol.yaml")
    rc = main(["--model-path", smollm2_folder(), "--method", "snapkv", "--ratio", "0.5", "--samples", "3",
               "--heldout", "3", "--min-tokens", "300", "--max-tokens", "360", "--heads-per-group", "1",
               "--parallel-capacity", "12", "--no-progress", "-o", out])
    assert rc == 0
    prof = load_profile(out)
    e = prof.select(0.5)
    assert (prof.model.num_layers, prof.model.num_kv_heads, prof.model.head_dim) == (30, 3, 64)
    assert prof.calibration.method == "snapkv" and prof.calibration.num_samples == 3
    # the global selection keeps ceil(rho * H * n) per chunk: heads' mean retention sums to ~rho * H
    np.testing.assert_allclose(e.mean.sum(axis=1), 1.5, atol=0.01)
    np.testing.assert_allclose(e.budgets, np.clip(e.mean + 2 * e.std, 1e-3, 1.0), atol=2e-6)
    assert e.split_map.shape == (30, 3) and (e.split_map >= 1).all()
    report_dir = str(tmp_path / "smol.report")
    assert sorted(os.listdir(report_dir)) == ["report.json", "report.md", "retention.png"]
    with open(os.path.join(report_dir, "report.json")) as f:
        rep = json.load(f)
    r = rep["ratios"][0]
    assert rep["samples"]["heldout"]["count"] == 3
    assert 0.0 <= r["heldout"]["coverage"]["share_covered"] <= 1.0
    assert r["spend"]["mean"] >= 1.0  # mu + 2 sigma >= mu, and sum mu ~ rho H


def test_calibrate_fastkvzip_writes_gates_named_in_the_profile(tmp_path):
    from tangram_sglang.scorers.fastkvzip import FastKVzipScorer, file_sha256
    from tangram_sglang.scorers.profile_scorer import profile_scorer

    out = str(tmp_path / "smol-fkz.yaml")
    rc = main(["--model-path", smollm2_folder(), "--method", "fastkvzip", "--ratio", "0.5", "--samples", "3",
               "--heldout", "2", "--min-tokens", "300", "--max-tokens", "360", "--heads-per-group", "1",
               "--parallel-capacity", "12", "--gate-steps", "20", "--no-progress", "-o", out])
    assert rc == 0
    prof = load_profile(out)
    gate = tmp_path / "smol-fkz.gate.safetensors"
    assert prof.calibration.method == "fastkvzip" and prof.calibration.weights == gate.name
    assert prof.calibration.weights_sha256 == file_sha256(str(gate))
    assert isinstance(profile_scorer(prof, out), FastKVzipScorer)
    np.testing.assert_allclose(prof.select(0.5).mean.sum(axis=1), 1.5, atol=0.01)
    with open(tmp_path / "smol-fkz.report" / "report.json") as f:
        rep = json.load(f)
    held = rep["gate"]["heldout"]
    assert rep["gate"]["train_rows_per_layer"] == 3 * 256 and held["samples"] == 2
    assert -1.0 <= held["spearman_mean"] <= 1.0 and set(held["topk_recall"]) == {"0.5"}
    assert "FastKVzip gate" in (tmp_path / "smol-fkz.report" / "report.md").read_text()

    # the same gate reused (no KVzip pass, no training) with the model-wide selection scope
    again = str(tmp_path / "other" / "smol-model.yaml")
    rc = main(["--model-path", smollm2_folder(), "--method", "fastkvzip", "--gate", str(gate), "--scope", "model",
               "--ratio", "0.5", "--samples", "3", "--heldout", "0", "--min-tokens", "300", "--max-tokens", "360",
               "--heads-per-group", "1", "--parallel-capacity", "12", "--no-progress", "-o", again])
    assert rc == 0
    prof2 = load_profile(again)
    assert prof2.calibration.scope == "model" and prof2.calibration.weights_sha256 == prof.calibration.weights_sha256
    assert (tmp_path / "other" / "smol-model.gate.safetensors").read_bytes() == gate.read_bytes()
    mean = prof2.select(0.5).mean
    np.testing.assert_allclose(mean.sum(), 0.5 * 30 * 3, atol=0.3)  # rho L H over the whole model
    assert np.ptp(mean.sum(axis=1)) > 0.1  # layers keep different shares
    with open(tmp_path / "other" / "smol-model.report" / "report.json") as f:
        rep2 = json.load(f)
    assert rep2["gate"]["reused_from"] == gate.name and rep2["gate"]["heldout"] == held
    assert "scope model" in (tmp_path / "other" / "smol-model.report" / "report.md").read_text()
    assert main(["--model-path", smollm2_folder(), "--method", "snapkv", "--gate", str(gate), "--ratio", "0.5",
                 "-o", str(tmp_path / "x.yaml")]) == 2
    assert main(["--model-path", smollm2_folder(), "--method", "fastkvzip", "--gate", str(tmp_path / "no.st"),
                 "--ratio", "0.5", "--samples", "1", "--heldout", "0", "-o", str(tmp_path / "y.yaml")]) == 2


def test_calibrate_refuses_a_tp_size_the_heads_cannot_shard_before_calibrating(tmp_path, capsys):
    assert main(["--model-path", smollm2_folder(), "--method", "snapkv", "--ratio", "0.5", "--tp-size", "2",
                 "-o", str(tmp_path / "p.yaml")]) == 2
    assert "--tp-size 2 cannot shard the model's 3 KV heads" in capsys.readouterr().err
    assert not (tmp_path / "p.yaml").exists()
