"""GPU tests: `skinny_linear` (Triton skinny GEMM for decode) against F.linear.

Errors are ||out - ref|| / ||ref|| against the float64 product. Shapes include N and K that are
not multiples of any block (N = 1000, K = 4100: no alignment is required, such a K only loses
vectorised loads), autotuned and with every config of the list forced, plus CUDA-graph capture
and replay on new inputs. Skipped without CUDA or without triton.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("triton")

from triton.runtime.errors import OutOfResources  # noqa: E402

from ninfer.ops.cuda.skinny import CONFIGS, skinny_linear, tuned_config  # noqa: E402

DEV = torch.device("cuda")
SHAPES = [(1000, 4100), (4096, 4096), (2000, 12288)]  # (N, K)
SPLIT = [c for c in CONFIGS if c.kwargs["SPLIT_K"] > 1]
DTYPES = [
    pytest.param(torch.float32, 1e-5, id="fp32"),
    pytest.param(torch.bfloat16, 1e-2, id="bf16"),
]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    assert not out.isnan().any(), "NaN in output"
    return ((out - ref).norm() / ref.norm()).item()


def inputs(m: int, n: int, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(m, k, device=DEV).to(dtype)
    w = (torch.randn(n, k, device=DEV) * k**-0.5).to(dtype)
    return x, w


def exact(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.linear(x.double(), w.double())


@pytest.mark.parametrize(("dtype", "tol"), DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("m", [1, 2, 5, 8])
def test_matches_linear(m, shape, dtype, tol) -> None:
    """Autotuned (first call tunes, second runs the tuned config) vs the exact product and
    F.linear."""
    x, w = inputs(m, *shape, dtype)
    for _ in range(2):
        out = skinny_linear(x, w)
        assert out.shape == (m, shape[0]) and out.dtype == dtype
        assert rel_err(out, exact(x, w)) < tol, tuned_config(x, w)
    assert rel_err(out, F.linear(x, w)) < 2 * tol


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(map(str, c.kwargs.values())))
def test_every_config(config) -> None:
    """Each config forced, bf16 and fp32, M = 1 (and 8 for the tensor-core ones). A config
    whose fp32 tiles do not fit in shared memory is let off (autotune times it as inf)."""
    for m in (1, 8) if config.kwargs["DOT"] else (1,):
        for dtype, tol in ((torch.bfloat16, 1e-2), (torch.float32, 1e-5)):
            x, w = inputs(m, 1000, 4100, dtype)
            try:
                out = skinny_linear(x, w, config=config)
            except OutOfResources:
                assert dtype == torch.float32
                continue
            assert rel_err(out, exact(x, w)) < tol, (m, dtype)


@pytest.mark.parametrize("config", [None, CONFIGS[0], SPLIT[0]], ids=["tuned", "plain", "split"])
@pytest.mark.parametrize("m", [1, 8])
def test_graph_replay(m, config) -> None:
    """Captured in a CUDA graph (after an eager call that tunes and compiles), replay on new x
    and w gives the new product; a split-K config replays its reduce too (N = 1000 tunes to
    split-K on an H200: too few column blocks otherwise)."""
    x, w = inputs(m, 1000, 4100, torch.bfloat16)
    skinny_linear(x, w, config=config)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = skinny_linear(x, w, config=config)
    fresh = inputs(m, 1000, 4100, torch.bfloat16)
    x.copy_(fresh[0])
    w.copy_(fresh[1])
    graph.replay()
    assert rel_err(out, exact(*fresh)) < 1e-2


def test_deterministic() -> None:
    """Split-K partials are summed in a fixed order: two calls agree bit for bit."""
    x, w = inputs(8, 1000, 4100, torch.bfloat16)
    split = next(c for c in SPLIT if c.kwargs["SPLIT_K"] == 4)
    assert torch.equal(skinny_linear(x, w, config=split), skinny_linear(x, w, config=split))


def test_rejects_bad_arguments() -> None:
    x, w = inputs(9, 64, 128, torch.bfloat16)
    with pytest.raises(ValueError, match="at most 8 rows"):
        skinny_linear(x, w)
    with pytest.raises(ValueError, match="contiguous w"):
        skinny_linear(x[:2], w.t().contiguous().t())
    with pytest.raises(ValueError, match="unit stride"):
        skinny_linear(x[:2, ::2], w[:, :64].contiguous())


def test_decode_linear_race_and_capture():
    """`DecodeLinear` races cuBLAS and the skinny kernel once per key, keeps the result, and
    matches F.linear either way; prefill-sized or fp32 inputs are plain F.linear; a key first
    seen inside a capture falls back to cuBLAS."""
    from ninfer.ops.cuda.linear import DecodeLinear

    lin = DecodeLinear()
    w = (torch.randn(4096, 4096, device=DEV) * 0.02).to(torch.bfloat16)
    for m in (1, 3, 8):
        x = torch.randn(m, 4096, device=DEV).to(torch.bfloat16)
        assert rel_err(lin(x, w), F.linear(x.double(), w.double())) < 1e-2
        assert (m, 4096, 4096, torch.bfloat16) in lin.choice
    n_keys = len(lin.choice)
    big = torch.randn(64, 4096, device=DEV).to(torch.bfloat16)
    assert torch.equal(lin(big, w), F.linear(big, w))
    assert torch.equal(lin(big.float(), w.float()), F.linear(big.float(), w.float()))
    assert len(lin.choice) == n_keys  # neither was raced
    x = torch.randn(5, 4096, device=DEV).to(torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = lin(x, w)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, F.linear(x, w))
    assert (5, 4096, 4096, torch.bfloat16) not in lin.choice
