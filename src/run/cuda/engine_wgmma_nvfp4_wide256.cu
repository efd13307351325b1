// The nvfp4 register-decode wgmma engine for experts of more than 128 rows ("wide256"): the wide
// engine's prepared weight blocks, decode, K order and mbarrier ring, but token tiles of up to 256
// rows, so each weight is decoded once per 256 tokens instead of once per 128.
//
// Why (bench/results/2026-12-01-session13-h200.md): an expert of 129-256 rows takes two 128-row
// tiles on the wide engine, and each decodes every weight of the expert again; under the router at
// 4096 tokens per GPU (DeepSeek-V3, 128 rows per expert on average) half the experts pay that, and
// the nvfp4 layer fell behind the bf16 one (8.34 against 7.04 ms).
//
// Registers bound the shape: a thread holds 128 fp32 accumulators, which the wide engine spends on
// two m64 halves x 128 tokens and this one on one m64 x 256 tokens. So a CTA is two warpgroups on
// the two 64-row halves of one 128-row prepared weight tile, each running m64nNk16 with N the
// tile's width rounded up to 32 (<= 256), and both share the stage's tokens in shared memory.
// Fused GEMM1: the prepared tile is 64 gate rows (half 0) and 64 up rows (half 1) of the same
// columns; here a warpgroup takes 32 of those columns, gate and up, and puts a column's gate row in
// fragment row g and its up row in row g + 8 (one thread holds both, as wgmma's fragment pairs rows g
// and g + 8), so SwiGLU needs no exchange. Each thread therefore reads 8-byte pieces of the
// prepared threads' 16-byte chunks, from shared memory, where the wide engine reads whole chunks.
//
// Pipeline: stages of 64 K (one sub-block: [256 rows][128 B] SW128 tokens = 32 KB, the sub-block's
// 4 KB of codes and the 1 KB of scales of its 128-K block), 5 ring slots, 3 stages ahead, guarded by
// mbarriers as in the wide engine. Two A-register sets: a stage's decode overlaps the previous
// stage's wgmmas. K % 128 == 64 (gpt-oss) is just an odd number of stages.
//
// Arithmetic: the same decoded A values, token K order, k16 steps in the same order into fp32
// accumulators and the same epilogue as the other nvfp4 engines; a product's row in the fragment
// differs (fused), the expected result does not (tests compare the engines bit for bit).
#include "run/cuda/engine_wgmma_nvfp4.cuh"

namespace epmoe::cuda::wgf4t {
namespace {

using namespace wgf4;
using gemm::cp_async16;
using gemm::cp_wait;
using gemm::smem_u32;

constexpr int kTN = kWgmmaWide256BlockM;  // token rows per tile
constexpr int kNR = kTN / 2;              // accumulators per thread
constexpr int kGroups = 2;                // warpgroups per CTA, one per 64-row half of the weight tile
constexpr int kCtaThreads = kGroups * kThreads;
constexpr int kSK = 64;                   // K per stage
constexpr int kAhead = 3;                 // stages loaded ahead of the one computed
constexpr int kSlots = kAhead + 2;        // + the stage computed and the previous one (its wgmmas)
constexpr int kTokBytes = kTN * 128;      // [kTN rows][128 B], SW128
constexpr int kCodeBytes = 4096;          // one sub-block of a prepared block: [half][thread][16 B]
constexpr int kScaleBytes = 1024;         // the 128-K block's scales: [thread][8 B]
constexpr int kSlot = kTokBytes + kCodeBytes + kScaleBytes;
constexpr int kBars = kSlot * kSlots;     // full[kSlots] then empty[kSlots]
constexpr int kSmem = kBars + 16 * kSlots + 1024;
static_assert(kSlot % 1024 == 0, "SW128 token atoms need 1024-byte alignment");
static_assert(kPreparedBlock == 2 * kCodeBytes + kScaleBytes, "prepared block: two sub-blocks of codes, then scales");
static_assert(kTN % (kCtaThreads / 2) == 0, "whole passes of token rows");

__device__ __forceinline__ uint32_t lds4(uint32_t a) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(a));
  return v;
}

__device__ __forceinline__ int tile_width(int rows) { return min(kTN, (rows + 31) & ~31); }

template <int N>
__device__ __forceinline__ void batch(float (&acc)[kNR], const uint32_t (&wa)[2][8], uint32_t tokens) {
  wg::wgmma_fence();
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t a[4] = {wa[0][2 * j], wa[1][2 * j], wa[0][2 * j + 1], wa[1][2 * j + 1]};
    wgrs::wgmma_bf16_rA<N>(acc, a, wg::desc_sw128(tokens + j * 32));
  }
  wg::wgmma_commit();
}

// The 4 wgmmas of one stage at the tile's width n (a multiple of 32, <= 256).
__device__ __forceinline__ void issue(float (&acc)[kNR], const uint32_t (&wa)[2][8], uint32_t tokens, int n) {
  switch (n) {
    case 32: batch<32>(acc, wa, tokens); break;
    case 64: batch<64>(acc, wa, tokens); break;
    case 96: batch<96>(acc, wa, tokens); break;
    case 128: batch<128>(acc, wa, tokens); break;
    case 160: batch<160>(acc, wa, tokens); break;
    case 192: batch<192>(acc, wa, tokens); break;
    case 224: batch<224>(acc, wa, tokens); break;
    default: batch<256>(acc, wa, tokens); break;
  }
}

// Accumulator register i of thread (warp w, lane l): fragment row 16 w + l / 4 + 8 ((i >> 1) & 1),
// token 8 (i >> 2) + 2 (l % 4) + (i & 1). Fused: fragment rows g / g + 8 are gate / up of column
// `col`; unfused: weight rows row0 and row0 + 8.
__device__ __forceinline__ void store(const GemmArgs& p, const MTile& mt, int n0, const float (&acc)[kNR], int lane,
                                      int col_or_row0, float scale) {
#pragma unroll
  for (int j = 0; j < kNR / 4; ++j)
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int tok = 8 * j + 2 * (lane & 3) + q;
      if (tok >= mt.rows) continue;
      bf16_raw* orow = p.out + int64_t(mt.row0 + tok) * p.N;
      const int i = 4 * j + q;
      if (p.fused) {
        const float gt = acc[i] * scale, up = acc[i + 2] * scale;
        orow[n0 + (p.out_kperm ? nvfp4_layout::kperm_pos(col_or_row0) : col_or_row0)] = num::f32_to_bf16(silu(gt) * up);
      } else {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int n = n0 + col_or_row0 + 8 * hh;
          if (n < p.N) orow[n] = num::f32_to_bf16(acc[i + 2 * hh] * scale);
        }
      }
    }
}

__global__ void __launch_bounds__(kCtaThreads, 1) nvfp4_wide256_kernel(GemmArgs p) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;

  const int cta_tid = threadIdx.x, wgi = cta_tid / kThreads, tid = cta_tid % kThreads, lane = tid & 31,
            warp = tid >> 5;
  const int K = p.K, KS = K / kSK, KT = (K + kKS - 1) / kKS;  // 64-K stages; 128-K prepared blocks
  const wg::TileWalk walk(p);
  const int my_tiles = walk.my_tiles;
  const int64_t steps = int64_t(my_tiles) * KS;
  using Cur = wg::TileWalk::Tile;
  const uint8_t* prep = static_cast<const uint8_t*>(p.W.prepared);

  // Which 8-byte pieces of the prepared block this thread decodes (prepared thread t, half h,
  // bytes 8q of its 16-byte chunk = its row g (q 0) or g + 8 (q 1)), for fragment rows g and g + 8.
  // Unfused: half wgi as the prepared thread tid holds it. Fused: column c = 32 wgi + 8 warp + l / 4
  // of the tile, gate from half 0 and up from half 1, both held by prepared thread t at byte 8q.
  // scale_off: the 4-byte word (both sub-blocks' scales of both rows of one half) holding the
  // piece's two scale bytes, at bit scale_shift.
  int code_off[2], scale_off[2], scale_shift[2], out_pos;
  if (p.fused) {
    const int c = 32 * wgi + 8 * warp + (lane >> 2), r = c & 15;
    const int t = 32 * (c >> 4) + 4 * (r & 7) + (lane & 3), q = r >> 3;
    for (int f = 0; f < 2; ++f) {
      code_off[f] = f * 2048 + t * 16 + 8 * q;
      scale_off[f] = t * 8 + 4 * f;
      scale_shift[f] = 16 * q;
    }
    out_pos = c;
  } else {
    for (int f = 0; f < 2; ++f) {
      code_off[f] = wgi * 2048 + tid * 16 + 8 * f;
      scale_off[f] = tid * 8 + 4 * wgi;
      scale_shift[f] = 16 * f;
    }
    out_pos = 64 * wgi + 16 * warp + (lane >> 2);
  }

  // Token loads: thread (row tr + 128 i, half th) copies 16-byte chunks 4 th .. 4 th + 3 of its
  // row's 128 bytes. Rows past the tile's rows are zero-filled up to its width; rows past the width
  // are not loaded (their token columns are never computed).
  constexpr int kRowsPerPass = kCtaThreads / 2;
  const int tr = cta_tid >> 1, th = cta_tid & 1;
  const uint32_t a_off = uint32_t(tr * 128);
  const int a_sw = tr & 7;
  const int64_t a_pass = int64_t(kRowsPerPass) * K * 2;
  const uint8_t* la = nullptr;  // row tr of the tile, chunk 4 th, at k = 0
  const uint8_t* lw = nullptr;  // the tile's prepared blocks
  int a_rows = 0, a_width = 0;
  auto enter = [&](const Cur& c) {
    a_rows = c.mt.rows;
    a_width = tile_width(c.mt.rows);
    la = reinterpret_cast<const uint8_t*>(p.A + int64_t(c.mt.row0 + tr) * K) + th * 64;
    lw = prep + (int64_t(c.mt.expert) * walk.NT + c.n0 / walk.n_per_tile) * int64_t(KT) * kPreparedBlock;
  };
  wg::LoadCursor lc;
  lc.start(walk, enter);
  auto load_stage = [&]() {
    const uint32_t st = base + uint32_t(lc.slot) * kSlot;
    const uint8_t* A = la + int64_t(lc.kt) * kSK * 2;
#pragma unroll
    for (int g = 0; g < kTN / kRowsPerPass; ++g) {
      const int row = tr + kRowsPerPass * g;
      if (row < a_width) {
        const bool ok = row < a_rows;
        const uint8_t* src = ok ? A + g * a_pass : A;  // a masked copy reads nothing
#pragma unroll
        for (int i = 0; i < 4; ++i)
          cp_async16(st + a_off + g * kRowsPerPass * 128 + (((4 * th + i) ^ a_sw) << 4), src + i * 16, ok);
      }
    }
    const uint8_t* W = lw + int64_t(lc.kt >> 1) * kPreparedBlock;
    cp_async16(st + kTokBytes + cta_tid * 16, W + (lc.kt & 1) * kCodeBytes + cta_tid * 16, true);
    if (cta_tid < kScaleBytes / 16)
      cp_async16(st + kTokBytes + kCodeBytes + cta_tid * 16, W + 2 * kCodeBytes + cta_tid * 16, true);
    lc.advance(KS, kSlots, walk, enter);
  };

  const uint32_t full0 = base + kBars, empty0 = full0 + 8 * kSlots;
  {
    if (cta_tid == 0)
      for (int i = 0; i < kSlots; ++i) {
        mbar_init(full0 + 8 * i, kCtaThreads);
        mbar_init(empty0 + 8 * i, kCtaThreads);
      }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    __syncthreads();
  }
  int64_t loaded = 0;
  auto produce = [&]() {
    const int slot = lc.slot;
    if (loaded >= kSlots) mbar_wait(empty0 + 8 * slot, uint32_t((loaded / kSlots) & 1) ^ 1u);
    load_stage();
    mbar_arrive_cp_async(full0 + 8 * slot);
    ++loaded;
  };

  float acc[kNR];
#pragma unroll
  for (int i = 0; i < kNR; ++i) acc[i] = 0.f;
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < steps) produce();
  }

  Cur cur = my_tiles > 0 ? walk.at(0) : Cur{};
  int width = my_tiles > 0 ? tile_width(cur.mt.rows) : 0;
  int c_kt = 0, c_slot = 0, c_local = 0;
  uint32_t wa[2][2][8];  // two sets: stage s decodes into set s & 1
  for (int64_t s = 0; s < steps; ++s) {
    const int kt = c_kt, slot = c_slot;
    if (++c_kt == KS) c_kt = 0;
    if (++c_slot == kSlots) c_slot = 0;
    // Stage s - 2's batch, the last reader of this stage's A set and of its slot, is done.
    wg::wgmma_wait1();
    if (s >= 2) mbar_arrive(empty0 + 8 * ((slot + kSlots - 2) % kSlots));
    if (s + kAhead < steps) produce();
    mbar_wait(full0 + 8 * slot, uint32_t((s / kSlots) & 1));
    wg::fence_proxy_async();  // cp.async wrote through the generic proxy; wgmma reads through the async one
    const uint32_t st = base + uint32_t(slot) * kSlot;
    const uint32_t w = st + kTokBytes;
    auto& set = wa[s & 1];
#pragma unroll
    for (int f = 0; f < 2; ++f) {
      const uint2 v = lds8(w + code_off[f]);
      uint32_t sc2[2];
      scale_pair(lds4(w + kCodeBytes + scale_off[f]) >> scale_shift[f], sc2);
      decode16<true>(v.x, v.y, sc2[kt & 1], set[f]);
    }
    issue(acc, set, st, width);
    if (kt == KS - 1) {
      wg::wgmma_wait0();
#pragma unroll
      for (int i = 0; i < kNR; ++i) asm volatile("" : "+f"(acc[i])::"memory");
      store(p, cur.mt, cur.n0, acc, lane, out_pos, nvfp4_layout::kAccScale / p.W.global_scale[cur.mt.expert]);
#pragma unroll
      for (int i = 0; i < kNR; ++i) acc[i] = 0.f;
      if (++c_local < my_tiles) {
        cur = walk.at(c_local);
        width = tile_width(cur.mt.rows);
      }
    }
  }
  wg::wgmma_wait0();
  cp_wait<0>();
}

}  // namespace
}  // namespace epmoe::cuda::wgf4t

namespace epmoe::cuda {

void launch_grouped_gemm_wgmma_nvfp4_wide256(const GemmArgs& a, cudaStream_t stream) {
  using namespace wgf4t;
  if (!a.W.prepared || !a.W.global_scale || !a.A)
    throw UsageError("cuda runner (wgmma nvfp4, wide256): needs prepared weights, global_scale and bf16 A");
  const void* k = reinterpret_cast<const void*>(nvfp4_wide256_kernel);
  const KernelFit fit = fit_kernel(k, kCtaThreads, kSmem);
  const int n_per_tile = a.fused ? wgf4::kRowsW / 2 : wgf4::kRowsW;
  const int64_t nt = (a.N + n_per_tile - 1) / n_per_tile;
  const int grid = static_cast<int>(std::min<int64_t>(int64_t(a.max_tiles) * nt, int64_t(fit.sms) * fit.per_sm));
  if (grid <= 0) return;
  nvfp4_wide256_kernel<<<grid, kCtaThreads, kSmem, stream>>>(a);
  EPMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace epmoe::cuda
