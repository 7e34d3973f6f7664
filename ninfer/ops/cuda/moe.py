"""Routed experts of Qwen3.5-MoE without host synchronisation (capturable in a CUDA graph).

The reference (`moe_ref`) loops over the experts that received tokens, which needs their ids on
the host. Every path here routes on the device and works on (token, expert) pairs p = (t, j) =
t * P + j, P pairs per token: the top_k routed experts, plus (`moe_block_decode`) the shared
expert as pair j = top_k. Which path runs depends only on shapes and dtypes, so a captured graph
always replays the path it was captured with:

- decode (N * top_k <= DECODE_PAIRS, bf16 / fp16 / fp32): four launches, no torch glue:

      logits = linear(x, router)                   [N, E] or [N, E + 1] x.dtype (F.linear or
                                                   CudaOps' decode linear)
      w, ids = route(logits)      one program per token: fp32 softmax, top-k, renormalised;
                                  moe_block_decode: pair top_k = (E, sigmoid(logits[t, E]))
      h[p]   = silu(gate_e x_t) * up_e x_t      one program per (pair, block of I rows)
      out[t] = sum_j w_tj * (down_e h[(t, j)])  one program per (token, block of H rows)

  `_route_kernel` equals `route_ref`: the same ids where the logits have no ties (ties go to the
  lowest expert id; torch.topk promises no order), weights within an ulp or two (the same expf
  and IEEE divisions, fp32 sums in another order); the shared expert's weight is
  1 / (1 + expf(-logit)) rounded to x.dtype, as torch's sigmoid of the x.dtype logit. The Triton
  kernels stream each pair's expert rows once with fp32 sums; gate, up, silu, each expert's down
  output and its product with w are rounded to x.dtype as in the reference, and the down kernel
  adds the P terms of a token in fp32 in a fixed order (the routed ones, then the shared one:
  deterministic) and rounds once. So `moe_block_decode`'s output differs from the reference's
  (routed sum rounded to x.dtype, then the shared term added and rounded again) by about an ulp
  of x.dtype, in favour of the fused sum. `block_fusable` says which MoE blocks it takes
  (`CudaOps.moe_block` runs it for those, else composes the block from its separate ops).
  At decode the work is a batch of matrix-vector products, bound by reading the weights, where
  the grouped GEMM below (GEMM tiles over a few rows per expert) stays far off that bound
  (`tools/device/bench_moe.py` compares the two; docs/results-h200.md). The shared expert's
  weights stay where the model keeps them (its own gate_up [2I, H] and down [H, I]): the gate_up
  kernel picks their base pointer for pair top_k, the down kernel reads them as one more tile.
  Each pair reads its rows once, so at N tokens the shared expert is read N times (from L2 after
  the first).
- grouped (larger bf16 batches): routed by `route_ref`, the pairs sorted by expert on the
  device, each projection one grouped GEMM (`torch._grouped_mm`) over the sorted pairs:

      offs[e] = number of pairs with expert id <= e          (scatter_add_ + cumsum, no sync)
      h  = grouped_mm(x[t_p], gate_up[e]^T)  -> silu(gate) * up
      y  = grouped_mm(h, down[e]^T) * w_p;   out[t_p] += y_p  (index_add_)

  Past `block_fusable`, `CudaOps.moe_block` composes the block as the model's separate ops
  would (`moe_block_ref` over `moe_grouped` and its linear, SwiGLU and sigmoid gate).
- bmm (larger batches in other dtypes, or no `torch._grouped_mm`): each pair's expert weights
  gathered and one bmm; it copies the weights, so it is only meant for small models.
- FP8 experts (`ninfer.ops.fp8.Fp8Weight`, `moe_fp8`): decode-sized inputs run the decode
  kernels above on the e4m3 weights (each weight times its block's scale in fp32 as it is read,
  or, where a tile's rows lie in one row of scale blocks (ROW_SCALE, the 128 x 128 blocks), the
  activations' K slice times the tile's scales once a step, so a weight costs one multiply-add;
  in `moe_block_decode` an FP8 shared expert's tiles too, times its own scales); larger ones
  `moe_grouped_fp8`: the grouped path's sorted pairs through a Triton grouped GEMM that reads
  the e4m3 experts as they are (`grouped_fp8`: W8A16, each K step times its scale block).
  Weights it does not take (a scale block narrower than its K step) go to `moe_dequantized`,
  which expands the experts it needs to x.dtype per call (correct, slow).

`CudaOps`' module imports this one, so it imports with torch alone; the Triton kernels are
defined only where triton is installed. Knows nothing about the model.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F

from ninfer.ops.cuda.timing import graph_bench
from ninfer.ops.fp8 import Fp8Weight
from ninfer.ops.reference.dense import moe_block_experts, route_ref

# routed pairs (N * top_k) up to which the Triton path runs: 32 tokens at top-8 (an MTP verify
# pass of 8 lanes at K = 3), where it still beats the grouped GEMM (docs/results-h200.md, "MoE
# decode")
DECODE_PAIRS = 256
DECODE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
ROUTE_MAX_EXPERTS = 1024  # one program holds a token's E logits (padded to a power of two)
# Autotuned in the engine's eager warm-up, before any graph capture, per (pairs or tokens rounded
# up to a power of two, rows, K, top_k, dtypes): (BLOCK_N, BLOCK_K, num_warps, STAGES). The
# rounding keeps the tunings to six sizes up to DECODE_PAIRS (the warm-up runs each), not one
# per token count a pass may bring while serving. STAGES 1: plain 16-byte loads,
# latency hidden by the programs in flight; 3: a cp.async ring in shared memory.
# gate_up: one pair's rows, BLOCK_N * BLOCK_K / (32 * num_warps) fp32 accumulators per thread,
# twice that (gate and up rows).
DECODE_CONFIGS = (
    (16, 256, 4, 1),
    (16, 256, 4, 3),
    (32, 128, 4, 3),
    (8, 512, 4, 1),
    (32, 256, 8, 3),
    (16, 512, 8, 1),
)
# down: all top_k experts of a token at once (their loads in flight together, as when each pair
# had its own programs), so top_k (padded to a power of two) times BLOCK_N * BLOCK_K / (32 *
# num_warps) accumulators per thread: 32 or 64 for top-8 (sm_90, bf16: ~80 or ~165 registers);
# `moe_block_decode` adds the shared expert's tile, one more BLOCK_N * BLOCK_K (4 or 8 per
# thread).
DOWN_CONFIGS = (
    (1, 512, 4, 1),
    (2, 256, 4, 1),
    (2, 512, 4, 1),
    (4, 256, 8, 1),
    (2, 256, 4, 3),
    (4, 256, 8, 3),
)
ROUTE_WARPS = (1, 2, 4)


grouped_fp8 = None  # the FP8 grouped GEMM's module, where triton is installed
if importlib.util.find_spec("triton") is not None:  # else only the torch paths
    import triton
    import triton.language as tl

    from ninfer.ops.cuda import grouped_fp8

    _INTERPRET = triton.knobs.runtime.interpret

    def _autotune(configs, key):
        """Under the interpreter (no device timer) only the first config: autotune never times.
        On a GPU each config is timed as a decode graph runs it (`timing.graph_bench`)."""
        return triton.autotune(configs[: 1 if _INTERPRET else None], key=key, do_bench=graph_bench)

    def _block_configs(table):
        return [
            triton.Config({"BLOCK_N": n, "BLOCK_K": k, "STAGES": st}, num_warps=w)
            for n, k, w, st in table
        ]

    def _scale_blocks(fp8: bool, block_k: int, bk_w: int, k: int) -> int:
        """How a kernel's K step of `block_k` columns meets FP8 scale blocks `bk_w` columns wide
        (`_scaled`): 1, inside one block (or not FP8); a power of two > 1, that many whole
        blocks (steps start at multiples of block_k); 0, neither (scales gathered per
        element)."""
        if not fp8 or bk_w % block_k == 0 or bk_w >= k:
            return 1
        n = block_k // bk_w
        return n if block_k % bk_w == 0 and n & (n - 1) == 0 else 0

    def _rows_share(block_n: int, bn_w: int, n: int) -> bool:
        """A kernel's BLOCK_N-row tiles (at multiples of block_n, and, gate_up's up rows, of
        n) each lie in one row of scale blocks bn_w rows tall: its rows share their scales."""
        return bn_w % block_n == 0 and n % block_n == 0

    _even = triton.heuristics(
        {
            "EVEN": lambda a: a["N"] % a["BLOCK_N"] == 0 and a["K"] % a["BLOCK_K"] == 0,
            "SCALES": lambda a: _scale_blocks(a["FP8"], a["BLOCK_K"], a["BK_W"], a["K"]),
            "ROW_SCALE": lambda a: bool(a["FP8"]) and _rows_share(a["BLOCK_N"], a["BN_W"], a["N"]),
        }
    )

    if _INTERPRET:  # no libdevice under the interpreter: numpy's exp, about as accurate

        @triton.jit
        def _expf(x):
            return tl.exp(x)

    else:
        from triton.language.extra import libdevice

        @triton.jit
        def _expf(x):
            """expf as in torch's CUDA softmax (tl.exp is ex2.approx for fp32)."""
            return libdevice.exp(x)

    @triton.jit
    def _ordered(bits):
        """fp32 bits (int32) -> int32 with the floats' order as signed ints; an involution."""
        return bits ^ ((bits >> 31) & 0x7FFFFFFF)

    @_autotune(
        [triton.Config({}, num_warps=w) for w in ROUTE_WARPS], ["tokens", "E", "TOP_K", "SHARED"]
    )
    @triton.jit(do_not_specialize=["tokens"])
    def _route_kernel(
        logits, wts, ids, tokens, E, s_lt,
        TOP_K: tl.constexpr, SHARED: tl.constexpr, KP: tl.constexpr, BLOCK_E: tl.constexpr,
    ):  # fmt: skip
        """Program t: route_ref on logits[t, :E] -> wts[t, :TOP_K] (wts' dtype), ids[t, :TOP_K]
        (int64), rows of P = TOP_K + SHARED. probs = exp(l - max) / sum (fp32, expf and IEEE
        division as torch's softmax); the TOP_K largest logits in descending order, ties to the
        lowest index (one max per choice over int64 keys: ordered logit bits, then
        BLOCK_E - 1 - index); weights = probs / their sum. Picking on the logits equals picking
        on the probabilities unless two distinct fp32 logits round to one probability. ids are
        distinct and < E whatever the logits (NaN ones give NaN weights). SHARED (0 or 1): also
        wts[t, TOP_K] = sigmoid(logits[t, E]) = 1 / (1 + expf(-l)) (fp32, IEEE division, as
        torch's sigmoid) and ids[t, TOP_K] = E. KP = next power of two >= P. `tokens` (the grid,
        rounded up to a power of two) is only an autotune key."""
        t = tl.program_id(0)
        offs = tl.arange(0, BLOCK_E)
        ok = offs < E
        logit = tl.load(logits + t * s_lt + offs, mask=ok, other=float("-inf")).to(tl.float32)
        top = tl.max(logit, axis=0)
        total = tl.sum(tl.where(ok, _expf(logit - top), 0.0), axis=0)
        logit = tl.where(logit == 0.0, 0.0, logit)  # -0.0 ties +0.0
        bits = _ordered(logit.to(tl.int32, bitcast=True))
        key = (bits.to(tl.int64) << 32) | (BLOCK_E - 1 - offs).to(tl.int64)
        lowest: tl.constexpr = -(2**63)
        key = tl.where(ok, key, lowest)
        offs_j = tl.arange(0, KP)
        probs = tl.zeros([KP], dtype=tl.float32)
        picked = tl.zeros([KP], dtype=tl.int64)
        for j in tl.static_range(TOP_K):
            best = tl.max(key, axis=0)
            key = tl.where(key == best, lowest, key)
            value = _ordered((best >> 32).to(tl.int32)).to(tl.float32, bitcast=True)
            prob = tl.math.div_rn(_expf(value - top), total)
            probs = tl.where(offs_j == j, prob, probs)
            picked = tl.where(offs_j == j, BLOCK_E - 1 - (best & (BLOCK_E - 1)), picked)
        weights = tl.math.div_rn(probs, tl.sum(probs, axis=0))  # the padding adds +0.0
        if SHARED:
            gate = tl.load(logits + t * s_lt + E).to(tl.float32)
            weights = tl.where(offs_j == TOP_K, tl.math.div_rn(1.0, 1.0 + _expf(-gate)), weights)
            picked = tl.where(offs_j == TOP_K, E, picked)
        per: tl.constexpr = TOP_K + SHARED
        j_ok = offs_j < per
        tl.store(wts + t * per + offs_j, weights.to(wts.dtype.element_ty), mask=j_ok)
        tl.store(ids + t * per + offs_j, picked, mask=j_ok)

    @triton.jit
    def _scaled(wf, srows, k0, K, ok, BLOCK_K: tl.constexpr, BK_W, SCALES: tl.constexpr):
        """The fp32 weight tile `wf` [R0, R1, BLOCK_K] at K step k0 times its FP8 scales, whose
        rows' scale rows start at the pointers `srows` [R0, R1]: SCALES (`_scale_blocks`) = 1,
        the step lies in one scale block: one scale per row; SCALES > 1, the step spans SCALES
        whole blocks: SCALES scales per row, each over its BLOCK_K / SCALES columns; 0,
        gathered per element. `ok` masks the rows. Every branch returns the tile's shape
        (Triton types a function's returns alike)."""
        if SCALES == 1:
            return wf * tl.load(srows + k0 // BK_W, mask=ok, other=0.0)[:, :, None]
        if SCALES > 1:
            SUB: tl.constexpr = BLOCK_K // SCALES
            j = tl.arange(0, SCALES)
            m = ok[:, :, None] & (k0 + j * SUB < K)[None, None, :]
            sc = tl.load(srows[:, :, None] + (k0 // BK_W + j)[None, None, :], mask=m, other=0.0)
            parts = tl.reshape(wf, (wf.shape[0], wf.shape[1], SCALES, SUB))
            return tl.reshape(parts * sc[:, :, :, None], wf.shape)
        blk = (k0 + tl.arange(0, BLOCK_K)) // BK_W
        k_ok = (k0 + tl.arange(0, BLOCK_K)) < K
        m = ok[:, :, None] & k_ok[None, None, :]
        return wf * tl.load(srows[:, :, None] + blk[None, None, :], mask=m, other=0.0)

    @triton.jit
    def _dot_rows(
        rows, vec, K, row_ok, srows, BK_W, BLOCK_K: tl.constexpr, EVEN: tl.constexpr,
        STAGES: tl.constexpr, FP8: tl.constexpr, SCALES: tl.constexpr, ROW_SCALE: tl.constexpr,
    ):  # fmt: skip
        """fp32 dot products [R0, R1] of the K-long unit-stride rows starting at the pointers
        `rows` [R0, R1] with vec [K]; row_ok [R0, R1] or [R0, 1]. Products are summed per lane
        over K and reduced once at the end. FP8: each weight times its scale (`_scaled`, scale
        rows at `srows`, BK_W columns per scale block) before the product; ROW_SCALE (the rows
        along R0 share their scales: srows [1, R1]), vec's slice times each R1 column's scales
        instead, once a step, and each weight only times that."""
        offs_k = tl.arange(0, BLOCK_K)
        ptrs = rows[:, :, None] + offs_k[None, None, :]
        acc = tl.zeros(ptrs.shape, dtype=tl.float32)
        for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            if EVEN:
                v = tl.load(vec + k0 + offs_k)
                w = tl.load(ptrs + k0)
            else:
                k_ok = k0 + offs_k < K
                v = tl.load(vec + k0 + offs_k, mask=k_ok, other=0.0)
                w = tl.load(ptrs + k0, mask=row_ok[:, :, None] & k_ok[None, None, :], other=0.0)
            wf = w.to(tl.float32)
            vf = v.to(tl.float32)[None, None, :]
            if ROW_SCALE:
                vf = tl.broadcast_to(vf, (1, srows.shape[1], BLOCK_K))
                vf = _scaled(
                    vf, srows, k0, K, tl.full(srows.shape, True, tl.int1), BLOCK_K, BK_W, SCALES
                )
            elif FP8:
                ok = tl.broadcast_to(row_ok, srows.shape)
                wf = _scaled(wf, srows, k0, K, ok, BLOCK_K, BK_W, SCALES)
            acc += wf * vf
        return tl.sum(acc, axis=2)

    @_autotune(_block_configs(DECODE_CONFIGS), ["pairs", "N", "K", "SHARED", "FP8", "BK_W"])
    @_even
    @triton.jit(do_not_specialize=["pairs"])
    def _gate_up_silu_kernel(
        x, w, ws, ids, h, pairs, N, K, s_xt, s_we, s_wn, s_hp, sc, ssc, s_se, s_sn, BN_W, BK_W,
        TOP_K: tl.constexpr, SHARED: tl.constexpr, FP8: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr, STAGES: tl.constexpr, EVEN: tl.constexpr,
        SCALES: tl.constexpr, ROW_SCALE: tl.constexpr,
    ):  # fmt: skip
        """Program (pair p, block nb): h[p, n] = silu(W[n] . x[t]) * (W[N + n] . x[t]) for
        n in [nb * BLOCK_N, (nb + 1) * BLOCK_N), t = p // P with P = TOP_K + SHARED pairs per
        token, W = w[ids[p]] for the routed pairs; with SHARED, W = ws (the shared expert's
        [2N, K], the same row stride s_wn) for pair j = p % P == TOP_K. N = I, K = H.
        `pairs` (the grid's first dim rounded up to a power of two) is only an autotune key: not
        specialised on, so that every batch size shares one binary per config. FP8: w (and ws)
        e4m3, sc the experts' scales [E, ceil(2N / BN_W), ceil(K / BK_W)] (strides s_se, s_sn)
        and ssc the shared expert's [ceil(2N / BN_W), ceil(K / BK_W)] (row stride s_sn)."""
        p, nb = tl.program_id(0), tl.program_id(1)
        per: tl.constexpr = TOP_K + SHARED
        e = tl.load(ids + p)
        base = w + e * s_we
        sbase = sc + e * s_se  # FP8 only
        if SHARED:  # that pair's id (E) is not an expert
            base = tl.where(p % per == TOP_K, ws, base)
            sbase = tl.where(p % per == TOP_K, ssc, sbase)
        offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
        rows = offs_n[:, None] + tl.arange(0, 2)[None, :] * N  # [gate row n, up row N + n]
        if ROW_SCALE:  # the tile's first gate and up rows' scale rows stand for all of them
            first = nb * BLOCK_N + tl.arange(0, 2)[None, :] * N  # [1, 2]
            srows = sbase + (first // BN_W) * s_sn
        else:
            srows = sbase + (rows // BN_W) * s_sn  # FP8 only
        rows = base + rows * s_wn
        xr = x + (p // per) * s_xt
        acc = _dot_rows(
            rows, xr, K, (offs_n < N)[:, None], srows, BK_W, BLOCK_K, EVEN, STAGES, FP8,
            SCALES, ROW_SCALE,
        )  # fmt: skip
        dt = h.dtype.element_ty
        gate, up = tl.split(acc.to(dt).to(tl.float32))
        act = (gate * tl.sigmoid(gate)).to(dt).to(tl.float32)
        tl.store(h + p * s_hp + offs_n, (act * up).to(dt), mask=offs_n < N)

    @_autotune(_block_configs(DOWN_CONFIGS), ["tokens", "N", "K", "TOP_K", "SHARED", "FP8", "BK_W"])
    @_even
    @triton.jit(do_not_specialize=["tokens"])
    def _down_sum_kernel(
        h, w, ws, ids, wts, out, tokens, N, K, s_hp, s_we, s_wn, s_ot, sc, ssc, s_se, s_sn, BN_W,
        BK_W, TOP_K: tl.constexpr, SHARED: tl.constexpr, FP8: tl.constexpr, KP: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
        EVEN: tl.constexpr, SCALES: tl.constexpr, ROW_SCALE: tl.constexpr,
    ):  # fmt: skip
        """Program (token t, block nb): out[t, n] = sum_j wts[p] * (w[e, n] . h[p]) over the
        TOP_K routed pairs p = t * P + j (P = TOP_K + SHARED), e = ids[p], for n in
        [nb * BLOCK_N, (nb + 1) * BLOCK_N); N = H, K = I. The TOP_K experts' tiles
        [KP, BLOCK_N, BLOCK_K] load together (slots j >= TOP_K repeat the last routed pair and
        are dropped); with SHARED, the shared pair p = t * P + TOP_K adds wts[p] * (ws[n] . h[p])
        from one more tile [BLOCK_N, BLOCK_K] of ws (the shared expert's [N, K], the same row
        stride s_wn). Each dot product and its product with the weight are rounded to out's dtype
        (as the reference's linear and multiply), then the terms are added in fp32 (the routed
        ones in a fixed tree, then the shared one: deterministic) and rounded once. `tokens` (the
        grid's first dim, rounded up to a power of two) is only an autotune key. FP8: w (and
        ws) e4m3, sc the experts' scales [E, ceil(N / BN_W), ceil(K / BK_W)] (strides s_se,
        s_sn) and ssc the shared expert's [ceil(N / BN_W), ceil(K / BK_W)] (row stride s_sn)."""
        t, nb = tl.program_id(0), tl.program_id(1)
        per: tl.constexpr = TOP_K + SHARED
        offs_j = tl.arange(0, KP)
        pair = t * per + tl.minimum(offs_j, TOP_K - 1)
        e = tl.load(ids + pair)
        weight = tl.load(wts + pair).to(tl.float32)
        offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        rows = w + e[:, None] * s_we + offs_n[None, :] * s_wn  # [KP, BLOCK_N]
        rows = rows[:, :, None] + offs_k[None, None, :]
        vecs = (h + pair * s_hp)[:, None, None] + offs_k[None, None, :]  # [KP, 1, BLOCK_K]
        n_ok = (offs_n < N)[None, :, None]
        if ROW_SCALE:  # [KP, 1]: each expert's scale row for all the tile's rows
            srows = sc + e[:, None] * s_se + ((nb * BLOCK_N) // BN_W) * s_sn
            s_ok = tl.full(srows.shape, True, tl.int1)
        else:
            srows = sc + e[:, None] * s_se + (offs_n // BN_W)[None, :] * s_sn  # [KP, BLOCK_N]
            s_ok = tl.broadcast_to((offs_n < N)[None, :], srows.shape)
        acc = tl.zeros([KP, BLOCK_N, BLOCK_K], dtype=tl.float32)
        if SHARED:
            s_pair = t * per + TOP_K
            s_rows = ws + offs_n[:, None] * s_wn + offs_k[None, :]  # [BLOCK_N, BLOCK_K]
            s_vec = h + s_pair * s_hp + offs_k
            s_acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
            if ROW_SCALE:
                s_srows = ssc + ((nb * BLOCK_N) // BN_W) * s_sn + tl.zeros([1, 1], tl.int32)
            else:
                s_srows = (ssc + (offs_n // BN_W) * s_sn)[None, :]  # [1, BLOCK_N], FP8 only
        for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            if EVEN:
                v = tl.load(vecs + k0)
                r = tl.load(rows + k0)
            else:
                k_ok = (k0 + offs_k < K)[None, None, :]
                v = tl.load(vecs + k0, mask=k_ok, other=0.0)
                r = tl.load(rows + k0, mask=n_ok & k_ok, other=0.0)
            rf = r.to(tl.float32)
            vf = v.to(tl.float32)  # [KP, 1, BLOCK_K]
            if ROW_SCALE:
                vf = _scaled(vf, srows, k0, K, s_ok, BLOCK_K, BK_W, SCALES)
            elif FP8:
                rf = _scaled(rf, srows, k0, K, s_ok, BLOCK_K, BK_W, SCALES)
            acc += rf * vf
            if SHARED:
                if EVEN:
                    sv = tl.load(s_vec + k0)
                    sr = tl.load(s_rows + k0)
                else:
                    sk_ok = k0 + offs_k < K
                    sv = tl.load(s_vec + k0, mask=sk_ok, other=0.0)
                    sr = tl.load(
                        s_rows + k0, mask=(offs_n < N)[:, None] & sk_ok[None, :], other=0.0
                    )
                srf = sr.to(tl.float32)
                svf = sv.to(tl.float32)[None, :]
                if ROW_SCALE:
                    every = tl.full(s_srows.shape, True, tl.int1)
                    one = _scaled(svf[None, :, :], s_srows, k0, K, every, BLOCK_K, BK_W, SCALES)
                    svf = tl.reshape(one, (1, BLOCK_K))
                elif FP8:
                    one = _scaled(srf[None, :, :], s_srows, k0, K, (offs_n < N)[None, :],
                                  BLOCK_K, BK_W, SCALES)  # fmt: skip
                    srf = tl.reshape(one, (BLOCK_N, BLOCK_K))
                s_acc += srf * svf
        dt = out.dtype.element_ty
        y = tl.sum(acc, axis=2).to(dt).to(tl.float32) * weight[:, None]  # [KP, BLOCK_N]
        y = tl.where((offs_j < TOP_K)[:, None], y.to(dt).to(tl.float32), 0.0)
        total = tl.sum(y, axis=0)
        if SHARED:
            s_weight = tl.load(wts + s_pair).to(tl.float32)
            s_y = tl.sum(s_acc, axis=1).to(dt).to(tl.float32) * s_weight
            total += s_y.to(dt).to(tl.float32)
        tl.store(out + t * s_ot + offs_n, total.to(dt), mask=offs_n < N)


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _route(logits: torch.Tensor, num_experts: int, top_k: int, shared: bool, dtype: torch.dtype):
    """`_route_kernel` on logits [N, E (+ 1)] (unit stride along the last dim) -> weights
    [N, P] dtype, ids [N, P] int64, P = top_k + shared."""
    if not 0 < top_k <= num_experts <= ROUTE_MAX_EXPERTS:
        raise ValueError(
            f"moe routing needs 0 < top_k <= E <= {ROUTE_MAX_EXPERTS}, got top_k={top_k}, "
            f"E={num_experts}"
        )
    if logits.shape[-1] != num_experts + shared:
        raise ValueError(f"router logits [N, {logits.shape[-1]}], want E + {int(shared)} columns")
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    n, per = logits.shape[0], top_k + shared
    weights = torch.empty(n, per, dtype=dtype, device=logits.device)
    ids = torch.empty(n, per, dtype=torch.int64, device=logits.device)
    _route_kernel[(n,)](
        logits, weights, ids, _pow2(n), num_experts, logits.stride(0),
        TOP_K=top_k, SHARED=int(shared), KP=_pow2(per), BLOCK_E=_pow2(num_experts),
    )  # fmt: skip
    return weights, ids


def moe_route(
    x: torch.Tensor, router_weight: torch.Tensor, top_k: int, shared: bool = False, linear=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`route_ref` in two launches: the router's linear (`linear`, default F.linear: cuBLAS, as
    the reference) and `_route_kernel`. x [N, H], router_weight [E, H] -> weights [N, top_k]
    x.dtype, ids [N, top_k] int64 (descending probability, ties to the lowest expert id).
    shared: router_weight [E + 1, H], its last row the shared expert's gate; one more pair per
    token, (E, sigmoid(x . router_weight[E])) -> weights, ids [N, top_k + 1]."""
    num_experts = router_weight.shape[0] - shared
    logits = (linear or F.linear)(x, router_weight)  # [N, E (+ 1)], last dim contiguous
    return _route(logits, num_experts, top_k, shared, x.dtype)


def _fp8_args(w: torch.Tensor | Fp8Weight) -> tuple[torch.Tensor, tuple, bool]:
    """(the weight values, the kernels' scale args (sc, s_se, s_sn, BN_W, BK_W), FP8?)."""
    if not isinstance(w, Fp8Weight):
        return w, (w, 0, 0, 1, 1), False
    s = w.scale
    if s.stride(-1) != 1:
        raise ValueError("moe_decode needs FP8 scales with unit stride along the last dim")
    return w.qweight, (s, s.stride(0), s.stride(1), *w.block), True


def _experts(
    x: torch.Tensor,
    gate_up: torch.Tensor | Fp8Weight,
    down: torch.Tensor | Fp8Weight,
    weights: torch.Tensor,
    ids: torch.Tensor,
    top_k: int,
    shared: tuple[torch.Tensor, torch.Tensor] | None,
) -> torch.Tensor:
    """The gate_up and down kernels over the pairs of (weights, ids) [N, P], P = top_k (+ 1
    when `shared` = (shared gate_up [2I, H], shared down [H, I]) is given). The expert weights
    may be FP8 (`Fp8Weight`: all of them or none; the shared expert's blocks the routed
    experts')."""
    gate_up, gate_up_scales, fp8 = _fp8_args(gate_up)
    down, down_scales, down_fp8 = _fp8_args(down)
    if fp8 != down_fp8:
        raise ValueError("moe_decode takes FP8 gate_up and down together")
    s_gate_up_scale = s_down_scale = gate_up_scales[0]  # dummies unless shared and FP8
    if shared is not None:
        (s_gate_up, su, su_fp8), (s_down, sd, sd_fp8) = map(_fp8_args, shared)
        if su_fp8 != fp8 or sd_fp8 != fp8:
            raise ValueError("the fused shared expert is FP8 exactly when the routed experts are")
        # a 2-D scale's args are (scale, row stride, 1, BN_W, BK_W); a stacked one's (scale,
        # expert stride, row stride, BN_W, BK_W)
        if fp8 and (su[3:] != gate_up_scales[3:] or sd[3:] != down_scales[3:]
                    or su[1] != gate_up_scales[2] or sd[1] != down_scales[2]):  # fmt: skip
            raise ValueError(
                "the fused FP8 shared expert needs the routed experts' scale blocks and scale row "
                f"strides: blocks {su[3:]}, {sd[3:]} vs {gate_up_scales[3:]}, {down_scales[3:]}"
            )
        s_gate_up_scale, s_down_scale = su[0], sd[0]
        shared = (s_gate_up, s_down)
    n, hidden = x.shape
    inter = down.shape[-1]
    if gate_up.stride(-1) != 1 or down.stride(-1) != 1:
        raise ValueError("moe_decode needs expert weights with unit stride along the last dim")
    s_gate_up, s_down = shared if shared is not None else (gate_up, down)  # dummies unless shared
    if shared is not None and (
        s_gate_up.shape != gate_up.shape[1:]
        or s_down.shape != down.shape[1:]
        or s_gate_up.stride() != gate_up.stride()[1:]
        or s_down.stride() != down.stride()[1:]
    ):
        raise ValueError(
            "the fused shared expert needs the routed experts' shapes and row strides: "
            f"{tuple(s_gate_up.shape)}, {tuple(s_down.shape)} vs experts {tuple(gate_up.shape)}, "
            f"{tuple(down.shape)}"
        )
    x = x if x.stride(-1) == 1 else x.contiguous()
    has_shared = int(shared is not None)
    pairs = n * (top_k + has_shared)
    h = x.new_empty(pairs, inter)
    out = x.new_empty(n, hidden)
    _gate_up_silu_kernel[lambda m: (pairs, -(-inter // m["BLOCK_N"]))](
        x, gate_up, s_gate_up, ids, h, _pow2(pairs), inter, hidden,
        x.stride(0), gate_up.stride(0), gate_up.stride(1), h.stride(0), gate_up_scales[0],
        s_gate_up_scale, *gate_up_scales[1:], TOP_K=top_k, SHARED=has_shared, FP8=int(fp8),
    )  # fmt: skip
    _down_sum_kernel[lambda m: (n, -(-hidden // m["BLOCK_N"]))](
        h, down, s_down, ids, weights, out, _pow2(n), hidden, inter,
        h.stride(0), down.stride(0), down.stride(1), out.stride(0), down_scales[0], s_down_scale,
        *down_scales[1:], TOP_K=top_k, SHARED=has_shared, FP8=int(fp8), KP=_pow2(top_k),
    )  # fmt: skip
    return out


def moe_decode(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
) -> torch.Tensor:
    """The decode path (module docstring), any N: x [N, H]; router_weight [E, H]; gate_up
    [E, 2I, H]; down [E, H, I], the weights with unit stride along the last dim. Returns
    [N, H] in x.dtype. Reads each pair's expert rows once: an expert shared by two pairs is read
    twice (from L2 at best)."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    weights, ids = moe_route(x, router_weight, top_k)
    return _experts(x, gate_up, down, weights, ids, top_k, None)


def moe_block_decode(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    shared_gate_up: torch.Tensor,
    shared_down: torch.Tensor,
    top_k: int,
    linear=None,
) -> torch.Tensor:
    """`Ops.moe_block` on the decode path (module docstring), any N, in four launches: the
    router linear over router_weight [E + 1, H] (`linear`, default F.linear), the routing
    kernel (top_k pairs + the shared one per token), gate_up + SwiGLU over all pairs, down
    summed per token. The shared expert needs the routed experts' shapes (shared_gate_up
    [2I, H], shared_down [H, I]) and row strides, and is FP8 exactly when they are
    (`block_fusable` checks all it needs)."""
    moe_block_experts(router_weight, gate_up)  # router [E + 1, H], else ValueError
    x = x if x.stride(-1) == 1 else x.contiguous()
    weights, ids = moe_route(x, router_weight, top_k, shared=True, linear=linear)
    return _experts(x, gate_up, down, weights, ids, top_k, (shared_gate_up, shared_down))


def _decode_sized(x: torch.Tensor, top_k: int) -> bool:
    return x.dtype in DECODE_DTYPES and x.shape[0] * top_k <= DECODE_PAIRS


def block_fusable(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    gate_up: torch.Tensor | Fp8Weight,
    down: torch.Tensor | Fp8Weight,
    shared_gate_up: torch.Tensor | Fp8Weight,
    shared_down: torch.Tensor | Fp8Weight,
    top_k: int,
) -> bool:
    """Whether `moe_block_decode` takes this MoE block (`Ops.moe_block`'s arguments): inputs
    decode-sized as for `moe_grouped`, router_weight [E + 1, H] with E <= ROUTE_MAX_EXPERTS,
    expert weights with unit stride along the last dim, and a shared expert with the routed
    experts' shapes and row strides; FP8 (`Fp8Weight`) all four or none, the shared expert's
    blocks and scale row strides those of the routed experts. Shapes, strides and dtypes
    only: a captured graph replays the choice it was captured with."""
    weights = (gate_up, down, shared_gate_up, shared_down)
    fp8 = [isinstance(w, Fp8Weight) for w in weights]
    if any(fp8) and not all(fp8):
        return False
    if all(fp8):
        if shared_gate_up.block != gate_up.block or shared_down.block != down.block:
            return False
        scales = [w.scale for w in weights]
        if any(sc.stride(-1) != 1 for sc in scales):
            return False
        if scales[2].stride(0) != scales[0].stride(1) or scales[3].stride(0) != scales[1].stride(1):
            return False
        gate_up, down, shared_gate_up, shared_down = (w.qweight for w in weights)
    num_experts = gate_up.shape[0]
    return (
        _decode_sized(x, top_k)
        and router_weight.shape[0] == num_experts + 1
        and num_experts <= ROUTE_MAX_EXPERTS
        and gate_up.stride(-1) == 1
        and down.stride(-1) == 1
        and shared_gate_up.shape == gate_up.shape[1:]
        and shared_down.shape == down.shape[1:]
        and shared_gate_up.stride() == gate_up.stride()[1:]
        and shared_down.stride() == down.stride()[1:]
    )


def moe_grouped(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
) -> torch.Tensor:
    """`ninfer.ops.base.Ops.moe`: x [N, H]; gate_up [E, 2I, H]; down [E, H, I] -> [N, H].
    The decode path up to DECODE_PAIRS pairs, else `moe_grouped_mm`."""
    if _decode_sized(x, top_k):
        return moe_decode(x, router_weight, gate_up, down, top_k)
    return moe_grouped_mm(x, router_weight, gate_up, down, top_k)


def moe_fp8(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    gate_up: torch.Tensor | Fp8Weight,
    down: torch.Tensor | Fp8Weight,
    top_k: int,
) -> torch.Tensor:
    """`moe_grouped` over FP8 experts: decode-sized inputs with both projections FP8 run the
    decode kernels on the e4m3 weights (scaled in fp32 as they are read: module docstring),
    larger ones the FP8 grouped GEMM (`moe_grouped_fp8`) where it takes the weights, the rest
    `moe_dequantized`."""
    both = isinstance(gate_up, Fp8Weight) and isinstance(down, Fp8Weight)
    if both and _decode_sized(x, top_k):
        return moe_decode(x, router_weight, gate_up, down, top_k)
    grouped = grouped_fp8 is not None and both
    if grouped and grouped_fp8.fits(x.dtype, gate_up) and grouped_fp8.fits(x.dtype, down):
        return moe_grouped_fp8(x, router_weight, gate_up, down, top_k)
    return moe_dequantized(x, router_weight, gate_up, down, top_k)


def _sorted_pairs(weights: torch.Tensor, ids: torch.Tensor, num_experts: int):
    """The routed (token, expert) pairs (`route_ref`'s weights and ids [N, top_k]) sorted by
    expert, on the device: (their routing weights [N * top_k, 1] in sorted order, each sorted
    pair's token, per-expert pair counts [E] int32)."""
    flat = ids.reshape(-1)
    n, top_k = ids.shape
    token = torch.arange(n, device=ids.device).repeat_interleave(top_k)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int32, device=ids.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    return weights.reshape(-1, 1)[order], token[order], counts


def moe_grouped_fp8(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    gate_up: Fp8Weight,
    down: Fp8Weight,
    top_k: int,
) -> torch.Tensor:
    """`moe_grouped_mm` with `grouped_fp8.grouped_fp8` for the two grouped GEMMs: each e4m3
    expert weight read as it is (scaled in the kernel), none expanded to x.dtype. The same
    roundings as `moe_grouped_mm` on the dequantised weights (each projection's output to
    x.dtype, SwiGLU in x.dtype, the routing weight's product rounded)."""
    pairs = x.shape[0] * top_k
    w, tok, counts = _sorted_pairs(*route_ref(x, router_weight, top_k), gate_up.shape[0])
    bm = grouped_fp8.block_m(pairs, gate_up.shape[0])
    offs, block_end = grouped_fp8.block_table(counts, bm)
    gate, up = grouped_fp8.grouped_fp8(x, tok, gate_up, offs, block_end, bm, pairs).chunk(2, -1)
    h = F.silu(gate) * up
    y = grouped_fp8.grouped_fp8(h, None, down, offs, block_end, bm, pairs, w.reshape(-1))
    return torch.zeros_like(x).index_add_(0, tok, y)


def moe_dequantized(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    gate_up: torch.Tensor | Fp8Weight,
    down: torch.Tensor | Fp8Weight,
    top_k: int,
) -> torch.Tensor:
    """`moe_grouped` over FP8 expert weights, without host syncs: fewer (token, expert) pairs
    than experts dequantise each pair's expert (to x.dtype) and multiply in one bmm per
    projection; more dequantise every expert once and run `moe_grouped_mm`. Correct, not fast
    (the weights are expanded per call)."""
    num_experts = gate_up.shape[0]
    if x.shape[0] * top_k >= num_experts:
        return moe_grouped_mm(
            x, router_weight, _dense(gate_up, None, x.dtype), _dense(down, None, x.dtype), top_k
        )
    weights, ids = route_ref(x, router_weight, top_k)
    flat = ids.reshape(-1)
    token = torch.arange(x.shape[0], device=x.device).repeat_interleave(top_k)
    gate_up_p, down_p = _dense(gate_up, flat, x.dtype), _dense(down, flat, x.dtype)
    gate, up = torch.bmm(gate_up_p, x[token, :, None]).squeeze(-1).chunk(2, dim=-1)
    y = torch.bmm(down_p, (F.silu(gate) * up)[:, :, None]).squeeze(-1) * weights.reshape(-1, 1)
    return torch.zeros_like(x).index_add_(0, token, y.to(x.dtype))


def _dense(w: torch.Tensor | Fp8Weight, rows: torch.Tensor | None, dtype: torch.dtype):
    """Stacked expert weights (those at `rows`, or all) in `dtype`."""
    if isinstance(w, Fp8Weight):
        picked = w if rows is None else Fp8Weight(w.qweight[rows], w.scale[rows], w.block)
        return picked.dequantize(dtype)
    return w if rows is None else w[rows]


def moe_grouped_mm(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
) -> torch.Tensor:
    """The grouped and bmm paths (module docstring), any N; shapes as `moe_grouped`."""
    n, num_experts = x.shape[0], gate_up.shape[0]
    weights, ids = route_ref(x, router_weight, top_k)  # [N, k] x.dtype, int64
    flat = ids.reshape(-1)
    w = weights.reshape(-1, 1)
    token = torch.arange(n, device=x.device).repeat_interleave(top_k)
    if x.dtype != torch.bfloat16 or not hasattr(torch, "_grouped_mm"):
        gate, up = torch.bmm(gate_up[flat], x[token, :, None]).squeeze(-1).chunk(2, dim=-1)
        y = torch.bmm(down[flat], (F.silu(gate) * up)[:, :, None]).squeeze(-1) * w
        return torch.zeros_like(x).index_add_(0, token, y.to(x.dtype))
    w_sorted, tok, counts = _sorted_pairs(weights, ids, num_experts)
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    gate, up = torch._grouped_mm(x[tok], gate_up.transpose(-2, -1), offs=offs).chunk(2, dim=-1)
    y = torch._grouped_mm(F.silu(gate) * up, down.transpose(-2, -1), offs=offs) * w_sorted
    return torch.zeros_like(x).index_add_(0, tok, y.to(x.dtype))
