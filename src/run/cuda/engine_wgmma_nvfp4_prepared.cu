// The nvfp4 register-decode wgmma kernel on PREPARED weights: the same tiles, K order, decode and
// wgmmas as engine_wgmma_nvfp4.cu (bitwise the same outputs), but the weights come from a copy made
// once (prepare_nvfp4_weights) in which every (weight tile, 128-K stage) is one contiguous 9 KB
// block ordered by the thread that decodes it, so they go from global memory straight into
// registers: no shared-memory ring, no per-row scale requests.
//
// Why (measured; bench/results/history-runner.md): the natural-layout kernel's loads alone, with no
// decode and no MMA, take 0.74x of the fp8 runner's time at M 128, with L2 85% busy at 66% DRAM.
// Per stage a CTA there asks L2 for 128 rows x two 32-byte sectors of codes and 128 single sectors
// for 8 bytes of scales each, a third of its requests for a ninth of the bytes. Here a stage is 4 x
// 512 contiguous bytes per warp of codes and 256 of scales: whole lines, nothing else.
//
// Block layout (9216 bytes; thread tid = 32 w + lane, g = lane / 4, t = lane % 4; the rows of
// thread tid are r(h, q) = 64 h + 16 w + g + 8 q of the tile, as in the A fragments):
//   codes  [i = 2 sb + h][tid][16 B]: bytes 8q .. 8q+7 are row r(h, q)'s codes of natural stage
//          columns 64 sb + 16 t .. +15 (scale block 4 sb + t), as the natural layout stores them;
//   scales 8192 + [tid][8 B]: byte 2 (2 h + q) + sb is row r(h, q)'s scale of block 4 sb + t.
// Tiles as wg::TileWalk (fused GEMM1: gate rows n0.., up rows I + n0..), blocks ordered
// [expert][n-tile][k-stage]; rows past N are zero. prepared_block_offset (below) is the host
// model of this layout, used by the prepare kernel and the CPU tests alike.
//
// Words are stored in the prepared bit order (nvfp4_layout::prepare_word): the decode of 8 codes is
// 4 rotations + 6 masks instead of ~20 compiled operations (1.335 vs 1.465 ms at M 128,
// two A sets, 2 CTAs/SM).
//
// Pipeline: the token stages keep the cp.async ring of the natural kernel (1 ahead, 3 slots); the
// weights of step s + kAheadW are loaded at the top of step s into a register ring of kAheadW + 1
// sets (the step loop is unrolled over the ring so every index is a constant). ONE set of A
// registers: a sub-block's wgmmas are waited for before the next sub-block is decoded into the same
// registers. That serializes decode and MMA inside a CTA, but it takes the kernel from ~220 to 168
// registers, 2 -> 3 CTAs per SM, and wins (ms at M 128 / 2048, one H200; history-runner.md):
//   two A sets, 2 ahead, 2 CTAs/SM   1.335 / 1.477     loads only (no decode, no MMA)  0.732 / 0.903
//   two A sets, 1 ahead, 3 CTAs/SM   1.217 / 1.336     no decode (raw bits to MMAs)    1.072 / 1.222
//   one A set,  1 ahead, 4 CTAs/SM   1.180 / 1.277     mma.sync m16n8k16 instead of wgmma,
//   one A set,  2 ahead, 3 CTAs/SM   1.158 / 1.264       2 CTAs/SM (254 registers)     1.583 / 1.755
// The loads alone reach the HBM copy rate at M 128; without any decode the kernel takes 1.072 /
// 1.222 ms. Neither deeper loads nor cheaper MMAs moved it (timing variants): the weight stages in
// a shared-memory ring filled by TMA bulk copies, 4 ahead (161 registers, 3 CTAs/SM) 1.237 / 1.330;
// the same with mma.sync m16n8k16 on the n8 groups that hold tokens (134 registers) 1.186 / 1.375.
#include "run/cuda/engine_wgmma_nvfp4.cuh"

namespace epmoe::cuda::wgf4p {
namespace {

using namespace wgf4;
using gemm::cp_async16;
using gemm::cp_commit;
using gemm::cp_wait;
using gemm::ldg_stream16;
using gemm::ldg_stream8;
using gemm::smem_u32;

constexpr int kBlock = kPreparedBlock;
constexpr int kAheadA = 1;            // token stages loaded ahead
constexpr int kSlotsA = kAheadA + 2;  // token ring slots (the batches of step s - 1 may still run)
constexpr int kAtoms = 2 * kBT * 128;  // one token stage: two SW128 atoms [32][128 B]
constexpr int kSmem = kAtoms * kSlotsA + 1024;

struct WeightRegs {
  uint4 c[4];  // codes, i = 2 sb + h
  uint2 s;     // scales
};

constexpr int kAheadW = 2;     // weight stages loaded ahead (register ring of kAheadW + 1 sets)
constexpr int kMinBlocks = 3;  // CTAs per SM the register budget is cut for (168 registers)

__global__ void __launch_bounds__(kThreads, kMinBlocks) nvfp4_prepared_kernel(GemmArgs p) {
  constexpr int kRing = kAheadW + 1;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // K % 128 == 64 (prepared weights only): the last stage is half a stage, sub-block 0 alone.
  const int K = p.K, KT = (K + kKS - 1) / kKS;
  const bool half = K % kKS != 0;
  const wg::TileWalk walk(p, 1, /*expert_order=*/false);  // see TileWalk
  const int my_tiles = walk.my_tiles;
  const int64_t steps = int64_t(my_tiles) * KT;
  using Cur = wg::TileWalk::Tile;
  const uint8_t* prep = static_cast<const uint8_t*>(p.W.prepared);

  // Token loads as in the natural kernel: thread (row tr, quarter tq), four 16-byte chunks.
  const int tr = tid >> 2, tq = tid & 3;
  const uint32_t a_off = uint32_t((tq >> 1) * 4096 + tr * 128);
  const int a_m0 = 4 * (tq & 1), a_sw = tr & 7;
  const uint8_t* la = nullptr;
  bool aok = false;
  auto enter_tokens = [&](const Cur& c) {
    aok = tr < c.mt.rows;
    la = reinterpret_cast<const uint8_t*>(p.A + int64_t(c.mt.row0 + (aok ? tr : 0)) * K) + tq * 64;
  };
  wg::LoadCursor lc;
  lc.start(walk, enter_tokens);
  auto load_tokens = [&]() {
    if (aok && !(half && lc.kt == KT - 1 && tq >= 2)) {  // a half stage has no sub-block 1
      const uint32_t st = base + uint32_t(lc.slot) * kAtoms;
      const uint8_t* A = la + int64_t(lc.kt) * kKS * 2;
#pragma unroll
      for (int i = 0; i < 4; ++i) cp_async16(st + a_off + (((a_m0 + i) ^ a_sw) << 4), A + i * 16, true);
    }
    lc.advance(KT, kSlotsA, walk, enter_tokens);
  };

  // Weight cursor: the block of the next step to load; the tile table entry of the tile after
  // the current one is read a tile ahead (as the token cursor does).
  const int64_t tile_blocks = int64_t(KT) * kBlock;
  auto block_of = [&](const Cur& c) {
    return prep + (int64_t(c.mt.expert) * walk.NT + c.n0 / walk.n_per_tile) * tile_blocks + tid * 16;
  };
  int w_local = 0, w_kt = 0;
  const uint8_t* wp = nullptr;
  Cur w_next{};
  if (my_tiles > 0) {
    wp = block_of(walk.at(0));
    if (my_tiles > 1) w_next = walk.at(1);
  }
  WeightRegs ring[kRing];
  auto load_weights = [&](WeightRegs& r) {
    if (w_local >= my_tiles) return;
#pragma unroll
    for (int i = 0; i < 4; ++i) r.c[i] = ldg_stream16(wp + i * 2048);
    r.s = ldg_stream8(wp + 8192 - tid * 8);
    wp += kBlock;
    if (++w_kt == KT) {
      w_kt = 0;
      if (++w_local < my_tiles) {
        wp = block_of(w_next);
        if (w_local + 1 < my_tiles) w_next = walk.at(w_local + 1);
      }
    }
  };

  float acc[2][16];
  zero(acc);

#pragma unroll
  for (int j = 0; j < kAheadW; ++j) load_weights(ring[j]);
#pragma unroll
  for (int s = 0; s < kAheadA; ++s) {
    if (s < steps) load_tokens();
    cp_commit();
  }

  Cur cur = my_tiles > 0 ? walk.at(0) : Cur{};
  int c_kt = 0, c_slot = 0, c_local = 0;
  uint32_t wa[2][2][8];  // A fragments of one sub-block: [half][row q (g, g + 8)][16 values]
  for (int64_t s0 = 0; s0 < steps; s0 += kRing) {
#pragma unroll
    for (int j = 0; j < kRing; ++j) {
      const int64_t s = s0 + j;
      if (s >= steps) break;
      load_weights(ring[(j + kAheadW) % kRing]);
      const int kt = c_kt, slot = c_slot;
      if (++c_kt == KT) c_kt = 0;
      if (++c_slot == kSlotsA) c_slot = 0;
      cp_wait<kAheadA - 1>();
      wg::fence_proxy_async();
      __syncthreads();
      if (s + kAheadA < steps) load_tokens();
      cp_commit();
      const uint32_t st = base + uint32_t(slot) * kAtoms;
      const WeightRegs& r = ring[j];
      uint32_t scl[2][2][2];
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int q = 0; q < 2; ++q) scale_pair((h ? r.s.y : r.s.x) >> (16 * q), scl[h][q]);
#pragma unroll
      for (int sb = 0; sb < 2; ++sb) {
        if (sb == 1 && half && kt == KT - 1) break;
        wg::wgmma_wait0();  // the previous batch still reads wa
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint4 v = r.c[2 * sb + h];
          decode16<true>(v.x, v.y, scl[h][0][sb], wa[h][0]);
          decode16<true>(v.z, v.w, scl[h][1][sb], wa[h][1]);
        }
        issue_batch(acc, wa, st + sb * 4096);
      }
      if (kt == KT - 1) {
        wg::wgmma_wait0();
        store_tile(p, cur, acc, warp, lane);
        if (++c_local < my_tiles) cur = walk.at(c_local);
      }
    }
  }
  wg::wgmma_wait0();
  cp_wait<0>();
}

// One thread per (expert, n-tile, k-stage, tid): the 64 code bytes and 8 scale bytes that thread
// tid of the GEMM kernel loads for that step.
__global__ void prepare_kernel(MatrixView m, bool fused, int N, int NT, int n_per_tile, uint8_t* out) {
  const int K = m.cols, KT = (K + kKS - 1) / kKS;  // the last stage half when K % 128 == 64
  const int64_t total = int64_t(m.experts) * NT * KT * kThreads;
  const int64_t w_row_bytes = K / 2, s_row_bytes = K / 16;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int tid = int(i % kThreads);
    const int64_t blk = i / kThreads;
    const int kt = int(blk % KT), nt = int((blk / KT) % NT), e = int(blk / (int64_t(KT) * NT));
    const int warp = tid >> 5, g = (tid & 31) >> 2, t = tid & 3;
    const int n0 = nt * n_per_tile;
    uint8_t* dst = out + blk * kBlock;
    uint8_t sc[8];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int r = 64 * h + 16 * warp + g + 8 * q;
        const int wr = fused ? (r < 64 ? n0 + r : N + n0 + r - 64) : n0 + r;
        const bool ok = fused || wr < N;
        const uint8_t* wrow = static_cast<const uint8_t*>(m.data) + (int64_t(e) * m.rows + wr) * w_row_bytes;
        const uint8_t* srow = static_cast<const uint8_t*>(m.scales) + (int64_t(e) * m.rows + wr) * s_row_bytes;
#pragma unroll
        for (int sb = 0; sb < 2; ++sb) {
          const int blk16 = kt * 8 + sb * 4 + t;  // scale block of the row
          const bool in = ok && blk16 < K / 16;   // a half last stage's sub-block 1 is zeros
          uint2 v = in ? *reinterpret_cast<const uint2*>(wrow + blk16 * 8) : make_uint2(0, 0);
          v.x = nvfp4_layout::prepare_word(v.x);
          v.y = nvfp4_layout::prepare_word(v.y);
          *reinterpret_cast<uint2*>(dst + ((2 * sb + h) * kThreads + tid) * 16 + 8 * q) = v;
          sc[2 * (2 * h + q) + sb] = in ? srow[blk16] : uint8_t(0);
        }
      }
    uint2 s;
    memcpy(&s, sc, 8);
    *reinterpret_cast<uint2*>(dst + 8192 + tid * 8) = s;
  }
}

}  // namespace
}  // namespace epmoe::cuda::wgf4p

namespace epmoe::cuda {

size_t nvfp4_prepared_bytes(const MatrixView& m, bool fused, int N) {
  const int n_per_tile = fused ? wgf4::kRowsW / 2 : wgf4::kRowsW;
  const int64_t NT = (N + n_per_tile - 1) / n_per_tile;
  return size_t(m.experts) * NT * ((m.cols + wgf4::kKS - 1) / wgf4::kKS) * wgf4p::kBlock;
}

void prepare_nvfp4_weights(const MatrixView& m, bool fused, int N, void* out, cudaStream_t stream) {
  const char* what = "prepare_nvfp4_weights";
  if (m.format != WeightFormat::nvfp4 || m.device != DeviceKind::cuda || !m.data || !m.scales)
    throw UsageError(std::string(what) + ": needs nvfp4 weights with scales on the device");
  if (!wgmma_nvfp4_supports(m.cols, N, fused, true) || (fused ? m.rows != 2 * N : m.rows != N))
    throw UsageError(std::string(what) + ": shape rows=" + std::to_string(m.rows) + " K=" + std::to_string(m.cols) +
                     " N=" + std::to_string(N) + (fused ? " (fused: rows = 2N, N % 64 == 0)" : "") +
                     " does not fit the engine (K % 64 == 0)");
  const int n_per_tile = fused ? wgf4::kRowsW / 2 : wgf4::kRowsW;
  const int NT = (N + n_per_tile - 1) / n_per_tile;
  const int64_t threads = int64_t(m.experts) * NT * ((m.cols + wgf4::kKS - 1) / wgf4::kKS) * wgf4::kThreads;
  if (threads == 0) return;
  const int grid = static_cast<int>(std::min<int64_t>((threads + 255) / 256, 132 * 16));
  wgf4p::prepare_kernel<<<grid, 256, 0, stream>>>(m, fused, N, NT, n_per_tile, static_cast<uint8_t*>(out));
  EPMOE_CUDA_CHECK_LAUNCH();
}

void launch_grouped_gemm_wgmma_nvfp4_prepared(const GemmArgs& a, cudaStream_t stream) {
  using namespace wgf4p;
  check_no_a_rows(a, "cuda runner (wgmma nvfp4, prepared)");
  if (!a.W.prepared || !a.W.global_scale || !a.A)
    throw UsageError("cuda runner (wgmma nvfp4, prepared): needs prepared weights, global_scale and bf16 A");
  const int grid = wg::persistent_grid(a, reinterpret_cast<const void*>(nvfp4_prepared_kernel), kSmem);
  if (grid <= 0) return;
  nvfp4_prepared_kernel<<<grid, kThreads, kSmem, stream>>>(a);
  EPMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace epmoe::cuda
