"""The fidelity benchmark's code versions: what each setting's recorded answers depend on."""

import os

import benchmarks.fidelity as fidelity

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROFILE = os.path.join(ROOT, "configs", "smollm2-fastkvzip.yaml")


def _rel(files):
    return {os.path.relpath(f, ROOT) for f in files}


def test_oracle_version_covers_the_oracle_and_not_the_data_plane():
    files = _rel(fidelity.oracle_files())
    assert {"tangram_sglang/oracle/serving_reference.py", "tangram_sglang/scorers/selection.py",
            "tangram_sglang/scorers/fastkvzip.py"} <= files
    assert not any(f.startswith(("tangram_sglang/attention/", "tangram_sglang/serving/", "tangram_sglang/pool/"))
                   for f in files)


def test_versions_differ_by_what_settings_run():
    tangram = fidelity.code_version("tangram", PROFILE)
    assert fidelity.code_version("dynamic", PROFILE) == fidelity.code_version("uniform", PROFILE) != tangram
    assert fidelity.code_version("tangram", os.path.join(ROOT, "configs", "smollm2-snapkv.yaml")) != tangram
    assert fidelity.code_version("kvpress-kvzip", PROFILE) == fidelity.code_version("kvpress-snapkv", "x.yaml")


def test_the_served_version_covers_the_native_loops(monkeypatch):
    """A change to the native control plane (C, built by launch/setup.sh) is a change to served code."""
    native = os.path.join(ROOT, "tangram_sglang", "pool", "native_src", "control_plane.c")
    real_open, before = open, fidelity.code_version("tangram", PROFILE)
    oracle = fidelity.code_version("dynamic", PROFILE)

    def edited(path, *args, **kw):
        f = real_open(path, *args, **kw)
        if os.path.abspath(path) != native:
            return f
        import io
        return io.BytesIO(f.read() + b"/* one more comment */")
    monkeypatch.setattr("builtins.open", edited)
    assert fidelity.code_version("tangram", PROFILE) != before
    assert fidelity.code_version("dynamic", PROFILE) == oracle   # the oracle does not load it


def test_latest_row_of_equivalent_versions_answers_never_over_a_row_run_at_that_version(tmp_path):
    """Equivalent versions alias rows forward; the latest recorded row wins among aliases (a pool row
    then reads the last full run), and a row run at a version is never replaced by an alias."""
    import json

    from benchmarks.fidelity import RunStore

    (tmp_path / "fidelity_versions.json").write_text(json.dumps(
        {"B": {"same_as": "A"}, "C": {"same_as": "B"}, "D": {"same_as": "C"}}))
    rows = [("m|s|0.5|pool|A", 1), ("m|s|0.5|pool|C", 3), ("m|s|0.5|pool|B", 2)]
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps({"key": k, "v": v}) + "\n" for k, v in rows))
    store = RunStore(str(tmp_path / "runs.jsonl"))
    got = {k.rsplit("|", 1)[1]: r["v"] for k, r in store.rows.items()}
    assert got == {"A": 1, "B": 2, "C": 3, "D": 2}


def test_setting_tags_name_the_oracle_they_run():
    for s in ("dynamic", "dynamic@0,0", "dynamic~position", "dynamic~position[fastkvzip]", "dynamic@0,0[kvzip]"):
        assert fidelity.base_setting(s) == "dynamic"
    assert fidelity.base_setting("tangram[fastkvzip]") == "tangram"
    assert fidelity.code_version("static~position", PROFILE) == fidelity.code_version("static", PROFILE)


def test_the_served_package_never_imports_the_oracle():
    """Served versions leave out tangram_sglang/oracle/ (NOT_SERVED): nothing the server loads imports it."""
    import subprocess
    import sys

    code = ("import sys, tangram_sglang.sglang.plugin, tangram_sglang.serving.runtime, tangram_sglang.sglang.backend\n"
            "print(sorted(m for m in sys.modules if m.startswith('tangram_sglang.oracle')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
