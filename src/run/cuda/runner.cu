#include "run/cuda/runner.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "epmoe/error.h"
#include "epmoe/numeric.h"
#include "quant/cuda/quant_device.cuh"
#include "run/cuda/engine_cutlass.h"
#include "run/cuda/engine.h"
#include "run/cuda/permute.cuh"
#include "run/cuda/rows.h"
#include "run/cuda/widen.h"

namespace epmoe::cuda {
namespace {

constexpr int kScanThreads = 1024;

__global__ void count_kernel(const int32_t* __restrict__ ids, const int32_t* __restrict__ counts, int64_t S, int C,
                             int K, int E, int32_t* __restrict__ cnt) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= S || !slot_valid(i, C, counts)) return;
  for (int k = 0; k < K; ++k) {
    const int e = ids[i * K + k];
    if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
  }
}

// Offsets of each expert's rows, the m-tile table, and zeroed fill counters. Thread i owns a
// contiguous chunk of experts.
__global__ void __launch_bounds__(kScanThreads) offsets_kernel(const int32_t* __restrict__ cnt, int E, int bm,
                                                               int32_t* __restrict__ offsets,
                                                               int32_t* __restrict__ fill, MTile* __restrict__ tiles,
                                                               int32_t* __restrict__ num_tiles) {
  __shared__ int32_t s_rows[kScanThreads], s_tiles[kScanThreads];
  const int tid = threadIdx.x;
  const int chunk = (E + kScanThreads - 1) / kScanThreads;
  const int e0 = tid * chunk, e1 = min(E, e0 + chunk);
  int32_t rows = 0, nt = 0;
  for (int e = e0; e < e1; ++e) {
    rows += cnt[e];
    nt += (cnt[e] + bm - 1) / bm;
  }
  s_rows[tid] = rows;
  s_tiles[tid] = nt;
  __syncthreads();
  for (int o = 1; o < kScanThreads; o <<= 1) {
    const int32_t a = tid >= o ? s_rows[tid - o] : 0, b = tid >= o ? s_tiles[tid - o] : 0;
    __syncthreads();
    s_rows[tid] += a;
    s_tiles[tid] += b;
    __syncthreads();
  }
  int32_t r = s_rows[tid] - rows, t = s_tiles[tid] - nt;
  for (int e = e0; e < e1; ++e) {
    offsets[e] = r;
    fill[e] = 0;
    for (int m = 0; m < cnt[e]; m += bm) tiles[t++] = MTile{e, r + m, min(bm, cnt[e] - m), 0};
    r += cnt[e];
  }
  if (tid == kScanThreads - 1) *num_tiles = s_tiles[tid];
}

// fp8 dispatch into the wgmma fp8 engine: the slot's e4m3 codes are copied as they are (16-byte
// moves when the payload is aligned) and its block scales go to the transposed scale matrix
// as_t[kb * ld + row].
__global__ void permute_fp8_kernel(const uint8_t* __restrict__ payload, const uint8_t* __restrict__ scales,
                                   const int32_t* __restrict__ ids, const int32_t* __restrict__ counts, int C, int K,
                                   int E, int H, bool aligned16, const int32_t* __restrict__ offsets,
                                   int32_t* __restrict__ fill, int32_t* __restrict__ pair_pos,
                                   uint8_t* __restrict__ A8, float* __restrict__ as_t, int64_t ld) {
  __shared__ int32_t pos[32];
  const int64_t i = blockIdx.x;
  if (!slot_valid(i, C, counts)) return;
  claim_rows(i, K, E, ids, offsets, fill, pair_pos, pos);
  const uint8_t* row = payload + i * int64_t(H);
  if (aligned16) {
    for (int c = threadIdx.x; c < H / 16; c += blockDim.x) {
      const uint4 v = reinterpret_cast<const uint4*>(row)[c];
      for (int k = 0; k < K; ++k)
        if (pos[k] >= 0) reinterpret_cast<uint4*>(A8 + int64_t(pos[k]) * H)[c] = v;
    }
  } else {
    for (int h = threadIdx.x; h < H; h += blockDim.x) {
      const uint8_t v = row[h];
      for (int k = 0; k < K; ++k)
        if (pos[k] >= 0) A8[int64_t(pos[k]) * H + h] = v;
    }
  }
  const float* sc = reinterpret_cast<const float*>(scales + i * int64_t(H / 128) * 4);
  for (int b = threadIdx.x; b < H / 128; b += blockDim.x) {
    const float s = sc[b];
    for (int k = 0; k < K; ++k)
      if (pos[k] >= 0) as_t[b * ld + pos[k]] = s;
  }
}

// Block b (128 elements) of an intermediate row, read by one warp: this lane's 4 values into v, and
// the block's fp8 parameters from the warp-wide amax. Both intermediate kernels start so.
__device__ __forceinline__ dev::Fp8Block load_block128(const bf16_raw* row, int b, int lane, bool ue8m0,
                                                        float (&v)[4]) {
  float amax = 0.f;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    v[q] = num::bf16_to_f32(row[b * 128 + lane * 4 + q]);
    amax = fmaxf(amax, fabsf(v[q]));
  }
  return dev::fp8_block_params(dev::warp_max(amax), ue8m0);
}

// h rows (bf16) to e4m3 codes + block-128 scales (intermediate_quant = fp8) for the wgmma fp8
// GEMM2: the same codes and scales as the round trip below, kept as codes. One warp per block.
__global__ void intermediate_to_fp8_kernel(const bf16_raw* __restrict__ h, const int32_t* __restrict__ offsets,
                                           const int32_t* __restrict__ cnt, int E, int I, bool ue8m0,
                                           uint8_t* __restrict__ h8, float* __restrict__ hs_t, int64_t ld) {
  const int64_t r = blockIdx.x;
  const int64_t rows = offsets[E - 1] + cnt[E - 1];
  if (r >= rows) return;
  const bf16_raw* row = h + r * I;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int b = warp; b < I / 128; b += warps) {
    float v[4];
    const dev::Fp8Block bp = load_block128(row, b, lane, ue8m0, v);
    uint32_t packed = 0;
#pragma unroll
    for (int q = 0; q < 4; ++q) packed |= uint32_t(dev::fp8_code(v[q], bp)) << (8 * q);
    *reinterpret_cast<uint32_t*>(h8 + r * I + b * 128 + lane * 4) = packed;
    if (lane == 0) hs_t[b * ld + r] = bp.scale;
  }
}

// h rows take the fp8 block-128 round trip (intermediate_quant = fp8); one warp per block.
__global__ void intermediate_fp8_kernel(bf16_raw* __restrict__ h, const int32_t* __restrict__ offsets,
                                        const int32_t* __restrict__ cnt, int E, int I, bool ue8m0) {
  const int64_t r = blockIdx.x;
  const int64_t rows = offsets[E - 1] + cnt[E - 1];
  if (r >= rows) return;
  bf16_raw* row = h + r * I;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int b = warp; b < I / 128; b += warps) {
    float v[4];
    const dev::Fp8Block bp = load_block128(row, b, lane, ue8m0, v);
#pragma unroll
    for (int q = 0; q < 4; ++q)
      row[b * 128 + lane * 4 + q] = num::f32_to_bf16(dev::fp8_dequant(dev::fp8_code(v[q], bp), bp.scale));
  }
}

std::string mat_desc(const MatrixView& m) {
  return std::string(format_name(m.format)) + "[" + std::to_string(m.experts) + ", " + std::to_string(m.rows) + ", " +
         std::to_string(m.cols) + "] on " + device_name(m.device);
}

// The tables both engines route rows with: rows per expert (cnt) and their offsets, the permute's
// fill counters and (slot, k) -> row positions, and the m-tile table.
struct Routing {
  DeviceBuffer &cnt, &offsets, &fill, &tiles, &num_tiles, &pair_pos;

  void reserve(int E, int64_t max_tiles, int64_t max_rows) {
    cnt.reserve(size_t(E) * 4);
    offsets.reserve(size_t(E) * 4);
    fill.reserve(size_t(E) * 4);
    tiles.reserve(size_t(max_tiles) * sizeof(MTile));
    num_tiles.reserve(4);
    pair_pos.reserve(size_t(max_rows) * 4);
  }
  // count -> offsets (and the m-tiles of bm rows).
  void count(const DispatchOutput& in, int bm, cudaStream_t st) {
    const int64_t S = in.slots();
    const int C = in.capacity, K = in.top_k, E = in.num_local_experts;
    EPMOE_CUDA_CHECK(cudaMemsetAsync(cnt.get(), 0, size_t(E) * 4, st));
    count_kernel<<<unsigned((S + 255) / 256), 256, 0, st>>>(in.local_ids, in.counts, S, C, K, E, cnt.get<int32_t>());
    EPMOE_CUDA_CHECK_LAUNCH();
    offsets_kernel<<<1, kScanThreads, 0, st>>>(cnt.get<int32_t>(), E, bm, offsets.get<int32_t>(), fill.get<int32_t>(),
                                               tiles.get<MTile>(), num_tiles.get<int32_t>());
    EPMOE_CUDA_CHECK_LAUNCH();
  }
  // The slots' activations as bf16 rows of A (any dispatch format).
  void permute_bf16(const DispatchOutput& in, bf16_raw* A, cudaStream_t st) {
    launch_permute_bf16(in, offsets.get<int32_t>(), fill.get<int32_t>(), pair_pos.get<int32_t>(), A, st);
  }
  // y[slot] = the routing-weighted sum of the slot's expert rows of o.
  void reduce(const DispatchOutput& in, const bf16_raw* o, bf16_raw* y, cudaStream_t st) {
    launch_reduce(in, pair_pos.get<int32_t>(), o, y, st);
  }
};

// One grouped GEMM on the engine chosen for it (decode wgmma variants, else mma.sync).
void launch_on_engine(const GemmArgs& g, bool wgmma_fp8, bool wgmma_bf16, bool wgmma_nvfp4, int bm, cudaStream_t st) {
  if (wgmma_fp8) launch_grouped_gemm_wgmma_fp8(g, st);
  else if (wgmma_bf16) launch_grouped_gemm_wgmma_bf16(g, st);
  else if (wgmma_nvfp4 && g.W.prepared) launch_grouped_gemm_wgmma_nvfp4_prepared(g, st);
  else if (wgmma_nvfp4) launch_grouped_gemm_wgmma_nvfp4(g, st);
  else launch_grouped_gemm(g, bm, st);
}

}  // namespace

CudaRunner::CudaRunner(const MoeConfig& cfg, int device_index) : cfg_(cfg), device_(device_index) {
  if (cfg.top_k > 32)
    throw UsageError("runner cuda: top_k=" + std::to_string(cfg.top_k) + " exceeds 32, the most the CUDA runner supports");
  if (cfg.hidden % 64 != 0 || cfg.intermediate % 64 != 0)
    throw UsageError("runner cuda: hidden=" + std::to_string(cfg.hidden) + " and intermediate=" +
                     std::to_string(cfg.intermediate) + " must be multiples of 64 for the CUDA runner's tiles");
  if (cfg.intermediate_quant == IntermediateQuant::fp8 && cfg.intermediate % 128 != 0)
    throw UsageError("runner cuda: intermediate_quant=fp8 needs intermediate % 128 == 0, got " +
                     std::to_string(cfg.intermediate));
  if (const char* env = std::getenv("EPMOE_RUNNER_ENGINE"); env && *env)
    set_engine(parse_engine(env, "environment variable EPMOE_RUNNER_ENGINE"));
  if (const char* env = std::getenv("EPMOE_WIDEN_SCRATCH_MB"); env && *env)
    widen_scratch_ = parse_scratch_mb(env, "environment variable EPMOE_WIDEN_SCRATCH_MB");
  if (const char* env = std::getenv("EPMOE_CUTLASS_SWIGLU"); env && *env) {
    const std::string v = env;
    if (v != "0" && v != "1")
      throw UsageError("runner cuda: environment variable EPMOE_CUTLASS_SWIGLU='" + v +
                       "' must be 0 (GEMM1 then a SwiGLU pass, the default) or 1 (SwiGLU in GEMM1's epilogue)");
    fused_swiglu_ = v == "1";
  }
}

size_t CudaRunner::parse_scratch_mb(const std::string& s, const char* what) {
  // Digits only (no sign, blanks or suffix), at most 2^24 MiB = 16 TiB.
  const bool digits = !s.empty() && s.size() <= 8 && s.find_first_not_of("0123456789") == std::string::npos;
  const long long mb = digits ? std::stoll(s) : 0;
  if (mb <= 0 || mb > (1ll << 24))
    throw UsageError(std::string("runner cuda: ") + what + "='" + s +
                     "' is not a whole number of MiB in [1, 16777216]; give e.g. 1024 (the default) or unset it");
  return size_t(mb) << 20;
}

void CudaRunner::check(const DispatchOutput& in, const ExpertWeights& w, const bf16_raw* y) const {
  auto fail = [](const std::string& m) { throw UsageError("runner cuda: " + m); };
  if (in.device != DeviceKind::cuda) fail("dispatch output is on " + std::string(device_name(in.device)) + ", needs cuda");
  if (w.w13.device != DeviceKind::cuda || w.w2.device != DeviceKind::cuda)
    fail("weights must be on the CUDA device (w13 " + mat_desc(w.w13) + ", w2 " + mat_desc(w.w2) + ")");
  const int H = in.hidden, I = w.intermediate, E = in.num_local_experts;
  if (w.hidden != H || w.num_local_experts != E)
    fail("weights are for hidden=" + std::to_string(w.hidden) + ", experts=" + std::to_string(w.num_local_experts) +
         " but the dispatch output has hidden=" + std::to_string(H) + ", experts=" + std::to_string(E));
  if (w.w13.experts != E || w.w13.rows != 2 * I || w.w13.cols != H)
    fail("w13 is " + mat_desc(w.w13) + "; expected [" + std::to_string(E) + ", " + std::to_string(2 * I) + ", " +
         std::to_string(H) + "]");
  if (w.w2.experts != E || w.w2.rows != H || w.w2.cols != I)
    fail("w2 is " + mat_desc(w.w2) + "; expected [" + std::to_string(E) + ", " + std::to_string(H) + ", " +
         std::to_string(I) + "]");
  if (w.w13.format != w.w2.format) fail("w13 and w2 must share one weight format");
  if (H % 64 != 0 || I % 64 != 0)
    fail("hidden=" + std::to_string(H) + " and intermediate=" + std::to_string(I) + " must be multiples of 64");
  if (in.top_k > 32) fail("top_k=" + std::to_string(in.top_k) + " exceeds 32");
  if (in.slots() > 0 && (!in.payload || !in.local_ids || !in.weights || !in.counts || !y))
    fail("payload, local_ids, weights, counts and y must be non-null");
  if (in.format != ActFormat::bf16 && !in.scales) fail(std::string("scales are null for format ") + format_name(in.format));
  if (in.format == ActFormat::nvfp4 && !(in.quant.nvfp4_global_scale > 0.f))
    fail("nvfp4 dispatch needs quant.nvfp4_global_scale > 0");
  if (w.w13.format == WeightFormat::nvfp4 && (!w.w13.global_scale || !w.w2.global_scale))
    fail("nvfp4 weights need global_scale arrays on the device");
}

void CudaRunner::run(const DispatchOutput& in, const ExpertWeights& w, bf16_raw* y, Stream stream) {
  check(in, w, y);
  const int64_t S = in.slots();
  if (S == 0) return;
  DeviceGuard g(device_);
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const int C = in.capacity, K = in.top_k, E = in.num_local_experts, H = in.hidden, I = w.intermediate;
  const int64_t max_rows = S * K;
  const double avg = expected_rows(in);
  const int bm = force_bm_ ? force_bm_ : (avg <= 48.0 ? 32 : 128);
  last_bm_ = bm;
  const int64_t max_tiles = (max_rows + bm - 1) / bm + E;
  if (max_rows > INT32_MAX) throw UsageError("runner cuda: R*C*K=" + std::to_string(max_rows) + " rows exceed 2^31");
  if (use_cutlass(in, w)) return run_cutlass(in, w, y, st);

  Routing rt{cnt_, offsets_, fill_, tiles_, num_tiles_, pair_pos_};
  rt.reserve(E, max_tiles, max_rows);
  a_.reserve(size_t(max_rows) * H * 2);
  h_.reserve(size_t(max_rows) * I * 2);
  o_.reserve(size_t(max_rows) * H * 2);

  // Decode engines (m-tile 32): wgmma for bf16 weights; for fp8 weights, fp8 x fp8 wgmma where
  // the operand arrives as fp8 (an fp8 dispatch for GEMM1, intermediate_quant = fp8 for GEMM2),
  // otherwise the mma.sync engine with widened weights.
  const WeightFormat wf = w.w13.format;
  const bool decode = wgmma_decode_ && bm == kWgmmaBlockM;
  const bool wg_bf16 = decode && wf == WeightFormat::bf16;
  const bool wg_fp8_1 = decode && wf == WeightFormat::fp8 && in.format == ActFormat::fp8;
  const bool wg_fp8_2 = decode && wf == WeightFormat::fp8 && cfg_.intermediate_quant == IntermediateQuant::fp8;
  static const char* const kEngines[2][2][2] = {
      {{"mma/mma", "mma/wgmma-fp8"}, {"wgmma-fp8/mma", "wgmma-fp8/wgmma-fp8"}},
      {{"wgmma-bf16/wgmma-bf16", "wgmma-bf16/wgmma-bf16"}, {"wgmma-bf16/wgmma-bf16", "wgmma-bf16/wgmma-bf16"}}};
  last_engines_ = kEngines[wg_bf16][wg_fp8_1][wg_fp8_2];
  // nvfp4 weights: wgmma with the weights decoded in registers (K % 128 == 0), else mma.sync.
  const bool wg_f4_1 = decode && wf == WeightFormat::nvfp4 && wgmma_nvfp4_supports(H, I, true);
  const bool wg_f4_2 = decode && wf == WeightFormat::nvfp4 && wgmma_nvfp4_supports(I, H, false);
  if (wg_f4_1 || wg_f4_2) {
    auto name = [](bool wg, const MatrixView& m) { return !wg ? "mma" : m.prepared ? "wgmma-nvfp4p" : "wgmma-nvfp4"; };
    engines_ = std::string(name(wg_f4_1, w.w13)) + "/" + name(wg_f4_2, w.w2);
    last_engines_ = engines_.c_str();
  }
  if (wg_fp8_1) {
    a8_.reserve(size_t(max_rows) * H);
    as_.reserve(size_t(max_rows) * (H / 128) * 4);
  }
  if (wg_fp8_2) {
    h8_.reserve(size_t(max_rows) * I);
    hs_.reserve(size_t(max_rows) * (I / 128) * 4);
  }

  rt.count(in, bm, st);
  if (wg_fp8_1) {
    const bool aligned16 = reinterpret_cast<uintptr_t>(in.payload) % 16 == 0;
    permute_fp8_kernel<<<unsigned(S), 256, 0, st>>>(in.payload, in.scales, in.local_ids, in.counts, C, K, E, H, aligned16,
                                                    offsets_.get<int32_t>(), fill_.get<int32_t>(),
                                                    pair_pos_.get<int32_t>(), a8_.get<uint8_t>(), as_.get<float>(),
                                                    max_rows);
    EPMOE_CUDA_CHECK_LAUNCH();
  } else {
    rt.permute_bf16(in, a_.get<bf16_raw>(), st);
  }

  GemmArgs g1;
  g1.A = a_.get<bf16_raw>();
  g1.K = H;
  g1.W = w.w13;
  g1.fused = true;
  g1.N = I;
  g1.out = h_.get<bf16_raw>();
  g1.tiles = tiles_.get<MTile>();
  g1.num_tiles = num_tiles_.get<int32_t>();
  g1.max_tiles = static_cast<int>(max_tiles);
  if (wg_fp8_1) {
    g1.A8 = a8_.get<uint8_t>();
    g1.a_scales = as_.get<float>();
    g1.a_scales_ld = max_rows;
  }
  // The nvfp4 engine reads its tokens K-permuted: GEMM1's rows are rewritten in place, GEMM2's
  // come that way out of GEMM1 when it ran on the same engine, else they are rewritten too.
  if (wg_f4_1) kperm_nvfp4_tokens(a_.get<bf16_raw>(), offsets_.get<int32_t>(), cnt_.get<int32_t>(), E, H, max_rows, st);
  g1.out_kperm = wg_f4_1 && wg_f4_2;
  launch_on_engine(g1, wg_fp8_1, wg_bf16, wg_f4_1, bm, st);

  if (wg_fp8_2) {
    intermediate_to_fp8_kernel<<<unsigned(max_rows), 256, 0, st>>>(h_.get<bf16_raw>(), offsets_.get<int32_t>(),
                                                                    cnt_.get<int32_t>(), E, I, in.quant.ue8m0,
                                                                    h8_.get<uint8_t>(), hs_.get<float>(), max_rows);
    EPMOE_CUDA_CHECK_LAUNCH();
  } else if (cfg_.intermediate_quant == IntermediateQuant::fp8) {
    intermediate_fp8_kernel<<<unsigned(max_rows), 256, 0, st>>>(h_.get<bf16_raw>(), offsets_.get<int32_t>(),
                                                                cnt_.get<int32_t>(), E, I, in.quant.ue8m0);
    EPMOE_CUDA_CHECK_LAUNCH();
  }

  GemmArgs g2 = g1;
  g2.A = h_.get<bf16_raw>();
  g2.K = I;
  g2.W = w.w2;
  g2.fused = false;
  g2.N = H;
  g2.out = o_.get<bf16_raw>();
  g2.A8 = nullptr;
  g2.a_scales = nullptr;
  g2.a_scales_ld = 0;
  if (wg_fp8_2) {
    g2.A8 = h8_.get<uint8_t>();
    g2.a_scales = hs_.get<float>();
    g2.a_scales_ld = max_rows;
  }
  g2.out_kperm = false;
  if (wg_f4_2 && !wg_f4_1)
    kperm_nvfp4_tokens(h_.get<bf16_raw>(), offsets_.get<int32_t>(), cnt_.get<int32_t>(), E, I, max_rows, st);
  launch_on_engine(g2, wg_fp8_2, wg_bf16, wg_f4_2, bm, st);

  rt.reduce(in, o_.get<bf16_raw>(), y, st);
}

// ---- CUTLASS engine (large M) ---------------------------------------------------------------------

CudaRunner::Engine CudaRunner::parse_engine(const std::string& s, const char* what) {
  if (s == "auto") return Engine::automatic;
  if (s == "mma") return Engine::mma;
  if (s == "cutlass") return Engine::cutlass;
  throw UsageError(std::string("runner cuda: ") + what + "='" + s + "' is not an engine; use auto, mma or cutlass");
}

void CudaRunner::set_engine(Engine e) {
  if (e == Engine::cutlass && !cutlass_engine::available())
    throw UsageError("runner cuda: engine cutlass was asked for, but this build has no CUTLASS (run scripts/setup.sh and "
                     "re-run cmake), or use engine auto/mma");
  engine_ = e;
}

void CudaRunner::set_widen_scratch_bytes(size_t bytes) {
  if (bytes == 0)
    throw UsageError("runner cuda: widen scratch of 0 bytes; give a positive size (default " +
                     std::to_string(widen::kDefaultScratchBytes >> 20) + " MiB)");
  widen_scratch_ = bytes;
}

// Host-side rule, no device data. The rows an expert can expect when every slot is full and the
// routing is balanced: the S*K (slot, k) pairs spread over all cfg.num_experts experts, so
// S*K / E_total per local expert (with several ranks, most of a slot's K ids name other ranks'
// experts: R*C*K / E_loc would overstate it R times). Up to 32 such rows an expert fits one 32-row
// m-tile of the decode kernels, which stream each weight once; beyond, they would stream it twice
// and CUTLASS's 128-row tiles win (kCutlassMinRows). Every weight format qualifies: what CUTLASS
// has no kernel for is widened to bf16 (widen.h).
double CudaRunner::expected_rows(const DispatchOutput& in) const {
  const int experts = std::max({cfg_.num_experts, in.num_local_experts, 1});
  return double(in.slots()) * in.top_k / experts;
}

bool CudaRunner::use_cutlass(const DispatchOutput& in, const ExpertWeights& w) const {
  if (engine_ == Engine::mma || !cutlass_engine::available()) return false;
  if (engine_ == Engine::cutlass) return true;
  const int min_rows = w.w13.format == WeightFormat::nvfp4 ? kCutlassMinRowsNvfp4 : kCutlassMinRows;
  return expected_rows(in) >= double(min_rows);
}

namespace {

// Operand path of one GEMM on the CUTLASS engine.
enum class CutlassPath { bf16, fp8, widened };

const char* path_name(CutlassPath p, WeightFormat wf) {
  if (p == CutlassPath::fp8) return "cutlass-fp8";
  if (p == CutlassPath::bf16) return "cutlass-bf16";
  return wf == WeightFormat::nvfp4 ? "cutlass-bf16(widened nvfp4)" : "cutlass-bf16(widened fp8)";
}

// GEMM1 `g` (N = 2I, W = W13 of g.experts experts, out = the intermediate [rows][I]) as its gate
// half into `gate` [rows][I] and its up half with SwiGLU in the epilogue, reading `gate`.
void gemm1_swiglu(const cutlass_engine::Grouped& g, bf16_raw* gate, cudaStream_t st) {
  const int I = g.N / 2;
  cutlass_engine::Grouped half = g;
  half.N = I;
  half.w_expert_stride = int64_t(2) * I * g.K;
  half.out = gate;
  cutlass_engine::grouped_gemm_bf16(half, st);
  half.W = static_cast<const bf16_raw*>(g.W) + int64_t(I) * g.K;
  half.src = gate;
  half.out = g.out;
  cutlass_engine::grouped_gemm_bf16_swiglu(half, st);
}

}  // namespace

// Runs grouped GEMM `g` (bf16 A) with the weights of `m` widened to bf16, a chunk of `chunk`
// consecutive experts at a time through `scratch`. A chunk is the same grouped GEMM restricted to
// experts [e0, e0 + n): rows + e0 and offsets + e0 still address the full A and out matrices (the
// offsets are absolute), only W points at the chunk's widened copy. Chunks reuse one scratch
// buffer: the next widen is stream-ordered after the previous GEMM, which is what bounds memory.
// Returns the number of chunks (a host bound, independent of the device counts).
int CudaRunner::run_widened(const cutlass_engine::Grouped& g, const MatrixView& m, const float* alpha, int chunk,
                            cudaStream_t st, bf16_raw* swiglu_gate) {
  int chunks = 0;
  for (int e0 = 0; e0 < g.experts; e0 += chunk, ++chunks) {
    const int n = std::min(chunk, g.experts - e0);
    widen::to_bf16(m, e0, n, g.rows, scratch_.get<bf16_raw>(), st);  // rows indexed by absolute expert
    cutlass_engine::Grouped c = g;
    c.experts = n;
    c.rows = g.rows + e0;
    c.offsets = g.offsets + e0;
    c.W = scratch_.get();
    c.sfa = nullptr;
    c.sfw = nullptr;
    c.alpha = alpha ? alpha + e0 : nullptr;
    if (swiglu_gate)
      gemm1_swiglu(c, swiglu_gate, st);
    else
      cutlass_engine::grouped_gemm_bf16(c, st);
  }
  return chunks;
}

// count -> offsets -> permute (bf16 rows, or the e4m3 rows + scales as dispatched) -> GEMM1
// [rows][2I] (gate | up) -> SwiGLU (bf16; fp8 round trip or e4m3 + scales per intermediate_quant)
// -> GEMM2 -> weighted sum. Where GEMM1 runs on the bf16 GEMM and the intermediate stays bf16,
// GEMM1 and the SwiGLU pass are instead its gate half [rows][I] and its up half with SwiGLU in the
// epilogue (gemm1_swiglu, engine_cutlass_swiglu.cu). Per GEMM the operand path is:
//   bf16 weights: CUTLASS bf16;
//   fp8 weights: CUTLASS fp8 where the other operand is e4m3 already (GEMM1: fp8 dispatch, GEMM2:
//     intermediate_quant = fp8), else widened to bf16(e4m3 * tile scale) + CUTLASS bf16, so that a
//     bf16 operand keeps its numerics (never requantized to e4m3);
//   nvfp4 weights: widened to bf16(e2m1 * block scale) + CUTLASS bf16 with alpha = 1/gs per expert.
// Where 1/gs goes: into the bf16 GEMM's epilogue as a per-group alpha (a runtime argument of the
// existing instantiation), so it multiplies the fp32 accumulator before the one bf16 rounding,
// exactly as the mma.sync and wgmma engines do; applying it later (in the SwiGLU pass, or in the
// weighted sum, which would need each row's expert) would scale an already rounded value.
// Widened GEMMs run as all GEMM1 chunks, the SwiGLU pass once over all rows, then all GEMM2 chunks:
// the SwiGLU pass and the intermediate's fp8 quantization stay one launch each, and both GEMMs
// share one scratch buffer (W13 chunks, then W2 chunks).
void CudaRunner::run_cutlass(const DispatchOutput& in, const ExpertWeights& w, bf16_raw* y, cudaStream_t st) {
  const int64_t S = in.slots();
  const int C = in.capacity, K = in.top_k, E = in.num_local_experts, H = in.hidden, I = w.intermediate;
  const int64_t max_rows = S * K;
  const WeightFormat wf = w.w13.format;
  const bool iq8 = cfg_.intermediate_quant == IntermediateQuant::fp8;
  const bool fp8w = wf == WeightFormat::fp8;
  const bool whole_tiles = H % 128 == 0 && I % 128 == 0;
  // fp8 GEMM1: the dispatched e4m3 rows are the A operand as they are (16-byte row copies).
  const bool fp8_1 = fp8w && in.format == ActFormat::fp8 && whole_tiles &&
                     reinterpret_cast<uintptr_t>(in.payload) % 16 == 0 && w.w13.scales;
  const bool fp8_2 = fp8w && iq8 && whole_tiles && w.w2.scales;
  const CutlassPath p1 = wf == WeightFormat::bf16 ? CutlassPath::bf16 : fp8_1 ? CutlassPath::fp8 : CutlassPath::widened;
  const CutlassPath p2 = wf == WeightFormat::bf16 ? CutlassPath::bf16 : fp8_2 ? CutlassPath::fp8 : CutlassPath::widened;
  const bool nvfp4 = wf == WeightFormat::nvfp4;
  // SwiGLU in GEMM1's epilogue where GEMM1 runs on the bf16 GEMM and the intermediate stays bf16.
  const bool fuse = fused_swiglu_ && p1 != CutlassPath::fp8 && !iq8;
  last_swiglu_fused_ = fuse;
  const int bm = 128;  // the offsets kernel also writes an m-tile table; CUTLASS does not read it
  const int64_t max_tiles = (max_rows + bm - 1) / bm + E;
  last_bm_ = bm;
  engines_ = std::string(path_name(p1, wf)) + "/" + path_name(p2, wf);
  last_engines_ = engines_.c_str();

  if (sms_ == 0) EPMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device_));
  // GEMMs run one after the other on the stream, so they share one workspace (sized for a full
  // group count; a chunk has fewer groups).
  const bool any_fp8 = p1 == CutlassPath::fp8 || p2 == CutlassPath::fp8;
  const bool any_bf16 = p1 != CutlassPath::fp8 || p2 != CutlassPath::fp8;
  cws_.reserve(std::max({any_fp8 ? cutlass_engine::fp8_workspace_bytes(E, sms_) : 0,
                         any_bf16 ? cutlass_engine::bf16_workspace_bytes(E, sms_) : 0,
                         fuse ? cutlass_engine::swiglu_workspace_bytes(E, sms_) : 0}));
  // Widening scratch: whole experts, as many as fit in the bound (at least one), sized from the
  // configuration alone so that graph replays see the same chunks.
  const size_t b13 = widen::expert_bytes(w.w13), b2 = widen::expert_bytes(w.w2);
  const int chunk1 = std::min(widen::chunk_experts(widen_scratch_, b13, E), 65535);
  const int chunk2 = std::min(widen::chunk_experts(widen_scratch_, b2, E), 65535);
  scratch_.reserve(std::max(p1 == CutlassPath::widened ? size_t(chunk1) * b13 : 0,
                            p2 == CutlassPath::widened ? size_t(chunk2) * b2 : 0));
  Routing rt{cnt_, offsets_, fill_, tiles_, num_tiles_, pair_pos_};
  rt.reserve(E, max_tiles, max_rows);
  gu_.reserve(size_t(max_rows) * 2 * I * 2);
  o_.reserve(size_t(max_rows) * H * 2);
  if (fp8_1) {
    a8_.reserve(size_t(max_rows) * H);
    as_.reserve(size_t(max_rows) * (H / 128) * 4);
  } else {
    a_.reserve(size_t(max_rows) * H * 2);
  }
  if (fp8_2) {
    h8_.reserve(size_t(max_rows) * I);
    hs_.reserve(size_t(max_rows) * (I / 128) * 4);
  } else {
    h_.reserve(size_t(max_rows) * I * 2);
  }
  if (nvfp4) {
    inv_gs_.reserve(size_t(E) * 2 * sizeof(float));
    widen::inverse_scales(w.w13.global_scale, E, inv_gs_.get<float>(), st);
    widen::inverse_scales(w.w2.global_scale, E, inv_gs_.get<float>() + E, st);
  }

  rt.count(in, bm, st);
  if (fp8_1) {
    cutlass_engine::permute_fp8(in.payload, reinterpret_cast<const float*>(in.scales), in.local_ids, in.counts, S, C, K,
                                E, H, offsets_.get<int32_t>(), fill_.get<int32_t>(), pair_pos_.get<int32_t>(),
                                a8_.get<uint8_t>(), as_.get<float>(), st);
  } else {
    rt.permute_bf16(in, a_.get<bf16_raw>(), st);
  }

  last_widen_chunks_ = 0;
  cutlass_engine::Grouped g1;
  g1.experts = E;
  g1.N = 2 * I;
  g1.K = H;
  g1.rows = cnt_.get<int32_t>();
  g1.offsets = offsets_.get<int32_t>();
  g1.W = w.w13.data;
  g1.out = gu_.get<bf16_raw>();
  g1.workspace = cws_.get();
  g1.sms = sms_;
  if (p1 == CutlassPath::fp8) {
    g1.A = a8_.get<uint8_t>();
    g1.sfa = as_.get<float>();
    g1.sfw = static_cast<const float*>(w.w13.scales);
    cutlass_engine::grouped_gemm_fp8(g1, st);
  } else if (fuse) {
    // gu_ holds the gate half [rows][I]; the up half's epilogue writes the intermediate into h_.
    g1.A = a_.get<bf16_raw>();
    g1.out = h_.get<bf16_raw>();
    if (p1 == CutlassPath::bf16)
      gemm1_swiglu(g1, gu_.get<bf16_raw>(), st);
    else
      last_widen_chunks_ +=
          run_widened(g1, w.w13, nvfp4 ? inv_gs_.get<float>() : nullptr, chunk1, st, gu_.get<bf16_raw>());
  } else {
    g1.A = a_.get<bf16_raw>();
    if (p1 == CutlassPath::bf16)
      cutlass_engine::grouped_gemm_bf16(g1, st);
    else
      last_widen_chunks_ += run_widened(g1, w.w13, nvfp4 ? inv_gs_.get<float>() : nullptr, chunk1, st);
  }

  if (!fuse)
    cutlass_engine::swiglu(gu_.get<bf16_raw>(), offsets_.get<int32_t>(), cnt_.get<int32_t>(), E, I, max_rows,
                           iq8 && !fp8_2, in.quant.ue8m0, fp8_2 ? nullptr : h_.get<bf16_raw>(),
                           fp8_2 ? h8_.get<uint8_t>() : nullptr, fp8_2 ? hs_.get<float>() : nullptr, st);

  cutlass_engine::Grouped g2 = g1;
  g2.N = H;
  g2.K = I;
  g2.W = w.w2.data;
  g2.out = o_.get<bf16_raw>();
  if (p2 == CutlassPath::fp8) {
    g2.A = h8_.get<uint8_t>();
    g2.sfa = hs_.get<float>();
    g2.sfw = static_cast<const float*>(w.w2.scales);
    cutlass_engine::grouped_gemm_fp8(g2, st);
  } else {
    g2.A = h_.get<bf16_raw>();
    g2.sfa = nullptr;
    g2.sfw = nullptr;
    if (p2 == CutlassPath::bf16)
      cutlass_engine::grouped_gemm_bf16(g2, st);
    else
      last_widen_chunks_ += run_widened(g2, w.w2, nvfp4 ? inv_gs_.get<float>() + E : nullptr, chunk2, st);
  }

  rt.reduce(in, o_.get<bf16_raw>(), y, st);
}

size_t prepare_nvfp4_weights(ExpertWeights& w, DeviceBuffer& w13, DeviceBuffer& w2, cudaStream_t stream) {
  if (w.w13.format != WeightFormat::nvfp4) return 0;
  const int H = w.hidden, I = w.intermediate;
  size_t bytes = 0;
  if (wgmma_nvfp4_supports(H, I, true)) {
    const size_t n = nvfp4_prepared_bytes(w.w13, true, I);
    w13.reserve(n);
    prepare_nvfp4_weights(w.w13, true, I, w13.get(), stream);
    w.w13.prepared = w13.get();
    bytes += n;
  }
  if (w.w2.format == WeightFormat::nvfp4 && wgmma_nvfp4_supports(I, H, false)) {
    const size_t n = nvfp4_prepared_bytes(w.w2, false, H);
    w2.reserve(n);
    prepare_nvfp4_weights(w.w2, false, H, w2.get(), stream);
    w.w2.prepared = w2.get();
    bytes += n;
  }
  return bytes;
}

}  // namespace epmoe::cuda
