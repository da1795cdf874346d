"""The engines' own start-up rules (SGLang 0.5.23, vLLM 0.33): whole numbers, choices, modes that
exclude each other, wiring, and flags in `args` that a key overrides or that override a key."""

from __future__ import annotations

from collections.abc import Iterator

from ..engines import ENGINES, ROUTER_ENGINES, WORKER_ENGINES, sglang, vllm
from ..engines.argv import as_float, as_int, has_flag, last_value, value
from .findings import CheckContext, Finding, error, plan_check, warning
from .reading import key_flags, origin, roles


@plan_check
def integer_options(ctx: CheckContext) -> Iterator[Finding]:
    """Sizes, ports and token counts are positive whole numbers (the engine's parser refuses others)."""
    for spec in roles(ctx):
        for flag in ENGINES[spec.engine].INTEGER_FLAGS:
            given = last_value(spec.args, flag)
            if given is not None and not (as_int(given) or 0) >= 1:
                yield error(
                    origin(ctx, spec, flag),
                    f"{flag} {given} is not a positive whole number",
                    f"give {flag} a number, e.g. {flag} 4",
                    spec.role,
                )


@plan_check
def engine_choices(ctx: CheckContext) -> Iterator[Finding]:
    """Values SGLang 0.5.23 and vLLM 0.33 accept for the disaggregation options."""
    for spec in roles(ctx):
        if spec.engine == vllm.NAME:
            config = vllm.kv_transfer_config(spec.args) or {}
            connector = config.get("kv_connector")
            # A connector of one's own comes with the module that registers it, as vLLM allows.
            if (
                connector is not None
                and connector not in vllm.KNOWN_CONNECTORS
                and not config.get(vllm.CONNECTOR_MODULE_PATH)
            ):
                yield error(
                    origin(ctx, spec, vllm.KV_TRANSFER_CONFIG, "transfer_backend"),
                    f"vLLM has no KV connector {connector}",
                    f"use transfer_backend {', '.join(vllm.CONNECTORS)}",
                    spec.role,
                )
            continue
        for flag, choices in sglang.CHOICES.items():
            given = last_value(spec.args, flag)
            if given is not None and given not in choices:
                key = next((k for k, flags in sglang.KEY_FLAGS.items() if flag in flags), None)
                yield error(
                    origin(ctx, spec, flag, key),
                    f"{flag} {given} is not one SGLang accepts",
                    f"use one of {', '.join(choices)}",
                    spec.role,
                )


@plan_check
def disaggregation_mode_matches_kind(ctx: CheckContext) -> Iterator[Finding]:
    """A --disaggregation-mode in args must not contradict the role's kind (the router wires by kind)."""
    flag = sglang.DISAGGREGATION_MODE
    for spec in roles(ctx, (sglang.NAME,)):
        mode = last_value(spec.args, flag)
        if spec.kind in ("prefill", "decode") and mode != spec.kind:
            yield error(
                origin(ctx, spec, flag),
                f"{flag} {mode} contradicts kind: {spec.kind}",
                f"remove {flag} from {spec.role}'s args (kind sets it)",
                spec.role,
            )
        elif spec.kind == "worker" and mode in ("prefill", "decode"):
            yield error(
                origin(ctx, spec, flag),
                f"{spec.role} is kind: worker but its args set {flag} {mode}",
                f"make it kind: {mode} and list it under the router's {mode}",
                spec.role,
            )


@plan_check
def encoder_only_exclusive(ctx: CheckContext) -> Iterator[Finding]:
    """SGLang: --encoder-only excludes --language-only and --disaggregation-mode prefill|decode."""
    encoder_only, language_only, mode_flag = (
        sglang.ENCODER_ONLY,
        sglang.LANGUAGE_ONLY,
        sglang.DISAGGREGATION_MODE,
    )
    for spec in roles(ctx, (sglang.NAME,)):
        if not has_flag(spec.args, encoder_only):
            continue
        if has_flag(spec.args, language_only):
            yield error(
                origin(ctx, spec, language_only),
                f"{spec.role} sets both {encoder_only} and {language_only}",
                f"keep {spec.role} an encoder: remove {language_only} from its args",
                spec.role,
            )
        mode = last_value(spec.args, mode_flag)
        if mode in ("prefill", "decode"):
            yield error(
                origin(ctx, spec, mode_flag),
                f"{spec.role} runs {encoder_only}, which excludes {mode_flag} {mode}",
                f"remove {mode_flag} from {spec.role}'s args",
                spec.role,
            )


@plan_check
def language_only_wiring(ctx: CheckContext) -> Iterator[Finding]:
    """--language-only without --encoder-urls makes encoders register themselves, reversing the start
    order."""
    encoders = [n for n, r in ctx.topology.roles.items() if r.kind == "encoder"]
    language_only, urls = sglang.LANGUAGE_ONLY, sglang.ENCODER_URLS
    for spec in roles(ctx, (sglang.NAME,)):
        if (
            has_flag(spec.args, language_only)
            and not has_flag(spec.args, urls)
            and not has_flag(spec.args, sglang.ENCODER_ONLY)
        ):
            listed = ", ".join(encoders) or "ENCODER"
            yield warning(
                origin(ctx, spec, language_only),
                f"{spec.role} runs {language_only} without {urls}, so "
                f"encoders must register themselves ({sglang.ENCODER_REGISTER_URLS}), which reverses the "
                f"start order",
                f"list {spec.role}.encoders: [{listed}] so muse-launch wires {urls} and "
                f"starts encoders first",
                spec.role,
            )


@plan_check
def args_shadowed(ctx: CheckContext) -> Iterator[Finding]:
    """--host/--port in `args` lose to bind/port (rendered after them); other flags there override their
    key."""
    for spec in roles(ctx, WORKER_ENGINES + ROUTER_ENGINES):
        role = ctx.topology.roles[spec.role]
        module = ENGINES[spec.engine]
        for flag, key in module.SHADOWED.items():
            given = last_value(role.args, flag)
            effective = last_value(spec.args, flag)
            if given is not None and given != effective:
                yield warning(
                    origin(ctx, spec, flag),
                    f"{flag} {given} in args is overridden by {key}: {effective}",
                    f"set {key}: {given} and remove {flag} from args",
                    spec.role,
                )
        for flag, ref in getattr(module, "WIRING", {}).items():
            if has_flag(role.args, flag) and getattr(role, ref, None):
                yield warning(
                    origin(ctx, spec, flag),
                    f"args give {flag} by hand while {ref}: "
                    f"{', '.join(getattr(role, ref))} wires it; the engine keeps the last one",
                    f"list the roles in {ref}: and remove {flag} from args",
                    spec.role,
                )
        for key, flags in key_flags(spec.engine).items():
            declared = getattr(role, key)
            given = value(role.args, *flags)
            if (
                declared is None
                or given is None
                or str(declared) == given
                or as_float(declared) == as_float(given)
            ):
                continue
            yield warning(
                origin(ctx, spec, flags),
                f"args set {flags[0]} {given}, overriding {key}: {declared}",
                f"keep one: set {key}: {given} and remove {flags[0]} from args",
                spec.role,
            )
