#!/usr/bin/env python3
"""Writes src/run/cuda/wgmma_rs.cuh: wgmma m64nNk16 bf16 with register A for N = 8, 16, 32, 64, 96, 128, 160.

Inline PTX needs literal operand lists (N / 2 accumulators each), so they are generated rather
than typed. Run from the repository root after changing the widths; the output is committed.
"""

WIDTHS = (8, 16, 32, 64, 96, 128, 160)

HEAD = """// Hopper wgmma m64nNk16 bf16 x bf16 -> f32 with the A operand from registers (the nvfp4 engines'
// decoded weights) and B (tokens) from a shared-memory descriptor, for the token-tile widths the
// nvfp4 engines run (N = 32, 64, 96, 128, 160; 8 and 16 for a micro-benchmark). d holds the first
// N / 2 accumulators of the m64n160 fragment, whose layout is the same for every N (register i:
// row 16 w + l / 4 + 8 ((i >> 1) & 1), column 8 (i >> 2) + 2 (l % 4) + (i & 1)). Always
// accumulates (scale-d = 1); the caller zeroes d. Written by scripts/gen_wgmma_rs.py (inline PTX
// needs literal operand lists). The 32-row nvfp4 engines use N = 32; N = 8 and 16 only
// bench/micro/wgmma_width.cu (narrower wgmmas in those engines measured slower,
// bench/results/designs-not-kept.md).
#pragma once
#include <cstdint>

namespace epmoe::cuda::wgrs {

template <int N>
__device__ __forceinline__ void wgmma_bf16_rA(float* d, const uint32_t (&a)[4], uint64_t db);
"""


def one(n_cols: int) -> str:
    n = n_cols // 2
    regs = ", ".join(f"%{i}" for i in range(n))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(n))
    return f"""
template <>
__device__ __forceinline__ void wgmma_bf16_rA<{n_cols}>(float* d, const uint32_t (&a)[4], uint64_t db) {{
  asm volatile(
      "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{n + 5}, 0;\\n"
      "wgmma.mma_async.sync.aligned.m64n{n_cols}k16.f32.bf16.bf16 "
      "{{{regs}}}, {{%{n}, %{n + 1}, %{n + 2}, %{n + 3}}}, %{n + 4}, p, 1, 1, 0;\\n}}\\n"
      : {outs}
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}}
"""


def main() -> None:
    text = HEAD + "".join(one(w) for w in WIDTHS) + "\n}  // namespace epmoe::cuda::wgrs\n"
    with open("src/run/cuda/wgmma_rs.cuh", "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
