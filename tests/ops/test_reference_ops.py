"""ReferenceOps and the pure reference functions against independent formulations (CPU, fp32)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ninfer.ops.reference import (
    ReferenceOps,
    causal_conv1d_ref,
    causal_conv1d_update_ref,
    chunk_gated_delta_rule_ref,
    gated_rms_norm_ref,
    moe_block_ref,
    moe_ref,
    paged_attention_ref,
    recurrent_gated_delta_rule_ref,
    rms_norm_ref,
    write_kv_ref,
)
from tests.models.util import Row, make_batch


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _gdn_inputs(t, hk, hv, dk, dv, seed=0, batch=1):
    g = _gen(seed)
    q, k = (torch.randn(batch, t, hk, dk, generator=g) for _ in range(2))
    v = torch.randn(batch, t, hv, dv, generator=g)
    decay = -torch.rand(batch, t, hv, generator=g) * 0.5
    beta = torch.rand(batch, t, hv, generator=g)
    state = torch.randn(batch, hv, dk, dv, generator=g)
    return q, k, v, decay, beta, state


@pytest.mark.parametrize("t", [1, 5, 63, 64, 65, 150])
@pytest.mark.parametrize("heads", [(2, 2), (1, 3), (2, 4)], ids=["hk=hv", "hv=3hk", "hv=2hk"])
def test_chunked_gdn_matches_recurrent(t, heads):
    q, k, v, g, beta, s0 = _gdn_inputs(t, *heads, dk=16, dv=8, batch=2)
    o_c, s_c = chunk_gated_delta_rule_ref(q, k, v, g, beta, 0.25, s0)
    o_r, s_r = recurrent_gated_delta_rule_ref(q, k, v, g, beta, 0.25, s0)
    assert s_c.dtype == torch.float32 and o_c.shape == v.shape
    torch.testing.assert_close(o_c, o_r, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(s_c, s_r, atol=2e-5, rtol=1e-5)


def test_chunked_gdn_matches_recurrent_on_correlated_keys():
    """A repeated token's chunk: keys nearly parallel, beta near 1, little decay, so the
    chunk's (I + A) is close to singular-looking (A ~ beta x the all-ones lower triangle). The
    reference's triangular solve still matches the recurrent form: it is the oracle the GPU
    test of this case (`test_gdn_prefill_is_stable_on_correlated_keys`) compares against,
    where a matmul-product inverse was off by ~1e5."""
    g = _gen(3)
    t, hk, hv, dk, dv = 150, 2, 4, 32, 16

    def near(direction, noise):
        return direction + noise * torch.randn(1, t, *direction.shape[2:], generator=g)

    q = near(torch.randn(1, 1, hk, dk, generator=g), 0.05)
    k = near(torch.randn(1, 1, hk, dk, generator=g), 0.05)
    v = near(torch.randn(1, 1, hv, dv, generator=g), 0.1)
    decay = torch.full((1, t, hv), -0.01)
    beta = 0.9 + 0.09 * torch.rand(1, t, hv, generator=g)
    s0 = torch.randn(1, hv, dk, dv, generator=g)
    o_c, s_c = chunk_gated_delta_rule_ref(q, k, v, decay, beta, 0.25, s0)
    o_r, s_r = recurrent_gated_delta_rule_ref(q, k, v, decay, beta, 0.25, s0)
    torch.testing.assert_close(o_c, o_r, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(s_c, s_r, atol=1e-4, rtol=1e-4)


def test_recurrent_gdn_matches_explicit_loop():
    q, k, v, g, beta, s0 = _gdn_inputs(7, 2, 4, 8, 8)
    o, s_final = recurrent_gated_delta_rule_ref(q, k, v, g, beta, 0.3, s0)
    s = s0[0].clone()
    for t in range(7):
        for j in range(4):
            qt, kt = (
                F.normalize(q[0, t, j // 2], dim=0, eps=0) * 0.3,
                F.normalize(k[0, t, j // 2], dim=0, eps=0),
            )
            s[j] *= g[0, t, j].exp()
            s[j] += torch.outer(kt, beta[0, t, j] * (v[0, t, j] - s[j].T @ kt))
            torch.testing.assert_close(o[0, t, j], s[j].T @ qt, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s_final[0], s, atol=1e-5, rtol=1e-5)


def test_chunked_gdn_split_with_state_equals_whole():
    q, k, v, g, beta, s0 = _gdn_inputs(130, 2, 4, 16, 8)
    whole, s_whole = chunk_gated_delta_rule_ref(q, k, v, g, beta, 0.25, s0)
    a, s_a = chunk_gated_delta_rule_ref(*(x[:, :70] for x in (q, k, v, g, beta)), 0.25, s0)
    b, s_b = chunk_gated_delta_rule_ref(*(x[:, 70:] for x in (q, k, v, g, beta)), 0.25, s_a)
    torch.testing.assert_close(torch.cat([a, b], dim=1), whole, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(s_b, s_whole, atol=2e-5, rtol=1e-5)


def test_conv_matches_torch_conv1d_and_splits():
    g = _gen(1)
    x, w = torch.randn(40, 12, generator=g), torch.randn(12, 4, generator=g)
    y, final = causal_conv1d_ref(x, w)
    want = F.silu(F.conv1d(x.T[None], w[:, None], padding=3, groups=12)[0, :, :40].T)
    torch.testing.assert_close(y, want)
    torch.testing.assert_close(final, x[-3:].T)
    y1, s1 = causal_conv1d_ref(x[:2], w)  # shorter than K - 1
    y2, s2 = causal_conv1d_ref(x[2:30], w, s1)
    steps, state = [], s2[None]
    for t in range(30, 40):
        out, state = causal_conv1d_update_ref(x[t : t + 1], w, state)
        steps.append(out)
    torch.testing.assert_close(torch.cat([y1, y2, *steps]), y)
    torch.testing.assert_close(state[0], final)


def _dense_causal(q, k, v, scale):
    """SDPA over one sequence: q [n, Hq, D] are the last n of the L positions of k, v."""
    n, length = q.shape[0], k.shape[0]
    mask = torch.ones(n, length, dtype=torch.bool).tril(length - n)
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale,
        enable_gqa=True,
    )  # fmt: skip
    return o.transpose(0, 1)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float8_e4m3fn])
def test_paged_attention_matches_dense_causal(kv_dtype):
    g = _gen(2)
    hq, hkv, d = 4, 2, 16
    lengths, ctx = [130, 1, 65], [60, 0, 64]  # row 0 continues, crossing pages
    pages = [[7, 2, 9], [4], [0, 5]]
    k_all = [torch.randn(n, hkv, d, generator=g) for n in lengths]
    v_all = [torch.randn(n, hkv, d, generator=g) for n in lengths]
    q_all = [torch.randn(n - c, hq, d, generator=g) for n, c in zip(lengths, ctx, strict=True)]
    cache = torch.full((10, 2, 64, hkv, d), float("nan")).to(kv_dtype)
    scale_kv = 0.5 if kv_dtype == torch.float8_e4m3fn else None
    # the cached prefixes, then the new tokens of every row
    prefix = [Row([0] * c, 0, 0, p) for c, p in zip(ctx, pages, strict=True) if c]
    pb = make_batch(prefix)
    cat = lambda xs: torch.cat(xs)  # noqa: E731
    write_kv_ref(cat([k[:c] for k, c in zip(k_all, ctx, strict=True) if c]),
                 cat([v[:c] for v, c in zip(v_all, ctx, strict=True) if c]),
                 cache, pb.slot_mapping, scale_kv, scale_kv)  # fmt: skip
    rows = [Row([0] * (n - c), c, 0, p) for n, c, p in zip(lengths, ctx, pages, strict=True)]
    batch = make_batch(rows)
    write_kv_ref(cat([k[c:] for k, c in zip(k_all, ctx, strict=True)]),
                 cat([v[c:] for v, c in zip(v_all, ctx, strict=True)]),
                 cache, batch.slot_mapping, scale_kv, scale_kv)  # fmt: skip
    got = paged_attention_ref(cat(q_all), cache, batch.block_table, batch.q_lens, batch.ctx_lens,
                              0.25, scale_kv, scale_kv)  # fmt: skip
    want = cat([_dense_causal(q, k, v, 0.25) for q, k, v in zip(q_all, k_all, v_all, strict=True)])
    tol = 1e-5 if scale_kv is None else 0.15
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


def test_reference_ops_attention_writes_then_reads(ref_ops):
    g = _gen(3)
    q, k, v = torch.randn(5, 2, 8, generator=g), *torch.randn(2, 5, 1, 8, generator=g)
    cache = torch.full((3, 2, 64, 1, 8), float("nan"))
    batch = make_batch([Row([0] * 5, 0, 0, [2])])
    got = ref_ops.attention(q, k, v, cache, batch, 0.3)
    torch.testing.assert_close(cache[2, 0, :5], k)
    torch.testing.assert_close(cache[2, 1, :5], v)
    torch.testing.assert_close(got, _dense_causal(q, k, v, 0.3))


def test_reference_ops_state_rows(ref_ops):
    """Ragged conv + gdn: a fresh row ignores its (NaN) slot, a continuing row reads its slot,
    a decode row steps; every slot ends with the state after its row's last token."""
    hk, hv, dk, dv, c = 1, 2, 8, 4, 6
    q, k, v, g, beta, _ = _gdn_inputs(75, hk, hv, dk, dv, seed=4)
    q, k, v, g, beta = (x[0] for x in (q, k, v, g, beta))
    x, w = torch.randn(75, c, generator=_gen(5)), torch.randn(c, 4, generator=_gen(6))
    conv_pool, ssm_pool = (
        torch.full((4, c, 3), float("nan")),
        torch.full((4, hv, dk, dv), float("nan")),
    )
    s_init = torch.randn(hv, dk, dv, generator=_gen(7))
    conv_init = torch.randn(c, 3, generator=_gen(8))
    for slot in (1, 3):
        ssm_pool[slot], conv_pool[slot] = s_init, conv_init
    # rows: fresh 70 tokens in slot 2, continuing 4 tokens in slot 1, decode 1 token in slot 3
    batch = make_batch([Row([0] * 70, 0, 2, [0, 1]), Row([0] * 4, 9, 1, [2]), Row([0], 9, 3, [3])])
    y = ref_ops.causal_conv(x, w, conv_pool, batch)
    o = ref_ops.gdn(q, k, v, g, beta, ssm_pool, batch, dk**-0.5)
    expected = [(slice(0, 70), 2, None, None), (slice(70, 74), 1, conv_init, s_init),
                (slice(74, 75), 3, conv_init, s_init)]  # fmt: skip
    for sl, slot, init_c, init_s in expected:
        want_y, want_c = causal_conv1d_ref(x[sl], w, init_c)
        want_o, want_s = recurrent_gated_delta_rule_ref(
            *(t[sl][None] for t in (q, k, v, g, beta)), dk**-0.5,
            None if init_s is None else init_s[None],
        )  # fmt: skip
        torch.testing.assert_close(y[sl], want_y)
        torch.testing.assert_close(conv_pool[slot], want_c)
        torch.testing.assert_close(o[sl], want_o[0], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(ssm_pool[slot], want_s[0], atol=2e-5, rtol=1e-5)
    assert conv_pool[0].isnan().all() and ssm_pool[0].isnan().all()


def test_rope_rotates_pairs(ref_ops):
    g = _gen(9)
    q, k = torch.randn(6, 3, 16, generator=g), torch.randn(6, 1, 16, generator=g)
    pos = torch.tensor([0, 1, 2, 100, 5000, 7])
    inv_freq = 1.0 / (1e4 ** (torch.arange(0, 8, 2).float() / 8))  # rotary_dim 8
    qr, kr = ref_ops.rope(q, k, pos, inv_freq, 8)
    for x, xr in ((q, qr), (k, kr)):
        torch.testing.assert_close(xr[..., 8:], x[..., 8:])
        angle = (pos[:, None].float() * inv_freq)[:, None, :]  # pairs (i, i + 4)
        z = torch.complex(x[..., :4], x[..., 4:8]) * torch.polar(torch.ones_like(angle), angle)
        torch.testing.assert_close(xr[..., :4], z.real)
        torch.testing.assert_close(xr[..., 4:8], z.imag)
    torch.testing.assert_close(qr[0], q[0])  # position 0 is the identity


def test_norms():
    g = _gen(10)
    x, z, w = (
        torch.randn(3, 5, 16, generator=g),
        torch.randn(3, 5, 16, generator=g),
        torch.randn(16, generator=g),
    )
    rms = x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    torch.testing.assert_close(rms_norm_ref(x, w, 1e-6), x / rms * (1 + w))
    torch.testing.assert_close(gated_rms_norm_ref(x, z, w, 1e-6), x / rms * w * F.silu(z))
    xb = x.bfloat16()
    assert rms_norm_ref(xb, w.bfloat16(), 1e-6).dtype == torch.bfloat16
    assert gated_rms_norm_ref(xb, z.bfloat16(), w.bfloat16(), 1e-6).dtype == torch.bfloat16


def test_moe_matches_per_token_loop():
    g = _gen(11)
    n, h, e, i, top_k = 9, 12, 5, 7, 2
    x, router = torch.randn(n, h, generator=g), torch.randn(e, h, generator=g)
    gate_up, down = torch.randn(e, 2 * i, h, generator=g), torch.randn(e, h, i, generator=g)
    got = moe_ref(x, router, gate_up, down, top_k)
    for t in range(n):
        p = (router @ x[t]).softmax(-1)
        top = p.topk(top_k)
        want = sum(
            wt
            / top.values.sum()
            * down[ex]
            @ (F.silu(gate_up[ex, :i] @ x[t]) * (gate_up[ex, i:] @ x[t]))
            for wt, ex in zip(top.values, top.indices.tolist(), strict=True)
        )
        torch.testing.assert_close(got[t], want, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("shared_i", [7, 10], ids=["Is=I", "Is!=I"])
def test_moe_block_matches_per_token_loop(shared_i):
    """Routed experts plus sigmoid(x . router[E]) * shared(x), per token in fp32; the same
    tensor through `ReferenceOps.moe_block`; bit for bit the separate ops' sum (what the model
    computes without the fused router)."""
    g = _gen(12)
    n, h, e, i, top_k = 9, 12, 5, 7, 2
    x, router = torch.randn(n, h, generator=g), torch.randn(e + 1, h, generator=g)
    gate_up, down = torch.randn(e, 2 * i, h, generator=g), torch.randn(e, h, i, generator=g)
    s_gate_up = torch.randn(2 * shared_i, h, generator=g)
    s_down = torch.randn(h, shared_i, generator=g)
    args = (x, router, gate_up, down, s_gate_up, s_down, top_k)
    got = moe_block_ref(*args)
    assert torch.equal(ReferenceOps().moe_block(*args), got)
    routed = moe_ref(x, router[:e], gate_up, down, top_k)
    for t in range(n):
        g_t, u_t = (s_gate_up @ x[t]).chunk(2)
        want = routed[t] + torch.sigmoid(router[e] @ x[t]) * (s_down @ (F.silu(g_t) * u_t))
        torch.testing.assert_close(got[t], want, atol=1e-4, rtol=1e-5)
    ops = ReferenceOps()
    gate, up = F.linear(x, s_gate_up).chunk(2, dim=-1)
    shared = ops.linear(ops.silu_mul(gate, up), s_down)
    separate = routed + ops.sigmoid_mul(shared, ops.linear(x, router[e:]))
    assert torch.equal(got, separate)
    bf16 = moe_block_ref(*(a.bfloat16() if torch.is_tensor(a) else a for a in args))
    assert bf16.dtype == torch.bfloat16
