"""SGLang's own rules (0.5.23), beside its command line: what its start-up refuses (modes that exclude each
other, wiring) and what the hardware's kernels allow (FP4 TRT-LLM MoE, Marlin on Hopper, prefill SP and
MegaMoE, DFlash, Xeon's page size). Each reads one role's rendered argv (a RoleView) and says what is wrong;
muse_launch/checks/ points it at the key or argument that decided it."""

from __future__ import annotations

from collections.abc import Iterator

from ..topology.hardware import DFLASH_DRAFT, NVFP4_CHECKPOINT, PROFILES
from . import sglang as sgl  # the flags; sglang.py imports this module first, so it is read at call time
from .argv import as_int, has_flag, last_value
from .base import Parallel, Problem, RoleView, error, warning

# ---- start-up ----------------------------------------------------------------------------------


def disaggregation_mode_matches_kind(view: RoleView) -> Iterator[Problem]:
    """A --disaggregation-mode in args must not contradict the role's kind (the router wires by kind)."""
    flag = sgl.DISAGGREGATION_MODE
    mode = last_value(view.args, flag)
    if view.kind in ("prefill", "decode") and mode != view.kind:
        yield error(
            flag,
            f"{flag} {mode} contradicts kind: {view.kind}",
            f"remove {flag} from {view.role}'s args (kind sets it)",
        )
    elif view.kind == "worker" and mode in ("prefill", "decode"):
        yield error(
            flag,
            f"{view.role} is kind: worker but its args set {flag} {mode}",
            f"make it kind: {mode} and list it under the router's {mode}",
        )


def encoder_only_exclusive(view: RoleView) -> Iterator[Problem]:
    """--encoder-only excludes --language-only and --disaggregation-mode prefill|decode."""
    encoder_only, language_only, mode_flag = sgl.ENCODER_ONLY, sgl.LANGUAGE_ONLY, sgl.DISAGGREGATION_MODE
    if not has_flag(view.args, encoder_only):
        return
    if has_flag(view.args, language_only):
        yield error(
            language_only,
            f"{view.role} sets both {encoder_only} and {language_only}",
            f"keep {view.role} an encoder: remove {language_only} from its args",
        )
    mode = last_value(view.args, mode_flag)
    if mode in ("prefill", "decode"):
        yield error(
            mode_flag,
            f"{view.role} runs {encoder_only}, which excludes {mode_flag} {mode}",
            f"remove {mode_flag} from {view.role}'s args",
        )


def language_only_wiring(view: RoleView) -> Iterator[Problem]:
    """--language-only without --encoder-urls makes encoders register themselves, reversing the start
    order."""
    language_only, urls = sgl.LANGUAGE_ONLY, sgl.ENCODER_URLS
    if (
        has_flag(view.args, language_only)
        and not has_flag(view.args, urls)
        and not has_flag(view.args, sgl.ENCODER_ONLY)
    ):
        listed = ", ".join(view.encoder_roles) or "ENCODER"
        yield warning(
            language_only,
            f"{view.role} runs {language_only} without {urls}, so "
            f"encoders must register themselves ({sgl.ENCODER_REGISTER_URLS}), which reverses the "
            f"start order",
            f"list {view.role}.encoders: [{listed}] so muse-launch wires {urls} and starts encoders first",
        )


def parallel_sizes(view: RoleView) -> Iterator[Problem]:
    """SGLang refuses MoE EP that does not divide TP, and attention DP that does not divide TP."""
    p = view.parallel
    if p is None:
        return
    if p.tp % p.ep:
        divisors = [d for d in range(1, p.tp + 1) if p.tp % d == 0]
        yield error(
            sgl.KEY_FLAGS["ep"],
            f"ep {p.ep} does not divide tp {p.tp}",
            f"use ep {', '.join(map(str, divisors))} (MoE EP splits the TP group)",
            "ep",
        )
    if p.dp_attention and p.tp % p.dp:
        yield error(
            sgl.KEY_FLAGS["dp"],
            f"{sgl.DP_ATTENTION} needs dp to divide tp; {view.role} has tp {p.tp}, dp {p.dp}",
            f"set dp to a divisor of {p.tp}",
            "dp",
        )


# ---- hardware ----------------------------------------------------------------------------------


def fp4_trtllm_moe(view: RoleView) -> Iterator[Problem]:
    """`--moe-runner-backend flashinfer_trtllm` runs the FP4 TRT-LLM MoE kernels of Blackwell."""
    profile, runner = view.profile, sgl.MOE_RUNNER_BACKEND
    if profile.fp4_trtllm_moe or last_value(view.args, runner) != "flashinfer_trtllm":
        return
    fix = (
        f"use {runner} marlin (Marlin W4A16 experts, as the cookbook runs NVFP4 on H200)"
        if profile.arch == "hopper"
        else f"remove {runner} flashinfer_trtllm"
    )
    yield error(
        runner,
        f"{runner} flashinfer_trtllm needs Blackwell FP4 TRT-LLM MoE kernels, which {profile.name} lacks",
        fix,
    )


def hopper_nvfp4_marlin(view: RoleView) -> Iterator[Problem]:
    """H200 serves the NVFP4 checkpoint with Marlin W4A16 experts."""
    if view.profile.arch != "hopper":
        return
    runner = sgl.MOE_RUNNER_BACKEND
    nvfp4 = last_value(view.args, sgl.QUANTIZATION) == "modelopt_fp4" or view.model == NVFP4_CHECKPOINT
    backend = last_value(view.args, runner)
    if view.kind == "encoder" or not nvfp4 or backend in ("marlin", "flashinfer_trtllm"):
        return  # flashinfer_trtllm: fp4_trtllm_moe already says use marlin
    using = f"{runner} {backend}" if backend else "the default MoE runner"
    yield error(
        runner,
        f"{view.profile.name} has no FP4 MoE kernels: {view.role} serves NVFP4 with {using}",
        f"add {runner} marlin to {view.role}'s args",
    )


def prefill_sequence_parallel(view: RoleView) -> Iterator[Problem]:
    """--enable-layernorm-sp and MegaMoE: Blackwell, prefill only, and SGLang 0.5.23's start-up rules."""
    sp_flag, mega_flag = sgl.LAYERNORM_SP, sgl.MEGAMOE
    sp, mega = has_flag(view.args, sp_flag), has_flag(view.args, mega_flag)
    if not (sp or mega):
        return
    name, flag = view.role, sp_flag if sp else mega_flag
    if not view.profile.prefill_sp:
        blackwell = [p.name for p in PROFILES.values() if p.prefill_sp]
        either = blackwell[0] if len(blackwell) == 1 else f"{', '.join(blackwell[:-1])} or {blackwell[-1]}"
        yield error(
            flag,
            f"{flag} needs SM100 kernels (Blackwell), which {view.profile.name} lacks",
            f"remove {sp_flag} and {mega_flag} from {name}, or use {either}",
        )
        return
    if view.kind == "decode":
        yield error(
            flag,
            f"{flag} on decode worker {name}: sequence parallel and MegaMoE are prefill "
            f"features, omitted on a PD decode worker",
            f"remove {sp_flag} and {mega_flag} from {name}'s args",
        )
        return
    p = view.parallel or Parallel()
    if mega and not sp:
        yield error(flag, f"{mega_flag} needs {sp_flag}", f"add {sp_flag} (MegaMoE requires SP to stay on)")
    if sp:
        yield from _sequence_parallel_needs(view, p, mega)
    if p.pp > 1:
        yield error(
            sgl.KEY_FLAGS["pp"],
            f"{flag} excludes pipeline parallelism; {name} has pp {p.pp}",
            "set pp: 1",
            "pp",
        )
    if mega and has_flag(view.args, sgl.MIXED_CHUNK):
        yield error(
            sgl.MIXED_CHUNK,
            f"{mega_flag} excludes {sgl.MIXED_CHUNK}",
            f"remove {sgl.MIXED_CHUNK} from {name}",
        )


def _sequence_parallel_needs(view: RoleView, p: Parallel, mega: bool) -> Iterator[Problem]:
    """What --enable-layernorm-sp needs of the rest of a prefill's command line."""
    sp_flag, name, args = sgl.LAYERNORM_SP, view.role, view.args
    runner, a2a, quant, speculative = (
        sgl.MOE_RUNNER_BACKEND,
        sgl.MOE_A2A_BACKEND,
        sgl.QUANTIZATION,
        sgl.SPECULATIVE_ALGORITHM,
    )
    if p.tp <= 1 or (p.tp, p.ep) not in ((4, 4), (8, 8)):
        yield error(
            sgl.KEY_FLAGS["ep"],
            f"{sp_flag} needs attention TP equal to MoE EP, TP4/EP4 or TP8/EP8; "
            f"{name} has tp {p.tp}, ep {p.ep}",
            "set tp and ep both to 4 or both to 8",
            "ep",
        )
    if last_value(args, runner) != "flashinfer_trtllm":
        yield error(
            runner,
            f"{sp_flag} needs {runner} flashinfer_trtllm",
            f"add {runner} flashinfer_trtllm to {name}'s args",
        )
    if last_value(args, a2a) != "flashinfer":
        yield error(a2a, f"{sp_flag} needs {a2a} flashinfer", f"add {a2a} flashinfer to {name}'s args")
    quantization = last_value(args, quant)
    if quantization != "modelopt_fp4" and not (quantization is None and mega):
        weights = quantization or "BF16 without MegaMoE"
        yield error(
            quant,
            f"{sp_flag} needs NVFP4 weights ({quant} modelopt_fp4), or BF16 with MegaMoE; "
            f"{name} has {weights}",
            f"serve the NVFP4 checkpoint with {quant} modelopt_fp4",
        )
    if p.dp_attention:
        yield error(
            sgl.DP_ATTENTION,
            f"{sp_flag} excludes {sgl.DP_ATTENTION}",
            f"remove {sgl.DP_ATTENTION} (or {sp_flag}) from {name}",
        )
    algorithm = last_value(args, speculative)
    if algorithm is not None and algorithm.upper() != "DFLASH":
        yield error(
            speculative,
            f"{sp_flag} supports speculative decoding only with DFLASH; {name} uses {algorithm}",
            f"use {speculative} DFLASH, or drop speculative decoding",
        )


def dflash_speculative(view: RoleView) -> Iterator[Problem]:
    """DFlash: draft model given, draft attention fa4 on NVIDIA / triton on AMD, 1-8 draft tokens."""
    want, profile, name = view.profile.draft_attention, view.profile, view.role
    algorithm = last_value(view.args, sgl.SPECULATIVE_ALGORITHM)
    if algorithm is None or algorithm.upper() != "DFLASH":
        return
    at, attention = sgl.SPECULATIVE_ALGORITHM, sgl.SPECULATIVE_DRAFT_ATTENTION
    backend = last_value(view.args, attention)
    if want is None:
        yield error(
            at,
            f"DFlash speculative decoding needs GPUs; {profile.name} has none",
            f"remove {sgl.SPECULATIVE_ALGORITHM} DFLASH from {name}",
        )
        return
    if backend is None:
        yield warning(
            at, f"{name} runs DFlash without {attention}", f"add {attention} {want} ({profile.vendor.value})"
        )
    elif backend != want:
        yield error(
            attention,
            f"DFlash draft attention {backend} does not run on {profile.name}; "
            f"{profile.vendor.value.upper()} GPUs use {want}",
            f"use {attention} {want}",
        )
    if last_value(view.args, sgl.SPECULATIVE_DRAFT_MODEL) is None:
        yield error(
            at,
            f"{name} runs DFlash without a draft model",
            f"add {sgl.SPECULATIVE_DRAFT_MODEL} {DFLASH_DRAFT}",
        )
    tokens = last_value(view.args, sgl.SPECULATIVE_DRAFT_TOKENS)
    if tokens is not None and not 1 <= (as_int(tokens) or 0) <= 8:
        yield error(
            sgl.SPECULATIVE_DRAFT_TOKENS,
            f"{sgl.SPECULATIVE_DRAFT_TOKENS} {tokens}: DFlash drafts 1 to 8 tokens",
            "use a value from 1 to 8 (default 8)",
        )


def xeon_page_size(view: RoleView) -> Iterator[Problem]:
    """The Xeon intel_amx attention backend wants --page-size 1."""
    if view.profile.arch != "xeon":
        return
    page_flag = sgl.KEY_FLAGS["page_size"][0]
    page = last_value(view.args, page_flag)
    if page not in (None, "1") and last_value(view.args, sgl.ATTENTION_BACKEND) in (None, "intel_amx"):
        yield warning(
            page_flag,
            f"page size {page} with the intel_amx attention backend (the CPU default)",
            "set page_size: 1, as the cookbook does on Xeon",
            "page_size",
        )


START_UP_RULES = (
    disaggregation_mode_matches_kind,
    encoder_only_exclusive,
    language_only_wiring,
    parallel_sizes,
)
HARDWARE_RULES = (
    fp4_trtllm_moe,
    hopper_nvfp4_marlin,
    prefill_sequence_parallel,
    dflash_speculative,
    xeon_page_size,
)
