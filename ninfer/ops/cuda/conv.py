"""Causal depthwise conv1d + SiLU over ragged rows with a slot-indexed state, in Triton.

Prefill, two launches per call: `_conv_out_kernel` computes every token's output, reading the
K-1 inputs before a row's chunk from the row's state slot; then `_conv_state_kernel` writes
each row's last K-1 inputs back to its slot (a second launch, so no program overwrites a state
that another still reads). Decode (one token per row, every row continuing), one launch:
`_conv_decode_kernel` computes the output and shifts the state of its (row, channel block),
which no other program reads; no host-built index and no host sync, so it can be captured in a
CUDA graph. Math in fp32, as the reference.

`causal_conv_qkv` is the prefill for a GDN layer's fused q | k | v channels: the output kernel
writes q, k (L2-normalised per head) and v as three contiguous tensors, which is what fla's
chunked kernels read; a separate split, `.contiguous()` and l2norm would move the conv output
through memory four more times (27B, 8k tokens: ~470 MB per layer).

A pass with state taps (the prefix cache's in-pass snapshots, the speculative verify's rows)
also writes the conv state at each tap: `tap_init` reads the near taps' initial states before
the conv (one launch), `write_taps` gathers each tap's K-1 inputs into its slot after it (one
launch); on every GDN layer of a verify pass, so launches, not bytes, are what they cost.
Knows nothing about the model.

Inputs of row r (W = K - 1), token i of the row is x[cu_q[r] + i]:

    U_r    | state[slot_r] (W, zeros if fresh) | x of row r (q_r) |
    y[cu_q[r] + i] = silu(sum_j w[:, j] * U_r[i + j]);  new state[slot_r] = U_r[q_r : q_r + W]
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ninfer.forward import ForwardBatch
from ninfer.ops.cuda.gdn import L2_EPS  # the GDN's q / k l2norm eps (fla's, the reference's)
from ninfer.ops.cuda.passmeta import PassMeta, TapIndex


class Tile(NamedTuple):
    """The prefill output kernel's launch shape: `rows` tokens x `chans` channels per program
    (`chans` a multiple of the GDN head dim when it writes q | k | v) and `warps`."""

    rows: int
    chans: int
    warps: int


# The prefill tile, chosen over the block shapes `tools/device/bench_gdn_glue.py` times at the
# 9B's and 27B's GDN channel counts, x a strided view of the in_proj (docs/results-h200.md,
# "Conv tiles"). A variant walking each tile's tokens in order, every input
# loaded once into registers, was slower than every tile shape: the K shifted loads of a tile
# hit the cache.
TILE = Tile(16, 256, 4)
HEAD = 128  # the GDN head dim that causal_conv_qkv normalises over
BLOCK_C = 128  # decode and state kernels: channels per program


@triton.jit
def _emit(
    acc, tx, t_ok, c, c0, c_ok, y, yk, yv, key_dim, value_dim, s_yt,
    QKV: tl.constexpr, HEAD: tl.constexpr, EPS: tl.constexpr,
):  # fmt: skip
    """Stores silu(acc) of tokens tx x channels c: y [T, C] with row stride s_yt, or with QKV
    into q = y, k = yk [T, key_dim] or v = yv [T, value_dim] of `causal_conv_qkv` (the tile
    inside one part), q and k L2-normalised per HEAD channels from the output rounded to y's
    dtype. Each part is its own pointer argument (Triton specialises each on its alignment),
    not an offset of part * n_tok * key_dim into one buffer."""
    out = (acc * tl.sigmoid(acc)).to(y.dtype.element_ty)
    m_y = t_ok[:, None] & c_ok[None, :]
    if QKV:
        if c0 < 2 * key_dim:  # q or k heads: l2norm over each head's channels, in fp32
            rows: tl.constexpr = acc.shape[0]
            chans: tl.constexpr = acc.shape[1]
            xf = tl.reshape(out.to(tl.float32), (rows, chans // HEAD, HEAD))
            xf = xf * (1.0 / tl.sqrt(tl.sum(xf * xf, axis=2) + EPS))[:, :, None]
            out = tl.reshape(xf, (rows, chans)).to(y.dtype.element_ty)
            if c0 < key_dim:
                tl.store(y + tx[:, None] * key_dim + c[None, :], out, mask=m_y)
            else:
                tl.store(yk + tx[:, None] * key_dim + (c - key_dim)[None, :], out, mask=m_y)
        else:
            dst = yv + tx[:, None] * value_dim + (c - 2 * key_dim)[None, :]
            tl.store(dst, out, mask=m_y)
    else:
        tl.store(y + tx[:, None] * s_yt + c[None, :], out, mask=m_y)


@triton.jit(do_not_specialize=["n_tok"])  # one compiled variant for every pass length
def _conv_out_kernel(
    x, w, state, y, yk, yv, tok_row, cu, slots, has_state, n_tok, n_ch, key_dim, value_dim,
    s_xt, s_yt, s_wc, s_st0, s_st1, s_st2,
    K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, HEAD: tl.constexpr,
    QKV: tl.constexpr, EPS: tl.constexpr,
):  # fmt: skip
    """Tile (tokens, channels); see `Tile` and `_emit`. QKV: the channels are q | k | v of
    `key_dim`, `key_dim` and `value_dim` (multiples of BC), written to the contiguous q = y,
    k = yk [T, key_dim] and v = yv [T, value_dim]. Else y [T, C] with row stride s_yt (yk and
    yv unused)."""
    t0 = tl.program_id(0) * BT
    t = t0 + tl.arange(0, BT)
    c0 = tl.program_id(1) * BC
    c = c0 + tl.arange(0, BC)
    t_ok, c_ok = t < n_tok, c < n_ch
    tx = t.to(tl.int64)
    # the common tile: its tokens and the K - 1 before them in one row (two scalar loads, so
    # that its x loads wait on nothing else)
    last = tl.load(tok_row + tl.minimum(t0 + BT, n_tok) - 1)
    inside = (t0 >= K - 1) & (tl.load(tok_row + tl.maximum(t0 - (K - 1), 0)) == last)
    if inside:  # K shifted loads of the tile (the state terms are 0)
        acc = tl.zeros((BT, BC), dtype=tl.float32)
        for j in tl.static_range(K):
            m_x = t_ok[:, None] & c_ok[None, :]
            xp = x + (tx + j - (K - 1))[:, None] * s_xt + c[None, :]
            xv = tl.load(xp, mask=m_x, other=0.0)
            wj = tl.load(w + c * s_wc + j, mask=c_ok, other=0.0).to(tl.float32)
            acc += xv.to(tl.float32) * wj[None, :]
        _emit(acc, tx, t_ok, c, c0, c_ok, y, yk, yv, key_dim, value_dim, s_yt, QKV, HEAD, EPS)
    else:  # a token of the tile reads its row's state, or the tile holds two rows
        row = tl.load(tok_row + t, mask=t_ok, other=0)
        i = t - tl.load(cu + row, mask=t_ok, other=0)
        has = tl.load(has_state + row, mask=t_ok, other=0) != 0
        slot = tl.load(slots + row, mask=t_ok, other=0).to(tl.int64)
        acc = tl.zeros((BT, BC), dtype=tl.float32)
        for j in tl.static_range(K):
            p = i + j - (K - 1)  # position in the chunk; < 0: from the state
            m_x = (t_ok & (p >= 0))[:, None] & c_ok[None, :]
            m_s = (t_ok & (p < 0) & has)[:, None] & c_ok[None, :]
            xv = tl.load(x + (tx + j - (K - 1))[:, None] * s_xt + c[None, :], mask=m_x, other=0.0)
            sp = state + slot[:, None] * s_st0 + c[None, :] * s_st1 + (i + j)[:, None] * s_st2
            sv = tl.load(sp, mask=m_s, other=0.0)
            wj = tl.load(w + c * s_wc + j, mask=c_ok, other=0.0).to(tl.float32)
            acc += (xv.to(tl.float32) + sv.to(tl.float32)) * wj[None, :]
        _emit(acc, tx, t_ok, c, c0, c_ok, y, yk, yv, key_dim, value_dim, s_yt, QKV, HEAD, EPS)


@triton.jit
def _conv_state_kernel(
    x, state, cu, slots, has_state, n_ch, s_xt, s_st0, s_st1, s_st2,
    W: tl.constexpr, WP: tl.constexpr, BC: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    m = tl.arange(0, WP)
    start = tl.load(cu + r)
    q_len = tl.load(cu + r + 1) - start
    has = tl.load(has_state + r) != 0
    slot = tl.load(slots + r).to(tl.int64)
    p = q_len + m - W  # position in the chunk of new state column m; < 0: old state column
    ok = (m < W)[None, :] & (c < n_ch)[:, None]
    from_x = (p >= 0)[None, :]
    xv = tl.load(x + (start + p)[None, :] * s_xt + c[:, None], mask=ok & from_x, other=0.0)
    base = state + slot * s_st0 + c[:, None] * s_st1
    sv = tl.load(base + (q_len + m)[None, :] * s_st2, mask=ok & ~from_x & has, other=0.0)
    new = tl.where(from_x, xv.to(state.dtype.element_ty), sv)
    tl.store(base + m[None, :] * s_st2, new, mask=ok)


@triton.jit
def _conv_decode_kernel(
    x, w, state, y, slots, n_ch, s_xt, s_yt, s_wc, s_st0, s_st1, s_st2,
    W: tl.constexpr, WP: tl.constexpr, BC: tl.constexpr,
):  # fmt: skip
    """Row r's one token: y = silu(w[:, :W] . state + w[:, W] x); state <- state[1:] | x."""
    r = tl.program_id(0)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    m = tl.arange(0, WP)
    c_ok = c < n_ch
    ok = c_ok[:, None] & (m < W)[None, :]
    slot = tl.load(slots + r).to(tl.int64)
    base = state + slot * s_st0 + c[:, None] * s_st1
    sv = tl.load(base + m[None, :] * s_st2, mask=ok, other=0.0)  # [BC, WP] oldest first
    xv = tl.load(x + r * s_xt + c, mask=c_ok, other=0.0)
    acc = tl.zeros((BC,), dtype=tl.float32)
    for j in tl.static_range(W):  # in tap order, as the prefill kernel sums
        sj = tl.sum(tl.where(m[None, :] == j, sv.to(tl.float32), 0.0), axis=1)
        acc += sj * tl.load(w + c * s_wc + j, mask=c_ok, other=0.0).to(tl.float32)
    acc += xv.to(tl.float32) * tl.load(w + c * s_wc + W, mask=c_ok, other=0.0).to(tl.float32)
    tl.store(y + r * s_yt + c, (acc * tl.sigmoid(acc)).to(y.dtype.element_ty), mask=c_ok)
    shifted = tl.load(base + (m + 1)[None, :] * s_st2, mask=ok & (m < W - 1)[None, :], other=0.0)
    new = tl.where((m == W - 1)[None, :], xv.to(state.dtype.element_ty)[:, None], shifted)
    tl.store(base + m[None, :] * s_st2, new, mask=ok)


def causal_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    batch: ForwardBatch,
    meta: PassMeta | None = None,
    tile: Tile = TILE,
) -> torch.Tensor:
    """`ninfer.ops.base.Ops.causal_conv`: x [T, C] (unit channel stride); weight [C, K];
    conv_state [slots, C, K-1] (any strides) read and written at batch.state_slots, zeros for
    rows with ctx_lens == 0. `meta`: the pass's `PassMeta`, shared by its GDN layers (built
    here when None; unused by decode). `tile`: the prefill launch shape (a tuning knob; every
    tile gives the same values). Returns y [T, C] in x.dtype."""
    n_tok, n_ch = x.shape
    width = weight.shape[1]
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("causal_conv needs unit channel stride in x and weight")
    slots = batch.state_slots
    y = torch.empty_like(x)
    if batch.is_decode:
        _conv_decode_kernel[(n_tok, triton.cdiv(n_ch, BLOCK_C))](
            x, weight, conv_state, y, slots, n_ch,
            x.stride(0), y.stride(0), weight.stride(0), *conv_state.stride(),
            W=width - 1, WP=triton.next_power_of_2(width), BC=BLOCK_C,
        )  # fmt: skip
        return y
    _prefill(x, weight, conv_state, (y, y, y), batch, meta, None, tile)
    return y


def splits_heads(n_ch: int, key_dim: int, head_dim: int) -> bool:
    """Whether `causal_conv_qkv` serves channels q | k | v of key_dim, key_dim and the rest:
    heads of HEAD channels, the three parts whole heads."""
    value_dim = n_ch - 2 * key_dim
    heads = key_dim % HEAD == 0 and value_dim % HEAD == 0
    return head_dim == HEAD and heads and key_dim > 0 and value_dim > 0


def _fit(tile: Tile, parts: tuple[int, ...]) -> Tile:
    """`tile` narrowed to one head of channels where its channels do not divide every part:
    a tile must lie in one of q, k, v."""
    return tile._replace(chans=HEAD) if any(p % tile.chans for p in parts) else tile


def causal_conv_qkv(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    batch: ForwardBatch,
    meta: PassMeta,
    key_dim: int,
    head_dim: int,
    tile: Tile = TILE,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A prefill pass's `causal_conv` of the GDN's fused q | k | v channels, split into heads:
    q, k [T, key_dim / head_dim, head_dim] L2-normalised per head (eps 1e-6, from the conv
    output rounded to x.dtype), v [T, value_dim / head_dim, head_dim], each contiguous, written
    by the conv kernel itself (no split copies, no l2norm passes). Needs `splits_heads`.
    `tile` as `causal_conv`'s."""
    n_tok, n_ch = x.shape
    if not splits_heads(n_ch, key_dim, head_dim):
        raise ValueError(f"causal_conv_qkv: {n_ch} channels, key_dim {key_dim}, dk {head_dim}")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("causal_conv_qkv needs unit channel stride in x and weight")
    value_dim = n_ch - 2 * key_dim
    flat = torch.empty(n_tok * n_ch, dtype=x.dtype, device=x.device)
    q, k, v = flat.split([n_tok * key_dim, n_tok * key_dim, n_tok * value_dim])
    _prefill(x, weight, conv_state, (q, k, v), batch, meta, (key_dim, value_dim), tile)
    return q.view(n_tok, -1, head_dim), k.view(n_tok, -1, head_dim), v.view(n_tok, -1, head_dim)


def _prefill(x, weight, conv_state, out, batch, meta, qkv: tuple[int, int] | None, tile) -> None:
    """The prefill's two launches (module docstring); `qkv` = (key_dim, value_dim): `out` is
    the contiguous (q, k, v) of `causal_conv_qkv`, else (y, y, y) with y [T, C]."""
    n_tok, n_ch = x.shape
    width = weight.shape[1]
    slots = batch.state_slots
    meta = meta or PassMeta.of(batch.q_lens, batch.ctx_lens, x.device)
    tok_row, has_state, cu = meta.tok_row, meta.has_state, meta.cu_seqlens
    key_dim, value_dim = qkv or (0, 0)
    tile = _fit(tile, qkv or ())
    grid = (triton.cdiv(n_tok, tile.rows), triton.cdiv(n_ch, tile.chans))
    _conv_out_kernel[grid](
        x, weight, conv_state, *out, tok_row, cu, slots, has_state, n_tok, n_ch, key_dim,
        value_dim, x.stride(0), out[0].stride(0) if qkv is None else 0, weight.stride(0),
        *conv_state.stride(),
        K=width, BT=tile.rows, BC=tile.chans, HEAD=HEAD, QKV=qkv is not None,
        EPS=L2_EPS, num_warps=tile.warps,
    )  # fmt: skip
    _conv_state_kernel[(batch.num_rows, triton.cdiv(n_ch, BLOCK_C))](
        x, conv_state, cu, slots, has_state, n_ch, x.stride(0), *conv_state.stride(),
        W=width - 1, WP=triton.next_power_of_2(width - 1), BC=BLOCK_C,
    )  # fmt: skip


def tap_init(conv_state: torch.Tensor, slots: torch.Tensor, meta) -> torch.Tensor | None:
    """The initial conv state [j, C, K-1] of the rows of the pass's taps near their row's start
    (`TapIndex.near`; zeros for a fresh row), read before the conv overwrites the rows' slots;
    None without such taps. `meta`: the pass's `PassMeta`. On CUDA one launch
    (`_tap_init_kernel`), elsewhere torch ops (`tap_init_ref`): the same values."""
    taps = meta.taps
    if taps is None or taps.near is None:
        return None
    if not conv_state.is_cuda:
        return tap_init_ref(conv_state, slots, meta)
    return _tap_init(conv_state, slots, meta)


def tap_init_ref(conv_state: torch.Tensor, slots: torch.Tensor, meta) -> torch.Tensor:
    """`tap_init` in torch ops (off CUDA, and the kernel's oracle); the pass has near taps."""
    rows = meta.taps.near.row
    return conv_state[slots[rows]] * meta.has_state[rows, None, None].to(conv_state.dtype)


def _tap_init(conv_state: torch.Tensor, slots: torch.Tensor, meta) -> torch.Tensor:
    rows = meta.taps.near.row
    j, (_, n_ch, w) = rows.shape[0], conv_state.shape
    init = torch.empty(j, n_ch, w, dtype=conv_state.dtype, device=conv_state.device)
    _tap_init_kernel[(j, triton.cdiv(n_ch, BLOCK_C))](
        conv_state, slots, rows, meta.has_state, init, n_ch, *conv_state.stride(),
        W=w, WP=triton.next_power_of_2(w), BC=BLOCK_C,
    )  # fmt: skip
    return init


@triton.jit
def _tap_init_kernel(
    conv_state, slots, rows, has_state, init, C, s_ss, s_sc, s_sw,
    W: tl.constexpr, WP: tl.constexpr, BC: tl.constexpr,
):  # fmt: skip
    """Program (near tap jj, channel block): init[jj, c, :] = conv_state[slots[r], c, :] *
    has_state[r] (r the tap's row; the product in the state's dtype, as the torch ops)."""
    jj, cb = tl.program_id(0), tl.program_id(1)
    r = tl.load(rows + jj)
    slot = tl.load(slots + r).to(tl.int64)
    keep = tl.load(has_state + r).to(init.dtype.element_ty)
    c = cb * BC + tl.arange(0, BC)
    w = tl.arange(0, WP)
    ok = (c < C)[:, None] & (w < W)[None, :]
    vals = tl.load(conv_state + slot * s_ss + c[:, None] * s_sc + w[None, :] * s_sw, mask=ok)
    dst = init + jj * C * W + c[:, None] * W + w[None, :]
    tl.store(dst, (vals * keep).to(init.dtype.element_ty), mask=ok)


def write_taps(
    x: torch.Tensor,
    width: int,
    conv_state: torch.Tensor,
    taps: TapIndex,
    init: torch.Tensor | None = None,
) -> None:
    """The conv state at each state tap (`forward.StateTap`): the K-1 inputs before it, taken
    from the pass's own inputs x [T, C], into conv_state[slot] [C, K-1]; those of a tap fewer
    than K-1 tokens into its row from `init` (`tap_init`, the row's initial state: its
    column K-1 + p holds the input at position p < 0 of the row), rounded to x's dtype as the
    pass's inputs are. Through an index made once per pass (`_tap_sources`); no host sync. On
    CUDA one launch (`_write_taps_kernel`), elsewhere a gather and a scatter in torch ops
    (`write_taps_ref`): the same values."""
    if not x.is_cuda:
        write_taps_ref(x, width, conv_state, taps, init)
        return
    _write_taps(x, width, conv_state, taps, init)


def _write_taps(x, width, conv_state, taps, init) -> None:
    w, (n_tok, n_ch) = width - 1, x.shape
    src = _tap_sources(taps, w, n_tok)
    n = taps.slot.shape[0]
    if n == 0:
        return
    # init's rows are read as a contiguous [j, C, W]; without near taps no source points there
    held = init.contiguous() if init is not None else conv_state  # (a stand-in, never read)
    _write_taps_kernel[(n, triton.cdiv(n_ch, BLOCK_C))](
        x, held, src, taps.slot, conv_state, n_tok, n_ch, x.stride(0), x.stride(1),
        *conv_state.stride(), W=w, WP=triton.next_power_of_2(w), BC=BLOCK_C,
    )  # fmt: skip


def write_taps_ref(
    x: torch.Tensor,
    width: int,
    conv_state: torch.Tensor,
    taps: TapIndex,
    init: torch.Tensor | None = None,
) -> None:
    """`write_taps` in torch ops (off CUDA, and the kernel's oracle)."""
    w, n_ch = width - 1, x.shape[1]
    src = _tap_sources(taps, w, x.shape[0])
    if init is not None:  # init's rows [j * (K-1), C] after x's
        x = torch.cat([x, init.transpose(1, 2).to(x.dtype).reshape(-1, n_ch)])
    cols = x.index_select(0, src).view(-1, w, n_ch)
    conv_state[taps.slot] = cols.transpose(1, 2).to(conv_state.dtype)


@triton.jit
def _write_taps_kernel(
    x, init, src, slot, conv_state, T, C, s_xt, s_xc, s_ss, s_sc, s_sw,
    W: tl.constexpr, WP: tl.constexpr, BC: tl.constexpr,
):  # fmt: skip
    """Program (tap n, channel block): conv_state[slot[n], c, i] = the i-th source of the tap,
    src[n * W + i]: x's token s (s < T) or column (s - T) % W of near tap (s - T) // W's
    initial state init [j, C, W] (contiguous), rounded to x's dtype first."""
    n, cb = tl.program_id(0), tl.program_id(1)
    c = cb * BC + tl.arange(0, BC)
    i = tl.arange(0, WP)
    i_ok = i < W
    s = tl.load(src + n * W + i, mask=i_ok, other=0)  # [WP] int64
    from_x = s < T
    r = tl.where(from_x, 0, s - T)
    ok = i_ok[:, None] & (c < C)[None, :]
    xv = tl.load(x + s[:, None] * s_xt + c[None, :] * s_xc, mask=ok & from_x[:, None])
    iv = tl.load(
        init + (r // W)[:, None] * (C * W) + c[None, :] * W + (r % W)[:, None],
        mask=ok & ~from_x[:, None],
    ).to(x.dtype.element_ty)
    v = tl.where(from_x[:, None], xv, iv).to(conv_state.dtype.element_ty)
    dst = conv_state + tl.load(slot + n).to(tl.int64) * s_ss
    tl.store(dst + c[None, :] * s_sc + i[:, None] * s_sw, v, mask=ok)


def _tap_sources(taps: TapIndex, w: int, n_tok: int) -> torch.Tensor:
    """[n * w] int64: for column i of tap n (the input at position o - w + i of its row, o the
    tap's offset), its row in cat(x [n_tok, C], the near taps' initial states [j * w, C]): the
    pass's token cut - w + i, or, at a position before the row's start, column w + p of the
    near tap's initial state. The same for every layer of a pass: made at the first, kept on
    the `TapIndex` (in a CUDA graph: the captured pass's constant index)."""
    key = ("conv", w, n_tok)
    src = taps.derived.get(key)
    if src is None:
        back = torch.arange(-w, 0, device=taps.cut.device)
        src = taps.cut[:, None] + back  # [n, w]; past the row's start for near taps only
        near = taps.near
        if near is not None:
            pos = near.offset[:, None] + back  # [j, w]: each column's position in its row
            j = torch.arange(near.index.shape[0], device=src.device)[:, None]
            before = n_tok + j * w + (pos + w)
            src[near.index] = torch.where(pos < 0, before, src[near.index])
        src = taps.derived[key] = src.flatten()
    return src
