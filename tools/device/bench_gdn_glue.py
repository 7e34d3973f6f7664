"""The GDN layer's prefill glue beside its memory bound: the conv (`conv.causal_conv_qkv`) over
launch shapes, and the gated output norm (Triton `glue.gated_norm` against the compiled
reference).

Each case: one fresh row of T tokens of a preset's GDN channels, bf16, x (and z) strided views
of the fused in_proj output as in the model. Every `conv.Tile` of the sweep is timed by
`triton.testing.do_bench` (median, after one untimed call that compiles it) and checked equal,
bit for bit, to the default tile's output. Bounds: what must be read once and written once,
over the copy bandwidth (`ninfer.probe.copy_bandwidth`). One JSON line per measurement.

    python3 tools/device/bench_gdn_glue.py [--cases 9B:8192,27B:8192] [--out bench_gdn_glue.json]
"""

from __future__ import annotations

import json

import case_runner  # tools/device/, beside this script
import torch
import triton.testing

from ninfer.forward import ForwardBatch
from ninfer.models.presets import PRESETS
from ninfer.ops.cuda import conv
from ninfer.ops.cuda.passmeta import PassMeta

DEV, BF16 = torch.device("cuda"), torch.bfloat16
SWEEP = [
    conv.Tile(r, c, w)
    for r, c, w in (
        (64, 128, 4),
        (16, 128, 4),
        (32, 128, 4),
        (8, 256, 4),
        (32, 256, 4),
        (32, 256, 8),
        (16, 512, 8),
    )
]


def fresh_row(tokens: int, slots: int) -> ForwardBatch:
    t = torch.arange(tokens, device=DEV)
    return ForwardBatch(
        input_ids=torch.zeros_like(t),
        positions=t,
        q_lens=[tokens],
        ctx_lens=[0],
        cu_q=torch.tensor([0, tokens], device=DEV, dtype=torch.int32),
        state_slots=torch.tensor([slots - 1], device=DEV),
        block_table=torch.zeros(1, 1, dtype=torch.int32, device=DEV),
        slot_mapping=torch.zeros(tokens, dtype=torch.int64, device=DEV),
        logits_indices=torch.tensor([tokens - 1], device=DEV),
    )


def run_case(name: str, tokens: int, copy_bps: float) -> list[dict]:
    cfg = PRESETS[name]
    key_dim = cfg.linear_num_key_heads * cfg.linear_key_head_dim
    value_dim = cfg.linear_num_value_heads * cfg.linear_value_head_dim
    ch = 2 * key_dim + value_dim
    width = ch + value_dim + 2 * cfg.linear_num_value_heads  # qkv | z | b | a
    proj = torch.randn(tokens, width, device=DEV, dtype=BF16)
    x = proj[:, :ch]
    w = torch.randn(ch, cfg.linear_conv_kernel_dim, device=DEV, dtype=BF16) * 0.5
    pool = torch.zeros(4, ch, cfg.linear_conv_kernel_dim - 1, device=DEV, dtype=BF16)
    batch = fresh_row(tokens, 4)
    meta = PassMeta.of(batch.q_lens, batch.ctx_lens, DEV)
    dk = cfg.linear_key_head_dim
    bound_ms = 2 * tokens * ch * 2 / copy_bps * 1e3
    want = torch.cat(
        [z.flatten() for z in conv.causal_conv_qkv(x, w, pool, batch, meta, key_dim, dk)]
    )
    rows = []
    for tile in [conv.TILE, *SWEEP]:
        try:
            fn = lambda t=tile: conv.causal_conv_qkv(x, w, pool, batch, meta, key_dim, dk, t)  # noqa: E731
            got = torch.cat([z.flatten() for z in fn()])
            ms = triton.testing.do_bench(fn, return_mode="median")
        except Exception as e:  # noqa: BLE001 (a shape the compiler refuses: report, go on)
            rows.append({"case": f"{name}:{tokens}", "tile": list(tile), "error": repr(e)[:200]})
            continue
        row = {
            "case": f"{name}:{tokens}",
            "tile": list(tile),
            "default": tile == conv.TILE,
            "ms": round(ms, 4),
            "bound_ms": round(bound_ms, 4),
            "of_bound": round(bound_ms / ms, 3),
            "equal": bool(torch.equal(got, want)),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    best = min((r for r in rows if "ms" in r and r["equal"]), key=lambda r: r["ms"])
    print(json.dumps({"case": f"{name}:{tokens}", "best": best}), flush=True)
    return rows + gated_norm_rows(name, tokens, proj, ch, value_dim, copy_bps)


def gated_norm_rows(name, tokens, proj, ch, value_dim, copy_bps) -> list[dict]:
    """The GDN output norm: o [T, Hv, dv] contiguous (as fla writes it), z the strided view of
    the in_proj's z part, weight bf16; the Triton kernel against the compiled reference."""
    from ninfer.ops.cuda import glue
    from ninfer.ops.reference.dense import gated_rms_norm_ref

    dv = 128
    o = torch.randn(tokens, value_dim // dv, dv, device=DEV, dtype=BF16)
    z = proj[:, ch : ch + value_dim].view(tokens, -1, dv)
    w = torch.rand(dv, device=DEV, dtype=BF16) + 0.5
    compiled = torch.compile(gated_rms_norm_ref, dynamic=True)
    bound_ms = 3 * o.numel() * 2 / copy_bps * 1e3
    want = gated_rms_norm_ref(o, z, w, 1e-6)
    rows = []
    for label, fn in (("compiled", compiled), ("triton", glue.gated_norm)):
        got = fn(o, z, w, 1e-6)
        ms = triton.testing.do_bench(lambda f=fn: f(o, z, w, 1e-6), return_mode="median")
        diff = (got.float() - want.float()).abs()
        row = {"case": f"{name}:{tokens}", "op": f"gated_norm {label}", "ms": round(ms, 4),
               "bound_ms": round(bound_ms, 4), "of_bound": round(bound_ms / ms, 3),
               "max_abs_vs_eager": diff.max().item(),
               "frac_differing": round((diff > 0).float().mean().item(), 6)}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    case_runner.main(__doc__, "9B:8192,27B:8192,9B:32768", "bench_gdn_glue.json", run_case)


if __name__ == "__main__":
    main()
