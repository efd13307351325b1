// Decode-regime grouped GEMM on Hopper warpgroup MMA (wgmma, sm_90a), operands swapped: the weight
// tile is the wgmma "A" (M = 64 weight rows per instruction, two instructions = 128 rows per CTA)
// and the tokens of one m-tile are the wgmma "N" (32 tokens). With 1-16 rows per expert the token
// side is tiny, so putting the weights on M wastes nothing and the whole CTA streams weight bytes.
//
// Why wgmma and not mma.sync here: on sm_90 `mma.sync ... e4m3` is emulated (the operands are
// converted to f16 first), so the only fp8 tensor-core path is wgmma (QGMMA); and for bf16 a
// single warpgroup issuing 8 wgmmas per 16 KB stage leaves the SM free to keep loads in flight.
//
//   bf16 : W bf16 [rows][K], A bf16 [rows][K]; m64n32k16, fp32 accumulation straight in the
//          accumulators.
//   fp8  : W e4m3 with one fp32 scale per 128x128 tile, A e4m3 with one fp32 scale per token and
//          128-block of K (the dispatch's fp8 format, or the fp8 intermediate). One stage is one
//          128-K block: four m64n32k32 wgmmas build a partial sum from zero, which is then folded
//          into the fp32 accumulator as acc += partial * (w_scale * a_scale[token]) ("promotion"),
//          so neither operand is ever widened or rounded.
//
// Shared memory per stage: W [128 rows][128 B] and A [32 rows][128 B], both in the 128-byte swizzle
// (16-byte chunk c of row r at c ^ (r & 7), 1024-byte aligned), which is the canonical K-major
// SW128 layout the wgmma descriptors describe; plus the stage's scales. Loads are 16-byte cp.async,
// 4 stages deep, two CTAs per SM; the grid is persistent over (m-tile, n-tile) pairs read from the
// device tile table (so launches never need the host to know the counts), and the pipeline runs on
// across tile boundaries.
//
// Two pipelines, the same arithmetic in the same order (so bitwise the same results):
//   plain    : issue stage s's wgmmas, wait for them, (fp8) promote, next stage;
//   deferred : issue stage s's wgmmas and go on; the wait (and fp8 promotion) for stage s happens
//              in the next iteration after its barrier and load issue, so the MMAs of one stage
//              run while the CTA synchronizes and issues the loads of the next. The stage being
//              computed may still be read while the loads of s + 3 land, hence a fifth ring slot
//              (5 x 21 KB, still two CTAs per SM). Tile ends wait at once (the epilogue needs the
//              sums). Chosen per launch by GemmArgs::wgmma_defer (default deferred, engine_wgmma.cu).
#pragma once
#include "core/cuda/pdl.cuh"
#include "epmoe/numeric.h"
#include "quant/cuda/quant_device.cuh"
#include "run/cuda/engine_mma.cuh"
#include "run/cuda/nvfp4_layout.h"
#include "run/cuda/staged_layout.h"
#include "run/cuda/tile_tables.h"

namespace epmoe::cuda::wg {

using gemm::cp_async16;
using gemm::cp_async4;
using gemm::cp_commit;
using gemm::cp_wait;
using gemm::pack_bf16;
using gemm::smem_u32;
using gemm::swz;

constexpr int kBT = 32;         // tokens per m-tile (wgmma N)
constexpr int kRowsW = 128;     // weight rows per CTA tile (two m64 halves)
constexpr int kRowBytes = 128;  // bytes of K per row and stage (fp8: 128 values, bf16: 64)
constexpr int kThreads = 128;   // one warpgroup
constexpr int kStages = 4;

struct Layout {
  static constexpr int W = 0;                      // [128][128 B]
  static constexpr int A = kRowsW * kRowBytes;     // [32][128 B]
  static constexpr int SA = A + kBT * kRowBytes;   // fp8: 32 activation scales (fp32)
  static constexpr int SW = SA + kBT * 4;          // fp8: 2 weight scales (fp32), one per half
  static constexpr int STAGE = 21 * 1024;
  // Ring slots: kStages, plus one in the deferred pipeline; + slack to align the base to 1024.
  static constexpr int slots(bool defer) { return kStages + (defer ? 1 : 0); }
  static constexpr int total(bool defer) { return STAGE * slots(defer) + 1024; }
};
static_assert(Layout::SW + 16 <= Layout::STAGE, "stage layout overflows");
static_assert(Layout::A % 1024 == 0 && Layout::STAGE % 1024 == 0, "SW128 tiles need 1024-byte alignment");

// Shared-memory matrix descriptor, K-major, 128-byte swizzle: start address, LBO (unused for
// swizzled K-major, 16 B), SBO = 1024 B between 8-row groups, layout type 1 (SW128) in bits 62-63.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr) {
  return uint64_t((addr & 0x3FFFFu) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// All but the most recent committed group done (the nvfp4 engine refills one A-register set while
// the other set's batch runs).
__device__ __forceinline__ void wgmma_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }
// cp.async writes are generic-proxy writes; wgmma reads shared memory through the async proxy.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Ties accumulator registers to the surrounding asm order so that no use moves across a wait.
__device__ __forceinline__ void reg_fence(float (&d)[16]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The tiles both decode engines (this file and engine_wgmma_nvfp4.cu) walk: the flat list of (m-tile,
// weight tile) pairs, of which a CTA of the persistent grid takes blockIdx.x, + gridDim.x, ...
// (`local` counts them). A weight tile is kRowsW rows; fused (GEMM1): rows 0-63 gate n0.., rows
// 64-127 up I+n0.. (N = I, a multiple of 64, so every row exists), so each thread holds gate and up
// of the same (column, token) and SwiGLU needs no exchange. A 64-row half never straddles a
// 128-row scale block because n0 and I are multiples of 64 and, where I % 128 != 0, W13's fp8 grid
// starts again at row I (MatrixView::row_split = I).
// `group` weight tiles side by side per CTA tile (the wide nvfp4 engine: one per warpgroup): the
// walk then lists (m-tile, group of weight tiles), n0 the first tile's; the last group of an odd
// NT has tiles past N, which that engine skips. The order of the list: tile_tables::walk_item (an
// expert's m-tiles side by side, so that they share each weight tile through L2: the bf16 / fp8
// engine), or row-major with expert_order = false (the nvfp4 engines, which decode the weights on
// the SMs and run below the copy rate, so a second read from HBM costs them little: the order
// moved them by -3% to +5% under the router and cost up to 5% on uniform loads, session 22; in
// the wide engine its registers would also add to the spills).
struct TileWalk {
  struct Tile {
    MTile mt;
    int n0;
  };
  const MTile* tiles;
  int N, n_per_tile, NT, NG, my_tiles;
  bool fused, expert_order;
  __device__ __forceinline__ explicit TileWalk(const GemmArgs& p, int group = 1, bool expert_order_ = true)
      : tiles(p.tiles), N(p.N), n_per_tile(p.fused ? kRowsW / 2 : kRowsW), fused(p.fused),
        expert_order(expert_order_) {
    NT = (N + n_per_tile - 1) / n_per_tile;
    NG = (NT + group - 1) / group;
    const int total = *p.num_tiles * NG;
    my_tiles = int(blockIdx.x) < total ? (total - 1 - int(blockIdx.x)) / int(gridDim.x) + 1 : 0;
    n_group = group * n_per_tile;
  }
  int n_group;
  __device__ __forceinline__ Tile at(int local) const {
    const int tile = int(blockIdx.x) + local * int(gridDim.x);
    const MTile first = tiles[tile / NG];
    const tile_tables::WalkItem it = tile_tables::walk_item(tile, NG, expert_order ? first.walk : 0);
    return Tile{it.q == tile / NG ? first : tiles[it.q], it.g * n_group};
  }
  // Tile row r -> weight row, and whether it exists.
  __device__ __forceinline__ int w_row(int n0, int r) const { return fused ? (r < 64 ? n0 + r : N + n0 + r - 64) : n0 + r; }
  __device__ __forceinline__ bool w_ok(int n0, int r) const { return fused || n0 + r < N; }
};

// The load cursor both decode engines use: the next stage to load is k-stage `kt` of the CTA's
// local tile `local`, into ring slot `slot`; `next` is the tile table entry of tile local + 1, read
// when the cursor enters `local` so that its global-load latency is a whole tile ahead of its use.
// `enter(tile)` computes the engine's per-tile pointers.
struct LoadCursor {
  int local = 0, kt = 0, slot = 0;
  TileWalk::Tile next{};
  template <class Enter>
  __device__ __forceinline__ void start(const TileWalk& w, Enter&& enter) {
    if (w.my_tiles > 0) {
      enter(w.at(0));
      if (w.my_tiles > 1) next = w.at(1);
    }
  }
  // After a stage's copies are issued.
  template <class Enter>
  __device__ __forceinline__ void advance(int KT, int slots, const TileWalk& w, Enter&& enter) {
    if (++slot == slots) slot = 0;
    if (++kt == KT) {
      kt = 0;
      if (++local < w.my_tiles) {
        enter(next);
        if (local + 1 < w.my_tiles) next = w.at(local + 1);
      }
    }
  }
};

#define EPMOE_WG_D16 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define EPMOE_WG_OUT16(d)                                                                                  \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),          \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])

// d[64 x 32] (+)= A[64 x k] . B[32 x k]^T; scale_d = 0 starts from zero.
__device__ __forceinline__ void wgmma_fp8(float (&d)[16], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 " EPMOE_WG_D16 ", %16, %17, p, 1, 1;\n}\n"
      : EPMOE_WG_OUT16(d)
      : "l"(da), "l"(db), "r"(scale_d));
}
__device__ __forceinline__ void wgmma_bf16(float (&d)[16], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " EPMOE_WG_D16 ", %16, %17, p, 1, 1, 0, 0;\n}\n"
      : EPMOE_WG_OUT16(d)
      : "l"(da), "l"(db), "r"(scale_d));
}
#undef EPMOE_WG_D16
#undef EPMOE_WG_OUT16

// Epilogue of a finished tile: bf16 out[row0 + token][n] from both m64 halves' accumulators, each
// times `scale` (1 here; the nvfp4 engines' 2^8 / global scale); fused: SwiGLU of gate half 0 and
// up half 1, written in the nvfp4 engine's K order when `kperm`. It touches no shared memory, so
// the loads of the next tile's stages keep running. Layout of acc: see below.
// NR = accumulators per half: 16 (m64n32), 64 (m64n128) or 80 (m64n160, the wide nvfp4 engine);
// the fragment layout is the same, NR / 4 groups of 8 tokens.
//
// Kept small because it is unrolled over every accumulator: a thread's two tokens t, t + 1 of one
// row are rounded together (one hardware bf16x2 conversion: round to nearest even like
// num::f32_to_bf16 on every number; a NaN becomes the canonical NaN, as in CUTLASS's epilogues),
// every store is a predicated 2-byte store at an immediate offset from one row address per 8
// tokens, and the bounds are predicates computed once, no branches.
// Why: ncu source counters (session 18) put the one-branchy-store-per-value form at ~20
// instructions per value, ~4400 unrolled instructions that miss the instruction cache, and 22-45%
// of the wide nvfp4 kernel's warp samples (bench/results/2026-12-02-session18-h200.md).
// kFused: 1 or 0 where the caller's kernel is compiled for one of the two (less code), -1: p.fused.
template <int NR, int kFused = -1>
__device__ __forceinline__ void store_tile(const GemmArgs& p, const TileWalk::Tile& cur, const float (&acc)[2][NR],
                                           int warp, int lane, float scale, bool kperm) {
  const int r0 = 16 * warp + (lane >> 2);  // this lane's rows: r0 + 8 hh (+ 64 h)
  const int t0 = 2 * (lane & 3);           // its tokens: 8 j + t0 + q
  const int rows = cur.mt.rows;
  // Output columns of rows r0 and r0 + 8 (fused: in the K order when kperm), and non-fused which
  // of the four (h, hh) rows exist (weight rows past N in the last tile).
  const int col[2] = {kperm ? nvfp4_layout::kperm_pos(r0) : r0, kperm ? nvfp4_layout::kperm_pos(r0 + 8) : r0 + 8};
  const int n_left = p.N - cur.n0 - r0;  // row r0 + 64 h + 8 hh exists if 64 h + 8 hh < n_left
  bf16_raw* const base = p.out + int64_t(cur.mt.row0 + t0) * p.N + cur.n0;
  // Tokens t (low half of v) and t + 1 (high half) of one column.
  auto put = [&](float a, float b, int j, int c, bool in) {
    const uint32_t v = dev::bf16x2_rn(a, b);
    bf16_raw* const o = base + int64_t(8 * j) * p.N + c;
    if (in && 8 * j + t0 < rows) o[0] = bf16_raw(v);
    if (in && 8 * j + t0 + 1 < rows) o[p.N] = bf16_raw(v >> 16);
  };
#pragma unroll
  for (int j = 0; j < NR / 4; ++j)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int i = 4 * j + 2 * hh;  // tokens 8 j + t0 (i) and + 1 (i + 1)
      if (kFused == 1 || (kFused == -1 && p.fused)) {
        put(silu(acc[0][i] * scale) * (acc[1][i] * scale), silu(acc[0][i + 1] * scale) * (acc[1][i + 1] * scale), j,
            col[hh], true);
      } else {
#pragma unroll
        for (int h = 0; h < 2; ++h)
          put(acc[h][i] * scale, acc[h][i + 1] * scale, j, 64 * h + 8 * hh + r0, 64 * h + 8 * hh < n_left);
      }
    }
}

// The non-fused epilogue through a warp-private shared buffer (kStagedStoreBytes at `buf`, 16-byte
// aligned, its own, not the ring's): same values and rounding as store_tile, but each warp
// transposes 32 tokens at a time with stmatrix.trans (its 32 weight rows of a token become four
// 16-byte chunks) and writes them back with 16-byte stores, so a thread issues NR / 4 vector stores
// instead of 2 NR two-byte ones. Needs p.N % 8 == 0 and a 16-byte aligned p.out (the wide engine's
// launcher refuses any other GEMM2 output). NR / 4 must be a multiple of 4 (the wide engine's 64 and 80). The buffer's
// layout: staged_layout.h.
constexpr int kStagedStoreBytes = staged_layout::kWarpBytes;
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a), "r"(b),
               "r"(c), "r"(d)
               : "memory");
}
template <int NR>
__device__ __forceinline__ void store_tile_staged(const GemmArgs& p, const TileWalk::Tile& cur,
                                                  const float (&acc)[2][NR], int warp, int lane, float scale,
                                                  uint32_t buf) {
  static_assert(NR % 16 == 0, "whole 32-token passes");
  auto pack = [&](float a, float b) { return dev::bf16x2_rn(a * scale, b * scale); };  // tokens t, t + 1
  const int rows = cur.mt.rows;
  // stmatrix: lane l gives row l & 7 of matrix (chunk) l >> 3.
  namespace sl = staged_layout;
  const uint32_t st_addr = buf + uint32_t(sl::gemm2_offset(lane & 7, lane >> 3));
  // Read-back: lane l takes chunk l & 3 of token rows (l >> 2) + 8 k.
  const int rq = lane >> 2, rc = lane & 3;
  const uint32_t ld_addr = buf + uint32_t(sl::gemm2_offset(rq, rc));
  const int col = cur.n0 + sl::gemm2_column(warp, rc);
  const bool col_ok = col < p.N;
  bf16_raw* const out = p.out + int64_t(cur.mt.row0 + rq) * p.N + col;
#pragma unroll
  for (int pass = 0; pass < NR / 16; ++pass) {
    if (32 * pass >= rows) break;
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const int i = 4 * (4 * pass + jj);  // acc index of tokens 8 j + 2 (lane & 3), j = 4 pass + jj
      stmatrix_x4_trans(st_addr + 8 * sl::kRowBytes * jj, pack(acc[0][i], acc[0][i + 1]),
                        pack(acc[0][i + 2], acc[0][i + 3]), pack(acc[1][i], acc[1][i + 1]),
                        pack(acc[1][i + 2], acc[1][i + 3]));
    }
    __syncwarp();
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      uint4 v;
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "r"(ld_addr + 8 * sl::kRowBytes * k)
                   : "memory");
      if (col_ok && 32 * pass + 8 * k + rq < rows)
        asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"l"(out + int64_t(32 * pass + 8 * k) * p.N),
                     "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                     : "memory");
    }
    __syncwarp();
  }
}

// Grid of a decode-engine launch (this file's and both nvfp4 ones, all kThreads per CTA and
// kRowsW-row weight tiles): one CTA per (m-tile, weight tile) pair, at most as many as fit on the
// device at once (the grid is persistent). <= 0: nothing to launch.
inline int persistent_grid(const GemmArgs& a, const void* kernel, int smem) {
  const KernelFit fit = fit_kernel(kernel, kThreads, smem);
  const int n_per_tile = a.fused ? kRowsW / 2 : kRowsW;
  const int64_t work = int64_t(a.max_tiles) * ((a.N + n_per_tile - 1) / n_per_tile);
  return static_cast<int>(std::min<int64_t>(work, int64_t(fit.sms) * fit.per_sm));
}

// Accumulator fragment of m64n32 (f32): register i of thread (warp w, lane l) holds weight row
// 16w + l/4 + 8*((i >> 1) & 1) and token 8*(i >> 2) + 2*(l % 4) + (i & 1).
template <bool FP8, bool DEFER>
__global__ void __launch_bounds__(kThreads) wgmma_gemm_kernel(GemmArgs p) {
  dev::pdl_enter();  // GemmArgs::pdl: before any global read (tiles, tokens)
  constexpr int kSlots = Layout::slots(DEFER);
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint8_t* sbase = smem_raw + (base - raw);

  constexpr int EB = FP8 ? 1 : 2;            // bytes per element
  constexpr int KPS = kRowBytes / EB;        // K values per stage
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // fp8: K % 128 != 0 (gpt-oss, 2880) ends on a partial stage whose chunks past K are zero-filled
  // for both operands (K % 16 == 0: a 16-byte chunk is all in or all out); its scales are the
  // partial blocks' own. bf16: K % 64 == 0.
  const int K = p.K, KT = (K + KPS - 1) / KPS;
  const int k_bytes = K * EB;
  const int rows_w = p.W.rows, cols_w = p.W.cols;
  const uint8_t* Abytes = FP8 ? p.A8 : reinterpret_cast<const uint8_t*>(p.A);
  const int64_t a_row_bytes = int64_t(K) * EB, w_row_bytes = int64_t(cols_w) * EB;
  const int rb = fp8_tile_rows(rows_w, p.W.row_split), cb = (cols_w + 127) / 128;  // fp8 weight-scale grid

  // The CTA's work is one flat stream of (tile, k-stage) steps, so the pipeline runs on across
  // tile boundaries: the next tile's first stages load while the current one finishes (GEMM2 tiles
  // are only 16 stages long; refilling the pipeline per tile would idle the loads every time).
  const TileWalk walk(p);
  const int my_tiles = walk.my_tiles;
  const int64_t steps = int64_t(my_tiles) * KT;
  using Cur = TileWalk::Tile;

  // Load geometry of this thread: 16-byte chunk `ch` of tile rows rq + 16 j (W: j = 0..7, the
  // first four in the 64-row half 0; A: j = 0, 1). swz(rq + 16 j, ch) = swz(rq, ch) + 2048 j, so
  // one shared-memory offset serves every chunk.
  //
  // Why a cursor and not "step s -> (tile, k)" per load: that mapping costs two integer divisions,
  // a dependent global load of the tile table and ~25 instructions of address arithmetic per 16-byte
  // copy, about 2200 warp instructions per 16 KB stage (Nsight Compute: the fp8 kernel issued every
  // 2.1 cycles per scheduler at 2 warps, DRAM 50%; bench/results/history-runner.md). Here a
  // tile's pointers and masks are computed once when the load cursor enters it, the table entry of
  // the tile after it is read a whole tile ahead, and a stage's copy is a pointer add.
  const int rq = tid >> 3, ch = tid & 7;
  const uint32_t sw_off = uint32_t(swz(rq, ch));
  const int64_t w16 = 16 * w_row_bytes;  // 16 weight rows
  const uint8_t* lw[2] = {nullptr, nullptr};  // W chunk 0 / chunk 4 of the tile at k = 0
  const uint8_t* lw_masked = nullptr;         // row 0 of the expert: the ignored source of a masked chunk
  const uint8_t* la[2] = {nullptr, nullptr};  // A chunks 0 / 1 at k = 0
  const float* lsa = nullptr;                 // fp8, tid < 32: this token's activation scales at kt = 0
  // GemmArgs::a_rows: the source rows of the tile the cursor enters next (A chunks j, the scale
  // row), read a stage after that tile's table entry (fetch_rows below) so that neither load is
  // waited for where it is issued; the scales of a source row are row-major (kt stride 1).
  int32_t src_a[2] = {0, 0}, src_s = 0;
  const int64_t sa_kt = p.a_rows ? 1 : p.a_scales_ld;
  auto fetch_rows = [&](const Cur& c) {
#pragma unroll
    for (int j = 0; j < 2; ++j) src_a[j] = rq + 16 * j < c.mt.rows ? p.a_rows[c.mt.row0 + rq + 16 * j] : 0;
    if constexpr (FP8) src_s = tid < min(c.mt.rows, kBT) ? p.a_rows[c.mt.row0 + tid] : 0;
  };
  const float* lsw = nullptr;                 // fp8, tid 32/33: the half's weight-scale row at kt = 0
  uint32_t lok = 0;                           // bits 0-7: W chunk j valid; 8-9: A chunk j; 10: scale
  auto enter_tile = [&](const Cur& c) {
    const int e = c.mt.expert;
    const uint8_t* W = static_cast<const uint8_t*>(p.W.data) + int64_t(e) * rows_w * w_row_bytes;
    lw_masked = W + ch * 16;
#pragma unroll
    for (int h = 0; h < 2; ++h) lw[h] = W + int64_t(walk.w_row(c.n0, 64 * h) + rq) * w_row_bytes + ch * 16;
    uint32_t ok = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) ok |= uint32_t(walk.w_ok(c.n0, rq + 16 * j)) << j;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const bool v = rq + 16 * j < c.mt.rows;
      ok |= uint32_t(v) << (8 + j);
      const int64_t src = p.a_rows ? int64_t(src_a[j]) : int64_t(c.mt.row0 + (v ? rq + 16 * j : 0));
      la[j] = Abytes + src * a_row_bytes + ch * 16;
    }
    if constexpr (FP8) {
      if (tid < kBT) {
        const bool v = tid < c.mt.rows;
        ok |= uint32_t(v) << 10;
        lsa = p.a_rows ? p.a_scales + int64_t(src_s) * p.a_scales_ld : p.a_scales + c.mt.row0 + (v ? tid : 0);
      } else if (tid < kBT + 2) {
        const int wr = min(walk.w_row(c.n0, (tid - kBT) * 64), rows_w - 1);
        lsw = static_cast<const float*>(p.W.scales) + (int64_t(e) * rb + fp8_tile_row(wr, p.W.row_split)) * cb;
      }
    }
    lok = ok;
  };
  LoadCursor lc;
  if (p.a_rows && my_tiles > 0) fetch_rows(walk.at(0));
  lc.start(walk, enter_tile);
  // The stage after which the next tile's source rows are fetched: one stage after the cursor read
  // its table entry (at the tile change), or at once where a tile is a single stage (then the
  // second tile's too, before the first stage's advance enters it).
  const int fetch_kt = KT > 1 ? 1 : 0;
  if (p.a_rows && KT == 1 && my_tiles > 1) fetch_rows(lc.next);
  auto load_next = [&]() {
    const uint32_t st = base + uint32_t(lc.slot) * Layout::STAGE;
    const int64_t k0 = int64_t(lc.kt) * kRowBytes;
    const bool kin = k0 + ch * 16 < k_bytes;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const bool v = (lok >> j) & 1u;
      const uint8_t* src = v && kin ? lw[j >> 2] + (j & 3) * w16 + k0 : lw_masked;
      cp_async16(st + Layout::W + sw_off + 2048u * j, src, v && kin);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const bool v = ((lok >> (8 + j)) & 1u) && kin;
      cp_async16(st + Layout::A + sw_off + 2048u * j, v ? la[j] + k0 : la[0], v);
    }
    if constexpr (FP8) {
      if (tid < kBT)
        cp_async4(st + Layout::SA + tid * 4, lsa + int64_t(lc.kt) * sa_kt, (lok >> 10) & 1u);
      else if (tid < kBT + 2)
        cp_async4(st + Layout::SW + (tid - kBT) * 4, lsw + lc.kt, true);
    }
    lc.advance(KT, kSlots, walk, enter_tile);
    if (p.a_rows && lc.kt == fetch_kt && lc.local + 1 < my_tiles) fetch_rows(lc.next);
  };

  float acc[2][16], part[2][16];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[h][i] = 0.f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) load_next();
    cp_commit();
  }

  // fp8: acc += part * (w_scale * a_scale[token]) with the scales of ring slot `slot`.
  auto promote = [&](int slot) {
    if constexpr (FP8) {
      reg_fence(part[0]);
      reg_fence(part[1]);
      const float* sa = reinterpret_cast<const float*>(sbase + slot * Layout::STAGE + Layout::SA);
      const float* sw = reinterpret_cast<const float*>(sbase + slot * Layout::STAGE + Layout::SW);
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const float a_s = sa[8 * j + 2 * (lane & 3) + q];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float sc = sw[h] * a_s;
            acc[h][4 * j + q] = fmaf(part[h][4 * j + q], sc, acc[h][4 * j + q]);
            acc[h][4 * j + 2 + q] = fmaf(part[h][4 * j + 2 + q], sc, acc[h][4 * j + 2 + q]);
          }
        }
    } else {
      (void)slot;
      reg_fence(acc[0]);
      reg_fence(acc[1]);
    }
  };

  Cur cur = my_tiles > 0 ? walk.at(0) : Cur{};
  int pending = -1;  // deferred: the ring slot whose wgmmas are issued but not yet waited for
  int c_kt = 0, c_slot = 0, c_local = 0;  // compute cursor: k-stage, ring slot and tile of step s
  for (int64_t s = 0; s < steps; ++s) {
    const int kt = c_kt, slot = c_slot;
    if (++c_kt == KT) c_kt = 0;
    if (++c_slot == kSlots) c_slot = 0;
    cp_wait<kStages - 2>();
    fence_proxy_async();
    // Stage s is visible to all. Plain: stage s-1 (overwritten next) is no longer read. Deferred:
    // every warp has waited for stage s-2's wgmmas, whose slot the next load takes.
    __syncthreads();
    {
      const int64_t ns = s + kStages - 1;
      if (ns < steps) load_next();
      cp_commit();
    }
    if constexpr (DEFER) {  // the previous stage's MMAs ran during the barrier and loads
      // Unconditional (a no-op when nothing is in flight): a wait on only some paths makes ptxas
      // add its own after the issue (C7517).
      wgmma_wait0();
      if (pending >= 0) promote(pending);
      pending = -1;
    }
    const uint32_t st = base + uint32_t(slot) * Layout::STAGE;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {  // 4 x 32 bytes of K per 128-byte row
      const uint64_t db = desc_sw128(st + Layout::A + ks * 32);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint64_t da = desc_sw128(st + Layout::W + h * 64 * kRowBytes + ks * 32);
        if constexpr (FP8)
          wgmma_fp8(part[h], da, db, ks);
        else
          // Deferred: a tile's first stage starts from zero in the MMA itself (scale-d 0) rather
          // than by zeroing acc after the epilogue: a second definition of acc would put
          // register copies on the loop's back edge, right after the issue, and ptxas would
          // wait there for the MMAs (C7517), undoing the deferral.
          wgmma_bf16(acc[h], da, db, DEFER ? int(kt > 0 || ks > 0) : 1);
      }
    }
    wgmma_commit();
    if (DEFER && kt != KT - 1) {
      pending = slot;
      continue;
    }
    wgmma_wait0();
    promote(slot);
    if (kt != KT - 1) continue;

    store_tile(p, cur, acc, warp, lane, 1.0f, false);
    if constexpr (FP8 || !DEFER) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < 16; ++i) acc[h][i] = 0.f;
    }
    if (++c_local < my_tiles) cur = walk.at(c_local);
  }
  if constexpr (DEFER) wgmma_wait0();  // the last step waited already; this covers every exit path
  cp_wait<0>();
}

template <bool FP8, bool DEFER>
void launch(const GemmArgs& a, cudaStream_t stream) {
  const char* what = FP8 ? "cuda runner (wgmma fp8)" : "cuda runner (wgmma bf16)";
  const int kps = FP8 ? 16 : 64;  // fp8: a partial last stage (above)
  if (a.K % kps != 0)
    throw UsageError(std::string(what) + ": GEMM K=" + std::to_string(a.K) + " is not a multiple of " +
                     std::to_string(kps) + "; use the mma.sync engine for this shape");
  if (a.fused && a.N % 64 != 0)
    throw UsageError(std::string(what) + ": intermediate=" + std::to_string(a.N) + " is not a multiple of 64");
  if (a.W.format != (FP8 ? WeightFormat::fp8 : WeightFormat::bf16))
    throw UsageError(std::string(what) + ": weights are " + format_name(a.W.format) + "; this engine takes " +
                     (FP8 ? "fp8" : "bf16"));
  if (FP8 ? (!a.A8 || !a.a_scales || a.a_scales_ld <= 0 || !a.W.scales) : !a.A)
    throw UsageError(std::string(what) + ": missing operand (fp8 needs A8, a_scales with a_scales_ld > 0 and "
                     "weight scales; bf16 needs A)");
  if (a.a_rows && reinterpret_cast<uintptr_t>(FP8 ? static_cast<const void*>(a.A8) : a.A) % 16 != 0)
    throw UsageError(std::string(what) + ": A read through a_rows must be 16-byte aligned (its rows are copied in "
                     "16-byte chunks); give a permuted copy instead");
  constexpr int smem = Layout::total(DEFER);
  const int grid = persistent_grid(a, reinterpret_cast<const void*>(wgmma_gemm_kernel<FP8, DEFER>), smem);
  if (grid <= 0) return;
  launch_kernel(wgmma_gemm_kernel<FP8, DEFER>, grid, kThreads, smem, stream, a.pdl, a);
}

}  // namespace epmoe::cuda::wg
