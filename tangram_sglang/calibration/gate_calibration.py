"""``calibrate --method fastkvzip``: KVzip scores -> trained gates -> the gate as the scorer.

1. KVzip scores (calibration/kvzip_teacher.py) of every calibration sample, with the
   hidden states of a random subset of each sample's tokens;
2. one gate per layer fitted to them (calibration/gate_training.py), saved as
   ``<profile stem>.gate.safetensors`` beside the profile, with its sha256;
3. the held-out samples' KVzip scores against the gate's (ranking report);
   the caller then runs the pilot with the gate as the scorer, so budgets are
   calibrated with the scores that will be served.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass

from tangram_sglang.calibration.gate_training import gate_ranking, train_gates
from tangram_sglang.calibration.kvzip_teacher import KVzipSample, kvzip_sample
from tangram_sglang.scorers.fastkvzip import FastKVzipScorer, GateShape, file_sha256, load_gates, save_gates


@dataclass
class GateCalibration:
    scorer: FastKVzipScorer
    weights: str  # file name, relative to the profile's folder
    sha256: str
    report: dict


def gate_shape(model) -> GateShape:
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    num_kv = int(cfg.num_key_value_heads or cfg.num_attention_heads)
    return GateShape(num_layers=int(cfg.num_hidden_layers), hidden_size=int(cfg.hidden_size),
                     num_kv_heads=num_kv, group=int(cfg.num_attention_heads) // num_kv)


def gate_file(profile_path: str) -> str:
    return os.path.splitext(profile_path)[0] + ".gate.safetensors"


def _kvzip_all(model, tok, samples, chunk_size: int, desc: str, progress: bool, gates=None) -> list[KVzipSample]:
    from tqdm import tqdm

    return [kvzip_sample(model, tok, s, chunk_size=chunk_size, seed=i, gates=gates)
            for i, s in enumerate(tqdm(samples, desc=desc, unit="sample", disable=not progress))]


def calibrate_gates(model, tok, cal_samples, held_samples, *, profile_path: str, chunk_size: int,
                    ratios: tuple[float, ...], steps: int = 300, seed: int = 0,
                    progress: bool = True) -> GateCalibration:
    """Steps 1-3 of the module docstring; writes the gate file next to ``profile_path``."""
    t0 = time.perf_counter()
    cal = _kvzip_all(model, tok, cal_samples, chunk_size, "KVzip scores", progress)
    t1 = time.perf_counter()
    gates, losses = train_gates(cal, gate_shape(model), steps=steps, seed=seed, progress=progress)
    t2 = time.perf_counter()
    path = gate_file(profile_path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    sha = save_gates(gates, path)
    gates = load_gates(path, sha)  # what will be served (float16 weights): held-out and pilot use it too
    report = {"file": os.path.basename(path), "sha256": sha, "shape": gate_shape(model).__dict__,
              "train_rows_per_layer": int(sum(s.rows.numel() for s in cal)), "steps": steps,
              "final_log_mse": [round(x, 4) for x in losses],
              "seconds_kvzip": round(t1 - t0, 1), "seconds_training": round(t2 - t1, 1)}
    if held_samples:
        held = _kvzip_all(model, tok, held_samples, chunk_size, "KVzip held-out", progress, gates)
        report["heldout"] = gate_ranking([h.gate_scores for h in held], held, ratios)
    return GateCalibration(FastKVzipScorer(gates), os.path.basename(path), sha, report)


def reuse_gates(model, source: str, *, profile_path: str) -> GateCalibration:
    """A gate file trained before (``--gate``), copied beside ``profile_path``; no KVzip pass, no training.

    The report is the source's training report (``<source stem>.report/report.json``) when it exists.
    Raises ValueError when the file is missing or its gates do not fit the model.
    """
    if not os.path.isfile(source):
        raise ValueError(f"--gate {source}: no such file")
    path = gate_file(profile_path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if os.path.abspath(source) != os.path.abspath(path):
        shutil.copyfile(source, path)
    sha = file_sha256(path)
    gates = load_gates(path, sha)
    want = gate_shape(model)
    if gates[0].shape != want:  # the shape names the layer count too
        raise ValueError(f"--gate {source}: gates of shape {gates[0].shape}, the model needs {want}")
    report = {}
    source_report = os.path.join(source.removesuffix(".gate.safetensors") + ".report", "report.json")
    if os.path.exists(source_report):
        with open(source_report) as f:
            report = json.load(f).get("gate", {})
    report.update(file=os.path.basename(path), sha256=sha, reused_from=os.path.basename(source))
    return GateCalibration(FastKVzipScorer(gates), os.path.basename(path), sha, report)
