"""A pure-torch stand-in for the `sgl_kernel` module on the CPU (no registry ships a CPU build).

SGLang 0.5.23's CPU engine gates almost every kernel on Intel AMX and falls back to torch, but it
imports two ops unconditionally (assign_req_to_token_pool_cpu, copy_all_layer_kv_cache_cpu), and the
Qwen-VL models bind torch.ops.sgl_kernel.<op> at import. Enough for dense models; MoE, quantized,
speculative and TP>1 paths raise NotImplementedError. scripts/install_sglang_cpu.sh copies it into
the SGLang-on-CPU venv.
"""

import torch

__version__ = "0.0.0+muse-launch-torch-stand-in"


def assign_req_to_token_pool_cpu(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len
):
    pt = 0
    for i in range(req_pool_indices.numel()):
        s, e = int(start_offset[i]), int(end_offset[i])
        n = e - s
        req_to_token[int(req_pool_indices[i]), s:e] = out_cache_loc[pt : pt + n].to(req_to_token.dtype)
        pt += n


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    raise NotImplementedError("copy_all_layer_kv_cache_cpu needs the real CPU sgl-kernel")


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def _missing(*a, **k):
        raise NotImplementedError(f"sgl_kernel.{name} is not available in the torch stand-in")

    _missing.__name__ = name
    return _missing


# Model modules bind these at import time on the CPU; they raise if ever called.
_lib = torch.library.Library("sgl_kernel", "DEF")
for _op in (
    "fused_sigmoid_mul_cpu",
    "fused_qk_gemma_rmsnorm_cpu",
    "fused_qk_gemma_rmsnorm_with_gate_cpu",
    "fused_qkvzba_split_reshape_cat_contiguous_cpu",
    "fused_gdn_gating_cpu",
    "fused_moe_router_cpu",
    "rmsnorm_cpu",
    "fused_dual_residual_rmsnorm_cpu",
):
    _lib.define(f"{_op}(Tensor[] args) -> ()")

    def _impl(args, _n=_op):
        raise NotImplementedError(f"torch.ops.sgl_kernel.{_n} is a placeholder in the torch stand-in")

    _lib.impl(_op, _impl, "CompositeExplicitAutograd")
