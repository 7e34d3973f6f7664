"""Where a long prefill's time goes on one GPU, part by part, beside the alternatives.

Sections (each case: one fresh row of T tokens of a preset, bf16, random inputs):

    ceilings   copy bandwidth (1 GiB uint8 copy_, read + write counted), bf16 8192^3 matmul
    gemm       every prefill GEMM of one layer of each kind, fused as on CUDA (GDN in_proj =
               qkv|z|b|a, attention q|k|v, MLP gate|up; plus the GDN in_proj with N padded to a
               multiple of 256), through F.linear: ms, TFLOP/s, fraction of the matmul peak,
               ms x layers of that kind per pass
    attention  causal prefill (ctx 0): our paged path (`CudaOps.attention`: K/V write + paged
               FlashInfer run; also the write and the run alone, and the host plan time) against
               FlashInfer's ragged prefill over contiguous k, v (fa3, auto) and over v as a
               strided view of the fused q|k|v output; relative L2 error against the paged path
    gdn        fla-core's forward stages as `gdn_prefill` calls them, each alone, beside the
               bytes it must move / copy bandwidth; the whole `gdn_prefill`; as alternatives
               `gdn_prefill(normalized=True)` where it exists, fla's public
               `chunk_gated_delta_rule` and (--fi-gdn) FlashInfer's GDN prefill

A summary row per case adds the per-pass totals (GEMMs + attention + GDN core: no norms, conv,
RoPE, glue or LM head). One JSON line per measurement, all rows in --out, a table at the end.
Timing: `triton.testing.do_bench(..., return_mode="median")` after one untimed call, so the
first-use JIT is not timed (FlashInfer's ragged fa3 kernel compiles ~80 s on first use).

    python3 tools/device/bench_prefill_parts.py [--parts gemm,attention,gdn]
        [--cases 27B:8192,9B:32768] [--fi-gdn] [--out bench_prefill_parts.json]
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import math
import random
import time
import traceback

import torch
import torch.nn.functional as F

DEV, BF16 = torch.device("cuda"), torch.bfloat16
WORKSPACE_BYTES = 256 << 20
PARTS = ("gemm", "attention", "gdn")
ROWS: list[dict] = []
PASS: dict[tuple[str, int], dict[str, float]] = {}  # (preset, T) -> per-pass ms by part


def emit(**row) -> None:
    ROWS.append(row)
    print(json.dumps(row), flush=True)


def rnd(x: float, n: int = 4) -> float:
    return round(x, n) if math.isfinite(x) else x


def nb(*ts: torch.Tensor) -> int:
    """Bytes of the tensors' elements (each counted once)."""
    return sum(t.numel() * t.element_size() for t in ts)


def bench(fn) -> float:
    """Median ms of fn (CUDA events, `do_bench`), after one untimed call (JIT, autotune)."""
    from triton.testing import do_bench

    fn()
    torch.cuda.synchronize()
    return do_bench(fn, return_mode="median")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    return rnd(((out - ref).norm() / ref.norm()).item(), 6)


def error_row(kind: str, model: str, t: int, name: str, e: BaseException) -> None:
    traceback.print_exc()
    emit(kind=kind, model=model, tokens=t, name=name, error=repr(e)[:300])


def free() -> None:
    gc.collect()
    torch.cuda.empty_cache()


# ---- ceilings ------------------------------------------------------------------------------


def ceilings() -> tuple[float, float]:
    """(copy bandwidth B/s counting read + write, bf16 matmul FLOP/s), measured here."""
    copy_ms = copy_1gib_ms()
    bw = 2 * (1 << 30) / (copy_ms / 1e3)
    x, y = (torch.randn(8192, 8192, dtype=BF16, device=DEV) for _ in "xy")
    mm_ms = bench(lambda: x @ y)
    peak = 2 * 8192**3 / (mm_ms / 1e3)
    emit(kind="ceiling", copy_ms=rnd(copy_ms), copy_TBps=rnd(bw / 1e12, 3), matmul_ms=rnd(mm_ms),
         bf16_matmul_TFLOPs=rnd(peak / 1e12, 1))  # fmt: skip
    return bw, peak


def copy_1gib_ms() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device=DEV).random_(1, 256)
    dst = torch.empty_like(src)
    return bench(lambda: dst.copy_(src))


# ---- gemm ----------------------------------------------------------------------------------


def gemm_shapes(cfg) -> list[tuple[str, int, int, int, bool]]:
    """(name, N, K, layers of that kind per pass, alternative?) of one layer's prefill GEMMs
    [T, K] x [K, N], with the fused weights of `fuse_projections`."""
    h, hd = cfg.hidden_size, cfg.head_dim
    n_gdn, n_full, n_all = len(cfg.gdn_layer_ids), len(cfg.full_layer_ids), cfg.num_hidden_layers
    in_proj = cfg.conv_dim + cfg.value_dim + 2 * cfg.linear_num_value_heads  # qkv | z | b | a
    qkv = 2 * cfg.num_attention_heads * hd + 2 * cfg.num_key_value_heads * hd  # q+gate | k | v
    rows = [
        ("gdn_in_proj", in_proj, h, n_gdn, False),
        ("gdn_in_proj N padded to 256", -(-in_proj // 256) * 256, h, n_gdn, True),
        ("gdn_out_proj", h, cfg.value_dim, n_gdn, False),
        ("attn_qkv", qkv, h, n_full, False),
        ("attn_o_proj", h, cfg.num_attention_heads * hd, n_full, False),
        ("mlp_gate_up", 2 * cfg.intermediate_size, h, n_all, False),
        ("mlp_down", h, cfg.intermediate_size, n_all, False),
    ]
    return [r for r in rows if r[1] > 0 and r[2] > 0]  # a MoE preset has no dense MLP


def time_linear(t: int, n: int, k: int) -> float:
    x = torch.randn(t, k, dtype=BF16, device=DEV)
    w = torch.randn(n, k, dtype=BF16, device=DEV) * k**-0.5  # [N, K] as the model's weights
    return bench(lambda: F.linear(x, w))


def bench_gemm(model: str, t: int, bw: float, peak: float, args) -> None:
    from ninfer.models.presets import PRESETS

    cfg = PRESETS[model]
    total_ms = total_flops = 0.0
    for name, n, k, layers, alt in gemm_shapes(cfg):
        try:
            ms = time_linear(t, n, k)
        except Exception as e:  # noqa: BLE001 - report and go on
            error_row("gemm", model, t, name, e)
            continue
        finally:
            free()
        flops = 2 * t * n * k
        emit(kind="gemm", model=model, tokens=t, name=name, M=t, N=n, K=k, ms=rnd(ms),
             TFLOPs=rnd(flops / ms / 1e9, 1), of_peak=rnd(flops / (ms / 1e3) / peak, 3),
             layers=layers, per_pass_ms=rnd(ms * layers, 3), alternative=alt)  # fmt: skip
        if not alt:
            total_ms += ms * layers
            total_flops += flops * layers
    if total_ms:
        PASS.setdefault((model, t), {})["gemm"] = total_ms
        emit(kind="gemm", model=model, tokens=t, name="all GEMMs of one pass",
             ms=rnd(total_ms, 3), TFLOPs=rnd(total_flops / total_ms / 1e9, 1),
             of_peak=rnd(total_flops / (total_ms / 1e3) / peak, 3),
             per_pass_ms=rnd(total_ms, 3))  # fmt: skip


# ---- attention -----------------------------------------------------------------------------


def make_batch(rows: list[tuple[int, int]], num_pages: int, num_slots: int):
    """As tests/ops/test_cuda_ops.py::make_batch: rows (ctx_len, q_len) each; distinct shuffled
    pages and slots (page 0 left unused)."""
    from ninfer.forward import ForwardBatch
    from ninfer.page import PAGE_SIZE

    rng = random.Random(torch.randint(1 << 30, ()).item())
    pages, slots = list(range(1, num_pages)), list(range(num_slots))
    rng.shuffle(pages)
    rng.shuffle(slots)
    n_pages = [(c + q + PAGE_SIZE - 1) // PAGE_SIZE for c, q in rows]
    table = torch.zeros(len(rows), max(n_pages), dtype=torch.int32)
    positions, slot_map = [], []
    for r, ((c, q), n) in enumerate(zip(rows, n_pages, strict=True)):
        table[r, :n] = torch.tensor([pages.pop() for _ in range(n)], dtype=torch.int32)
        positions += range(c, c + q)
        slot_map += [
            int(table[r, p // PAGE_SIZE]) * PAGE_SIZE + p % PAGE_SIZE for p in range(c, c + q)
        ]
    cu = torch.tensor([0, *torch.tensor([q for _, q in rows]).cumsum(0).tolist()])
    t = torch.tensor(positions)
    return ForwardBatch(
        input_ids=torch.zeros_like(t, device=DEV),
        positions=t.to(DEV),
        q_lens=[q for _, q in rows],
        ctx_lens=[c for c, _ in rows],
        cu_q=cu.to(DEV, torch.int32),
        state_slots=torch.tensor([slots.pop() for _ in rows], device=DEV),
        block_table=table.to(DEV),
        slot_mapping=torch.tensor(slot_map, device=DEV),
        logits_indices=torch.arange(len(positions), device=DEV),
    )


def bench_attention(model: str, t: int, bw: float, peak: float, args) -> None:
    import flashinfer

    from ninfer.models.presets import PRESETS
    from ninfer.ops.cuda.attention import write_kv
    from ninfer.ops.cuda.ops import CudaOps
    from ninfer.page import PAGE_SIZE

    cfg = PRESETS[model]
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    n_full = len(cfg.full_layer_ids)
    scale = d**-0.5
    flops = 4 * hq * d * t * (t + 1) / 2
    base = dict(kind="attention", model=model, tokens=t, hq=hq, hkv=hkv, head_dim=d)

    def report(name: str, ms: float, **extra) -> None:
        emit(**base, name=name, ms=rnd(ms), TFLOPs=rnd(flops / ms / 1e9, 1),
             of_peak=rnd(flops / (ms / 1e3) / peak, 3), layers=n_full,
             per_pass_ms=rnd(ms * n_full, 3), **extra)  # fmt: skip

    # q after q_norm + RoPE and k after k_norm + RoPE are fresh tensors; v is a column view of
    # the fused projection's output [T, 2 Hq D | Hkv D | Hkv D], as the model hands it over.
    q = torch.randn(t, hq, d, dtype=BF16, device=DEV)
    k = torch.randn(t, hkv, d, dtype=BF16, device=DEV)
    proj = torch.randn(t, 2 * hq * d + 2 * hkv * d, dtype=BF16, device=DEV)
    v_view = proj[:, 2 * hq * d + hkv * d :].view(t, hkv, d)
    v = v_view.contiguous()

    # (a) the engine's path: CudaOps.attention = write_kv + paged FlashInfer prefill
    pages = -(-t // PAGE_SIZE) + 2
    batch = make_batch([(0, t)], pages, 4)
    cache = torch.randn(pages, 2, PAGE_SIZE, hkv, d, dtype=BF16, device=DEV)
    ops = CudaOps(DEV)
    planner = ops.attention_planner
    paged = lambda: ops.attention(q, k, v_view, cache, batch, scale)
    out_a = paged()
    torch.cuda.synchronize()
    ms_a = bench(paged)
    wrapper = planner._wrapper
    report("paged: write_kv + run (CudaOps.attention)", ms_a,
           backend=getattr(wrapper, "_backend", None))  # fmt: skip
    PASS.setdefault((model, t), {})["attention (paged)"] = ms_a * n_full
    try:
        ms_w = bench(lambda: write_kv(k, v_view, cache, batch.slot_mapping, None, None))
        kv_bytes = 2 * nb(k, v)  # K and V read, written into the pages
        emit(**base, name="paged: write_kv alone", ms=rnd(ms_w), bytes=kv_bytes,
             bound_ms=rnd(kv_bytes / bw * 1e3), of_bound=rnd(kv_bytes / bw * 1e3 / ms_w, 3),
             layers=n_full, per_pass_ms=rnd(ms_w * n_full, 3))  # fmt: skip
    except Exception as e:  # noqa: BLE001
        ms_w = float("nan")
        error_row("attention", model, t, "paged: write_kv alone", e)
    try:
        ms_r = bench(lambda: wrapper.run(q, cache))
        report("paged: run alone (planned)", ms_r, backend=getattr(wrapper, "_backend", None))
        shape = (hq, hkv, d, BF16, BF16, scale)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            planner.plan(batch, shape)
        torch.cuda.synchronize()
        emit(**base, name="paged: plan (host, once per pass)",
             ms=rnd((time.perf_counter() - t0) / 5 * 1e3))  # fmt: skip
    except Exception as e:  # noqa: BLE001
        error_row("attention", model, t, "paged: run alone / plan", e)

    # (b), (c) FlashInfer's ragged prefill over the same q, k, v (nothing written)
    for backend in ("fa3", "auto"):
        try:
            shape = (hq, hkv, d, scale)
            ms_b = ragged(flashinfer, backend, q, k, v, v_view, out_a, shape, base, report)
            if backend == "fa3" and math.isfinite(ms_w):
                PASS[(model, t)]["attention (ragged fa3 + write_kv)"] = (ms_b + ms_w) * n_full
        except Exception as e:  # noqa: BLE001
            error_row("attention", model, t, f"ragged {backend}", e)
        free()


def ragged(flashinfer, backend, q, k, v, v_view, ref, shape, base, report) -> float:
    """FlashInfer's `BatchPrefillWithRaggedKVCacheWrapper` (causal, one row), planned once:
    contiguous v, then v as a strided view. Returns the contiguous run's ms."""
    hq, hkv, d, scale = shape
    t = q.shape[0]
    indptr = torch.tensor([0, t], dtype=torch.int32)  # host: plan copies it to the device
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=DEV)
    wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend=backend)
    plan = lambda: wrapper.plan(
        qo_indptr=indptr, kv_indptr=indptr, num_qo_heads=hq, num_kv_heads=hkv, head_dim_qk=d,
        causal=True, sm_scale=scale, q_data_type=BF16, kv_data_type=BF16,
    )  # fmt: skip
    t0 = time.perf_counter()
    plan()  # the first plan of a kernel variant loads (or JIT-compiles) its module
    out = wrapper.run(q, k, v)
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    plan()  # what a pass would pay on the host
    plan_ms = (time.perf_counter() - t0) * 1e3
    resolved = getattr(wrapper, "_backend", backend)
    ms = bench(lambda: wrapper.run(q, k, v))
    report(f"ragged {backend}: contiguous k, v", ms, backend=resolved,
           rel_err_vs_paged=rel_err(out, ref), first_plan_run_s=round(first_s, 2),
           plan_host_ms=rnd(plan_ms, 3))  # fmt: skip
    del out
    name = f"ragged {backend}: v strided view of q|k|v"
    try:
        out = wrapper.run(q, k, v_view)
        ms_c = bench(lambda: wrapper.run(q, k, v_view))
        report(name, ms_c, backend=resolved, rel_err_vs_paged=rel_err(out, ref),
               v_stride=list(v_view.stride()))  # fmt: skip
    except Exception as e:  # noqa: BLE001 - FlashInfer may refuse the strided v
        emit(**base, name=name, backend=resolved, error=repr(e)[:300])
    return ms


# ---- gdn -----------------------------------------------------------------------------------


def bench_gdn(model: str, t: int, bw: float, peak: float, args) -> None:
    from fla.modules.l2norm import l2norm_fwd
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
    from fla.ops.common.chunk_o import chunk_fwd_o
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2

    from ninfer.models.presets import PRESETS
    from ninfer.ops.cuda import gdn
    from ninfer.ops.cuda.passmeta import CHUNK, PassMeta

    cfg = PRESETS[model]
    hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    layers = len(cfg.gdn_layer_ids)
    scale = dk**-0.5
    base = dict(kind="gdn", model=model, tokens=t, hk=hk, hv=hv)

    # As the model hands them over: q, k, v column views of the causal conv's output [T, C],
    # g fp32 <= 0 and beta = sigmoid(b) from the gates; the state pool a layer view.
    mixed = torch.randn(t, cfg.conv_dim, dtype=BF16, device=DEV)
    q, k, v = mixed.split([cfg.key_dim, cfg.key_dim, cfg.value_dim], dim=-1)
    q, k, v = q.view(t, hk, dk), k.view(t, hk, dk), v.view(t, hv, dv)
    g = -F.softplus(torch.randn(t, hv, device=DEV)) * 0.5 - 1e-3
    beta = torch.rand(t, hv, device=DEV).clamp_(min=1e-3).to(BF16)
    pool = torch.randn(4, 2, hv, dk, dv, device=DEV)[:, 1]
    slots = torch.tensor([1], device=DEV)
    meta = PassMeta.of([t], [0], DEV)
    tab = {"cu_seqlens": meta.cu_seqlens, "chunk_indices": meta.chunk_indices}

    # Every stage's inputs, made once as gdn_prefill makes them (untimed).
    h0 = gdn.gather_states(pool, slots, meta.has_state)
    qn, q_rstd = l2norm_fwd(q.contiguous()[None])
    kn, _ = l2norm_fwd(k.contiguous()[None])
    kc = k.contiguous()
    vc, bc = v.contiguous()[None], beta.contiguous()[None]
    gc = chunk_local_cumsum(g.float().contiguous()[None], CHUNK, scale=RCP_LN2, **tab)
    w, u, a_mat = chunk_gated_delta_rule_fwd_intra(
        k=kn, v=vc, g=gc, beta=bc, chunk_size=CHUNK, **tab
    )
    fwd_h = lambda: chunk_gated_delta_rule_fwd_h(
        k=kn, w=w, u=u, g=gc, initial_state=h0, output_final_state=True, chunk_size=CHUNK,
        chunk_offsets=meta.chunk_offsets, **tab,
    )  # fmt: skip
    h, v_new, final = fwd_h()
    fwd_o = lambda: chunk_fwd_o(
        q=qn, k=kn, v=v_new, h=h, g=gc, scale=scale, chunk_size=CHUNK, **tab
    )
    o = fwd_o()
    norm_bytes = 2 * nb(qn) + nb(q_rstd)  # read x, write y and rstd (no separate copy)
    stages = [  # (name, fn, bytes it must move, part of gdn_prefill)
        ("gather_states (fresh row: zeros)",
         lambda: gdn.gather_states(pool, slots, meta.has_state), nb(h0), True),
        ("l2norm_fwd q (.contiguous() of the view + l2norm)",
         lambda: l2norm_fwd(q.contiguous()[None]), norm_bytes, True),
        ("l2norm_fwd k (.contiguous() of the view + l2norm)",
         lambda: l2norm_fwd(k.contiguous()[None]), norm_bytes, True),
        ("v.contiguous() (copy of the view)", lambda: v.contiguous(), 2 * nb(vc), True),
        ("chunk_local_cumsum",
         lambda: chunk_local_cumsum(g.float().contiguous()[None], CHUNK, scale=RCP_LN2, **tab),
         2 * nb(gc), True),
        ("chunk_gated_delta_rule_fwd_intra",
         lambda: chunk_gated_delta_rule_fwd_intra(
             k=kn, v=vc, g=gc, beta=bc, chunk_size=CHUNK, **tab),
         nb(kn, vc, gc, bc, w, u, a_mat), True),
        ("chunk_gated_delta_rule_fwd_h", fwd_h, nb(kn, w, u, gc, h0, h, v_new, final), True),
        ("chunk_fwd_o", fwd_o, nb(qn, kn, v_new, h, gc, o), True),
        ("final state scatter (state[slots] = final)",
         lambda: pool.index_put_((slots,), final), 2 * nb(final), True),
        ("alt: l2norm_fwd k, input already contiguous", lambda: l2norm_fwd(kc[None]),
         norm_bytes, False),
        ("alt: k.contiguous() alone", lambda: k.contiguous(), 2 * nb(kc), False),
    ]  # fmt: skip
    staged_ms = staged_bytes = 0.0
    for name, fn, n_bytes, staged in stages:
        try:
            ms = bench(fn)
        except Exception as e:  # noqa: BLE001
            error_row("gdn", model, t, name, e)
            continue
        bound = n_bytes / bw * 1e3
        emit(**base, name=name, ms=rnd(ms), bytes=n_bytes, bound_ms=rnd(bound),
             of_bound=rnd(bound / ms, 3), layers=layers, per_pass_ms=rnd(ms * layers, 3),
             alternative=not staged)  # fmt: skip
        if staged:
            staged_ms += ms
            staged_bytes += n_bytes

    whole = lambda: gdn.gdn_prefill(q, k, v, g, beta, pool, slots, scale, meta)
    ref = whole()
    ms = bench(whole)
    min_bytes = nb(mixed, g, beta, o, final)  # read q|k|v, g, beta; write o, the final state
    bound = min_bytes / bw * 1e3
    emit(**base, name="gdn_prefill (whole call)", ms=rnd(ms), bytes=min_bytes,
         bound_ms=rnd(bound), of_bound=rnd(bound / ms, 3), sum_stages_ms=rnd(staged_ms),
         staged_bytes=int(staged_bytes), staged_bound_ms=rnd(staged_bytes / bw * 1e3),
         layers=layers, per_pass_ms=rnd(ms * layers, 3))  # fmt: skip
    PASS.setdefault((model, t), {})["gdn_prefill"] = ms * layers
    free()

    if "normalized" in inspect.signature(gdn.gdn_prefill).parameters:
        try:  # q, k already L2-normalised and q, k, v contiguous (as a fused conv writes them)
            q1, k1, v1 = qn[0], kn[0], vc[0]
            pre = lambda: gdn.gdn_prefill(
                q1, k1, v1, g, beta, pool, slots, scale, meta, normalized=True
            )
            err = rel_err(pre(), ref)
            ms = bench(pre)
            emit(**base, name="alt: gdn_prefill(normalized=True), contiguous q,k,v",
                 ms=rnd(ms), bound_ms=rnd(bound), of_bound=rnd(bound / ms, 3),
                 rel_err_vs_ours=err, layers=layers, per_pass_ms=rnd(ms * layers, 3),
                 alternative=True)  # fmt: skip
        except Exception as e:  # noqa: BLE001
            error_row("gdn", model, t, "alt: gdn_prefill(normalized=True)", e)

    try:  # fla's public entry (autograd Function, input guards, l2norm in its forward)
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        fla_fn = lambda: chunk_gated_delta_rule(
            q[None], k[None], v[None], g[None], beta[None], scale=scale, initial_state=h0,
            output_final_state=True, use_qk_l2norm_in_kernel=True, **tab,
        )  # fmt: skip
        out = fla_fn()[0]
        ms = bench(fla_fn)
        emit(**base, name="alt: fla chunk_gated_delta_rule (public API)", ms=rnd(ms),
             bound_ms=rnd(bound), of_bound=rnd(bound / ms, 3), rel_err_vs_ours=rel_err(out[0], ref),
             layers=layers, per_pass_ms=rnd(ms * layers, 3), alternative=True)  # fmt: skip
        del out
    except Exception as e:  # noqa: BLE001
        error_row("gdn", model, t, "alt: fla chunk_gated_delta_rule", e)
    free()
    if args.fi_gdn:
        try:
            fi_gdn(q, k, v, g, beta, meta, scale, ref, bound, base, layers)
        except Exception as e:  # noqa: BLE001
            error_row("gdn", model, t, "alt: flashinfer chunk_gated_delta_rule", e)


def fi_gdn(q, k, v, g, beta, meta, scale, ref, bound, base, layers) -> None:
    """FlashInfer's GDN prefill (contiguous q, k, v; alpha and beta fp32; the state out in
    [N, H, V, K]). Its g is taken as the multiplicative decay alpha = exp(g); the error of
    the other reading (log decay) is reported too, since the docs say only 'forget gate'."""
    from flashinfer.gdn_prefill import chunk_gated_delta_rule

    qc, kc, vc = q.contiguous(), k.contiguous(), v.contiguous()
    alpha, bf = g.exp(), beta.float()
    run = lambda gate: chunk_gated_delta_rule(
        qc, kc, vc, g=gate, beta=bf, scale=scale, output_final_state=True,
        cu_seqlens=meta.cu_seqlens, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    out = run(alpha)[0]
    err_exp = rel_err(out, ref)
    try:
        err_log = rel_err(run(g.contiguous())[0], ref)
    except Exception as e:  # noqa: BLE001
        err_log = repr(e)[:100]
    ms = bench(lambda: run(alpha))
    emit(**base, name="alt: flashinfer chunk_gated_delta_rule", ms=rnd(ms), bound_ms=rnd(bound),
         of_bound=rnd(bound / ms, 3), rel_err_alpha_exp_g=err_exp, rel_err_alpha_g=err_log,
         layers=layers, per_pass_ms=rnd(ms * layers, 3), alternative=True)  # fmt: skip


# ---- driver --------------------------------------------------------------------------------

SECTIONS = {"gemm": bench_gemm, "attention": bench_attention, "gdn": bench_gdn}


def summary(model: str, t: int) -> None:
    parts = PASS.get((model, t), {})
    if not parts:
        return
    core = [parts[p] for p in ("gemm", "attention (paged)", "gdn_prefill") if p in parts]
    emit(kind="summary", model=model, tokens=t, name="per pass (ms x layers)",
         per_pass_ms={p: rnd(v, 3) for p, v in parts.items()}, ms=rnd(sum(core), 3),
         tok_s=round(t / (sum(core) / 1e3)),
         note="gemm + paged attention + gdn_prefill; no norms, conv, RoPE, glue, LM head",
    )  # fmt: skip


def fmt(v, spec: str, width: int) -> str:
    return format(v, spec).rjust(width) if isinstance(v, int | float) else " " * width


def table() -> None:
    print("\n" + "-" * 118)
    print(f"{'part':<10}{'case':<11}{'name':<50}{'ms':>9}{'TFLOP/s':>8}{'peak':>6}"
          f"{'bound':>8}{'of bd':>6}{'per pass':>10}  note")  # fmt: skip
    for r in ROWS:
        if r["kind"] == "ceiling":
            print(f"ceilings: copy {r.get('copy_TBps')} TB/s, bf16 matmul "
                  f"{r.get('bf16_matmul_TFLOPs')} TFLOP/s {r.get('error', '')}")  # fmt: skip
            continue
        if r["kind"] not in SECTIONS and r["kind"] != "summary":
            continue
        case = f"{r.get('model', '')}:{r.get('tokens', '')}"
        note = r.get("error") or r.get("backend") or ""
        for key in ("rel_err_vs_paged", "rel_err_vs_ours", "rel_err_alpha_exp_g"):
            if key in r:
                note = f"{note} err {r[key]:.2e}".strip()
        if r["kind"] == "summary":
            note = ", ".join(f"{p} {v}" for p, v in r["per_pass_ms"].items())
        print(f"{r['kind']:<10}{case:<11}{r.get('name', '')[:49]:<50}"
              f"{fmt(r.get('ms'), '.3f', 9)}{fmt(r.get('TFLOPs'), '.0f', 8)}"
              f"{fmt(r.get('of_peak'), '.2f', 6)}{fmt(r.get('bound_ms'), '.3f', 8)}"
              f"{fmt(r.get('of_bound'), '.2f', 6)}{fmt(r.get('per_pass_ms'), '.2f', 10)}  "
              f"{note}")  # fmt: skip


def parse_cases(text: str) -> list[tuple[str, int]]:
    cases = []
    for item in filter(None, text.split(",")):
        name, _, tokens = item.partition(":")
        cases.append((name, int(tokens)))
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--parts", default=",".join(PARTS), help="any of gemm,attention,gdn")
    ap.add_argument("--cases", default="27B:8192,9B:32768", help="PRESET:TOKENS,...")
    ap.add_argument(
        "--fi-gdn", action="store_true",
        help="also time FlashInfer's GDN prefill (its first call may JIT for long)",
    )  # fmt: skip
    ap.add_argument("--out", default="bench_prefill_parts.json")
    args = ap.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    if bad := [p for p in parts if p not in PARTS]:
        ap.error(f"unknown parts {bad}: choose from {','.join(PARTS)}")
    try:
        cases = parse_cases(args.cases)
    except ValueError:
        ap.error(f"--cases {args.cases!r}: expected PRESET:TOKENS,...")
    from ninfer.models.presets import PRESETS

    if bad := [n for n, _ in cases if n not in PRESETS]:
        ap.error(f"unknown presets {bad}: choose from {','.join(PRESETS)}")
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    emit(kind="env", device=torch.cuda.get_device_name(), torch=torch.__version__,
         **versions())  # fmt: skip
    t_start = time.perf_counter()
    try:
        with torch.inference_mode():
            try:
                bw, peak = ceilings()
            except Exception as e:  # noqa: BLE001
                error_row("ceiling", "", 0, "ceilings", e)
                bw = peak = float("nan")
            free()
            for model, t in cases:
                for part in parts:
                    t0 = time.perf_counter()
                    try:
                        SECTIONS[part](model, t, bw, peak, args)
                    except Exception as e:  # noqa: BLE001 - report and go on
                        error_row(part, model, t, f"{part} section", e)
                    free()
                    print(f"# {part} {model}:{t} done in {time.perf_counter() - t0:.1f} s",
                          flush=True)  # fmt: skip
                summary(model, t)
    finally:
        with open(args.out, "w") as f:
            json.dump(ROWS, f, indent=1)
        table()
        print(f"# total {time.perf_counter() - t_start:.1f} s, rows in {args.out}", flush=True)


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("flashinfer-python", "fla-core", "triton"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "absent"
    return out


if __name__ == "__main__":
    main()
