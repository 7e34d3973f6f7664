"""The e4m3 -> bf16 widening that the FP8 GEMV's BITS configs run as inline PTX
(`ninfer.ops.cuda.fp8.E4M3_BF16_ASM`), executed here by a small interpreter of the PTX it
uses (mov, prmt, and, shr, or, fma.rn.bf16x2), on every byte in every position of the word:
each result must be torch's e4m3 -> bf16 conversion, bit for bit. The hardware runs it in
tests/ops/test_cuda_fp8.py (`test_every_skinny_config_widens_every_e4m3_value_exactly`)."""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("triton")

from ninfer.ops.cuda.fp8 import E4M3_BF16_ASM  # noqa: E402

MASK = 0xFFFFFFFF


def _bf16x2(word: int) -> torch.Tensor:
    lanes = torch.tensor([word & 0xFFFF, word >> 16], dtype=torch.int32).to(torch.int16)
    return lanes.view(torch.bfloat16)


def _word(pair: torch.Tensor) -> int:
    lo, hi = (int(v) & 0xFFFF for v in pair.view(torch.int16))
    return lo | hi << 16


def _prmt(a: int, b: int, selector: int) -> int:
    source = (a | b << 32).to_bytes(8, "little")
    picked = [source[(selector >> (4 * i)) & 0x7] for i in range(4)]
    assert not selector & 0x8888, "sign-replicating selectors are not interpreted"
    return int.from_bytes(bytes(picked), "little")


def run_asm(asm: str, word: int) -> tuple[int, int]:
    """Runs the asm block with $2 = word; returns ($0, $1)."""
    regs: dict[str, int] = {"$2": word}

    def val(token: str) -> int:
        return int(token, 0) if token[0].isdigit() else regs[token]

    for line in asm.strip().strip("{}").split(";"):
        line = line.strip()
        if not line or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        d, *src = [t.strip() for t in args.split(",")]
        v = [val(t) for t in src]
        if op == "mov.b32":
            regs[d] = v[0]
        elif op == "prmt.b32":
            regs[d] = _prmt(v[0], v[1], v[2])
        elif op == "and.b32":
            regs[d] = v[0] & v[1]
        elif op == "or.b32":
            regs[d] = v[0] | v[1]
        elif op == "shr.b32":
            regs[d] = (v[0] & MASK) >> v[1]
        elif op == "fma.rn.bf16x2":
            a, b, c = (_bf16x2(x).double() for x in v)
            regs[d] = _word((a * b + c).to(torch.bfloat16))
        else:
            raise AssertionError(f"unknown instruction {op!r}")
    return regs["$0"], regs["$1"]


def test_the_asm_widens_every_e4m3_byte_in_every_position_exactly():
    asm = E4M3_BF16_ASM.value
    assert set(re.findall(r"\$\d", asm)) == {"$0", "$1", "$2"}
    checked = 0
    for start in range(256):
        data = [(start + i) % 256 for i in range(4)]
        lo, hi = run_asm(asm, int.from_bytes(bytes(data), "little"))
        got = torch.cat([_bf16x2(lo), _bf16x2(hi)])
        for pos, byte in enumerate(data):
            if byte & 0x7F == 0x7F:  # e4m3's NaNs: no quantised weight holds one
                continue
            want = torch.tensor([byte], dtype=torch.uint8).view(torch.float8_e4m3fn)
            want = want.to(torch.bfloat16)
            assert got[pos].view(torch.int16) == want.view(torch.int16), (byte, pos)
            checked += 1
    assert checked == 254 * 4
