// Decode-regime grouped GEMM for nvfp4 weights on Hopper wgmma, weights as the M operand taken
// from REGISTERS (the tokens of one 32-row m-tile are the N operand, bf16, from shared memory).
//
// Why registers: Hopper has no fp4 tensor cores, so every weight is widened to bf16 once
// (e2m1 * e4m3 block scale, exact in bf16: <= 6 significant bits). Widening in registers straight
// into wgmma's A fragment skips a shared-memory round trip of the widened tile. The widening is
// shifts and masks that put a code's bits straight into a (2^-126-scaled) bf16, then one bf16x2
// multiply by the block scale (e2m1x8_to_bf16 in nvfp4_layout.h; it replaced PRMT table lookups,
// see below).
//
// K order. The nvfp4 scale changes every 16 K. In wgmma's A fragment a thread holds, per k16
// instruction and row, only 4 of the 16 K values, so in natural order it would need one scale
// conversion per 4 weights. Instead the K order inside each 64-K block is permuted (the same
// permutation for weights and tokens, so the dot products are unchanged): over the four k16
// instructions of a block, thread t of a quad (t = lane % 4) holds exactly the 16 K values
// 16t .. 16t+15 of its rows, i.e. one whole scale block: one 8-byte load and one scale per row.
// Within those 16 the decode's own pairing (codes i and i + 4 of a 32-bit word share a register)
// fixes the rest: kperm_pos / kperm_src (nvfp4_layout.h). The weights stay in their natural layout; only the
// tokens are permuted, and they arrive that way already (kperm_nvfp4_tokens below rewrites GEMM1's
// rows in place, and GEMM1's epilogue writes the intermediate that way when GEMM2 runs here too),
// so a stage's token bytes are plain 16-byte copies into the SW128 layout instead of sixteen
// 4-byte copies per thread (ncu: the 4-byte copies and their address arithmetic were ~5%
// of the instructions, and 4 of every 32 bytes moved from L2 were used per request).
//
// Numerics equal the mma.sync nvfp4 path: bf16(e2m1) * bf16(e4m3 scale) exactly (here times 2^-8,
// undone exactly in the epilogue), fp32 accumulation, the per-expert global scale divides the
// accumulator in the epilogue.
//
// Pipeline: one warpgroup per CTA, 128 weight rows (two m64 halves; fused GEMM1: gate rows 0-63,
// up rows 64-127 of the same 64 intermediate columns), stage = 128 K (64 bytes of each weight row:
// two whole 32-byte sectors; 8 scale bytes; two SW128 token atoms), 3 ring slots loaded 1 stage
// ahead (measured: 1.50 / 1.66 ms at M 128 / 2048 against 1.59 / 1.75 with 4 slots 2 ahead; with
// the L2 hints below the copies mostly hit L2), persistent grid over one flat stream of (tile,
// k-stage) steps like engine_wgmma.cuh.
// A stage is two batches of 8 wgmmas (one per 64-K sub-block), each from its own set of A
// registers, and a batch is waited for only when its registers are about to be refilled: the
// decode of one sub-block runs while the tensor cores work on the previous one (before: decode,
// issue, wait for all 16, decode...; ncu: 49% of issue slots used, 2.6 warps per scheduler).
// The stage loaded at step s (for step s + kAhead) goes into the slot of step s - 2, whose batches
// every warp has waited for before the step's barrier (kStages = kAhead + 2).
//
// L2: a stage reads 64 bytes of each of 128 weight rows (half a line). The weight copies carry the
// L2::256B hint, so the first copy of an aligned 256-byte block of a row brings this stage's and
// the next three stages' bytes into L2 and DRAM sees whole lines (cp_async16_l2_256). Before, an
// explicit prefetch instruction per row every second stage, 3 stages ahead, did that (2.02 -> 1.90
// ms at M 128), but it adds L2 requests of its own (ncu: L2 72% busy at 48% DRAM); the hint
// measured 1.49 / 1.61 ms at M 128 / 2048 against 1.52 / 1.66, and dropping the last prefetch (a
// tile's scale rows, a tile ahead) 1.445 / 1.576. Neither reaches the copy rate: the loads alone
// (no decode, a timing variant) take 1.19 ms at M 128, and the issue slots are ~60% used (ncu: 4.3
// cycles per issued instruction with 2.7 warps per scheduler; ~2.9 instructions per weight in the
// stage loop are the decode). Figures of this comment: bench/results/history-runner.md.
// Tried and not kept: 256-K stages (a whole line per row and stage, 34 KB stages, 2 CTAs per SM):
// 1.48-1.50 ms at M 128 (same), 1.88 at M 2048 (worse, from 1.66).
//
#include "run/cuda/engine_wgmma_nvfp4.cuh"

namespace epmoe::cuda::wgf4 {
namespace {

using gemm::cp_async16;
using gemm::cp_commit;
using gemm::cp_wait;
using gemm::smem_u32;
using wg::desc_sw128;
using wg::fence_proxy_async;
using wg::reg_fence;
using wg::wgmma_commit;
using wg::wgmma_fence;
using wg::wgmma_wait0;
using wg::wgmma_wait1;
using namespace nvfp4_layout;

constexpr int kAhead = 1;      // stages loaded ahead of the one computed
constexpr int kStages = kAhead + 2;  // ring slots: the two batches of step s - 1 may still run

struct Layout {
  static constexpr int A = 0;                    // tokens: 2 atoms [32][128 B], SW128, permuted K
  static constexpr int W = 2 * kBT * 128;        // weights [128 rows][64 B], chunk c at c ^ (r & 2)
  static constexpr int S = W + kRowsW * 64;      // scales [128 rows][8 B]
  static constexpr int STAGE = S + kRowsW * 8;   // 17 KB
  static constexpr int TOTAL = STAGE * kStages + 1024;
};
static_assert(Layout::STAGE % 1024 == 0, "token atoms need 1024-byte alignment");

__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 8 : 0));
}
// A weight copy that asks L2 for the aligned 256-byte block around its 16 bytes (see "L2" above).
__device__ __forceinline__ void cp_async16_l2_256(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
// e2m1x8_to_bf16 (nvfp4_layout.h): shifts and masks instead of PRMT lookups. A timing variant
// measured this decode 13% faster than the lookup one (1.56 vs 1.80 ms at M 128; history-runner.md
// in bench/results); the shifts issue on the FMA pipe (IMAD.SHL) next to the ALU pipe's LOP3s,
// where the PRMTs all went to the ALU pipe (51% busy, ncu).

// In place, one thread per 64-K block of a row (it holds all 128 bytes): position p gets natural
// column kperm_src(p) (nvfp4_layout::kperm_block, one byte permute per output word). Rows past
// offsets[E-1] + cnt[E-1] (unused) are left alone. The permute writes GEMM1's rows in this order
// itself where it can (rows.h); this pass covers the rest.
__global__ void kperm_kernel(bf16_raw* __restrict__ A, const int32_t* __restrict__ offsets,
                             const int32_t* __restrict__ cnt, int E, int K, int64_t max_rows) {
  const int64_t rows = min(int64_t(offsets[E - 1]) + cnt[E - 1], max_rows);
  const int64_t blocks = rows * (K / 64);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < blocks; i += int64_t(gridDim.x) * blockDim.x) {
    uint4* p = reinterpret_cast<uint4*>(A + i * 64);
    uint32_t w[32], o[32];
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      const uint4 v = p[c];
      w[4 * c] = v.x, w[4 * c + 1] = v.y, w[4 * c + 2] = v.z, w[4 * c + 3] = v.w;
    }
    nvfp4_layout::kperm_block(w, o);
#pragma unroll
    for (int c = 0; c < 8; ++c) p[c] = make_uint4(o[4 * c], o[4 * c + 1], o[4 * c + 2], o[4 * c + 3]);
  }
}

__global__ void __launch_bounds__(kThreads) nvfp4_wgmma_kernel(GemmArgs p) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint8_t* sbase = smem_raw + (base - raw);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int K = p.K, KT = K / kKS;
  const int rows_w = p.W.rows, cols_w = p.W.cols;
  const int64_t w_row_bytes = cols_w / 2, s_row_bytes = cols_w / 16;
  const wg::TileWalk walk(p, 1, /*expert_order=*/false);  // see TileWalk
  const int my_tiles = walk.my_tiles;
  const int64_t steps = int64_t(my_tiles) * KT;
  using Cur = wg::TileWalk::Tile;

  // Token loads: thread (row tr, quarter tq) copies 16-byte chunks 4tq .. 4tq+3 of its token row's
  // 256 stage bytes (already K-permuted): atom tq / 2, chunks m = 4 (tq % 2) + i, swizzled.
  const int tr = tid >> 2, tq = tid & 3;
  // Weight loads: chunk ch = tid % 4 of tile rows wq + 32 j (j = 0, 1 in half 0; 2, 3 in half 1);
  // (wq + 32 j) & 2 = wq & 2, so one shared offset serves every chunk. Scales: row tid.
  // A load cursor as in engine_wgmma.cuh: a tile's pointers and masks are computed when the cursor
  // enters it and the next tile's table entry is read a tile ahead, so a stage's copies are
  // pointer adds rather than per-step divisions, a dependent table load and row arithmetic.
  const int wq = tid >> 2, ch = tid & 3;
  const uint32_t w_off = uint32_t(Layout::W + wq * 64 + ((ch ^ (wq & 2)) << 4));
  const uint32_t a_off = uint32_t(Layout::A + (tq >> 1) * 4096 + tr * 128);
  const int a_m0 = 4 * (tq & 1), a_sw = tr & 7;
  const int64_t w32 = 32 * w_row_bytes;  // 32 weight rows
  const uint8_t* lw[2] = {nullptr, nullptr};  // W chunk 0 / chunk 2 at kt = 0
  const uint8_t* lw_masked = nullptr;         // row 0 of the expert: the ignored source of a masked chunk
  const uint8_t* ls = nullptr;                // this thread's scale row at kt = 0
  const uint8_t* la = nullptr;                // this thread's token bytes at kt = 0
  uint32_t lok = 0;                           // bits 0-3: W chunk j valid; 4: scale row; 5: token row
  auto enter_tile = [&](const Cur& c) {
    const int e = c.mt.expert;
    const uint8_t* W = static_cast<const uint8_t*>(p.W.data) + int64_t(e) * rows_w * w_row_bytes;
    const uint8_t* Sc = static_cast<const uint8_t*>(p.W.scales) + int64_t(e) * rows_w * s_row_bytes;
    lw_masked = W + ch * 16;
#pragma unroll
    for (int h = 0; h < 2; ++h) lw[h] = W + int64_t(walk.w_row(c.n0, 64 * h) + wq) * w_row_bytes + ch * 16;
    uint32_t ok = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) ok |= uint32_t(walk.w_ok(c.n0, wq + 32 * j)) << j;
    const bool sok = walk.w_ok(c.n0, tid);
    ok |= uint32_t(sok) << 4;
    ls = Sc + int64_t(sok ? walk.w_row(c.n0, tid) : 0) * s_row_bytes;
    const bool aok = tr < c.mt.rows;
    ok |= uint32_t(aok) << 5;
    la = reinterpret_cast<const uint8_t*>(p.A + int64_t(c.mt.row0 + (aok ? tr : 0)) * K) + tq * 64;
    lok = ok;
  };
  wg::LoadCursor lc;
  lc.start(walk, enter_tile);
  auto load_next = [&]() {
    const uint32_t st = base + uint32_t(lc.slot) * Layout::STAGE;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const bool v = (lok >> j) & 1u;
      const uint8_t* src = (v ? lw[j >> 1] + (j & 1) * w32 : lw_masked) + int64_t(lc.kt) * 64;
      cp_async16_l2_256(st + w_off + 2048u * j, src, v);
    }
    cp_async8(st + Layout::S + tid * 8, ls + int64_t(lc.kt) * 8, (lok >> 4) & 1u);
    // Token rows past the m-tile's rows are not copied at all (not even zero-filled): they only
    // feed accumulator columns that the epilogue never stores, whatever the stale bytes hold. At
    // 1-16 rows per expert that is most of the tile.
    if ((lok >> 5) & 1u) {
      const uint8_t* A = la + int64_t(lc.kt) * kKS * 2;
#pragma unroll
      for (int i = 0; i < 4; ++i) cp_async16(st + a_off + (((a_m0 + i) ^ a_sw) << 4), A + i * 16, true);
    }
    lc.advance(KT, kStages, walk, enter_tile);
  };

  float acc[2][16];
  zero(acc);

#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < steps) load_next();
    cp_commit();
  }

  Cur cur = my_tiles > 0 ? walk.at(0) : Cur{};
  int c_kt = 0, c_slot = 0, c_local = 0;  // compute cursor: k-stage, ring slot and tile of step s
  // A fragments of one sub-block: [half][row q (r0, r0+8)][8 x bf16x2 = the 16 values of block t].
  uint32_t wa[2][2][2][8];
  for (int64_t s = 0; s < steps; ++s) {
    const int kt = c_kt, slot = c_slot;
    if (++c_kt == KT) c_kt = 0;
    if (++c_slot == kStages) c_slot = 0;
    cp_wait<kAhead - 1>();
    fence_proxy_async();
    // Stage s visible to all; every warp has waited for the batches of step s - 2 (at the latest
    // before its second batch of step s - 1), so the slot of step s - 2 is free.
    __syncthreads();
    {
      if (s + kAhead < steps) load_next();
      cp_commit();
    }
    const uint32_t st = base + uint32_t(slot) * Layout::STAGE;
    const uint8_t* sp = sbase + slot * Layout::STAGE;

    // Scales of block t (sub-block 0) and 4 + t (sub-block 1) of each row.
    uint32_t scl[2][2][2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int r = h * 64 + 16 * warp + g + 8 * q;
        const uint2 sc8 = *reinterpret_cast<const uint2*>(sp + Layout::S + r * 8);
        scale_pair(prmt(sc8.x, sc8.y, uint32_t(t) | (uint32_t(t + 4) << 4)), scl[h][q]);
      }
#pragma unroll
    for (int sb = 0; sb < 2; ++sb) {
      // The batch that last read wa[sb] (sub-block sb of step s - 1) must be done; the other one
      // may still run.
      wgmma_wait1();
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int r = h * 64 + 16 * warp + g + 8 * q;
          const uint32_t s2 = scl[h][q][sb];
          const int c16 = sb * 2 + (t >> 1);
          const uint2 v = *reinterpret_cast<const uint2*>(sp + Layout::W + r * 64 + ((c16 ^ (r & 2)) << 4) + (t & 1) * 8);
          decode16(v.x, v.y, s2, wa[sb][h][q]);
        }
      issue_batch(acc, wa[sb], st + Layout::A + sb * 4096);
    }
    if (kt != KT - 1) continue;

    wgmma_wait0();
    store_tile(p, cur, acc, warp, lane);
    if (++c_local < my_tiles) cur = walk.at(c_local);
  }
  wgmma_wait0();
  cp_wait<0>();
}

}  // namespace
}  // namespace epmoe::cuda::wgf4

namespace epmoe::cuda {

bool wgmma_nvfp4_supports(int K, int N, bool fused, bool prepared) {
  // The prepared engines run a last half stage (K % 128 == 64); this natural-layout one does not.
  return K % (prepared ? wgf4::kKS / 2 : wgf4::kKS) == 0 && (!fused || N % 64 == 0);
}

void kperm_nvfp4_tokens(bf16_raw* A, const int32_t* offsets, const int32_t* cnt, int E, int K, int64_t max_rows,
                        cudaStream_t stream) {
  if (E <= 0 || max_rows <= 0) return;
  if (K % 64 != 0 || reinterpret_cast<uintptr_t>(A) % 16 != 0)
    throw UsageError("cuda runner (wgmma nvfp4): token K-permutation needs K % 64 == 0 and a 16-byte aligned A, got K=" +
                     std::to_string(K));
  const int64_t blocks = max_rows * (K / 64);
  const int grid = static_cast<int>(std::min<int64_t>((blocks + 255) / 256, 132 * 8));
  wgf4::kperm_kernel<<<grid, 256, 0, stream>>>(A, offsets, cnt, E, K, max_rows);
  EPMOE_CUDA_CHECK_LAUNCH();
}

void launch_grouped_gemm_wgmma_nvfp4(const GemmArgs& a, cudaStream_t stream) {
  using namespace wgf4;
  const char* what = "cuda runner (wgmma nvfp4)";
  check_no_a_rows(a, what);
  if (a.K % kKS != 0)
    throw UsageError(std::string(what) + ": GEMM K=" + std::to_string(a.K) + " is not a multiple of " +
                     std::to_string(kKS) + "; use the mma.sync engine for this shape");
  if (a.fused && a.N % 64 != 0)
    throw UsageError(std::string(what) + ": intermediate=" + std::to_string(a.N) + " is not a multiple of 64");
  if (a.W.format != WeightFormat::nvfp4 || !a.W.scales || !a.W.global_scale || !a.A)
    throw UsageError(std::string(what) + ": needs nvfp4 weights with scales and global_scale, and bf16 A (weights are " +
                     format_name(a.W.format) + ")");
  constexpr int smem = Layout::TOTAL;
  const int grid = wg::persistent_grid(a, reinterpret_cast<const void*>(nvfp4_wgmma_kernel), smem);
  if (grid <= 0) return;
  nvfp4_wgmma_kernel<<<grid, kThreads, smem, stream>>>(a);
  EPMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace epmoe::cuda
