"""The op set's choices: which path or kernel variant serves an op where the CUDA op set has more
than one. Fixed when the op set is built (`CudaOps(choices=...)`, from `OpsConfig.op_choices`
through `ninfer.engine.executor.backend.select_ops`); the reference ops have one path per op and
take none. Plain data, no torch: `ninfer.config` declares the matching engine options (no
command-line flag but `--fp8-decode`: experiments and tests set them).

    gather_min_rows  query rows per KV head, averaged over the KV tokens, from which an eager
                     prefill pass over a cached context takes the gathered path
                     (`attention.gather_pays`; 0 forces it, inf forbids it)
    conv_tile        the prefill conv's launch shape (rows, channels, warps; `conv.Tile`),
                     None for the kernel's own (`conv.TILE`); every tile gives the same values
    verify_backend   FlashInfer's backend for the speculative verify step's attention (K+1
                     queries a row over its context, in the verify graphs): "fa2" (default),
                     whose plan splits a long context over several CTAs, faster at every
                     length measured and far faster at long ones, or "auto" / "fa3" (fa3 on
                     sm_90 for a bf16 cache: one CTA a KV head, however long the context;
                     docs/results-h200.md, "Verify attention")
    fp8_decode       the FP8 decode GEMV's activations on 128 x 128-block weights: "w8a16"
                     (default: x stays bf16, times the dequantised weight), "w8a8" (x quantised
                     per token per 128 columns as the prefill quantises it, e4m3 products on
                     the tensor cores) or "fastest" (per shape, whichever the autotuner times
                     faster); `ninfer.ops.cuda.fp8.ACTS`
"""

from __future__ import annotations

from dataclasses import dataclass

# The gathered path pays when the pass's query rows per KV head (q_len x GQA group), averaged
# over its KV tokens, reach this: above the measured break-even, with a margin
# (docs/results-h200.md, "gathered attention over a cached context").
GATHER_MIN_ROWS = 1536
VERIFY_BACKENDS = ("auto", "fa2", "fa3")
FP8_DECODE = ("w8a16", "w8a8", "fastest")


@dataclass(frozen=True, slots=True)
class OpChoices:
    """One op set's choices (module docstring). Constructing one checks every field
    (ValueError naming it)."""

    gather_min_rows: float = GATHER_MIN_ROWS
    conv_tile: tuple[int, int, int] | None = None
    verify_backend: str = "fa2"
    fp8_decode: str = "w8a16"

    def __post_init__(self) -> None:
        rows = self.gather_min_rows
        if not isinstance(rows, int | float) or isinstance(rows, bool) or not rows >= 0:
            raise ValueError(f"gather_min_rows must be a number >= 0, got {rows!r}")
        if self.conv_tile is not None and not _is_tile(self.conv_tile):
            raise ValueError(
                "conv_tile must be None or (rows, channels, warps), each a power of two, got "
                f"{self.conv_tile!r}"
            )
        if self.verify_backend not in VERIFY_BACKENDS:
            raise ValueError(
                f"verify_backend must be one of {VERIFY_BACKENDS}, got {self.verify_backend!r}"
            )
        if self.fp8_decode not in FP8_DECODE:
            raise ValueError(f"fp8_decode must be one of {FP8_DECODE}, got {self.fp8_decode!r}")


def _is_tile(tile: object) -> bool:
    """Three positive powers of two: Triton block sizes and a warp count."""
    if not isinstance(tile, tuple) or len(tile) != 3:
        return False
    ints = all(isinstance(n, int) and not isinstance(n, bool) for n in tile)
    return ints and all(n > 0 and n & (n - 1) == 0 for n in tile)
