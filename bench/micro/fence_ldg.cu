// Does a proxy fence wait for a thread's register loads still in flight? (not part of the library)
//
// The prepared nvfp4 decode engine (engine_wgmma_nvfp4_prepared.cu) loads each weight stage into
// registers two steps ahead (ld.global.nc, a register ring) and, once per step, makes the token
// stage that cp.async wrote visible to its wgmmas with `fence.proxy.async.shared::cta` and a
// barrier. ptxas compiles that fence to MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S (cuobjdump). If the
// MEMBAR holds the warp until its outstanding loads have returned, the register ring's loads ahead
// are waited for in the same step that issues them, and every step pays one loaded DRAM latency:
// the engine's weights would stream at the rate of (CTAs per SM x 9 KB) per latency, not HBM's.
//
// Each CTA (128 threads, as the engine) walks 9216-byte blocks, a thread loading 4 x 16 + 8 bytes
// of each as the engine does, into a ring `kAhead` steps ahead, and folds the block of `kAhead`
// steps ago into a checksum. Per step, one of:
//   none      nothing else (the loads alone)
//   bar       a barrier
//   fence     the engine's order: loads, then fence.proxy.async, then the barrier
//   after     fence.proxy.async and the barrier first, then the loads
//   block     loads, then fence.acq_rel.cta (__threadfence_block), then the barrier
// Printed per variant and CTAs per SM: GB/s and its ratio to a device-to-device copy measured in
// the same run. If `fence` is far below `bar` and `after` close to it, the engine's loads should
// move after its barrier (or the fence leave the loop).
// Usage: cmake -S . -B build -DEPMOE_BUILD_MICRO=ON && cmake --build build --target micro_fence_ldg
//        && build/micro_fence_ldg [MiB, default 4096]
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "core/cuda/check.h"

namespace {

constexpr int kThreads = 128, kBlock = 9216, kAhead = 2, kRing = kAhead + 1;
enum Variant { kNone, kBar, kFence, kAfter, kBlockFence, kVariants };
const char* const kNames[kVariants] = {"none", "bar", "fence", "after", "block"};

struct Regs {
  uint4 c[4];
  uint2 s;
};

__device__ __forceinline__ uint4 ldg16(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ldg8(const uint8_t* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

template <int V>
__global__ void __launch_bounds__(kThreads) stream_kernel(const uint8_t* W, int64_t blocks, unsigned* sink) {
  const int tid = threadIdx.x;
  const int64_t mine = int64_t(blockIdx.x) < blocks ? (blocks - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  int64_t next = 0;  // the next of this CTA's blocks to load
  auto load = [&](Regs& r) {
    if (next >= mine) return;
    const uint8_t* p = W + (int64_t(blockIdx.x) + next * gridDim.x) * kBlock + tid * 16;
#pragma unroll
    for (int i = 0; i < 4; ++i) r.c[i] = ldg16(p + i * 2048);
    r.s = ldg8(W + (int64_t(blockIdx.x) + next * gridDim.x) * kBlock + 8192 + tid * 8);
    ++next;
  };
  Regs ring[kRing];
#pragma unroll
  for (int j = 0; j < kAhead; ++j) load(ring[j]);
  unsigned sum = 0;
  for (int64_t s0 = 0; s0 < mine; s0 += kRing) {
#pragma unroll
    for (int j = 0; j < kRing; ++j) {
      if (s0 + j >= mine) break;
      if constexpr (V != kAfter) load(ring[(j + kAhead) % kRing]);
      if constexpr (V == kFence || V == kAfter) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      if constexpr (V == kBlockFence) __threadfence_block();
      if constexpr (V != kNone) __syncthreads();
      if constexpr (V == kAfter) load(ring[(j + kAhead) % kRing]);
      const Regs& r = ring[j];
#pragma unroll
      for (int i = 0; i < 4; ++i) sum += r.c[i].x ^ r.c[i].y ^ r.c[i].z ^ r.c[i].w;
      sum += r.s.x ^ r.s.y;
    }
  }
  if (sum == 0x9e3779b9u) sink[0] = sum;  // keeps the loads
}

template <int V>
float time_variant(const uint8_t* W, int64_t blocks, int grid, unsigned* sink) {
  cudaEvent_t a, b;
  EPMOE_CUDA_CHECK(cudaEventCreate(&a));
  EPMOE_CUDA_CHECK(cudaEventCreate(&b));
  stream_kernel<V><<<grid, kThreads>>>(W, blocks, sink);  // warm-up
  EPMOE_CUDA_CHECK(cudaEventRecord(a));
  constexpr int kReps = 3;
  for (int i = 0; i < kReps; ++i) stream_kernel<V><<<grid, kThreads>>>(W, blocks, sink);
  EPMOE_CUDA_CHECK(cudaEventRecord(b));
  EPMOE_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  EPMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / kReps;
}

}  // namespace

int main(int argc, char** argv) {
  const long mib = argc > 1 ? std::atol(argv[1]) : 4096;
  if (mib < 256) {
    std::fprintf(stderr, "micro_fence_ldg: MiB=%s must be at least 256 (the stream must not fit in L2)\n", argv[1]);
    return 2;
  }
  cudaDeviceProp prop{};
  EPMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major < 9) {
    std::fprintf(stderr, "micro_fence_ldg: fence.proxy.async needs sm_90 or newer, found %s (sm_%d%d)\n", prop.name,
                 prop.major, prop.minor);
    return 2;
  }
  const int64_t blocks = (int64_t(mib) << 20) / kBlock;
  const size_t bytes = size_t(blocks) * kBlock;
  uint8_t *W = nullptr, *C = nullptr;
  unsigned* sink = nullptr;
  EPMOE_CUDA_CHECK(cudaMalloc(&W, bytes));
  EPMOE_CUDA_CHECK(cudaMalloc(&C, bytes));
  EPMOE_CUDA_CHECK(cudaMalloc(&sink, sizeof(unsigned)));
  EPMOE_CUDA_CHECK(cudaMemset(W, 0x5a, bytes));
  // The copy baseline: a device-to-device copy reads and writes every byte.
  cudaEvent_t a, b;
  EPMOE_CUDA_CHECK(cudaEventCreate(&a));
  EPMOE_CUDA_CHECK(cudaEventCreate(&b));
  EPMOE_CUDA_CHECK(cudaMemcpy(C, W, bytes, cudaMemcpyDeviceToDevice));
  EPMOE_CUDA_CHECK(cudaEventRecord(a));
  EPMOE_CUDA_CHECK(cudaMemcpy(C, W, bytes, cudaMemcpyDeviceToDevice));
  EPMOE_CUDA_CHECK(cudaEventRecord(b));
  EPMOE_CUDA_CHECK(cudaEventSynchronize(b));
  float copy_ms = 0;
  EPMOE_CUDA_CHECK(cudaEventElapsedTime(&copy_ms, a, b));
  const double copy_gbs = 2.0 * double(bytes) / (copy_ms * 1e6);
  std::printf("# register-ring loads (%d ahead, 9 KB blocks, 128 threads per CTA) and a fence per step: %s, %d SMs, "
              "%ld MiB; HBM copy %.0f GB/s\n",
              kAhead, prop.name, prop.multiProcessorCount, mib, copy_gbs);
  std::printf("| CTAs per SM | none | bar | fence | after | block |\n|---|---|---|---|---|---|\n");
  for (int per_sm : {2, 3, 4}) {
    const int grid = prop.multiProcessorCount * per_sm;
    const float ms[kVariants] = {time_variant<kNone>(W, blocks, grid, sink), time_variant<kBar>(W, blocks, grid, sink),
                                 time_variant<kFence>(W, blocks, grid, sink),
                                 time_variant<kAfter>(W, blocks, grid, sink),
                                 time_variant<kBlockFence>(W, blocks, grid, sink)};
    std::printf("| %d |", per_sm);
    for (float t : ms) {
      const double gbs = double(bytes) / (t * 1e6);
      std::printf(" %.0f GB/s (%.2f) |", gbs, gbs / copy_gbs);
    }
    std::printf("\n");
  }
  std::printf("\n(GB/s of weights read; in parentheses, the ratio to the HBM copy rate.) Variants: %s = loads only; "
              "%s = + a barrier per step; %s = loads, fence.proxy.async, barrier (the prepared nvfp4 engine); %s = "
              "fence and barrier, then the loads; %s = loads, __threadfence_block, barrier.\n",
              kNames[kNone], kNames[kBar], kNames[kFence], kNames[kAfter], kNames[kBlockFence]);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFree(W);
  cudaFree(C);
  cudaFree(sink);
  return 0;
}
