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
// and the same question for cp.async into a shared-memory ring (the wide nvfp4 engine issues the
// copies of stage s + ahead, then waits for stage s and fences):
//   cp-before the copies of stage s + ahead, then cp.async.wait_group for stage s, fence, barrier
//   cp-after  the wait, fence and barrier first, then the copies (the bf16 / fp8 decode engines)
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
#include "run/cuda/engine_mma.cuh"  // the engines' streaming loads

namespace {

constexpr int kThreads = 128, kBlock = 9216, kAhead = 2, kRing = kAhead + 1;
enum Variant { kNone, kBar, kFence, kAfter, kBlockFence, kCpBefore, kCpAfter, kVariants };
const char* const kNames[kVariants] = {"none", "bar", "fence", "after", "block", "cp-before", "cp-after"};

struct Regs {
  uint4 c[4];
  uint2 s;
};

template <int V>
__global__ void __launch_bounds__(kThreads) stream_kernel(const uint8_t* W, int64_t blocks, unsigned* sink) {
  const int tid = threadIdx.x;
  const int64_t mine = int64_t(blockIdx.x) < blocks ? (blocks - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  int64_t next = 0;  // the next of this CTA's blocks to load
  auto load = [&](Regs& r) {
    if (next >= mine) return;
    const uint8_t* p = W + (int64_t(blockIdx.x) + next * gridDim.x) * kBlock + tid * 16;
#pragma unroll
    for (int i = 0; i < 4; ++i) r.c[i] = epmoe::cuda::gemm::ldg_stream16(p + i * 2048);
    r.s = epmoe::cuda::gemm::ldg_stream8(W + (int64_t(blockIdx.x) + next * gridDim.x) * kBlock + 8192 + tid * 8);
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

__device__ __forceinline__ void cp16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

// The cp.async form: a ring of kSlots 9 KB slots; a thread copies its 4 x 16 bytes of codes, the
// first 64 threads 16 bytes of scales each (as the wide engine), and reads its own bytes back.
template <int V>
__global__ void __launch_bounds__(kThreads) ring_kernel(const uint8_t* W, int64_t blocks, unsigned* sink) {
  // kAhead + 2 slots: the copy of stage s + ahead (issued before step s's barrier in cp-before)
  // goes into the slot of stage s - 2, which every thread finished reading before step s - 1's barrier.
  constexpr int kSlots = kAhead + 2;
  __shared__ alignas(128) uint8_t ring[kSlots][kBlock];
  const int tid = threadIdx.x;
  const int64_t mine = int64_t(blockIdx.x) < blocks ? (blocks - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  int64_t next = 0;
  auto copy = [&]() {
    if (next < mine) {
      const uint8_t* p = W + (int64_t(blockIdx.x) + next * gridDim.x) * kBlock;
      uint8_t* d = ring[next % kSlots];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        cp16(static_cast<uint32_t>(__cvta_generic_to_shared(d + i * 2048 + tid * 16)), p + i * 2048 + tid * 16);
      if (tid < 64) cp16(static_cast<uint32_t>(__cvta_generic_to_shared(d + 8192 + tid * 16)), p + 8192 + tid * 16);
    }
    ++next;
    asm volatile("cp.async.commit_group;\n" ::);
  };
#pragma unroll
  for (int j = 0; j < kAhead; ++j) copy();
  unsigned sum = 0;
  for (int64_t s = 0; s < mine; ++s) {
    if constexpr (V == kCpBefore) copy();  // stage s + ahead, before waiting for stage s
    // Stage s complete: kAhead groups younger than it may stay in flight (before) or kAhead - 1
    // (after: stage s + ahead is not issued yet).
    if constexpr (V == kCpBefore)
      asm volatile("cp.async.wait_group %0;\n" ::"n"(kAhead));
    else
      asm volatile("cp.async.wait_group %0;\n" ::"n"(kAhead - 1));
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if constexpr (V == kCpAfter) copy();
    const uint8_t* d = ring[s % kSlots];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 v = *reinterpret_cast<const uint4*>(d + i * 2048 + tid * 16);
      sum += v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  asm volatile("cp.async.wait_all;\n" ::);
  if (sum == 0x9e3779b9u) sink[0] = sum;
}

template <int V>
float time_variant(const uint8_t* W, int64_t blocks, int grid, unsigned* sink) {
  cudaEvent_t a, b;
  EPMOE_CUDA_CHECK(cudaEventCreate(&a));
  EPMOE_CUDA_CHECK(cudaEventCreate(&b));
  auto launch = [&]() {
    if constexpr (V >= kCpBefore)
      ring_kernel<V><<<grid, kThreads>>>(W, blocks, sink);
    else
      stream_kernel<V><<<grid, kThreads>>>(W, blocks, sink);
  };
  launch();  // warm-up
  EPMOE_CUDA_CHECK(cudaGetLastError());
  EPMOE_CUDA_CHECK(cudaEventRecord(a));
  constexpr int kReps = 3;
  for (int i = 0; i < kReps; ++i) launch();
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
  std::printf("| CTAs per SM |");
  for (const char* n : kNames) std::printf(" %s |", n);
  std::printf("\n|---|---|---|---|---|---|---|---|\n");
  for (int per_sm : {2, 3, 4}) {
    const int grid = prop.multiProcessorCount * per_sm;
    const float ms[kVariants] = {time_variant<kNone>(W, blocks, grid, sink), time_variant<kBar>(W, blocks, grid, sink),
                                 time_variant<kFence>(W, blocks, grid, sink),
                                 time_variant<kAfter>(W, blocks, grid, sink),
                                 time_variant<kBlockFence>(W, blocks, grid, sink),
                                 time_variant<kCpBefore>(W, blocks, grid, sink),
                                 time_variant<kCpAfter>(W, blocks, grid, sink)};
    std::printf("| %d |", per_sm);
    for (float t : ms) {
      const double gbs = double(bytes) / (t * 1e6);
      std::printf(" %.0f GB/s (%.2f) |", gbs, gbs / copy_gbs);
    }
    std::printf("\n");
  }
  std::printf("\n(GB/s of weights read; in parentheses, the ratio to the HBM copy rate.) Variants: %s = loads only; "
              "%s = + a barrier per step; %s = loads, fence.proxy.async, barrier (the prepared nvfp4 engine); %s = "
              "fence and barrier, then the loads; %s = loads, __threadfence_block, barrier; %s = cp.async of stage s + "
              "ahead, then wait for stage s, fence, barrier (the wide nvfp4 engine's order); %s = wait, fence, barrier, "
              "then the cp.async (the bf16 / fp8 decode engines' order).\n",
              kNames[kNone], kNames[kBar], kNames[kFence], kNames[kAfter], kNames[kBlockFence], kNames[kCpBefore],
              kNames[kCpAfter]);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFree(W);
  cudaFree(C);
  cudaFree(sink);
  return 0;
}
