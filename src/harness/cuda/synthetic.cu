// The device generator (synthetic.h): harness/counter_hash.h's values, quantized with the
// device codecs of quant/cuda/quant_device.cuh in quantize_matrix's order (src/quant/cpu.cpp):
//   bf16:  one RNE conversion per element;
//   fp8:   per 128x128 tile, amax -> (scale = a / 448, mul = 448 / a) -> e4m3(x * mul);
//   nvfp4: per expert gs = 2688 / amax over the expert, then per 16 along cols nvfp4_block.
// Maxima are order-free (no NaN among the values), so block reductions give the host's amax.
#include "harness/cuda/synthetic.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string>
#include <vector>

#include "epmoe/error.h"
#include "epmoe/quant.h"
#include "harness/counter_hash.h"
#include "harness/synthetic.h"
#include "quant/cuda/quant_device.cuh"

namespace epmoe::harness::cuda {
namespace {

using epmoe::cuda::DeviceBuffer;

// One slot's stream: its counter base and step, or zeros for a slot no expert occupies.
struct SlotGen {
  uint64_t base = 0;
  float a = 0.f;
  int live = 0;
};

__device__ __forceinline__ float value(const SlotGen& g, uint64_t i) {
  return g.live ? hash::element(g.base, g.a, i) : 0.f;
}

constexpr int kThreads = 256;

__global__ void bf16_kernel(const SlotGen* __restrict__ slots, size_t per_expert, size_t n, uint16_t* __restrict__ out) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = num::f32_to_bf16(value(slots[i / per_expert], i % per_expert));
}

__device__ float block_max(float v) {
  __shared__ float part[kThreads / 32];
  v = epmoe::cuda::dev::warp_max(v);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < kThreads / 32 ? part[threadIdx.x] : 0.f;
    v = epmoe::cuda::dev::warp_max(v);
    if (threadIdx.x == 0) part[0] = v;
  }
  __syncthreads();
  return part[0];
}

// One 128x128 tile per block: grid (col tiles, row tiles, slots); rows [0, row_split) and
// [row_split, rows) tiled apart when row_split > 0 (MatrixView::row_split, quantize_matrix).
__global__ void fp8_kernel(const SlotGen* __restrict__ slots, int rows, int cols, int row_split,
                           uint8_t* __restrict__ data, float* __restrict__ scales) {
  const int bj = blockIdx.x, bi = blockIdx.y, e = blockIdx.z;
  const int r0 = fp8_tile_row_begin(bi, row_split), c0 = bj * 128;
  const int nr = fp8_tile_row_end(bi, rows, row_split) - r0, nc = min(128, cols - c0);
  const SlotGen g = slots[e];
  float amax = 0.f;
  for (int t = threadIdx.x; t < nr * nc; t += blockDim.x) {
    const uint64_t i = uint64_t(r0 + t / nc) * cols + c0 + t % nc;
    amax = fmaxf(amax, fabsf(value(g, i)));
  }
  amax = block_max(amax);
  const epmoe::cuda::dev::Fp8Block p = epmoe::cuda::dev::fp8_block_params(amax, false);
  if (threadIdx.x == 0) scales[(size_t(e) * gridDim.y + bi) * gridDim.x + bj] = p.scale;
  uint8_t* de = data + size_t(e) * rows * cols;
  for (int t = threadIdx.x; t < nr * nc; t += blockDim.x) {
    const uint64_t i = uint64_t(r0 + t / nc) * cols + c0 + t % nc;
    de[i] = epmoe::cuda::dev::fp8_code(value(g, i), p);
  }
}

// amax over each slot's matrix into bits[e] (float bits of a non-negative value order like the
// floats): grid (chunks, slots).
__global__ void amax_kernel(const SlotGen* __restrict__ slots, size_t per_expert, unsigned* __restrict__ bits) {
  const SlotGen g = slots[blockIdx.y];
  float amax = 0.f;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < per_expert; i += size_t(gridDim.x) * blockDim.x)
    amax = fmaxf(amax, fabsf(value(g, i)));
  amax = block_max(amax);
  if (threadIdx.x == 0) atomicMax(bits + blockIdx.y, __float_as_uint(amax));
}

// nvfp4_global_scale's rule: 1 for an all-zero matrix, 2688 / amax, the largest float if that overflows.
__global__ void global_scale_kernel(const unsigned* __restrict__ bits, int slots, float* __restrict__ gs) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= slots) return;
  const float amax = __uint_as_float(bits[e]);
  float s = 1.f;
  if (amax != 0.f) {
    s = __fdiv_rn(num::kE4m3Max * 6.0f, amax);
    if (!isfinite(s)) s = FLT_MAX;
  }
  gs[e] = s;
}

// One block of 16 along cols per thread; block k of the whole [slots][rows][cols / 16] scale array
// owns data bytes [8k, 8k + 8) and elements [16k, 16k + 16) of the flattened matrix.
__global__ void nvfp4_kernel(const SlotGen* __restrict__ slots, size_t blocks_per_expert, size_t n,
                             const float* __restrict__ gs, uint8_t* __restrict__ data, uint8_t* __restrict__ scales) {
  for (size_t k = blockIdx.x * size_t(blockDim.x) + threadIdx.x; k < n; k += size_t(gridDim.x) * blockDim.x) {
    const size_t e = k / blocks_per_expert, j0 = (k % blocks_per_expert) * 16;
    const SlotGen g = slots[e];
    float x[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) x[i] = value(g, j0 + i);
    uint8_t packed[8];
    scales[k] = epmoe::cuda::dev::nvfp4_block(x, gs[e], packed);
    uint2 w;
    w.x = uint32_t(packed[0]) | uint32_t(packed[1]) << 8 | uint32_t(packed[2]) << 16 | uint32_t(packed[3]) << 24;
    w.y = uint32_t(packed[4]) | uint32_t(packed[5]) << 8 | uint32_t(packed[6]) << 16 | uint32_t(packed[7]) << 24;
    reinterpret_cast<uint2*>(data)[k] = w;
  }
}

__global__ void uniform_kernel(uint64_t base, float a, size_t n, uint16_t* __restrict__ out) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = num::f32_to_bf16(hash::element(base, a, i));
}

int grid_for(size_t n) { return int(std::min<size_t>((n + kThreads - 1) / kThreads, 8192)); }

// Generates and quantizes one matrix kind (w13 or w2) of every slot.
MatrixView make_matrix(WeightFormat f, const std::vector<SlotGen>& gens, int rows, int cols, int row_split,
                       DeviceBuffer& slots, DeviceBuffer& d, DeviceBuffer& s, DeviceBuffer& gsb, DeviceBuffer& scratch,
                       cudaStream_t st) {
  const int El = int(gens.size());
  MatrixView v;
  v.format = f;
  v.experts = El;
  v.rows = rows;
  v.cols = cols;
  v.row_split = f == WeightFormat::fp8 ? row_split : 0;
  v.device = DeviceKind::cuda;
  const size_t per_expert = size_t(rows) * cols, n = per_expert * El;
  slots.reserve(gens.size() * sizeof(SlotGen));
  EPMOE_CUDA_CHECK(cudaMemcpyAsync(slots.get(), gens.data(), gens.size() * sizeof(SlotGen), cudaMemcpyHostToDevice, st));
  d.reserve(std::max<size_t>(v.data_bytes(), 1));
  v.data = d.get();
  if (n == 0) return v;
  const SlotGen* sg = slots.get<SlotGen>();
  if (f == WeightFormat::bf16) {
    bf16_kernel<<<grid_for(n), kThreads, 0, st>>>(sg, per_expert, n, d.get<uint16_t>());
    EPMOE_CUDA_CHECK_LAUNCH();
    return v;
  }
  s.reserve(std::max<size_t>(v.scale_bytes(), 4));
  v.scales = s.get();
  if (f == WeightFormat::fp8) {
    const dim3 grid((cols + 127) / 128, fp8_tile_rows(rows, v.row_split), El);
    fp8_kernel<<<grid, kThreads, 0, st>>>(sg, rows, cols, v.row_split, d.get<uint8_t>(), s.get<float>());
    EPMOE_CUDA_CHECK_LAUNCH();
    return v;
  }
  scratch.reserve(size_t(El) * 4);
  gsb.reserve(size_t(El) * 4);
  EPMOE_CUDA_CHECK(cudaMemsetAsync(scratch.get(), 0, size_t(El) * 4, st));
  const dim3 agrid(std::max(1, std::min(grid_for(per_expert), 8192 / std::max(1, El))), El);
  amax_kernel<<<agrid, kThreads, 0, st>>>(sg, per_expert, scratch.get<unsigned>());
  EPMOE_CUDA_CHECK_LAUNCH();
  global_scale_kernel<<<(El + kThreads - 1) / kThreads, kThreads, 0, st>>>(scratch.get<unsigned>(), El, gsb.get<float>());
  EPMOE_CUDA_CHECK_LAUNCH();
  const size_t blocks = n / 16;
  nvfp4_kernel<<<grid_for(blocks), kThreads, 0, st>>>(sg, per_expert / 16, blocks, gsb.get<float>(),
                                                       d.get<uint8_t>(), s.get<uint8_t>());
  EPMOE_CUDA_CHECK_LAUNCH();
  v.global_scale = gsb.get<float>();
  return v;
}

}  // namespace

void rank_weights(const MoeConfig& c, uint64_t seed, int l, int rank, DeviceRankWeights& out, cudaStream_t st) {
  const int H = c.hidden, I = c.intermediate;
  if (c.weight_format == WeightFormat::nvfp4 && (H % 16 != 0 || I % 16 != 0))
    throw UsageError("harness::cuda::rank_weights: hidden=" + std::to_string(H) + " intermediate=" + std::to_string(I) +
                     " are not both multiples of 16, which weight format nvfp4 requires; use bf16 or fp8 weights");
  const std::vector<int> slot_expert = harness::slot_experts(c, rank);
  const int El = int(slot_expert.size());
  // The steps of synthetic.cpp: gate/up rows 1/sqrt(H), down rows 1/sqrt(I), uniform.
  const float a13 = hash::stddev_step(hash::row_stddev(H)), a2 = hash::stddev_step(hash::row_stddev(I));
  std::vector<SlotGen> g13(El), g2(El);
  for (int s = 0; s < El; ++s) {
    if (slot_expert[s] < 0) continue;
    g13[s] = {hash::matrix_base(seed, l, slot_expert[s], hash::kW13), a13, 1};
    g2[s] = {hash::matrix_base(seed, l, slot_expert[s], hash::kW2), a2, 1};
  }
  DeviceBuffer slots13, slots2, scratch13, scratch2;
  out.w.num_local_experts = El;
  out.w.hidden = H;
  out.w.intermediate = I;
  // W13 with gate and up tiled apart, as synthetic.cpp quantizes it.
  out.w.w13 = make_matrix(c.weight_format, g13, 2 * I, H, I, slots13, out.d13, out.s13, out.g13, scratch13, st);
  out.w.w2 = make_matrix(c.weight_format, g2, H, I, 0, slots2, out.d2, out.s2, out.g2, scratch2, st);
  // The slot tables and scratch are freed on return: finish the work that reads them first.
  EPMOE_CUDA_CHECK(cudaStreamSynchronize(st));
}

void uniform_bf16(bf16_raw* p, size_t n, float amplitude, uint64_t seed, cudaStream_t st) {
  if (n == 0) return;
  uniform_kernel<<<grid_for(n), kThreads, 0, st>>>(hash::mix64(seed), hash::amplitude_step(amplitude), n, p);
  EPMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace epmoe::harness::cuda
