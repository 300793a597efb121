"""Build the GPU kit: sglang 0.5.23 and the wheels the borrowed GPU image lacks, as one archive.

    .venv/bin/python launch/gpu_kit/build.py

Downloads (pip download, cp312 manylinux x86-64, no deps) sglang and every wheel pinned in
launch/gpu_kit/wheels.txt into .gpu_kit/cache/ (kept between builds), unpacks them into one
site tree .gpu_kit/site/ (removed once packed), slims it (launch/gpu_kit/slim.py), adds a
dist-info that makes SGLang's plugin discovery find tangram_sglang, adds SmolLM2's tokenizer (the GPU
run's dummy-weight models take its vocabulary, so sglang.bench_serving has real text to send;
site/_tokenizers/smollm2, from the converted model launch/models.py caches), and writes:

    .gpu_kit/kit.tar.xz     the site tree (top folder site/), xz -9   } these two travel (the device
    .gpu_kit/SHA256SUMS     its sha256 (install.sh checks it)         } tool's carry), not the folder
    .gpu_kit/manifest.json  every wheel (version, file, sha256), what was dropped, the sizes
    launch/gpu_kit/manifest.json  the committed summary: artifact sizes and wheel versions

The GPU machine runs launch/gpu_kit/install.sh, which unpacks the archive and prints the
PYTHONPATH that serves from it. Standard library only (plus pip, tar and xz).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile

import slim

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, ".gpu_kit")
CACHE = os.path.join(OUT, "cache")
SITE = os.path.join(OUT, "site")
KIT = "kit.tar.xz"
TOKENIZER = ("smollm2", "SmolLM2-135M-Instruct", ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"))
CARRY = ".gpu_kit/kit.tar.xz .gpu_kit/SHA256SUMS"
SGLANG = ("sglang", "0.5.23")
PY_VERSION = "3.12"
# pip matches manylinux_2_N exactly, so every N a pinned wheel is tagged with is named
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 26, 27, 28, 31, 34, 35)] + \
    ["manylinux2014_x86_64", "manylinux1_x86_64"]


def step(msg: str) -> None:
    print(f"[gpu_kit] {msg}", flush=True)


def norm(name: str) -> str:
    """PEP 503 name: 'Pydantic_Core' -> 'pydantic-core'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: str = os.path.join(HERE, "wheels.txt")) -> list[tuple[str, str]]:
    """(name, version) pairs of wheels.txt, in file order; raises on a line that is not name==version."""
    pins = []
    with open(path) as f:
        for raw in f:
            line = raw.split("#")[0].strip()
            if not line:
                continue
            name, sep, version = line.partition("==")
            if not sep or not name.strip() or not version.strip():
                raise SystemExit(f"wheels.txt: expected name==version, got {line!r}")
            pins.append((norm(name.strip()), version.strip()))
    return pins


def wheel_key(filename: str) -> tuple[str, str]:
    """('pydantic-core', '2.50.4') from 'pydantic_core-2.50.4-cp312-...whl'."""
    name, version = filename.split("-")[:2]
    return norm(name), version


def cached_wheels() -> dict[tuple[str, str], str]:
    os.makedirs(CACHE, exist_ok=True)
    return {wheel_key(f): os.path.join(CACHE, f) for f in sorted(os.listdir(CACHE)) if f.endswith(".whl")}


def download(pins: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Fetch the pins missing from the cache (one pip call); returns pin -> wheel path."""
    missing = [p for p in pins if p not in cached_wheels()]
    if missing:
        step(f"downloading {len(missing)} wheels: {' '.join(f'{n}=={v}' for n, v in missing)}")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
               "--disable-pip-version-check", "--python-version", PY_VERSION, "--implementation", "cp",
               "--abi", "cp312", "--abi", "abi3", "--abi", "none", "-d", CACHE]
        cmd += [a for p in PLATFORMS for a in ("--platform", p)]
        subprocess.run(cmd + [f"{n}=={v}" for n, v in missing], check=True)
    have = cached_wheels()
    lost = [p for p in pins if p not in have]
    if lost:
        raise SystemExit(f"pip download did not produce: {lost}")
    step(f"{len(pins)} wheels in {os.path.relpath(CACHE, ROOT)}/")
    return {p: have[p] for p in pins}


def unpack(wheel: str, site: str) -> None:
    """Install a wheel's files the way pip would, minus scripts: purelib/platlib land in site."""
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            path = info.filename
            top, _, rest = path.partition("/")
            if top.endswith(".data"):  # name-version.data/<kind>/...
                kind, _, path = rest.partition("/")
                if kind not in ("purelib", "platlib") or not path:
                    continue
            if path.endswith("/"):
                continue
            dest = os.path.join(site, path)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(info) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out)
            mode = info.external_attr >> 16
            if mode:
                os.chmod(dest, mode & 0o777 | 0o644)


def plugin_dist_info(site: str) -> str:
    """tangram_sglang-<version>.dist-info with the pyproject's SGLang plugin entry points."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    groups = project.get("entry-points", {})
    folder = os.path.join(site, f"{project['name']}-{project['version']}.dist-info")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
                "Summary: entry points only; the code is the repo root on PYTHONPATH (launch/gpu_kit)\n")
    with open(os.path.join(folder, "entry_points.txt"), "w") as f:
        for group, entries in groups.items():
            f.write(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()) + "\n")
    return os.path.basename(folder)


def add_tokenizer(site: str) -> str:
    """Copy the tokenizer files of TOKENIZER into site/_tokenizers/<key> (converting the model first
    if the cache lacks it: launch/models.py); returns the folder relative to site."""
    key, folder, files = TOKENIZER
    cache = os.environ.get("TANGRAM_CACHE", os.path.expanduser("~/.cache/tangram_sglang"))
    src = os.path.join(cache, "models", folder)
    if not all(os.path.exists(os.path.join(src, f)) for f in files):
        step(f"converting {key} for its tokenizer (launch/models.py) ...")
        subprocess.run([sys.executable, os.path.join(ROOT, "launch", "models.py"), key], check=True)
    rel = os.path.join("_tokenizers", key)
    os.makedirs(os.path.join(site, rel), exist_ok=True)
    for f in files:
        shutil.copyfile(os.path.join(src, f), os.path.join(site, rel, f))
    return rel


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def pack(site: str, dest: str) -> None:
    """Reproducible tar (sorted, fixed owner and mtime) of site as site/, through xz -9."""
    tar = ["tar", "--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner",
           "-C", os.path.dirname(site), "-cf", "-", os.path.basename(site)]
    with open(dest + ".tmp", "wb") as out:
        t = subprocess.Popen(tar, stdout=subprocess.PIPE)
        subprocess.run(["xz", "-9", "-T2", "-c"], stdin=t.stdout, stdout=out, check=True)
        if t.wait() != 0:
            raise SystemExit("tar failed")
    os.replace(dest + ".tmp", dest)


def write_json(path: str, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=False)
        f.write("\n")


def main() -> None:
    pins = [SGLANG] + read_pins()
    wheels = download(pins)
    shutil.rmtree(SITE, ignore_errors=True)
    for pin in pins:
        unpack(wheels[pin], SITE)
    step(f"unpacked into {os.path.relpath(SITE, ROOT)}/: {slim.tree_bytes(SITE) / 2**20:.1f} MiB")
    dropped = slim.slim_site(SITE)
    step(f"slimmed: dropped {len(dropped)} entries, {sum(d['bytes'] for d in dropped) / 2**20:.1f} MiB; "
         f"site now {slim.tree_bytes(SITE) / 2**20:.1f} MiB")
    dist_info = plugin_dist_info(SITE)
    step(f"added {dist_info} (sglang.srt.plugins entry points)")
    tokenizer = add_tokenizer(SITE)
    step(f"added the tokenizer {tokenizer}/")
    kit = os.path.join(OUT, KIT)
    step("packing (xz -9) ...")
    pack(SITE, kit)
    digest = sha256(kit)
    with open(os.path.join(OUT, "SHA256SUMS"), "w") as f:
        f.write(f"{digest}  {KIT}\n")
    manifest = {
        "python": PY_VERSION, "platforms": PLATFORMS, "plugin_dist_info": dist_info, "tokenizer": tokenizer,
        "wheels": [{"name": n, "version": v, "file": os.path.basename(wheels[(n, v)]),
                    "sha256": sha256(wheels[(n, v)]), "bytes": os.path.getsize(wheels[(n, v)])} for n, v in pins],
        "dropped": dropped, "site_bytes": slim.tree_bytes(SITE),
        "kit": {"file": KIT, "sha256": digest, "bytes": os.path.getsize(kit)},
    }
    write_json(os.path.join(OUT, "manifest.json"), manifest)
    artifacts = {name: os.path.getsize(os.path.join(OUT, name)) for name in (KIT, "SHA256SUMS", "manifest.json")}
    write_json(os.path.join(HERE, "manifest.json"), {
        "artifacts": artifacts, "site_bytes": manifest["site_bytes"], "tokenizer": tokenizer,
        "wheels": {n: v for n, v in pins}, "kit_sha256": digest})
    shutil.rmtree(SITE)  # scratch: the archive is what travels
    step(f"wrote {os.path.relpath(kit, ROOT)} {artifacts[KIT] / 2**20:.2f} MiB (sha256 {digest[:16]}...), "
         f"site {manifest['site_bytes'] / 2**20:.1f} MiB unpacked, {len(pins)} wheels")
    step(f"to the GPU machine: carry {CARRY} (not the folder: its cache/ holds the wheels)")


if __name__ == "__main__":
    main()
