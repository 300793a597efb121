"""The GPU kit (launch/gpu_kit/): it fits what travels to the GPU machine, its pins are consistent,
and install.sh unpacks only an archive whose sha256 matches (on fake kits: no network, no build)."""

import hashlib
import io
import json
import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KIT = REPO / "launch" / "gpu_kit"
INSTALL = KIT / "install.sh"
MiB = 2**20
LIMIT = 56 * MiB  # what travels per call is 64 MiB: keep a margin for untracked files and shared/


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path) -> list[tuple[str, str]]:
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    return [(norm(n), v) for n, _, v in (line.partition("==") for line in lines if line)]


def tracked_bytes() -> int:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    files = [REPO / f for f in out.decode().split("\0") if f]
    return sum(f.stat().st_size for f in files if f.is_file())


def test_kit_and_tracked_files_fit_what_travels():
    manifest = json.loads((KIT / "manifest.json").read_text())
    kit = sum(manifest["artifacts"].values())
    assert set(manifest["artifacts"]) == {"kit.tar.xz", "SHA256SUMS", "manifest.json"}
    assert kit <= 30 * MiB, f"the kit grew to {kit / MiB:.1f} MiB"
    total = kit + tracked_bytes()
    assert total <= LIMIT, f"kit {kit / MiB:.1f} MiB + tracked files = {total / MiB:.1f} MiB > 56 MiB"


def test_wheels_pinned_once_and_match_the_manifest():
    wheels = pins(KIT / "wheels.txt")
    names = [n for n, _ in wheels]
    assert all(v and re.fullmatch(r"[\w.+!-]+", v) for _, v in wheels), wheels
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
    assert "sglang" not in names  # build.py adds it
    manifest = json.loads((KIT / "manifest.json").read_text())["wheels"]
    assert {norm(n): v for n, v in manifest.items()} == {"sglang": "0.5.23", **dict(wheels)}


def test_wheels_use_the_projects_pins():
    project = dict(pins(REPO / "launch" / "requirements-cpu.txt") + pins(REPO / "launch" / "requirements-dev.txt"))
    wrong = {n: (v, project[n]) for n, v in pins(KIT / "wheels.txt") if n in project and project[n] != v}
    assert not wrong, f"wheels.txt differs from launch/requirements-*.txt: {wrong}"


def fake_kit(folder, digest: str | None = None) -> str:
    """A tiny kit.tar.xz (site/marker.txt) in folder with a SHA256SUMS naming digest (default: its own)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = b"kit\n"
    with tarfile.open(folder / "kit.tar.xz", "w:xz") as tar:
        info = tarfile.TarInfo("site/marker.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    real = hashlib.sha256((folder / "kit.tar.xz").read_bytes()).hexdigest()
    (folder / "SHA256SUMS").write_text(f"{digest or real}  kit.tar.xz\n")
    return real


def install(kit_dir, scratch, *args, python: str = "true", script: str | None = None):
    """Run install.sh (PYTHON=true stands in for a Python 3.12) or a bash script around it."""
    env = {**os.environ, "KIT_DIR": str(kit_dir), "PYTHON": python, "PYTHONPATH": "/before"}
    cmd = ["bash", "-c", script, "x", str(scratch)] if script else ["bash", str(INSTALL), *args, str(scratch)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


def test_install_refuses_a_kit_whose_sha256_differs(tmp_path):
    fake_kit(tmp_path / "kit", digest="0" * 64)
    r = install(tmp_path / "kit", tmp_path / "scratch", "--print-env")
    assert r.returncode == 1 and r.stdout == ""
    assert "sha256" in r.stderr and "refused" in r.stderr
    assert not (tmp_path / "scratch" / "site").exists()


def test_install_refuses_a_missing_kit_and_another_python(tmp_path):
    r = install(tmp_path / "nothing", tmp_path / "scratch", "--print-env")
    assert r.returncode == 1 and "missing" in r.stderr
    fake_kit(tmp_path / "kit")
    r = install(tmp_path / "kit", tmp_path / "scratch", "--print-env", python="false")
    assert r.returncode == 1 and "3.12" in r.stderr and r.stdout == ""


def test_install_unpacks_once_and_prints_the_exports(tmp_path):
    digest = fake_kit(tmp_path / "kit")
    scratch = tmp_path / "scratch"
    r = install(tmp_path / "kit", scratch, "--print-env")
    assert r.returncode == 0, r.stderr
    assert (scratch / "site" / "marker.txt").read_text() == "kit\n"
    assert (scratch / "site" / ".kit-sha256").read_text().strip() == digest
    assert f"export PYTHONPATH={REPO}/tangram_sglang/gpu_compat/shims:{scratch}/site:{REPO}:/before" in r.stdout
    assert "export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python" in r.stdout
    assert "export SGLANG_FORCE_FUSED_OP_BACKEND=torch" in r.stdout
    again = install(tmp_path / "kit", scratch, "--print-env")
    assert again.returncode == 0 and "already unpacked" in again.stderr and again.stdout == r.stdout


def test_install_sourced_exports_into_the_shell_or_returns_1(tmp_path):
    fake_kit(tmp_path / "kit")
    script = f'source {INSTALL} "$1" && echo "PP=$PYTHONPATH" && echo "FUSED=$SGLANG_FORCE_FUSED_OP_BACKEND"'
    r = install(tmp_path / "kit", tmp_path / "scratch", script=script)
    assert r.returncode == 0, r.stderr
    assert f"PP={REPO}/tangram_sglang/gpu_compat/shims:{tmp_path}/scratch/site:{REPO}:/before" in r.stdout
    assert "FUSED=torch" in r.stdout
    fake_kit(tmp_path / "bad", digest="f" * 64)
    script = f'source {INSTALL} "$1"; echo "status=$? PP=$PYTHONPATH"'
    r = install(tmp_path / "bad", tmp_path / "scratch2", script=script)
    assert "status=1 PP=/before" in r.stdout
