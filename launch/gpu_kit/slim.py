"""What build.py drops from the unpacked wheels (sglang above all), and the check that nothing kept
imports it.

Dropped: the diffusion server (multimodal_gen), sglang's own test kits, kernel benchmarks, the
prebuilt Rust extensions (the HTTP server, gRPC and benchmark clients the Python server does not
load; the radix TreeCore, which install.sh turns off and which falls back to Python when absent),
and every model file under sglang/srt/models that no kept file imports. Kept models: the
architectures the project serves (KEEP_MODELS) and everything they or the rest of sglang import.
From the other wheels: data and extensions that serving never reads (DROPS, each with its reason).

The model registry imports every module in sglang/srt/models at start and skips those that fail,
so a dropped model file only removes that architecture. `check_no_dangling` proves no kept file
names a dropped module, in an import statement or as a dotted string (importlib.import_module).
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import glob
import os
import re
import shutil

# Llama (also Mistral 7B), Qwen2, Qwen3, Qwen3-MoE, Gemma 3 (text and multimodal checkpoints),
# GPT-OSS, Mistral 3; registry/utils are the package's plumbing; transformers the HF fallback.
KEEP_MODELS = ("llama", "qwen2", "qwen3", "qwen3_moe", "gemma3_causal", "gemma3_mm", "gpt_oss",
               "mistral", "registry", "utils", "transformers")
# Dropped outright (glob patterns relative to the site tree) -> why.
DROPS = {
    "sglang/multimodal_gen": "the diffusion server (`sglang serve` of image/video models)",
    "sglang/test": "sglang's own test kits",
    "sglang/kernels/jit/benchmark": "kernel benchmarks",
    "sglang/srt/rust_extensions/*.so": "prebuilt Rust HTTP server, gRPC, multimodal and bench clients; "
                                       "the Python server loads none by default",
    "sglang/srt/mem_cache/rust_tree_core/*.so": "the Rust radix TreeCore (linked to one torch); "
                                                "install.sh selects the Python one, the fallback anyway",
    "mistral_common/data": "tokenizer files read only by MistralTokenizer.v1()..v7(), test-mode constructors",
    "pycountry/locales": "gettext translations of country names; only the path is computed at import",
    "zstandard/_cffi.*.so": "the CFFI backend; CPython imports backend_c",
    "tvm_ffi/3rdparty/libbacktrace": "sources for building libtvm_ffi; JIT builds use include/ and dlpack",
    "torchvision/image.so": "the image-codec extension (GPU JPEG decode, 3 MB of nvjpeg); optional in "
                            "torchvision, and sglang falls back to PIL when decode_jpeg fails",
    "torchvision.libs/libnvjpeg*": "used by torchvision/image.so only",
    "torchvision.libs/libjpeg*": "used by torchvision/image.so only",
}
MODELS = "sglang/srt/models"
MODELS_MOD = "sglang.srt.models"
DOTTED = re.compile(r"\bsglang(?:\.\w+)+")
# Kept files that do name a dropped module, each read and found harmless for
# `python -m sglang.launch_server` / `python -m sglang.bench_serving` (sglang 0.5.23):
# (file or folder prefix, dropped module prefix) -> why.
ALLOWED_REFS = {
    ("sglang/cli/", "sglang.multimodal_gen"): "the `sglang serve|generate` CLI's diffusion branch",
    ("sglang/kernels/ops/diffusion/", "sglang.multimodal_gen"):
        "diffusion kernels; in sglang/srt only models/beam.py (dropped) imports them",
    ("sglang/srt/hardware_backend/npu/utils.py", "sglang.multimodal_gen"): "a sys.modules check (Ascend)",
    ("sglang/benchmark/one_batch_server.py", "sglang.test"): "CI nightly benchmark, not bench_serving",
    ("sglang/srt/constrained/xgrammar_backend.py", "sglang.test"): "inside demo_test()",
    ("sglang/srt/managers/scheduler.py", "sglang.test.scripted_runtime"):
        "only when SGLANG_TEST_SCRIPTED_RUNTIME is set",
    ("sglang/srt/managers/scheduler_components/", "sglang.test.scripted_runtime"):
        "TYPE_CHECKING, or only with the scripted test runtime",
    ("sglang/kernels/ops/elementwise/row_sum.py", "sglang.test.kernels"): "a docstring",
    ("sglang/kernels/ops/lplb/cuda_solver.py", "sglang.test.kernels"): "a docstring",
}


def module_name(rel: str) -> str:
    """'sglang/srt/models/llama.py' -> 'sglang.srt.models.llama' (a package: its folder's name)."""
    rel = rel[:-3] if rel.endswith(".py") else rel
    parts = rel.split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


@functools.lru_cache(maxsize=None)
def imported_names(path: str, mod: str) -> frozenset[str]:
    """Every dotted module name a file refers to: import statements anywhere in it (relative ones
    resolved, `from a import b` read as both a and a.b) and dotted 'sglang.*' string literals."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    names = set(DOTTED.findall(text))
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return frozenset(names)
    package = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return frozenset(names)


def py_files(site: str, top: str = "sglang"):
    """(relative path, module name) of every .py file under site/top."""
    for root, _, files in os.walk(os.path.join(site, top)):
        for name in files:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(root, name), site).replace(os.sep, "/")
                yield rel, module_name(rel)


def model_unit(mod: str) -> str | None:
    """The top-level entry of sglang/srt/models a module belongs to ('deepseek_common' for
    sglang.srt.models.deepseek_common.utils), or None outside the models package."""
    prefix = MODELS_MOD + "."
    return mod[len(prefix):].split(".")[0] if mod.startswith(prefix) else None


def kept_models(site: str) -> set[str]:
    """Closure of KEEP_MODELS under imports, seeded also by every non-model sglang file."""
    refs: dict[str, set[str]] = {}
    seeds: set[str] = set(KEEP_MODELS)
    for rel, mod in py_files(site):
        unit = model_unit(mod)
        found = {u for n in imported_names(os.path.join(site, rel), mod) if (u := model_unit(n))}
        if unit is None:
            seeds |= found
        else:
            refs.setdefault(unit, set()).update(found - {unit})
    keep, todo = set(), list(seeds)
    while todo:
        unit = todo.pop()
        if unit not in keep:
            keep.add(unit)
            todo.extend(refs.get(unit, ()))
    return keep


def tree_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def drop_list(site: str) -> list[str]:
    """Relative paths (files or folders) to remove from the unpacked site tree: DROPS, then the
    model files no kept file imports."""
    drops = sorted(os.path.relpath(p, site) for pattern in DROPS for p in glob.glob(os.path.join(site, pattern)))
    keep = kept_models(site)
    for entry in sorted(os.listdir(os.path.join(site, MODELS))):
        unit = entry[:-3] if entry.endswith(".py") else entry
        is_module = entry.endswith(".py") or os.path.isdir(os.path.join(site, MODELS, entry))
        if is_module and unit not in keep and unit not in ("__init__", "__pycache__"):
            drops.append(f"{MODELS}/{entry}")
    return drops


def reason(rel: str) -> str:
    for pattern, why in DROPS.items():
        if fnmatch.fnmatch(rel, pattern):
            return why
    return "a model file no kept file imports"


def dropped_modules(drops: list[str]) -> list[str]:
    """Module names of the dropped .py files and folders (sglang's; other drops hold no modules)."""
    return [module_name(d) for d in drops if d.startswith("sglang/") and not d.endswith(".so")]


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def allowed(rel: str, name: str) -> bool:
    return any(rel.startswith(f) and within(name, m) for f, m in ALLOWED_REFS)


def check_no_dangling(site: str, drops: list[str]) -> None:
    """Raise if a kept .py file names a dropped module (or something inside a dropped package),
    ALLOWED_REFS aside."""
    gone = dropped_modules(drops)
    bad = []
    for rel, mod in py_files(site):
        if any(within(mod, g) for g in gone):
            continue
        for name in imported_names(os.path.join(site, rel), mod):
            if any(within(name, g) for g in gone) and not allowed(rel, name):
                bad.append(f"{rel} -> {name}")
    if bad:
        raise SystemExit("kept files import dropped modules:\n  " + "\n  ".join(sorted(set(bad))))


def remove_pycache(site: str) -> int:
    removed = 0
    for root, dirs, _ in os.walk(site):
        for d in [d for d in dirs if d == "__pycache__"]:
            removed += tree_bytes(os.path.join(root, d))
            shutil.rmtree(os.path.join(root, d))
            dirs.remove(d)
    return removed


def slim_site(site: str) -> list[dict]:
    """Remove the drop list from site (after the dangling-import check); returns [{path, bytes}]."""
    drops = drop_list(site)
    check_no_dangling(site, drops)
    out = []
    for rel in drops:
        full = os.path.join(site, rel)
        out.append({"path": rel, "bytes": tree_bytes(full), "why": reason(rel)})
        shutil.rmtree(full) if os.path.isdir(full) else os.remove(full)
    out.append({"path": "**/__pycache__", "bytes": remove_pycache(site), "why": "bytecode"})
    return out
