"""The engines muse-launch knows, by name, and the module that holds each one's facts: the one list that the
topology's schema accepts and that muse_launch/engines/ loads. Below both (it imports nothing), so the
schema reads it without importing the engines. Adding an engine: its module, and one line here."""

WORKER_ENGINES: dict[str, str] = {  # serve a model
    "sglang": "muse_launch.engines.sglang",
    "vllm": "muse_launch.engines.vllm",
}
ROUTER_ENGINES: dict[str, str] = {
    "sglang-router": "muse_launch.engines.sglang_router",
    "smg": "muse_launch.engines.smg",
    "vllm-router": "muse_launch.engines.vllm_router",
}
OTHER_ENGINES: dict[str, str] = {"command": "muse_launch.engines.command"}  # `kind: command` roles
