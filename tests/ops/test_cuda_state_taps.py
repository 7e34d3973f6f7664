"""GPU tests: state taps (`forward.StateTap`) in `CudaOps`: one prefill pass over rows with taps
on their 64-token chunk grid, off it (the chunk's state advanced over the rest: a prompt's
exact taps), or within a chunk of the row's start (a verify row's), several per row, fresh
rows and rows continuing a cached state, leaves in each tap's slot, within the model dtype's
rounding, the state that passes split at the taps leave (the recurrent state is read from
fla's chunk states, in k's dtype), computes what the split passes compute, and leaves the
rows' own states as a pass without taps does. Skipped without CUDA or without flashinfer /
fla / triton."""

from __future__ import annotations

import pytest
import torch

from ninfer.forward import StateTap
from ninfer.ops.reference import ReferenceOps
from tests.ops.state_taps import Layer

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
for _mod in ("triton", "flashinfer", "fla"):
    pytest.importorskip(_mod)

from ninfer.ops.cuda import CudaOps  # noqa: E402

ROWS = [(0, 300), (70, 200), (0, 1000), (128, 65)]
TAPS = [StateTap(0, 64, 4), StateTap(0, 256, 5), StateTap(1, 128, 6), StateTap(2, 512, 7),
        StateTap(2, 960, 8), StateTap(3, 64, 9)]  # fmt: skip
# off the grid (1 and 63 tokens into a chunk, two in one chunk of a row), beside grid taps
OFF_GRID = [StateTap(0, 100, 4), StateTap(0, 299, 5), StateTap(1, 129, 6), StateTap(2, 511, 7),
            StateTap(2, 577, 8), StateTap(2, 600, 10), StateTap(3, 64, 9)]  # fmt: skip
# within a chunk of the row's start (a verify row's 1 .. k: advanced from the row's initial
# state; the conv state partly the row's initial one below K-1), fresh and continuing rows
NEAR = [StateTap(0, 1, 4), StateTap(0, 2, 5), StateTap(1, 3, 6), StateTap(1, 66, 10),
        StateTap(2, 5, 7), StateTap(2, 63, 8), StateTap(3, 1, 9)]  # fmt: skip
TAP_SETS = {"grid": TAPS, "off-grid": OFF_GRID, "near": NEAR}
TOL = {torch.float32: 2e-3, torch.bfloat16: 3e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    assert not out.isnan().any(), "NaN in output"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-12)).item()


@pytest.mark.parametrize("dims", [(2, 4, 128, 128), (2, 4, 32, 32)], ids=["qkv", "composed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("tap_set", list(TAP_SETS))
def test_taps_match_passes_split_at_them(dtype, dims, tap_set):
    """dk = 128: the model's path (`conv.causal_conv_qkv`, then `gdn.gdn_prefill`); dk = 32:
    the composition of `causal_conv` and `gdn` (channels the conv cannot split by head)."""
    ops = CudaOps("cuda")
    TAPS = TAP_SETS[tap_set]  # noqa: N806
    layer = Layer(ROWS, 7, seed=3, device="cuda", dtype=dtype, dims=dims)
    out, conv, ssm = layer.tapped(ops, TAPS)
    ref_out, ref_conv, ref_ssm = layer.split(ops, TAPS)
    plain_out, plain_conv, plain_ssm = layer.tapped(ops, [])
    tol = TOL[dtype]
    assert rel_err(out, ref_out) < tol
    for t in TAPS:
        assert torch.equal(conv[t.slot], ref_conv[t.slot])  # the inputs before the tap
        assert rel_err(ssm[t.slot], ref_ssm[t.slot]) < tol, t
    for r in range(len(ROWS)):  # the rows' own states: as without taps
        assert torch.equal(conv[r], plain_conv[r])
        assert rel_err(ssm[r], plain_ssm[r]) < 1e-6
    assert rel_err(out, plain_out) < 1e-6
    # the reference agrees with the fast path on the same taps
    _, _, ref_ssm2 = layer.tapped(ReferenceOps(), TAPS)
    for t in TAPS:
        assert rel_err(ssm[t.slot], ref_ssm2[t.slot]) < tol, t


def test_a_tap_outside_its_row_is_refused():
    ops = CudaOps("cuda")
    layer = Layer(ROWS, 1, seed=0, device="cuda", dtype=torch.bfloat16, dims=(2, 4, 128, 128))
    with pytest.raises(ValueError, match="inside its row"):
        layer.tapped(ops, [StateTap(3, 65, 4)])
