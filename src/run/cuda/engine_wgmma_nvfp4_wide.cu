// The nvfp4 register-decode wgmma engine for many rows per expert ("wide"): the prepared kernel's
// weight blocks, decode, K order and epilogue (engine_wgmma_nvfp4_prepared.cu), but token tiles of
// up to 128 rows (or 160: Geo below), so each weight is decoded once per 128 tokens instead of once
// per 32. The runner gives each expert the height that makes it fewer tiles (rows.h, launch_count's
// second table; tuning.nvfp4_wide_rows) and launches this kernel once per height.
//
// Why (bench/results/2026-12-01-session10-h200.md): the 32-token decode engine streams and decodes
// an expert's weights once per 32 rows, 5.5 ms at 128 rows per expert (DeepSeek-V3, M 16384), and
// above 192 rows the runner widened nvfp4 to bf16 in scratch for CUTLASS (10.3 ms at M 32768,
// against 4.9 for bf16 weights). Here the weights are never widened into memory.
//
// CTA: two warpgroups, each on its own 128-row weight tile (the prepared layout's tiles, thread tid
// of a warpgroup playing the prepared kernel's thread tid), sharing one token tile. Per tile the
// wgmmas run the narrowest width N = 32, 64, 96 or 128 that covers its rows (wgrs::wgmma_bf16_rA<N>),
// so an expert's last, partial tile costs at most 31 padded token columns; every width reads a
// prefix of the same accumulators. Fused GEMM1: each weight tile is 64 gate + 64 up rows of the
// same columns, so each warpgroup applies SwiGLU to its own accumulators.
//
// Pipeline: a 4-slot shared-memory ring, 2 stages ahead; a slot holds a 128-K stage of the tokens
// ([2 sub-blocks][128 rows][128 B], SW128) and both warpgroups' prepared weight blocks (9 KB each,
// copied as they are), all by cp.async. Slots are guarded by mbarriers: `full` completes when every
// thread's copies of the stage landed (cp.async.mbarrier.arrive.noinc), `empty` when both
// warpgroups' wgmmas that read it are done; no __syncthreads in the loop. Two sets of A registers:
// a sub-block is decoded while the previous sub-block's wgmmas run (wait_group 1).
//
// How it got here (DeepSeek-V3, 128 local experts, H200, ms at M 8192 / 32768 / 131072; session 11):
//   one warpgroup, 64 tokens, weights in registers       2.27 / 8.64 / 35.0  (~330 TFLOP/s)
//   two warpgroups, 128 tokens, weights via the ring     2.55 / 7.63 / 30.1  (+ two A sets: 29.0)
//   + mbarriers instead of the per-stage barrier         2.48 / 6.64 / 26.0  (~440 TFLOP/s)
// ncu before the mbarriers (M 32768): tensor pipe ~42% busy, issue slots 26%, L2 28%, DRAM 12%;
// warps mostly stalled on the per-stage barrier (2.0 of 7.3 cycles per instruction), fixed-latency
// dependencies of the decode (1.4) and the shared-memory queue (1.1). Still below CUTLASS on bf16
// (~600 TFLOP/s), so above policy::kNvfp4WideMaxRows rows per expert the widened copy wins.
//
// Epilogue: GEMM1 (SwiGLU, K order) through wg::store_tile; GEMM2 of the 128-row kernel through
// wg::store_tile_staged (a 2 KB shared buffer per warp, stmatrix.trans, 16-byte stores), the two as
// separate instantiations. Session 19: the epilogue's share of Qwen3-30B GEMM2's warp samples
// 47% -> 21%; DeepSeek-V3 M 32768 6.29 -> 6.04 ms (bench/results/2026-12-02-session19-h200.md).
//
// Arithmetic: the same A fragments (decoded weights times block scale, times 2^-8), the same token K
// order, the same k16 steps in the same order into fp32 accumulators, the same epilogue scale: the
// outputs equal the 32-row engines' bit for bit (tested on the H200: the hardware's sum for one
// output column does not depend on N).
#include "run/cuda/engine_wgmma_nvfp4.cuh"

namespace epmoe::cuda::wgf4w {
namespace {

using namespace wgf4;
using gemm::cp_async16;
using gemm::cp_wait;
using gemm::smem_u32;

constexpr int kGroups = 2;             // warpgroups per CTA, each on its own 128-row weight tile
constexpr int kCtaThreads = kGroups * kThreads;

// Geometry for token tiles of up to TN rows: 128 (kWgmmaWideBlockM), or 160 (kWgmmaWide160BlockM),
// which keeps an expert of 129-160 rows in one tile, one decode of its weights instead of two.
// TN = 160 has 160 accumulators per thread, so it keeps one set of A registers instead of two
// (two would not fit the 255-register budget) and, with 40 KB of tokens per stage, a 3-slot ring
// loaded one stage ahead (four would not fit shared memory; a stage is ~10 MFLOP per CTA, several
// microseconds, so one stage ahead still covers the load latency).
template <int TN>
struct Geo {
  static constexpr int kNR = TN / 2;          // accumulators per m64 half and thread
  static constexpr int kSets = TN > 128 ? 1 : 2;  // A-register sets
  static constexpr int kAhead = TN > 128 ? 1 : 2;  // stages loaded ahead of the one computed
  static constexpr int kSlots = kAhead + 2;   // + the stage computed and the previous one (its last wgmmas)
  static constexpr int kAtom = TN * 128;      // one 64-K sub-block of tokens: [TN rows][128 B], SW128
  static constexpr int kTokBytes = 2 * kAtom; // a stage's tokens
  static constexpr int kSlot = kTokBytes + kGroups * kPreparedBlock;  // + each warpgroup's prepared block
  static constexpr int kBars = kSlot * kSlots;  // full[kSlots] then empty[kSlots] mbarriers
  // Only the 128-row kernel has the staged epilogue: ptxas spills 128 -> 284 B in the 160-row one.
  static constexpr bool kStagedEpilogue = TN == 128;
  static constexpr int kStaged = kBars + 16 * kSlots;  // each warp's wg::store_tile_staged buffer
  static constexpr int kSmem = kStaged + (kStagedEpilogue ? kGroups * 4 * wg::kStagedStoreBytes : 0) + 1024;
  static constexpr int kPasses = (TN + kCtaThreads / 4 - 1) / (kCtaThreads / 4);  // of token-row loads
  static_assert(TN == 128 || TN == 160, "the token-tile widths issue_width covers");
  static_assert(kSlot % 1024 == 0, "SW128 token atoms need 1024-byte alignment");
  static_assert(kSmem <= 227 * 1024, "exceeds Hopper's shared memory per block");
};

// The ring's mbarriers (shared memory, CTA scope).
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
// Arrives once every cp.async this thread issued before has landed (counts as one of the arrivals).
__device__ __forceinline__ void mbar_arrive_cp_async(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

__device__ __forceinline__ uint4 lds16(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}
__device__ __forceinline__ uint2 lds8(uint32_t a) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(a));
  return v;
}

template <int NR>
__device__ __forceinline__ void zero(float (&acc)[2][NR]) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < NR; ++i) acc[h][i] = 0.f;
}

// The 8 wgmmas of one 64-K sub-block at the tile's width n (32, 64, 96, 128, and 160 where NR = 80).
template <int NR>
__device__ __forceinline__ void issue_width(float (&acc)[2][NR], const uint32_t (&wa)[2][2][8], uint32_t tokens,
                                            int n) {
  static_assert(NR == 64 || NR == 80, "the widths below are those of 128- and 160-token tiles");
  switch (n) {
    case 32: issue_batch<32>(acc, wa, tokens); break;
    case 64: issue_batch<64>(acc, wa, tokens); break;
    case 96: issue_batch<96>(acc, wa, tokens); break;
    case 128: issue_batch<128>(acc, wa, tokens); break;
    default:
      if constexpr (NR == 80) issue_batch<160>(acc, wa, tokens);
      break;
  }
}

template <int TN>
__device__ __forceinline__ int tile_width(int rows) { return min(TN, (rows + 31) & ~31); }

// The ring's slots are guarded by mbarriers (full: the stage's copies landed, every thread's
// cp.async arriving on it; empty: both warpgroups' wgmmas that read it are done) instead of one
// __syncthreads per stage, so the warpgroups run out of phase (one decodes while the other's wgmmas
// run) and wait on each other only when a slot is really not ready. Two sets of A registers: a
// sub-block's decode overlaps the previous sub-block's wgmmas (wait for all but the last batch).
// FUSED == p.fused: GEMM1 and GEMM2 are separate instantiations, each with one epilogue. With both
// epilogues in one kernel ptxas spilled 16 B in the 128-row kernel (one reload per stage); apart:
// 4 B in GEMM2 (as before the staged epilogue), none in GEMM1, 128 B (from 136) in the 160-row ones.
template <int TN, bool FUSED>
__global__ void __launch_bounds__(kCtaThreads, 1) nvfp4_wide_kernel(GemmArgs p) {
  using G = Geo<TN>;
  constexpr int kTN = TN, kNR = G::kNR, kAtom = G::kAtom, kTokBytes = G::kTokBytes, kSlot = G::kSlot;
  constexpr int kAhead = G::kAhead, kSlots = G::kSlots, kSets = G::kSets;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;

  // Warpgroup wgi works on weight tile (the group's first n-tile) + wgi; inside it, thread tid
  // plays the prepared kernel's thread tid (its rows, its bytes of each prepared block).
  const int cta_tid = threadIdx.x, wgi = cta_tid / kThreads, tid = cta_tid % kThreads, lane = tid & 31,
            warp = tid >> 5;
  // K % 128 == 64: the last stage is half a stage, sub-block 0 alone (its prepared blocks hold
  // zeros for sub-block 1, and no token bytes past K are read).
  const int K = p.K, KT = (K + kKS - 1) / kKS;
  const bool half = K % kKS != 0;
  const wg::TileWalk walk(p, kGroups, /*expert_order=*/false);
  const int my_tiles = walk.my_tiles;
  const int64_t steps = int64_t(my_tiles) * KT;
  using Cur = wg::TileWalk::Tile;
  const uint8_t* prep = static_cast<const uint8_t*>(p.W.prepared);

  // Token loads (both warpgroups): thread (row tr + 64 i, quarter tq) copies four 16-byte chunks
  // of its row per pass i: quarter tq is bytes 64 tq .. of the stage's 256-byte row, i.e.
  // sub-block tq / 2, chunks 4 (tq % 2) .. +3. Rows past the tile's rows are zero-filled up to
  // its width (their token columns are computed and never stored); rows past the width are not
  // loaded.
  constexpr int kRowsPerPass = kCtaThreads / 4;
  const int tr = cta_tid >> 2, tq = cta_tid & 3;
  const uint32_t a_off = uint32_t((tq >> 1) * kAtom + tr * 128);
  const int a_m0 = 4 * (tq & 1), a_sw = tr & 7;
  const int64_t a_pass = int64_t(kRowsPerPass) * K * 2;  // bytes between rows tr and tr + kRowsPerPass
  // Weight loads: this warpgroup's prepared block of the stage, copied as it is: thread tid its own
  // four 16-byte code chunks (the ones it decodes), threads 0-63 the 1 KB of scales.
  const uint32_t w_off = uint32_t(kTokBytes + wgi * kPreparedBlock);
  const uint8_t* la = nullptr;  // row tr of the tile, quarter tq, at k = 0
  const uint8_t* lw = nullptr;  // this warpgroup's weight tile, stage 0
  int a_rows = 0, a_width = 0;
  auto enter = [&](const Cur& c) {
    a_rows = c.mt.rows;
    a_width = tile_width<kTN>(c.mt.rows);
    la = reinterpret_cast<const uint8_t*>(p.A + int64_t(c.mt.row0 + tr) * K) + tq * 64;
    // Past NT (the odd last group) this warpgroup re-reads tile NT - 1 and stores nothing.
    const int nt = min(c.n0 / walk.n_per_tile + wgi, walk.NT - 1);
    lw = prep + (int64_t(c.mt.expert) * walk.NT + nt) * int64_t(KT) * kPreparedBlock;
  };
  wg::LoadCursor lc;
  lc.start(walk, enter);
  auto load_stage = [&]() {
    const uint32_t st = base + uint32_t(lc.slot) * kSlot;
    const uint8_t* A = la + int64_t(lc.kt) * kKS * 2;
    const bool no_sb1 = half && lc.kt == KT - 1 && tq >= 2;
#pragma unroll
    for (int g = 0; g < G::kPasses; ++g) {
      const int row = tr + kRowsPerPass * g;
      if (row < a_width && !no_sb1) {
        const bool ok = row < a_rows;
        const uint8_t* src = ok ? A + g * a_pass : A;  // a masked copy reads nothing
#pragma unroll
        for (int i = 0; i < 4; ++i)
          cp_async16(st + a_off + g * kRowsPerPass * 128 + (((a_m0 + i) ^ a_sw) << 4), src + i * 16, ok);
      }
    }
    const uint8_t* W = lw + int64_t(lc.kt) * kPreparedBlock;
#pragma unroll
    for (int i = 0; i < 4; ++i) cp_async16(st + w_off + i * 2048 + tid * 16, W + i * 2048 + tid * 16, true);
    if (tid < 64) cp_async16(st + w_off + 8192 + tid * 16, W + 8192 + tid * 16, true);
    lc.advance(KT, kSlots, walk, enter);
  };

  const uint32_t full0 = base + G::kBars, empty0 = full0 + 8 * kSlots;
  {
    if (cta_tid == 0)
      for (int i = 0; i < kSlots; ++i) {
        mbar_init(full0 + 8 * i, kCtaThreads);
        mbar_init(empty0 + 8 * i, kCtaThreads);
      }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    __syncthreads();
  }
  int64_t loaded = 0;  // stages whose copies are issued
  auto produce = [&]() {
    const int slot = lc.slot;
    // The slot's previous stage (loaded - kSlots) must be released by both warpgroups.
    if (loaded >= kSlots) mbar_wait(empty0 + 8 * slot, uint32_t((loaded / kSlots) & 1) ^ 1u);
    load_stage();
    mbar_arrive_cp_async(full0 + 8 * slot);
    ++loaded;
  };

  float acc[2][kNR];
  zero(acc);
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < steps) produce();
  }

  Cur cur = my_tiles > 0 ? walk.at(0) : Cur{};
  int width = my_tiles > 0 ? tile_width<kTN>(cur.mt.rows) : 0;
  // The tile's global scale, loaded when the tile starts and first used by its epilogue, so that no
  // warp waits for the load (ncu: the load and its reciprocal at the tile change were ~2% of the
  // samples when waited for at once).
  float gscale = my_tiles > 0 ? p.W.global_scale[cur.mt.expert] : 1.f;
  int c_kt = 0, c_slot = 0, c_local = 0;
  uint32_t wa[kSets][2][2][8];  // sub-block sb decodes into set sb % kSets
  for (int64_t s = 0; s < steps; ++s) {
    const int kt = c_kt, slot = c_slot;
    if (++c_kt == KT) c_kt = 0;
    const int prev_slot = slot == 0 ? kSlots - 1 : slot - 1;
    if (++c_slot == kSlots) c_slot = 0;
    if (s + kAhead < steps) produce();
    mbar_wait(full0 + 8 * slot, uint32_t((s / kSlots) & 1));
    wg::fence_proxy_async();  // cp.async wrote through the generic proxy; wgmma reads through the async one
    const uint32_t st = base + uint32_t(slot) * kSlot;
    const uint32_t w = st + w_off;
    // Two A sets: all four code chunks and the scales up front (the decode overlaps the other set's
    // wgmmas). One set (160-row tiles): each sub-block's chunks are read after the wait, so that
    // fewer registers are live next to the 160 accumulators.
    uint4 c[4];
    uint2 sc;
    uint32_t scl[2][2][2];
    if constexpr (kSets == 1) sc = lds8(w + 8192 + tid * 8);
    if constexpr (kSets == 2) {
#pragma unroll
      for (int i = 0; i < 4; ++i) c[i] = lds16(w + i * 2048 + tid * 16);
      sc = lds8(w + 8192 + tid * 8);
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int q = 0; q < 2; ++q) scale_pair((h ? sc.y : sc.x) >> (16 * q), scl[h][q]);
    }
#pragma unroll
    for (int sb = 0; sb < 2; ++sb) {
      auto& set = wa[sb % kSets];
      // The batch that last read this set (two sets: the one before the previous) is done.
      if constexpr (kSets == 2)
        wg::wgmma_wait1();
      else
        wg::wgmma_wait0();
      // At sb 1 every wgmma of stage s - 1 is done (all but this stage's sb 0): release its slot.
      if (sb == 1 && s > 0) mbar_arrive(empty0 + 8 * prev_slot);
      // A half stage is always a tile's last: the epilogue below waits for its one batch.
      if (sb == 1 && half && kt == KT - 1) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (kSets == 1) {
          c[2 * sb + h] = lds16(w + (2 * sb + h) * 2048 + tid * 16);
#pragma unroll
          for (int q = 0; q < 2; ++q) scale_pair((h ? sc.y : sc.x) >> (16 * q), scl[h][q]);
        }
        const uint4 v = c[2 * sb + h];
        decode16<true>(v.x, v.y, scl[h][0][sb], set[h][0]);
        decode16<true>(v.z, v.w, scl[h][1][sb], set[h][1]);
      }
      issue_width(acc, set, st + sb * kAtom, width);
    }
    if (kt == KT - 1) {
      wg::wgmma_wait0();
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < kNR; ++i) asm volatile("" : "+f"(acc[h][i])::"memory");
      const float out_scale = nvfp4_layout::kAccScale / gscale;
      const Cur mine{cur.mt, cur.n0 + wgi * walk.n_per_tile};
      if (mine.n0 / walk.n_per_tile < walk.NT) {
        // GEMM2 (non-fused) through the staged 16-byte epilogue (launch_wide checks its conditions).
        if constexpr (G::kStagedEpilogue && !FUSED)
          wg::store_tile_staged(p, mine, acc, warp, lane, out_scale,
                                base + uint32_t(G::kStaged + (wgi * 4 + warp) * wg::kStagedStoreBytes));
        else
          wg::store_tile<kNR, FUSED ? 1 : 0>(p, mine, acc, warp, lane, out_scale, p.out_kperm);
      }
      zero(acc);
      if (++c_local < my_tiles) {
        cur = walk.at(c_local);
        width = tile_width<kTN>(cur.mt.rows);
        gscale = p.W.global_scale[cur.mt.expert];
      }
    }
  }
  wg::wgmma_wait0();
  cp_wait<0>();
}

}  // namespace
}  // namespace epmoe::cuda::wgf4w

namespace epmoe::cuda {

namespace {
template <int TN>
void launch_wide(const GemmArgs& a, cudaStream_t stream) {
  using namespace wgf4w;
  const void* k = a.fused ? reinterpret_cast<const void*>(nvfp4_wide_kernel<TN, true>)
                          : reinterpret_cast<const void*>(nvfp4_wide_kernel<TN, false>);
  const KernelFit fit = fit_kernel(k, kCtaThreads, Geo<TN>::kSmem);
  const int n_per_tile = a.fused ? wgf4::kRowsW / 2 : wgf4::kRowsW;
  const int64_t groups = ((a.N + n_per_tile - 1) / n_per_tile + kGroups - 1) / kGroups;
  const int grid = static_cast<int>(std::min<int64_t>(int64_t(a.max_tiles) * groups, int64_t(fit.sms) * fit.per_sm));
  if (grid <= 0) return;
  if (a.fused)
    nvfp4_wide_kernel<TN, true><<<grid, kCtaThreads, Geo<TN>::kSmem, stream>>>(a);
  else
    nvfp4_wide_kernel<TN, false><<<grid, kCtaThreads, Geo<TN>::kSmem, stream>>>(a);
  EPMOE_CUDA_CHECK_LAUNCH();
}
}  // namespace

void launch_grouped_gemm_wgmma_nvfp4_wide(const GemmArgs& a, int tile_rows, cudaStream_t stream) {
  check_no_a_rows(a, "cuda runner (wgmma nvfp4, wide)");
  if (!a.W.prepared || !a.W.global_scale || !a.A)
    throw UsageError("cuda runner (wgmma nvfp4, wide): needs prepared weights, global_scale and bf16 A");
  // The staged GEMM2 epilogue writes 8 output columns with one 16-byte store.
  if (!a.fused && (a.N % 8 != 0 || reinterpret_cast<uintptr_t>(a.out) % 16 != 0))
    throw UsageError("cuda runner (wgmma nvfp4, wide): GEMM2 output needs N % 8 == 0 (N = " + std::to_string(a.N) +
                     ") and a 16-byte aligned pointer (out); H is a multiple of 64 and the runner's buffers come "
                     "from cudaMalloc, so pass an aligned buffer");
  if (tile_rows == kWgmmaWide160BlockM)
    launch_wide<kWgmmaWide160BlockM>(a, stream);
  else if (tile_rows == kWgmmaWideBlockM)
    launch_wide<kWgmmaWideBlockM>(a, stream);
  else
    throw UsageError("cuda runner (wgmma nvfp4, wide): token tiles of " + std::to_string(tile_rows) +
                     " rows; this engine has 128 and 160");
}

}  // namespace epmoe::cuda
