"""SGLang (0.5.23): its flags, choices and default ports, the renderer for encoder, prefill, decode,
aggregated worker and multi-node ranks, and the reader of a rendered argv, as the engine SGLang (ENGINE).
Everything muse-launch knows about SGLang's command line is written here once; its start-up and hardware
rules are beside it in sglang_rules.py."""

from __future__ import annotations

from ..readiness import Probe, ProbeKind
from .argv import as_float, has_flag, last_value, opt, sizes, value
from .base import Context, Instance, Parallel, Rendered, WorkerEngine, WorkerFacts
from .sglang_rules import HARDWARE_RULES, START_UP_RULES

NAME = "sglang"
RELEASE = "0.5.23"  # the release whose command line is written here
DEFAULT_LAUNCHER = ("sglang", "serve")
DEFAULT_BOOTSTRAP_PORT = 8998  # --disaggregation-bootstrap-port
DEFAULT_ENCODER_BOOTSTRAP_PORT = 8997  # --encoder-bootstrap-port
DEFAULT_TRANSFER_BACKEND = "mooncake"  # --disaggregation-transfer-backend
# What provides it, and the module its programs run (host/versions.py reads the installed release).
DISTRIBUTIONS = ("sglang",)
MODULES = ("sglang",)
READY = Probe(ProbeKind.HTTP, ("/health",))  # 503 while starting, 200 once up

# Topology keys and the flags that render them; the first spelling is the one rendered, and a
# flag in `args` (any spelling) overrides its key.
KEY_FLAGS = {
    "model": ("--model-path", "--model"),
    "tp": ("--tp-size", "--tensor-parallel-size"),
    "ep": ("--ep-size", "--expert-parallel-size"),
    "dp": ("--dp-size", "--data-parallel-size"),
    "pp": ("--pp-size", "--pipeline-parallel-size"),
    "mem_fraction": ("--mem-fraction-static",),
    "transfer_backend": ("--disaggregation-transfer-backend",),
    "bootstrap_port": ("--disaggregation-bootstrap-port",),
    "encoder_bootstrap_port": ("--encoder-bootstrap-port",),
    "encoder_transfer_backend": ("--encoder-transfer-backend",),
    "kv_cache_dtype": ("--kv-cache-dtype",),
    "page_size": ("--page-size",),
}
HOST, PORT = "--host", "--port"
# Rendered after `args`, so that the key wins over the same flag in args.
SHADOWED = {HOST: "bind", PORT: "port"}
ENCODER_ONLY = "--encoder-only"
LANGUAGE_ONLY = "--language-only"
ENCODER_URLS = "--encoder-urls"
ENCODER_REGISTER_URLS = "--encoder-register-urls"
# Wiring muse-launch renders from references; the same flag in `args` rewires behind the checks' back.
WIRING = {ENCODER_URLS: "encoders"}
DISAGGREGATION_MODE = "--disaggregation-mode"
PD_ROLE_SWITCH = "--enable-pd-role-switch"
NNODES, NODE_RANK, DIST_INIT_ADDR = "--nnodes", "--node-rank", "--dist-init-addr"
DP_ATTENTION = "--enable-dp-attention"
LAYERNORM_SP = "--enable-layernorm-sp"
MEGAMOE = "--enable-megamoe-for-layernorm-sp"
MIXED_CHUNK = "--enable-mixed-chunk"
MOE_RUNNER_BACKEND = "--moe-runner-backend"
MOE_A2A_BACKEND = "--moe-a2a-backend"
QUANTIZATION = "--quantization"
ATTENTION_BACKEND = "--attention-backend"
SERVED_MODEL_NAME = "--served-model-name"
TOKENIZER = ("--tokenizer-path",)  # a tokenizer directory of its own (bench reads it from the argv)
REASONING_PARSER = "--reasoning-parser"
TOOL_CALL_PARSER = "--tool-call-parser"
SPECULATIVE_ALGORITHM = "--speculative-algorithm"
SPECULATIVE_DRAFT_MODEL = "--speculative-draft-model-path"
SPECULATIVE_DRAFT_ATTENTION = "--speculative-draft-attention-backend"
SPECULATIVE_DRAFT_TOKENS = "--speculative-num-draft-tokens"

CHOICES = {
    DISAGGREGATION_MODE: ("null", "prefill", "decode"),
    KEY_FLAGS["transfer_backend"][0]: ("mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp"),
    KEY_FLAGS["encoder_transfer_backend"][0]: ("auto", "zmq_to_scheduler", "zmq_to_tokenizer", "mooncake"),
}
# The first release that accepts each flag, of those topologies/ renders that older releases lack
# (read from the released wheels' sglang/srt sources: 0.5.12, 13, 14, 18, 19, 20, 22 and 23).
FLAG_SINCE = {
    KEY_FLAGS["encoder_bootstrap_port"][0]: "0.5.13",  # the language worker's encoder bootstrap server
    "--cuda-graph-max-bs-decode": "0.5.14",
    "--disable-prefill-cuda-graph": "0.5.14",
    LAYERNORM_SP: "0.5.19",
    MEGAMOE: "0.5.23",
}


MODEL_TYPE = "--model-type"  # `sglang serve`'s backend selector, taken out before ServerArgs parses


TRANSFER_BACKEND_FLAGS = KEY_FLAGS["transfer_backend"]  # where a pair's KV hand-off protocol is set
# Options SGLang parses as positive whole numbers.
INTEGER_FLAGS = (
    *KEY_FLAGS["tp"],
    *KEY_FLAGS["ep"],
    *KEY_FLAGS["dp"],
    *KEY_FLAGS["pp"],
    NNODES,
    *KEY_FLAGS["page_size"],
    *KEY_FLAGS["bootstrap_port"],
    *KEY_FLAGS["encoder_bootstrap_port"],
    SPECULATIVE_DRAFT_TOKENS,
)
# Port kind -> the flag of the final argv that decides it; bound_ports() below reads SGLang's already.
PORT_FLAGS: dict[str, str] = {}

# A language worker's encoder list (disaggregation/encoder/receiver.py): GET this path on its encoder
# bootstrap port answers {"encoder_urls": [...]}. It starts as --encoder-urls; every interval each listed
# and each evicted encoder's /health is probed: ENCODER_FAIL_THRESHOLD failures in a row evict one, a
# healthy probe re-adds it, and one evicted for the TTL is dropped for good. Env var -> default seconds.
ENCODER_LIST_PATH = "/list_encoder_urls"
ENCODER_HEALTH_CHECK_INTERVAL_ENV = ("SGLANG_ENCODER_BOOTSTRAP_HEALTH_CHECK_INTERVAL", 10.0)  # 0: no checks
ENCODER_HEALTH_CHECK_TIMEOUT_ENV = ("SGLANG_ENCODER_BOOTSTRAP_HEALTH_CHECK_TIMEOUT", 2.0)
ENCODER_EVICTED_TTL_ENV = ("SGLANG_ENCODER_BOOTSTRAP_EVICTED_TTL", 600.0)  # 0: never dropped
ENCODER_FAIL_THRESHOLD = 3
# From this release a language worker takes an evicted encoder back when it turns healthy (0.5.16
# dropped it for good), so it may start before its encoders (plan/start_policy.py: the overlap start).
LATE_ENCODERS_SINCE = "0.5.17"


def _flag(key: str) -> str:
    return KEY_FLAGS[key][0]


def bound_ports(args: list[str], inst: Instance) -> dict[str, int]:
    """The ports SGLang 0.5.23 binds for this argv, read from the final argv so that a flag given
    in `args` counts: node rank 0 only; the KV bootstrap server on a prefill, or on any PD
    instance with --enable-pd-role-switch; the encoder bootstrap server on a language worker."""
    if not inst.serves_http:
        return {}
    ports = {"http": inst.port}
    mode = last_value(args, DISAGGREGATION_MODE)
    if mode == "prefill" or (mode == "decode" and has_flag(args, PD_ROLE_SWITCH)):
        ports["bootstrap"] = _port(last_value(args, _flag("bootstrap_port")), DEFAULT_BOOTSTRAP_PORT)
    if has_flag(args, LANGUAGE_ONLY):
        ports["encoder_bootstrap"] = _port(
            last_value(args, _flag("encoder_bootstrap_port")), DEFAULT_ENCODER_BOOTSTRAP_PORT
        )
    dist_init = last_value(args, DIST_INIT_ADDR)
    if inst.nnodes > 1 and dist_init:
        ports["dist_init"] = _port(dist_init.rpartition(":")[2], inst.dist_init_port)
    return {k: v for k, v in ports.items() if v is not None}


def _port(text: str | None, default: int | None) -> int | None:
    return (
        int(text) if text is not None and text.isdigit() else default
    )  # a bad value is the checks' to report


class SGLang(WorkerEngine):
    NAME, DEFAULT_LAUNCHER, RELEASE = NAME, DEFAULT_LAUNCHER, RELEASE
    DISTRIBUTIONS, MODULES = DISTRIBUTIONS, MODULES
    KEY_FLAGS, SHADOWED, WIRING, PORT_FLAGS = KEY_FLAGS, SHADOWED, WIRING, PORT_FLAGS
    INTEGER_FLAGS, CHOICES, FLAG_SINCE = INTEGER_FLAGS, CHOICES, FLAG_SINCE
    MIN_VERSION, MIN_VERSION_MODELS = None, ()
    SERVED_MODEL_NAME, TOKENIZER, TRANSFER_BACKEND_FLAGS = (
        SERVED_MODEL_NAME,
        TOKENIZER,
        TRANSFER_BACKEND_FLAGS,
    )
    START_UP_RULES, HARDWARE_RULES = START_UP_RULES, HARDWARE_RULES
    FACTS = WorkerFacts(
        name=NAME,
        title="SGLang",
        default_launcher=DEFAULT_LAUNCHER,
        entrypoint=None,
        image_field="sglang_image",
        privileged=False,  # its images take the whole command
        binds=("http", "bootstrap", "encoder_bootstrap", "dist_init"),
        bootstrap_port=DEFAULT_BOOTSTRAP_PORT,
        encoder_bootstrap_port=DEFAULT_ENCODER_BOOTSTRAP_PORT,
        encoder_list_path=ENCODER_LIST_PATH,
        late_encoders_since=LATE_ENCODERS_SINCE,
        encoder_evicted_ttl_env=ENCODER_EVICTED_TTL_ENV,
        peer_flags=WIRING,
        mem_fraction_flag=KEY_FLAGS["mem_fraction"][0],
        attention_backend_flag=ATTENTION_BACKEND,
        rehearsed_as=NAME,
        language_only_flag=LANGUAGE_ONLY,
    )

    def render(self, inst: Instance, ctx: Context) -> Rendered:
        role = inst.role
        args: list[str] = [*opt(_flag("model"), inst.model), *ctx.topology.args]
        for key in ("tp", "ep", "dp", "pp", "mem_fraction"):
            args += opt(_flag(key), getattr(role, key))
        if inst.kind == "encoder":
            args += [ENCODER_ONLY, *opt(_flag("encoder_transfer_backend"), role.encoder_transfer_backend)]
        if inst.encoders:
            args += [
                LANGUAGE_ONLY,
                ENCODER_URLS,
                *(e.url for e in inst.encoders),
                *opt(_flag("encoder_transfer_backend"), role.encoder_transfer_backend),
                *opt(_flag("encoder_bootstrap_port"), inst.encoder_bootstrap_port),
            ]
        if inst.kind in ("prefill", "decode"):
            args += [
                DISAGGREGATION_MODE,
                inst.kind,
                *opt(_flag("transfer_backend"), role.transfer_backend),
                *opt(_flag("bootstrap_port"), inst.bootstrap_port),
            ]
        args += [*opt(_flag("kv_cache_dtype"), role.kv_cache_dtype), *opt(_flag("page_size"), role.page_size)]
        if inst.nnodes > 1:
            args += [
                NNODES,
                str(inst.nnodes),
                NODE_RANK,
                str(inst.node_rank),
                DIST_INIT_ADDR,
                f"{inst.dist_init_host}:{inst.dist_init_port}",
            ]
        args += [*role.args, *opt(HOST, inst.bind), *opt(PORT, inst.port)]
        probe = READY if inst.serves_http else Probe(ProbeKind.PROCESS)
        return Rendered(tuple(args), bound_ports(args, inst), probe)

    # ---- reading a rendered argv (checks, smoke, exporters) ----

    def model(self, args: tuple[str, ...]) -> str | None:
        return value(args, *KEY_FLAGS["model"])

    def served_model_name(self, args: tuple[str, ...]) -> str | None:
        return value(args, SERVED_MODEL_NAME) or self.model(args)

    def transfer_backend(self, args: tuple[str, ...]) -> str:
        return last_value(args, _flag("transfer_backend")) or DEFAULT_TRANSFER_BACKEND

    def kv_cache_dtype(self, args: tuple[str, ...]) -> str:
        return last_value(args, _flag("kv_cache_dtype")) or "auto"

    def page_size(self, args: tuple[str, ...]) -> str | None:
        return value(args, *KEY_FLAGS["page_size"])

    def mem_fraction(self, args: tuple[str, ...]) -> float | None:
        raw = last_value(args, _flag("mem_fraction"))
        return as_float(raw) if raw else None

    def parallel(self, args: tuple[str, ...], nnodes: int) -> Parallel | None:
        """Parallel sizes; None when one is not a positive whole number (the checks say which)."""
        found = sizes(args, KEY_FLAGS, ("tp", "ep", "dp", "pp"))
        return (
            None
            if found is None
            else Parallel(**found, nnodes=nnodes, dp_attention=has_flag(args, DP_ATTENTION))
        )

    def nnodes(self, args: tuple[str, ...]) -> str | None:
        return last_value(args, NNODES)

    def reasoning(self, args: tuple[str, ...]) -> bool:
        return has_flag(args, REASONING_PARSER)

    def tool_calls(self, args: tuple[str, ...]) -> bool:
        return has_flag(args, TOOL_CALL_PARSER)

    # ---- its own argument parser ----

    def parser_args(self, entry: str, args: tuple[str, ...]) -> list[str]:
        """The argv SGLang's ServerArgs parser sees: `sglang serve` (sglang/cli/serve.py) takes --model-type
        out and reads a first positional word as the model path."""
        args = list(args)
        if entry != "sglang serve":
            return args
        args = [
            a
            for i, a in enumerate(args)
            if a != MODEL_TYPE
            and not a.startswith(MODEL_TYPE + "=")
            and not (i and args[i - 1] == MODEL_TYPE)
        ]
        return [KEY_FLAGS["model"][0], *args] if args and not args[0].startswith("-") else args

    def parser_entry(self, module: str | None, rest: tuple[str, ...]) -> str | None:
        """Which of SGLang's entry points a program reaches, as the engine check names them: `sglang serve`
        (the console script, sglang.cli.main) or `python -m sglang.launch_server`; None for anything else."""
        if module == "sglang.launch_server":
            return "sglang.launch_server"
        if module and module.split(".")[:2] == ["sglang", "cli"] and rest[:1] == ("serve",):
            return "sglang serve"
        return None


ENGINE = SGLang()
