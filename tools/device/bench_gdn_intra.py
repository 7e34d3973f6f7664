"""The GDN prefill's intra-chunk stage (w, u of `ninfer.ops.cuda.gdn_intra`): ninfer's one-launch
kernel over its variants against fla's two kernels (fused kkt + solve, then recompute_w_u), on
one fresh row of T tokens of a preset's GDN heads, bf16 as in the model.

Inputs as the model's prefill makes them: L2-normalised q/k, v ~ N(0, 1), beta = sigmoid(N(0,
1)), g = -exp(A_log) softplus(a + dt_bias) with the preset's typical decay range, then fla's
chunk-local cumsum (log2 units). Each variant: time by `triton.testing.do_bench` (median,
after a call that compiles or autotunes it); accuracy as ||x - ref|| / ||ref|| against a
float64 solve (`torch.linalg.solve_triangular`) of the first 64 chunks, for w and u, beside
fla's own error. Bound: what must be read (k, v, g, beta) and written (w, u) once, over the
measured copy bandwidth. One JSON line per measurement.

    python3 tools/device/bench_gdn_intra.py [--cases 9B:8192,27B:8192,9B:32768]
"""

from __future__ import annotations

import json
import math

import case_runner  # tools/device/, beside this script
import torch
import triton.testing

from ninfer.models.presets import PRESETS
from ninfer.ops.cuda.gdn_intra import wy_repr
from ninfer.ops.cuda.passmeta import CHUNK, PassMeta

DEV, BF16 = torch.device("cuda"), torch.bfloat16
VARIANTS = [("tf32x3", 4), ("tf32x3", 8), ("tf32", 4), ("tf32", 8), ("ieee", 4)]
CHECKED_CHUNKS = 64


def inputs(name: str, tokens: int):
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2

    cfg = PRESETS[name]
    hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    gen = torch.Generator(DEV).manual_seed(0)
    k = torch.nn.functional.normalize(
        torch.randn(1, tokens, hk, dk, device=DEV, generator=gen), dim=-1
    )
    v = torch.randn(1, tokens, hv, dv, device=DEV, generator=gen)
    beta = torch.sigmoid(torch.randn(1, tokens, hv, device=DEV, generator=gen))
    a = torch.randn(1, tokens, hv, device=DEV, generator=gen)
    a_log = torch.rand(hv, device=DEV, generator=gen) * math.log(16)  # A in [1, 16)
    g_raw = -a_log.exp() * torch.nn.functional.softplus(a - 4.0)  # decays mostly near 1
    meta = PassMeta.of([tokens], [0], DEV)
    tables = {"cu_seqlens": meta.cu_seqlens, "chunk_indices": meta.chunk_indices}
    g = chunk_local_cumsum(g_raw.contiguous(), CHUNK, scale=RCP_LN2, **tables)
    return k.to(BF16), v.to(BF16), g, beta.to(BF16), meta, tables


def reference(k, v, g, beta, hv: int, chunks: int):
    """float64 w, u of the first `chunks` chunks: [chunks * 64, Hv, d]."""
    n = chunks * CHUNK
    group = hv // k.shape[2]
    kk = k[0, :n].double().repeat_interleave(group, dim=1).view(chunks, CHUNK, hv, -1)
    kk = kk.permute(0, 2, 1, 3)  # [C, Hv, 64, dk]
    vv = v[0, :n].double().view(chunks, CHUNK, hv, -1).permute(0, 2, 1, 3)
    bb = beta[0, :n].double().view(chunks, CHUNK, hv).permute(0, 2, 1)  # [C, Hv, 64]
    gg = g[0, :n].double().view(chunks, CHUNK, hv).permute(0, 2, 1)
    a = kk @ kk.transpose(-1, -2) * torch.exp2(gg[..., :, None] - gg[..., None, :])
    a = torch.tril(a * bb[..., :, None], -1)
    eye = torch.eye(CHUNK, dtype=torch.float64, device=DEV).expand_as(a)
    rhs_w = kk * (bb * torch.exp2(gg))[..., None]
    rhs_u = vv * bb[..., None]
    w = torch.linalg.solve_triangular(eye + a, rhs_w, upper=False, unitriangular=True)
    u = torch.linalg.solve_triangular(eye + a, rhs_u, upper=False, unitriangular=True)
    back = lambda x: x.permute(0, 2, 1, 3).reshape(n, hv, -1)  # noqa: E731
    return back(w), back(u)


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    x = x[0, : ref.shape[0]].double()
    return round(((x - ref).norm() / ref.norm()).item(), 7)


def run_case(name: str, tokens: int, copy_bps: float) -> list[dict]:
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra

    k, v, g, beta, meta, tables = inputs(name, tokens)
    hv = v.shape[2]
    ref_w, ref_u = reference(k, v, g, beta, hv, min(CHECKED_CHUNKS, tokens // CHUNK))
    moved = (k.numel() + 2 * v.numel() * 2) * 2 + g.numel() * 4 + beta.numel() * 2  # w, u: 2
    bound_ms = moved / copy_bps * 1e3
    case = f"{name}:{tokens}"
    rows = []

    def fla():
        w, u, _ = chunk_gated_delta_rule_fwd_intra(
            k=k, v=v, g=g, beta=beta, chunk_size=CHUNK, **tables
        )
        return w, u

    candidates = [("fla", fla)] + [
        (
            f"ninfer {s} w{nw}",
            lambda s=s, nw=nw: wy_repr(
                k, v, g, beta, meta.cu_seqlens, meta.chunk_indices, solve=s, num_warps=nw
            ),
        )
        for s, nw in VARIANTS
    ]
    for label, fn in candidates:
        try:
            w, u = fn()
            ms = triton.testing.do_bench(fn, return_mode="median")
        except Exception as e:  # noqa: BLE001 (a variant the compiler refuses: report it)
            rows.append({"case": case, "kernel": label, "error": repr(e)[:300]})
            print(json.dumps(rows[-1]), flush=True)
            continue
        row = {"case": case, "kernel": label, "ms": round(ms, 4),
               "bound_ms": round(bound_ms, 4), "of_bound": round(bound_ms / ms, 3),
               "w_err": rel(w, ref_w), "u_err": rel(u, ref_u)}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    case_runner.main(__doc__, "9B:8192,27B:8192,9B:32768", "bench_gdn_intra.json", run_case)


if __name__ == "__main__":
    main()
