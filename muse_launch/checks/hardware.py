"""Hardware capability rules from the cookbook and the recipe: each engine's own (written beside it in
muse_launch/engines/), the checkpoints' hardware, vLLM on AMD."""

from __future__ import annotations

from collections.abc import Iterator

from ..engines import vllm
from ..topology.hardware import MXFP4_CHECKPOINT, NVFP4_CHECKPOINT, Vendor
from .engine_rules import engine_own_rules
from .findings import CheckContext, Finding, error, plan_check
from .reading import key_flags, model, origin, parallel, roles


@plan_check
def engine_hardware_rules(ctx: CheckContext) -> Iterator[Finding]:
    """Each engine's own hardware rules (muse_launch/engines/: SGLang's FP4 TRT-LLM MoE, Marlin on Hopper,
    prefill SP and MegaMoE, DFlash, Xeon's page size; vLLM's DSpark)."""
    yield from engine_own_rules(ctx, lambda engine: engine.HARDWARE_RULES)


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
