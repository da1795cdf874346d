"""Hardware profiles: what a host offers, and the capabilities the cookbook relies on."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class Vendor(str, Enum):
    NVIDIA = "nvidia"
    AMD = "amd"
    INTEL = "intel"  # CPU serving: no accelerator
    NONE = "none"


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    display: str
    vendor: Vendor
    arch: str  # blackwell | hopper | cdna4 | xeon | cpu
    gpus_per_node: int
    memory_gb: int  # per GPU (0 for CPU profiles)
    # Capabilities the cookbook's rules depend on.
    fp4_trtllm_moe: bool = False  # flashinfer TRT-LLM FP4 MoE kernels (SM100)
    prefill_sp: bool = False  # --enable-layernorm-sp / MegaMoE (SM100 kernels)
    draft_attention: str | None = None  # DFlash draft attention backend for this vendor
    sglang_image: str | None = None
    vllm_image: str | None = None

    @property
    def has_gpus(self) -> bool:
        return self.vendor in (Vendor.NVIDIA, Vendor.AMD)

    @property
    def visible_devices_var(self) -> str | None:
        return {Vendor.NVIDIA: "CUDA_VISIBLE_DEVICES", Vendor.AMD: "HIP_VISIBLE_DEVICES"}.get(self.vendor)

    @property
    def device_order_env(self) -> dict[str, str]:
        """So that GPU N is the same GPU to the engine, nvidia-smi and NVML (CUDA's default is fastest
        first)."""
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"} if self.vendor is Vendor.NVIDIA else {}

    def matches_gpu(self, device_name: str) -> bool:
        """Is a GPU the driver names so ("NVIDIA H200", "AMD Instinct MI355X") this profile's? B300 is not
        GB300."""
        return (
            self.has_gpus
            and re.search(rf"(?<![A-Z0-9]){self.name.upper()}(?![0-9])", device_name.upper()) is not None
        )

    @property
    def docker_gpu_args(self) -> tuple[str, ...]:
        if self.vendor is Vendor.NVIDIA:
            return ("--gpus", "all")
        if self.vendor is Vendor.AMD:
            return ("--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video")
        return ()


_SGL_CUDA = "lmsysorg/sglang:dev-muse-spark-open"
_SGL_ROCM = "lmsysorg/sglang-rocm:muse-spark-open"
_SGL_XEON = "lmsysorg/sglang:dev-muse-spark-xeon"
_VLLM_CUDA = "vllm/vllm-openai:muse-spark-open"
_VLLM_ROCM = "vllm/vllm-openai-rocm:muse-spark-open"


def _blackwell(name: str, display: str, gpus: int, mem: int) -> HardwareProfile:
    return HardwareProfile(
        name,
        display,
        Vendor.NVIDIA,
        "blackwell",
        gpus,
        mem,
        fp4_trtllm_moe=True,
        prefill_sp=True,
        draft_attention="fa4",
        sglang_image=_SGL_CUDA,
        vllm_image=_VLLM_CUDA,
    )


def _cdna4(name: str, display: str) -> HardwareProfile:
    return HardwareProfile(
        name,
        display,
        Vendor.AMD,
        "cdna4",
        8,
        288,
        draft_attention="triton",
        sglang_image=_SGL_ROCM,
        vllm_image=_VLLM_ROCM,
    )


PROFILES: dict[str, HardwareProfile] = {
    p.name: p
    for p in (
        _blackwell("b300", "NVIDIA B300 (8 x 288 GB)", 8, 288),
        _blackwell("b200", "NVIDIA B200 (8 x 180 GB)", 8, 180),
        # Grace-Blackwell trays carry 4 GPUs per host.
        _blackwell("gb300", "NVIDIA GB300 (4 x 288 GB per tray)", 4, 288),
        _blackwell("gb200", "NVIDIA GB200 (4 x 186 GB per tray)", 4, 186),
        HardwareProfile(
            "h200",
            "NVIDIA H200 (8 x 141 GB)",
            Vendor.NVIDIA,
            "hopper",
            8,
            141,
            draft_attention="fa4",
            sglang_image=_SGL_CUDA,
            vllm_image=_VLLM_CUDA,
        ),
        _cdna4("mi355x", "AMD Instinct MI355X (8 x 288 GB)"),
        _cdna4("mi350x", "AMD Instinct MI350X (8 x 288 GB)"),
        HardwareProfile(
            "xeon", "Intel Xeon 6 (CPU serving)", Vendor.INTEL, "xeon", 0, 0, sglang_image=_SGL_XEON
        ),
        HardwareProfile("cpu", "Any CPU (rehearsal, tests, vLLM on CPU)", Vendor.NONE, "cpu", 0, 0),
    )
}

# The checkpoints of the cookbook and the vLLM recipe.
BF16_CHECKPOINT = "meta-models/Muse-Spark-Open-816B-A42B"
NVFP4_CHECKPOINT = "meta-models/Muse-Spark-Open-816B-A42B-NVFP4"
MXFP4_CHECKPOINT = "amd/Muse-Spark-Open-816B-A42B-Quark-MXFP4"  # MI350X/MI355X only
INT4_CHECKPOINT = "intel-ai/Muse-Spark-Open-816B-A42B-INT4"
DFLASH_DRAFT = "RadixArk/Muse-Spark-Open-DFlash2"

# Smallest total accelerator memory (GB) each checkpoint needs, from the vLLM recipe's variants.
CHECKPOINT_VRAM_GB: dict[str, int] = {BF16_CHECKPOINT: 1959, NVFP4_CHECKPOINT: 640, MXFP4_CHECKPOINT: 611}
