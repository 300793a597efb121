"""benchmarks.remeasure: which figures measured the current code, and the commands it runs."""

import json
import os
import re

import pytest

from benchmarks import remeasure
from benchmarks.remeasure import FIGURES, Figure, fidelity_status, stamp_status

FIG = Figure("x", "serving", "benchmarks.serving.soak", ("--profile", "configs/smollm2-snapkv.yaml"), ())


def _write(tmp_path, kind, name, data):
    (tmp_path / kind).mkdir(exist_ok=True)
    (tmp_path / kind / name).write_text(json.dumps(data))


def test_unstamped_dirty_and_unknown_commits_are_not_current(tmp_path):
    assert stamp_status(FIG, str(tmp_path)) == (False, "no results file")
    _write(tmp_path, "serving", "x.json", {"rows": []})
    assert stamp_status(FIG, str(tmp_path))[1].startswith("results not stamped")
    _write(tmp_path, "serving", "x.json", {"stamp": {"commit": "abc1234-dirty"}})
    assert stamp_status(FIG, str(tmp_path))[1] == "measured on uncommitted code (abc1234-dirty)"
    _write(tmp_path, "serving", "x.json", {"stamp": {"commit": "0000000"}})
    assert stamp_status(FIG, str(tmp_path)) == (False, "commit 0000000 is not in this repository")


def test_a_stamped_commit_is_current_only_while_its_counted_files_are_unchanged(tmp_path, monkeypatch):
    _write(tmp_path, "serving", "x.json", {"stamp": {"commit": "HEAD"}})
    then = {"tangram_sglang/pool/page_pool.py": "a1", "configs/smollm2-snapkv.yaml": "b2"}
    now = dict(then)
    monkeypatch.setattr(remeasure, "files_at", lambda commit, fig: then if commit else now)
    assert stamp_status(FIG, str(tmp_path)) == (True, "measured at HEAD")
    now["tangram_sglang/pool/page_pool.py"] = "c3"
    ok, why = stamp_status(FIG, str(tmp_path))
    assert not ok and why.startswith("1 counted files changed since HEAD (tangram_sglang/pool/page_pool.py")


def test_a_figure_is_carried_over_recorded_neutral_commits_only(tmp_path, monkeypatch):
    _write(tmp_path, "serving", "x.json", {"stamp": {"commit": "abc1234"}})
    then = {"tangram_sglang/sglang/compatibility.py": "a1", "tangram_sglang/pool/page_pool.py": "b1"}
    now = {"tangram_sglang/sglang/compatibility.py": "a2", "tangram_sglang/pool/page_pool.py": "b1"}
    head = dict(now)
    monkeypatch.setattr(remeasure, "files_at", lambda commit, fig: then if commit == "abc1234" else
                        head if commit == "HEAD" else now)
    log = ["1111111aaaa", "2222222bbbb"]
    compat, pool = "tangram_sglang/sglang/compatibility.py", "tangram_sglang/pool/page_pool.py"
    touched = {"1111111aaaa": [compat], "2222222bbbb": [compat, "README.md"], "3333333cccc": [compat]}

    def git(*args, **kwargs):
        if args[0] == "log":
            return "\n".join(log) + "\n"
        return "\n".join(touched[args[-1]]) + "\n"     # show --name-only --format= COMMIT

    monkeypatch.setattr(remeasure, "_git", git)
    neutral = {"1111111": frozenset([compat]), "2222222": frozenset([compat])}
    monkeypatch.setattr(remeasure, "neutral_commits", lambda: neutral)
    ok, why = stamp_status(FIG, str(tmp_path))
    assert ok and why.startswith("measured at abc1234, carried over 1111111, 2222222")
    log.append("3333333cccc")                        # one commit since the stamp is not recorded neutral
    assert stamp_status(FIG, str(tmp_path))[0] is False
    log.pop()
    neutral["2222222"] = frozenset([pool])            # recorded, but not for the counted file it changed
    assert stamp_status(FIG, str(tmp_path))[0] is False
    neutral["2222222"] = frozenset([compat])
    now[compat] = "a3"                                # uncommitted edits are never carried
    assert stamp_status(FIG, str(tmp_path))[0] is False


def test_the_neutral_record_names_commits_with_their_evidence():
    rows = json.load(open(remeasure.NEUTRAL_CHANGES))["commits"]
    assert rows and all(re.fullmatch(r"[0-9a-f]{7,40}", r["commit"]) and r["why"] and r["files"] for r in rows)
    root = remeasure.ROOT
    assert all(os.path.isfile(os.path.join(root, r["evidence"].split("::")[0])) for r in rows)
    if remeasure._git("rev-parse", "--is-shallow-repository").strip() == "false":  # a full clone: they exist
        for commit in remeasure.neutral_commits():
            assert remeasure._git("rev-parse", "--verify", f"{commit}^{{commit}}").strip()


def test_counted_files_are_the_served_package_the_module_and_its_profiles():
    counted = lambda p: remeasure._counted(p, FIG)  # noqa: E731
    assert counted("tangram_sglang/pool/page_pool.py") and counted("benchmarks/serving/soak.py")
    assert counted("tangram_sglang/pool/native_src/control_plane.c")   # the native control plane serves too
    assert counted("configs/smollm2-snapkv.yaml") and counted("configs/smollm2-snapkv.gate.safetensors")
    assert not counted("tangram_sglang/oracle/serving_reference.py")       # never loaded by the server
    assert not counted("tangram_sglang/calibration/pilot.py") and not counted("README.md")
    assert not counted("configs/smollm2-fastkvzip.yaml") and not counted("benchmarks/serving/pressure.py")


def test_files_at_head_lists_blobs_of_the_served_package():
    files = remeasure.files_at("HEAD", FIG)
    assert "tangram_sglang/pool/ragged_cache.py" in files and len(files["tangram_sglang/pool/ragged_cache.py"]) == 40
    assert not any("/oracle/" in p for p in files)


def test_fidelity_rows_count_when_run_or_linked_to_the_current_version(tmp_path, monkeypatch):
    import benchmarks.fidelity.versions as versions

    fig = next(f for f in FIGURES if f.name == "fidelity_gemma")
    monkeypatch.setattr(versions, "code_version",
                        lambda setting, profile: {"full": "F2", "tangram": "T3", "dynamic": "D"}[setting])
    rows = [{"setting": "full", "ratio": 1.0, "version": "F2"}, {"setting": "tangram", "ratio": 0.5, "version": "T1"},
            *({"setting": "dynamic", "ratio": r, "version": "D"} for r in (0.5, 0.25))]
    _write(tmp_path, "fidelity", "fidelity_gemma.json", {"rows": rows})
    ok, why = fidelity_status(fig, str(tmp_path))
    assert not ok and why.startswith("1 of 4 rows not from the current code (tangram 0.5")
    _write(tmp_path, "fidelity", "fidelity_versions.json", {"T3": {"same_as": "T2"}, "T2": {"same_as": "T1"}})
    assert fidelity_status(fig, str(tmp_path)) == (True, "all 4 rows from the current code")
    rows[0].pop("version")                                  # reports written before rows carried versions
    _write(tmp_path, "fidelity", "fidelity_gemma.json", {"rows": rows})
    assert not fidelity_status(fig, str(tmp_path))[0]


def test_a_setting_asked_but_never_run_makes_the_figure_stale(tmp_path, monkeypatch):
    import benchmarks.fidelity.versions as versions

    fig = next(f for f in FIGURES if f.name == "fidelity_long")     # full, tangram; kvpress at --peer-ratios
    monkeypatch.setattr(versions, "code_version", lambda setting, profile: "V")
    rows = [{"setting": "full", "ratio": 1.0, "version": "V"}, {"setting": "tangram[fastkvzip]", "ratio": 0.4,
                                                                  "version": "V"}]
    _write(tmp_path, "fidelity", "fidelity_long.json", {"rows": rows})
    assert fidelity_status(fig, str(tmp_path)) == (False, "no rows for kvpress-kvzip 0.51 (asked, never run)")
    rows.append({"setting": "kvpress-kvzip", "ratio": 0.51, "version": "V", "n": 21})
    rows[0]["n"] = rows[1]["n"] = 24
    _write(tmp_path, "fidelity", "fidelity_long.json", {"rows": rows})
    assert fidelity_status(fig, str(tmp_path)) == (
        False, "rows run on part of the conversations: kvpress-kvzip 0.51 (21 of 24)")
    rows[2]["n"] = 24
    _write(tmp_path, "fidelity", "fidelity_long.json", {"rows": rows})
    assert fidelity_status(fig, str(tmp_path)) == (True, "all 3 rows from the current code")
    assert remeasure._values(["--ratios", "0.4", "0.5", "--name", "x"], "--ratios") == ["0.4", "0.5"]


def test_quick_commands_never_write_the_committed_results():
    for fig in FIGURES:
        quick = " ".join(fig.quick)
        assert "benchmarks/results" not in quick, fig.name
        outs = [a for flag in ("--out", "--out-dir") if flag in fig.quick for a in [fig.quick[fig.quick.index(flag) + 1]]]
        assert all(o.startswith(remeasure.QUICK_DIR) for o in outs), fig.name


def test_unknown_figure_names_are_refused(capsys):
    with pytest.raises(SystemExit):
        remeasure.main(["--only", "nope"])
    assert "unknown figures ['nope']" in capsys.readouterr().err


def test_every_shown_results_file_is_re_measured_or_listed_with_its_reason():
    """What the README, docs/results.md and the generated tables show is a FIGURES entry (its currency is
    checked) or in OTHER_RESULTS with the reason it is not re-measured; nothing shown goes untracked."""
    import os
    import re

    from benchmarks.common.paths import ROOT

    shown = set()
    for doc in ("README.md", "docs/results.md"):
        text = open(os.path.join(ROOT, doc)).read()
        shown |= {p.removeprefix("benchmarks/results/") for p in re.findall(r"benchmarks/results/[\w./-]+\.\w+", text)}
    tables = open(os.path.join(ROOT, "benchmarks/common/report_tables.py")).read()
    shown |= set(re.findall(r'"((?:fidelity|serving|timing|modeled)/[\w.-]+\.json)"', tables))
    stems = {os.path.splitext(f.path)[0] for f in FIGURES} | {os.path.splitext(p)[0] for p in remeasure.OTHER_RESULTS}
    untracked = sorted(p for p in shown if p and os.path.splitext(p)[0] not in stems)
    assert not untracked, f"shown but neither re-measured nor listed in OTHER_RESULTS: {untracked}"
    assert all(why.strip() for why in remeasure.OTHER_RESULTS.values())


def test_a_figure_counts_the_benchmark_code_and_launch_flags_its_module_loads():
    fig = next(f for f in FIGURES if f.name == "concurrency_multiturn_r04")
    counted = lambda p: remeasure._counted(p, fig)  # noqa: E731
    assert counted("benchmarks/serving/concurrency.py") and counted("benchmarks/common/client.py")
    assert counted("tangram_sglang/sglang/server_process.py")      # writes the servers' launch flags
    assert not counted("benchmarks/common/stamp.py") and not counted("benchmarks/common/report_tables.py")
    assert not counted("benchmarks/serving/pressure.py")           # another figure's module


# modules that serve a model's shipped profile (named by --profile or by --model): each figure states the ratio
RATIO_SERVING = ("benchmarks.serving.think_time", "benchmarks.serving.multiturn_rounds",
                 "benchmarks.serving.hit_recompute", "benchmarks.serving.concurrency", "benchmarks.serving.bench_serving",
                 "benchmarks.timing.prefill_history", "benchmarks.timing.prefill_cost", "benchmarks.timing.decode_step",
                 "benchmarks.fidelity.run")


def test_every_figure_serving_a_profile_names_its_ratio():
    """A profile's default_ratio never reaches a figure (so changing it, 2026-12-07, leaves every figure's inputs
    the same): each run of a profile-serving module passes --ratio / --ratios."""
    for fig in FIGURES:
        if fig.module in RATIO_SERVING:
            assert {"--ratio", "--ratios"} & set(fig.full), f"{fig.name} serves its profile's default ratio"
