"""--tangram-profile / --tangram-ratio on SGLang's ServerArgs (CLI and Engine).

ServerArgs is a sealed msgspec record: unknown fields are refused, but
underscore-prefixed bookkeeping attributes ride along through pickling into
the spawned scheduler processes. What was asked travels as one: ``server_args._tangram``,
a ServedProfile (profile path, ratio, data plane); ``served_profile`` reads it anywhere.
The profile is validated (and checked against a local model folder) here, in
the launching process, so a bad profile stops the launch before any process
is spawned.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass

from tangram_sglang.profile import ModelShape, ProfileError, TangramProfile, load_profile
from tangram_sglang.scorers.profile_scorer import check_scorer_weights
from tangram_sglang.sglang.compatibility import check_server_args, check_tensor_parallel

logger = logging.getLogger("tangram_sglang")

HANDLE = "_tangram"
DATA_PLANES = ("auto", "torch", "triton", "cuda")
REPLIES = ("whole", "compressed")   # the assistant's messages in the chunk rule (method/chunks.py)


@dataclass(frozen=True)
class ServedProfile:
    """What --tangram-profile / --tangram-ratio / --tangram-data-plane asked for, validated."""

    path: str
    ratio: float | None = None
    data_plane: str = "auto"
    host_ratio: float = 0.0   # the compressed host tier's pages, in device pools (0: none)
    replies: str = "whole"    # REPLIES: the assistant's messages kept whole, or compressed once closed


def add_cli_args(result, parser: argparse.ArgumentParser, *args, **kwargs) -> None:
    """AFTER hook on ServerArgs.add_cli_args."""
    group = parser.add_argument_group("Tangram (non-uniform KV cache compression)")
    group.add_argument("--tangram-profile", type=str, default=None, metavar="PATH",
                       help="Tangram profile (YAML, format tangram-profile v1) for the served model.")
    group.add_argument("--tangram-ratio", type=float, default=None, metavar="RHO",
                       help="Which target ratio of the profile to serve (default: the profile's default_ratio).")
    group.add_argument("--tangram-data-plane", choices=DATA_PLANES, default="auto",
                       help="Attention kernels: auto (Triton on CUDA, the torch data plane elsewhere), "
                            "torch (the reference), triton (on CPU only under TRITON_INTERPRET=1, for tests), "
                            "cuda (the CUDA decode kernel, compiled at start, with the Triton prefill).")
    group.add_argument("--tangram-host-ratio", type=float, default=0.0, metavar="R",
                       help="A compressed host tier of R times the ragged pool's bytes in host memory: tree "
                            "segments evicted for device room move there still compressed and are loaded back "
                            "when a later turn matches them, instead of being prefilled again (0: none).")
    group.add_argument("--tangram-replies", choices=REPLIES, default="whole",
                       help="The assistant's messages in the history: whole (read back from the tree as "
                            "generated) or compressed (once the next turn closes them, recomputed with it and "
                            "kept at the profile's budgets, like the user's).")
    # Unset unless given, so a profile can pick its own default (profile_defaults); SGLang's otherwise.
    parser.set_defaults(schedule_policy=None)


# With a profile, multi-turn serving's defaults where the user chose nothing. lpm admits the turns whose history
# the tree still holds first: with more open sessions than the pool holds, SGLang's fcfs admits turns in arrival
# order and each one waiting behind the queue loses its history to the admissions ahead of it (the think-time
# benchmark: fcfs reused 2% of later turns, lpm most). SGLang itself falls back to fcfs past 128 waiting.
PROFILE_DEFAULTS = {"schedule_policy": "lpm"}


def profile_defaults(target: dict, profile: TangramProfile | None) -> list[str]:
    """Fill the unset (missing or None) fields of PROFILE_DEFAULTS: the profile's choice with one, SGLang's
    own default without (the CLI parser's default was unset to tell the two apart). Returns what it chose,
    to log once the launch is accepted (a refused launch prints its one line only)."""
    chosen = []
    for name, value in PROFILE_DEFAULTS.items():
        if target.get(name) is not None:
            continue
        if profile is None:
            target.pop(name, None)  # SGLang's default applies (the Engine path: a missing kwarg)
            continue
        target[name] = value
        chosen.append(f"--{name.replace('_', '-')} {value}")
    return chosen


def _log_chosen(chosen: list[str]) -> None:
    for what in chosen:
        logger.info("Tangram: %s (the default with a profile; pass the option to choose another)", what)


def serving_overrides(profile: TangramProfile | None, data_plane: str | None = "auto",
                      device: str | None = None) -> dict:
    """ServerArgs fields a served profile needs: the Tangram backend and tree, logical page 1,
    no prefill CUDA graphs (compression
    plans on the host per chunk), and decode CUDA graphs only where they can run: on CUDA with
    the Triton data plane (decode_graphs_possible). Overlap scheduling stays as SGLang sets it: a
    request that finished in step t runs once more in step t+1 (its KV slot reserved by the
    capacity check like any other) and is released after, so the pool and the tree see what
    they see without it."""
    if profile is None:
        return {}
    out = {"attention_backend": "tangram", "radix_cache_backend": "tangram", "page_size": 1,
           "disable_prefill_cuda_graph": True,
           "disable_hybrid_swa_memory": True}   # gpt-oss: its window layers live in the ragged pool
    if not decode_graphs_possible(data_plane, device):
        out["disable_cuda_graph"] = True
    return out


def decode_graphs_possible(data_plane: str | None, device: str | None) -> bool:
    """Decode CUDA graphs need a CUDA device (None: SGLang picks CUDA when torch sees one) and
    the kernels (triton or cuda data plane; the torch one syncs with the host inside attention)."""
    if (data_plane or "auto") == "torch":
        return False
    if device is None:
        import torch

        return torch.cuda.is_available()
    return str(device).startswith("cuda")


# options a user may have set that a profile replaces, and why (logged with the old and new value)
REPLACED_WITH_A_WORD = {
    "attention_backend": "a profile is served by the tangram backend",
    "radix_cache_backend": "a profile's history lives in the segment radix tree",
    "page_size": "SGLang's logical page is one token; the ragged pool has the profile's own pages",
}

# SGLang's smallest default --chunked-prefill-size (devices under 20 GB; 4096 on this CPU, 8192 on an H200)
SGLANG_MIN_DEFAULT_PASS = 2048


def prefill_pass_size(target: dict, profile: TangramProfile | None) -> None:
    """--chunked-prefill-size with a profile: the tokens of one prefill pass, SGLang's as given or as
    it defaults them, holding several of the profile's compression chunks of several requests (each
    extend is held to whole chunks, sglang/scheduling.py). A pass must hold one whole chunk: a smaller
    value (or chunked prefill turned off, -1: a prompt is compressed chunk by chunk) becomes the chunk,
    with a warning naming both."""
    if profile is None:
        return
    from tangram_sglang.serving.context import chunk_size_of

    chunk, value = chunk_size_of(profile), target.get("chunked_prefill_size")
    if value is None:
        if chunk > SGLANG_MIN_DEFAULT_PASS:
            target["chunked_prefill_size"] = chunk
        return
    if value < chunk:
        logger.warning("Tangram: --chunked-prefill-size %s replaced by %s (a prefill pass must hold one whole "
                       "compression chunk of the profile; a prompt is compressed chunk by chunk)", value, chunk)
        target["chunked_prefill_size"] = chunk


def _apply_overrides(target: dict, overrides: dict) -> None:
    for name, value in overrides.items():
        old = target.get(name)
        if old not in (None, False, value) and name in REPLACED_WITH_A_WORD:
            logger.warning("Tangram: --%s %s replaced by %s (%s)", name.replace("_", "-"), old, value,
                           REPLACED_WITH_A_WORD[name])
        target[name] = value


def read_profile(profile_path: str | None) -> tuple[str | None, TangramProfile | None]:
    """(absolute path, profile) of --tangram-profile, read and validated once per launch."""
    if profile_path is None:
        return None, None
    path = os.path.abspath(os.path.expanduser(profile_path))
    return path, load_profile(path)


def attach_profile(server_args, path: str | None, profile: TangramProfile | None, ratio: float | None,
                   data_plane: str | None = "auto", host_ratio: float | None = 0.0, replies: str | None = "whole") -> None:
    """Check the profile against the request (and the model when its folder is local) and record
    it on server_args. Raises ProfileError naming the field and the problem.
    """
    data_plane, replies = data_plane or "auto", replies or "whole"
    if data_plane not in DATA_PLANES:
        raise ProfileError("tangram_data_plane", f"{data_plane!r} is not one of {', '.join(DATA_PLANES)}")
    if replies not in REPLIES:
        raise ProfileError("tangram_replies", f"{replies!r} is not one of {', '.join(REPLIES)}")
    if profile is None:
        if ratio is not None:
            raise ProfileError("tangram_ratio", "given without --tangram-profile")
        if data_plane != "auto":
            raise ProfileError("tangram_data_plane", "given without --tangram-profile")
        if host_ratio:
            raise ProfileError("tangram_host_ratio", "given without --tangram-profile")
        if replies != "whole":
            raise ProfileError("tangram_replies", "given without --tangram-profile")
        return
    profile.select(ratio)
    check_scorer_weights(profile, path)
    model_path = getattr(server_args, "model_path", None)
    if model_path and os.path.isfile(os.path.join(model_path, "config.json")):
        profile.check_model(ModelShape.from_model_path(model_path))
    check_server_args(server_args)
    check_tensor_parallel(server_args, profile)
    _check_data_plane(server_args, data_plane)
    host_ratio = _check_host_ratio(host_ratio, profile)
    # A bookkeeping attribute (leading underscore) is allowed on the sealed record.
    setattr(server_args, HANDLE, ServedProfile(path, ratio, data_plane, host_ratio, replies))


def _check_host_ratio(host_ratio: float | None, profile: TangramProfile) -> float:
    import math

    host_ratio = float(host_ratio or 0.0)
    if not math.isfinite(host_ratio) or host_ratio < 0:
        raise ProfileError("tangram_host_ratio", f"{host_ratio} is not a ratio >= 0 of the pool's bytes")
    if host_ratio and any(profile.model.windows):
        raise ProfileError("tangram_host_ratio", "the host tier keeps whole segments; a model with "
                           "sliding-window layers drops their window pages from the tree")
    return host_ratio


def _check_data_plane(server_args, data_plane: str) -> None:
    """A data plane this device cannot run stops the launch here, not in the scheduler process."""
    from tangram_sglang.serving.data_plane import DataPlaneError, choose_data_plane

    device = getattr(server_args, "device", None) or "cpu"
    if data_plane == "auto" or not str(device).startswith(("cpu", "cuda")):
        return
    try:
        choose_data_plane(data_plane, device)
    except DataPlaneError as exc:
        raise ProfileError("tangram_data_plane", str(exc)) from None


def from_cli_args(original, cls, args: argparse.Namespace):
    """AROUND hook on ServerArgs.from_cli_args: a bad profile ends the launch with its error."""
    try:
        path, profile = read_profile(getattr(args, "tangram_profile", None))
        data_plane = getattr(args, "tangram_data_plane", "auto")
        _apply_overrides(vars(args), serving_overrides(profile, data_plane, getattr(args, "device", None)))
        prefill_pass_size(vars(args), profile)
        chosen = _cli_defaults(args, profile)
        server_args = original(cls, args)
        attach_profile(server_args, path, profile, getattr(args, "tangram_ratio", None), data_plane,
                       getattr(args, "tangram_host_ratio", 0.0), getattr(args, "tangram_replies", "whole"))
        _log_chosen(chosen)
    except ProfileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    return server_args


def _cli_defaults(args: argparse.Namespace, profile: TangramProfile | None) -> list[str]:
    """profile_defaults on the parsed CLI: a field left unset gets the profile's default, else the field's own."""
    values = vars(args)
    chosen = profile_defaults(values, profile)
    from sglang.srt.server_args import ServerArgs

    for name in PROFILE_DEFAULTS:
        if values.get(name) is None:
            values[name] = _field_default(ServerArgs, name)
    return chosen


def _field_default(cls, name: str):
    import msgspec

    for field in msgspec.structs.fields(cls):
        if field.name == name:
            return field.default
    raise AttributeError(f"ServerArgs has no field {name}")


def engine_server_args_factory(server_args_cls):
    """A stand-in for Engine.server_args_class that accepts tangram_profile= and tangram_ratio=."""

    def build(**kwargs):
        path, profile = read_profile(kwargs.pop("tangram_profile", None))
        ratio = kwargs.pop("tangram_ratio", None)
        data_plane = kwargs.pop("tangram_data_plane", "auto")
        host_ratio = kwargs.pop("tangram_host_ratio", 0.0)
        replies = kwargs.pop("tangram_replies", "whole")
        _apply_overrides(kwargs, serving_overrides(profile, data_plane, kwargs.get("device")))
        prefill_pass_size(kwargs, profile)
        chosen = profile_defaults(kwargs, profile)
        server_args = server_args_cls(**kwargs)
        attach_profile(server_args, path, profile, ratio, data_plane, host_ratio, replies)
        _log_chosen(chosen)
        return server_args

    build.tangram_wrapped = server_args_cls
    return build


def sinks_backend_check(server_args, previous) -> None:
    """Resolution hook around SGLang's handle_model_specific_adjustments: for gpt-oss it asserts an
    attention backend that adds learned sinks; the tangram backend adds them too (attention/merge.py
    add_sinks), so while that step runs a served hybrid model sees tangram as such a backend."""
    from sglang.srt.arg_groups import model_hook

    from tangram_sglang.sglang.compatibility import HYBRID_SERVED

    try:
        arch = (model_hook.model_config_of(server_args).hf_config.architectures or [""])[0]
    except Exception:  # no local config (a connector): SGLang's step decides alone
        arch = ""
    real = model_hook.attention_backends_of
    if arch not in HYBRID_SERVED:
        return previous(server_args)
    model_hook.attention_backends_of = lambda cfg: tuple("triton" if b == "tangram" else b for b in real(cfg))
    try:
        previous(server_args)
    finally:
        model_hook.attention_backends_of = real


def served_profile(server_args) -> ServedProfile | None:
    """The profile recorded on a ServerArgs, in any process (None: stock SGLang)."""
    return getattr(server_args, HANDLE, None)
