"""The fidelity benchmark's code versions: what each setting's recorded answers depend on."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import fidelity  # noqa: E402

PROFILE = os.path.join(ROOT, "configs", "smollm2-fastkvzip.yaml")


def _rel(files):
    return {os.path.relpath(f, ROOT) for f in files}


def test_oracle_version_covers_the_oracle_and_not_the_data_plane():
    files = _rel(fidelity.oracle_files())
    assert {"tangram_sglang/serving_reference.py", "tangram_sglang/selection.py",
            "tangram_sglang/scorers/fastkvzip.py"} <= files
    assert not any(f.startswith(("tangram_sglang/attention/", "tangram_sglang/serving/", "tangram_sglang/pool/"))
                   for f in files)


def test_versions_differ_by_what_settings_run():
    tangram = fidelity.code_version("tangram", PROFILE)
    assert fidelity.code_version("dynamic", PROFILE) == fidelity.code_version("uniform", PROFILE) != tangram
    assert fidelity.code_version("tangram", os.path.join(ROOT, "configs", "smollm2-snapkv.yaml")) != tangram
    assert fidelity.code_version("kvpress-kvzip", PROFILE) == fidelity.code_version("kvpress-snapkv", "x.yaml")
