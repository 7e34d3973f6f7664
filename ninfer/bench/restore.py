"""Restore and tap bandwidth: the copies the prefix cache issues, timed on the model's layouts.

    tap          state image, active slot -> snapshot slot (Device -> Device, ssm + conv)
    resume       state image, snapshot slot -> active slot (Device -> Device)
    kv_offload   a run of KV pages, every full-attention layer, Device -> Host (write-through)
    kv_restore   the same run, Host -> Device
    image_offload / image_restore   one state image, Device <-> Host

The tensors have the engine's layouts (memory/state_pool.py, memory/kv_pool.py; Host memory is
pinned when the device is CUDA) but are allocated here, so the figures do not depend on what
the cache happens to hold. On a CPU "Device" and "Host" are both RAM: the copies are memcpys.
Each figure is printed beside the measured copy bandwidth (bytes read + written per second).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ninfer.models.config import Qwen35Config
from ninfer.page import PAGE_SIZE
from ninfer.probe import timeit


def _state_pool(cfg: Qwen35Config, slots: int, dtype: torch.dtype, device: torch.device):
    n = len(cfg.gdn_layer_ids)
    k = cfg.linear_conv_kernel_dim - 1
    conv = torch.zeros((slots, n, cfg.conv_dim, k), dtype=dtype, device=device)
    ssm = torch.zeros(
        (slots, n, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim),
        dtype=torch.float32,
        device=device,
    )
    return conv, ssm


def _copy_cases(
    cfg: Qwen35Config, device: torch.device, dtype: torch.dtype, kv_dtype: torch.dtype, pages: int
) -> dict[str, tuple[int, Callable[[], object]]]:
    """{kind: (bytes copied, the copy)} over tensors of the engine's layouts, allocated here."""
    pin = device.type == "cuda"
    conv, ssm = _state_pool(cfg, 2, dtype, device)
    h_conv = torch.empty_like(conv[0], device="cpu", pin_memory=pin)
    h_ssm = torch.empty_like(ssm[0], device="cpu", pin_memory=pin)
    image_bytes = conv[0].nbytes + ssm[0].nbytes
    n_fa = len(cfg.full_layer_ids)
    shape = (pages, 2, PAGE_SIZE, cfg.num_key_value_heads, cfg.head_dim)
    kv = [torch.zeros(shape, dtype=kv_dtype, device=device) for _ in range(n_fa)]
    h_kv = [torch.empty(shape, dtype=kv_dtype, pin_memory=pin) for _ in range(n_fa)]
    kv_bytes = sum(t.nbytes for t in kv)

    def copy_pairs(pairs):
        return lambda: [dst.copy_(src, non_blocking=pin) for dst, src in pairs]

    return {
        "tap": (image_bytes, copy_pairs([(conv[1], conv[0]), (ssm[1], ssm[0])])),
        "resume": (image_bytes, copy_pairs([(conv[0], conv[1]), (ssm[0], ssm[1])])),
        "image_offload": (image_bytes, copy_pairs([(h_conv, conv[0]), (h_ssm, ssm[0])])),
        "image_restore": (image_bytes, copy_pairs([(conv[0], h_conv), (ssm[0], h_ssm)])),
        "kv_offload": (kv_bytes, copy_pairs(list(zip(h_kv, kv, strict=True)))),
        "kv_restore": (kv_bytes, copy_pairs(list(zip(kv, h_kv, strict=True)))),
    }


def bench_restore(
    cfg: Qwen35Config,
    device: torch.device,
    dtype: torch.dtype,
    kv_dtype: torch.dtype,
    pages: int = 16,
    iters: int = 10,
    bounds: dict[str, float] | None = None,
) -> dict:
    """Times each copy kind; returns {kind: {bytes, seconds, bytes_per_s, bound_bytes_per_s,
    fraction_of_bound}}. `bounds` (bounds.machine_bounds) gives the copy bandwidth (read +
    write) for Device copies and the Host link bandwidth for Host copies."""
    cases = _copy_cases(cfg, device, dtype, kv_dtype, pages)
    # A Device copy reads and writes each byte, so it runs at half the measured copy traffic.
    device_bound = (bounds or {}).get("copy_bytes_per_s", 0.0) / 2
    link_bound = (bounds or {}).get("link_bytes_per_s", 0.0)
    results = {}
    for name, (nbytes, fn) in cases.items():
        seconds = timeit(fn, device, iters)
        bound = device_bound if name in ("tap", "resume") else link_bound
        results[name] = {
            "bytes": nbytes,
            "seconds": seconds,
            "bytes_per_s": nbytes / seconds,
            "bound_bytes_per_s": bound,
            "fraction_of_bound": nbytes / seconds / bound if bound else None,
        }
    image_bytes, kv_bytes = cases["tap"][0], cases["kv_offload"][0]
    results["params"] = {"pages": pages, "image_bytes": image_bytes, "kv_run_bytes": kv_bytes}
    return results
