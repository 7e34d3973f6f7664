"""Which `CudaOps` fast paths serve a model, decided once from its configuration and dtypes.

The kernels have limits that the model code does not: FlashInfer serves 16-bit queries with
head dims 64, 128 and 256 (no fp32 attention); the Triton GDN kernels take power-of-two key and
value head dims (`tl.arange` extents, whole blocks of 16 or 32), fla's chunked stages at most
256 and compute fp32 inputs in tf32; the attention glue kernels take power-of-two head dims.
An op whose fast path cannot take the model runs its reference op (`ninfer.ops.reference`,
same contract) for the engine's life: one warning per such op, naming it and why. Nothing is
decided per call by catching a kernel's failure: a compile error inside a kernel library is a
bug to see, not a path to take silently. Pure: no torch, no kernel library imported; the model
is described by its `HeadDims` (`ninfer.forward`), not by its configuration class.

    op (`OpPlan` key)  fast path                          needs
    attention          FlashInfer paged / ragged          dtype 16-bit; head_dim 64/128/256;
                                                          kv_dtype = dtype or fp8_e4m3
    gdn_prefill        fla chunked stages + state gather  dtype 16-bit; dk, dv 2^n in 16..256
    gdn_decode         Triton recurrent step              dk, dv 2^n in 16..256
    qk_norm_rope       Triton norm + RoPE                 head_dim 2^n; rotary_dim / 2 2^n
    sigmoid_mul        Triton output gate                 head_dim 2^n
    gated_rms_norm     Triton GDN output norm             dv 2^n <= 256

CUDA graphs replay fast paths only (a reference op syncs with the host): decode graphs need
`attention` and `gdn_decode`, prefill graphs also `gdn_prefill` (`OpPlan.decode_graphs`,
`OpPlan.prefill_graphs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ninfer.forward import HeadDims

HALF_DTYPES = ("bfloat16", "float16")
ATTENTION_HEAD_DIMS = (64, 128, 256)
GDN_DIMS = (16, 32, 64, 128, 256)
OPS = ("attention", "gdn_prefill", "gdn_decode", "qk_norm_rope", "sigmoid_mul", "gated_rms_norm")


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@dataclass(frozen=True, slots=True)
class OpPlan:
    """The fast paths a model may use; `fallbacks`: op -> why it runs the reference op."""

    fallbacks: dict[str, str] = field(default_factory=dict)

    def fast(self, op: str) -> bool:
        return op not in self.fallbacks

    @property
    def decode_graphs(self) -> bool:
        return self.fast("attention") and self.fast("gdn_decode")

    @property
    def prefill_graphs(self) -> bool:
        return self.decode_graphs and self.fast("gdn_prefill")

    def warnings(self) -> list[str]:
        """One line per fallback, naming the op and the reason."""
        return [
            f"ninfer: CudaOps.{op} runs the reference op (slow): {why}"
            for op, why in self.fallbacks.items()
        ]


def plan_ops(dims: HeadDims, dtype: str, kv_dtype: str) -> OpPlan:
    """The `OpPlan` of a model with head dims `dims` run in `dtype` ("bfloat16" | "float16" |
    "float32") with a KV cache in `kv_dtype` (resolved names, as `MemoryGeometry`'s)."""
    out: dict[str, str] = {}
    hd, rot = dims.head_dim, dims.rotary_dim
    dk, dv = dims.gdn_key_dim, dims.gdn_value_dim
    if dtype not in HALF_DTYPES:
        out["attention"] = f"FlashInfer has no {dtype} attention (bfloat16 / float16 only)"
    elif hd not in ATTENTION_HEAD_DIMS:
        out["attention"] = f"head_dim {hd} is not one FlashInfer serves {ATTENTION_HEAD_DIMS}"
    elif kv_dtype not in (dtype, "fp8_e4m3"):
        out["attention"] = f"a {kv_dtype} KV cache with {dtype} queries"
    gdn_dims_ok = dk in GDN_DIMS and dv in GDN_DIMS
    gdn_dims = f"GDN head dims dk {dk}, dv {dv} (the kernels need powers of two in 16..256)"
    if not gdn_dims_ok:
        out["gdn_prefill"] = gdn_dims
        out["gdn_decode"] = gdn_dims
    elif dtype not in HALF_DTYPES:
        out["gdn_prefill"] = f"fla's chunked kernels compute {dtype} inputs in tf32"
    if not (_pow2(hd) and rot % 2 == 0 and _pow2(rot // 2) and rot <= hd):
        out["qk_norm_rope"] = f"head_dim {hd} / rotary_dim {rot} (the kernel needs powers of two)"
    if not _pow2(hd):
        out["sigmoid_mul"] = f"head_dim {hd} (the output-gate kernel needs a power of two)"
    if not (_pow2(dv) and dv <= 256):
        out["gated_rms_norm"] = f"dv {dv} (the kernel needs a power of two <= 256)"
    return OpPlan(out)
