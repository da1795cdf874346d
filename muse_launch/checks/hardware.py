"""Hardware capability rules from the cookbook: FP4 TRT-LLM MoE, Marlin on Hopper, prefill SP and
MegaMoE, DFlash, the checkpoints' hardware, vLLM on AMD, DSpark, Xeon's page size."""

from __future__ import annotations

import json
from collections.abc import Iterator

from ..engines import sglang, vllm
from ..engines.argv import as_int, has_flag, last_value
from ..engines.base import Parallel
from ..topology.hardware import DFLASH_DRAFT, MXFP4_CHECKPOINT, NVFP4_CHECKPOINT, PROFILES, Vendor
from ..topology.load import Path_
from .findings import CheckContext, Finding, error, plan_check, warning
from .reading import join, key_flags, model, origin, parallel, roles


@plan_check
def fp4_trtllm_moe(ctx: CheckContext) -> Iterator[Finding]:
    """`--moe-runner-backend flashinfer_trtllm` runs the FP4 TRT-LLM MoE kernels of Blackwell."""
    if ctx.profile.fp4_trtllm_moe:
        return
    runner = sglang.MOE_RUNNER_BACKEND
    fix = (
        f"use {runner} marlin (Marlin W4A16 experts, as the cookbook runs NVFP4 on H200)"
        if ctx.profile.arch == "hopper"
        else f"remove {runner} flashinfer_trtllm"
    )
    for spec in roles(ctx, (sglang.NAME,)):
        if last_value(spec.args, runner) == "flashinfer_trtllm":
            yield error(
                origin(ctx, spec, runner),
                f"{runner} flashinfer_trtllm needs Blackwell FP4 TRT-LLM MoE "
                f"kernels, which {ctx.profile.name} lacks",
                fix,
                spec.role,
            )


@plan_check
def hopper_nvfp4_marlin(ctx: CheckContext) -> Iterator[Finding]:
    """H200 serves the NVFP4 checkpoint with Marlin W4A16 experts."""
    if ctx.profile.arch != "hopper":
        return
    runner = sglang.MOE_RUNNER_BACKEND
    for spec in roles(ctx, (sglang.NAME,)):
        nvfp4 = (
            last_value(spec.args, sglang.QUANTIZATION) == "modelopt_fp4" or model(spec) == NVFP4_CHECKPOINT
        )
        backend = last_value(spec.args, runner)
        if spec.kind == "encoder" or not nvfp4 or backend in ("marlin", "flashinfer_trtllm"):
            continue  # flashinfer_trtllm: fp4_trtllm_moe already says use marlin
        using = f"{runner} {backend}" if backend else "the default MoE runner"
        yield error(
            origin(ctx, spec, runner),
            f"{ctx.profile.name} has no FP4 MoE kernels: {spec.role} serves NVFP4 with {using}",
            f"add {runner} marlin to {spec.role}'s args",
            spec.role,
        )


@plan_check
def prefill_sequence_parallel(ctx: CheckContext) -> Iterator[Finding]:
    """--enable-layernorm-sp and MegaMoE: Blackwell, prefill only, and SGLang 0.5.23's start-up rules."""
    sp_flag, mega_flag, quant, speculative = (
        sglang.LAYERNORM_SP,
        sglang.MEGAMOE,
        sglang.QUANTIZATION,
        sglang.SPECULATIVE_ALGORITHM,
    )
    runner, a2a = sglang.MOE_RUNNER_BACKEND, sglang.MOE_A2A_BACKEND
    for spec in roles(ctx, (sglang.NAME,)):
        sp, mega = has_flag(spec.args, sp_flag), has_flag(spec.args, mega_flag)
        if not (sp or mega):
            continue
        name, flag = spec.role, sp_flag if sp else mega_flag
        at = origin(ctx, spec, flag)
        if not ctx.profile.prefill_sp:
            blackwell = [p.name for p in PROFILES.values() if p.prefill_sp]
            yield error(
                at,
                f"{flag} needs SM100 kernels (Blackwell), which {ctx.profile.name} lacks",
                f"remove {sp_flag} and {mega_flag} from {name}, or use "
                f"{join(blackwell).replace(' and ', ' or ')}",
                name,
            )
            continue
        if spec.kind == "decode":
            yield error(
                at,
                f"{flag} on decode worker {name}: sequence parallel and MegaMoE are prefill "
                f"features, omitted on a PD decode worker",
                f"remove {sp_flag} and {mega_flag} from {name}'s args",
                name,
            )
            continue
        p = parallel(ctx, spec) or Parallel()
        problems: list[tuple[Path_, str, str]] = []
        if mega and not sp:
            problems.append(
                (at, f"{mega_flag} needs {sp_flag}", f"add {sp_flag} (MegaMoE requires SP to stay on)")
            )
        if sp:
            if p.tp <= 1 or (p.tp, p.ep) not in ((4, 4), (8, 8)):
                problems.append(
                    (
                        origin(ctx, spec, sglang.KEY_FLAGS["ep"], "ep"),
                        f"{sp_flag} needs attention TP equal to MoE EP, TP4/EP4 or TP8/EP8; {name} has tp "
                        f"{p.tp}, "
                        f"ep {p.ep}",
                        "set tp and ep both to 4 or both to 8",
                    )
                )
            if last_value(spec.args, runner) != "flashinfer_trtllm":
                problems.append(
                    (
                        origin(ctx, spec, runner),
                        f"{sp_flag} needs {runner} flashinfer_trtllm",
                        f"add {runner} flashinfer_trtllm to {name}'s args",
                    )
                )
            if last_value(spec.args, a2a) != "flashinfer":
                problems.append(
                    (
                        origin(ctx, spec, a2a),
                        f"{sp_flag} needs {a2a} flashinfer",
                        f"add {a2a} flashinfer to {name}'s args",
                    )
                )
            quantization = last_value(spec.args, quant)
            if quantization != "modelopt_fp4" and not (quantization is None and mega):
                weights = quantization or "BF16 without MegaMoE"
                problems.append(
                    (
                        origin(ctx, spec, quant),
                        f"{sp_flag} needs NVFP4 weights ({quant} modelopt_fp4), or BF16 "
                        f"with MegaMoE; {name} has {weights}",
                        f"serve the NVFP4 checkpoint with {quant} modelopt_fp4",
                    )
                )
            if p.dp_attention:
                problems.append(
                    (
                        origin(ctx, spec, sglang.DP_ATTENTION),
                        f"{sp_flag} excludes {sglang.DP_ATTENTION}",
                        f"remove {sglang.DP_ATTENTION} (or {sp_flag}) from {name}",
                    )
                )
            algorithm = last_value(spec.args, speculative)
            if algorithm is not None and algorithm.upper() != "DFLASH":
                problems.append(
                    (
                        origin(ctx, spec, speculative),
                        f"{sp_flag} supports speculative decoding only with DFLASH; {name} uses {algorithm}",
                        f"use {speculative} DFLASH, or drop speculative decoding",
                    )
                )
        if p.pp > 1:
            problems.append(
                (
                    origin(ctx, spec, sglang.KEY_FLAGS["pp"], "pp"),
                    f"{flag} excludes pipeline parallelism; {name} has pp {p.pp}",
                    "set pp: 1",
                )
            )
        if mega and has_flag(spec.args, sglang.MIXED_CHUNK):
            problems.append(
                (
                    origin(ctx, spec, sglang.MIXED_CHUNK),
                    f"{mega_flag} excludes {sglang.MIXED_CHUNK}",
                    f"remove {sglang.MIXED_CHUNK} from {name}",
                )
            )
        for path, message, fix in problems:
            yield error(path, message, fix, name)


@plan_check
def dflash_speculative(ctx: CheckContext) -> Iterator[Finding]:
    """DFlash: draft model given, draft attention fa4 on NVIDIA / triton on AMD, 1-8 draft tokens."""
    want = ctx.profile.draft_attention
    for spec in roles(ctx, (sglang.NAME,)):
        algorithm = last_value(spec.args, sglang.SPECULATIVE_ALGORITHM)
        if algorithm is None or algorithm.upper() != "DFLASH":
            continue
        name = spec.role
        at = origin(ctx, spec, sglang.SPECULATIVE_ALGORITHM)
        backend = last_value(spec.args, sglang.SPECULATIVE_DRAFT_ATTENTION)
        if want is None:
            yield error(
                at,
                f"DFlash speculative decoding needs GPUs; {ctx.profile.name} has none",
                f"remove {sglang.SPECULATIVE_ALGORITHM} DFLASH from {name}",
                name,
            )
            continue
        if backend is None:
            yield warning(
                at,
                f"{name} runs DFlash without {sglang.SPECULATIVE_DRAFT_ATTENTION}",
                f"add {sglang.SPECULATIVE_DRAFT_ATTENTION} {want} ({ctx.profile.vendor.value})",
                name,
            )
        elif backend != want:
            yield error(
                origin(ctx, spec, sglang.SPECULATIVE_DRAFT_ATTENTION),
                f"DFlash draft attention {backend} does not run on {ctx.profile.name}; "
                f"{ctx.profile.vendor.value.upper()} GPUs use {want}",
                f"use {sglang.SPECULATIVE_DRAFT_ATTENTION} {want}",
                name,
            )
        if last_value(spec.args, sglang.SPECULATIVE_DRAFT_MODEL) is None:
            yield error(
                at,
                f"{name} runs DFlash without a draft model",
                f"add {sglang.SPECULATIVE_DRAFT_MODEL} {DFLASH_DRAFT}",
                name,
            )
        tokens = last_value(spec.args, sglang.SPECULATIVE_DRAFT_TOKENS)
        if tokens is not None and not 1 <= (as_int(tokens) or 0) <= 8:
            yield error(
                origin(ctx, spec, sglang.SPECULATIVE_DRAFT_TOKENS),
                f"{sglang.SPECULATIVE_DRAFT_TOKENS} {tokens}: DFlash drafts 1 to 8 tokens",
                "use a value from 1 to 8 (default 8)",
                name,
            )


@plan_check
def checkpoint_hardware(ctx: CheckContext) -> Iterator[Finding]:
    """The Quark MXFP4 checkpoint runs on MI350X/MI355X; vLLM on AMD runs TP and TP + EP only."""
    amd = ctx.profile.vendor is Vendor.AMD
    for spec in roles(ctx):
        if model(spec) == MXFP4_CHECKPOINT and not amd:
            yield error(
                origin(ctx, spec, key_flags(spec.engine)["model"], "model"),
                f"{MXFP4_CHECKPOINT} runs on MI350X/MI355X only, not {ctx.profile.name}",
                f"serve {NVFP4_CHECKPOINT} on {ctx.profile.name}",
                spec.role,
            )
        p = parallel(ctx, spec)
        if amd and spec.engine == vllm.NAME and p and (p.pp > 1 or p.dp > 1):
            key = "pp" if p.pp > 1 else "dp"
            yield error(
                origin(ctx, spec, vllm.KEY_FLAGS[key], key),
                f"vLLM on {ctx.profile.name} supports "
                f"TP and TP + expert parallel only; {spec.role} sets {key} {getattr(p, key)}",
                f"set {key}: 1 and use tp (with ep) across the GPUs",
                spec.role,
            )


@plan_check
def vllm_speculative(ctx: CheckContext) -> Iterator[Finding]:
    """vLLM's DSpark drafts at most seven tokens."""
    for spec in roles(ctx, (vllm.NAME,)):
        raw = last_value(spec.args, vllm.SPECULATIVE_CONFIG)
        try:
            config = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            yield error(
                origin(ctx, spec, vllm.SPECULATIVE_CONFIG),
                f"{vllm.SPECULATIVE_CONFIG} is not JSON: {raw}",
                'write it as one JSON object, e.g. \'{"method":"dspark",...}\'',
                spec.role,
            )
            continue
        tokens = config.get("num_speculative_tokens") if isinstance(config, dict) else None
        if (
            isinstance(config, dict)
            and config.get("method") == "dspark"
            and tokens is not None
            and not 1 <= (as_int(tokens) or 0) <= 7
        ):
            yield error(
                origin(ctx, spec, vllm.SPECULATIVE_CONFIG),
                f"DSpark num_speculative_tokens {tokens}: it drafts 1 to 7 tokens",
                "set num_speculative_tokens to 7 or less",
                spec.role,
            )


@plan_check
def xeon_page_size(ctx: CheckContext) -> Iterator[Finding]:
    """The Xeon intel_amx attention backend wants --page-size 1."""
    if ctx.profile.arch != "xeon":
        return
    for spec in roles(ctx, (sglang.NAME,)):
        page = last_value(spec.args, sglang.KEY_FLAGS["page_size"][0])
        if page not in (None, "1") and last_value(spec.args, sglang.ATTENTION_BACKEND) in (None, "intel_amx"):
            yield warning(
                origin(ctx, spec, sglang.KEY_FLAGS["page_size"][0], "page_size"),
                f"page size {page} with the intel_amx attention backend (the CPU default)",
                "set page_size: 1, as the cookbook does on Xeon",
                spec.role,
            )
