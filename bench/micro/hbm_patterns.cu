// Read-bandwidth micro-benchmark of the decode engines' weight access pattern (not part of the
// library). The decode wgmma kernels stream weights as: a CTA owns R rows of one expert and walks K
// in stages of S bytes per row (R x S bytes per stage, 16-byte cp.async, 4-stage ring, 2 CTAs per
// SM, persistent grid). This measures how the achieved HBM read rate depends on (R, S) at equal
// bytes per stage, next to a plain contiguous read and a device-to-device copy, so that a kernel
// rewrite can be predicted before it is written.
//   cmake -S . -B build -DEPMOE_BUILD_MICRO=ON && cmake --build build --target micro_hbm_patterns
//   && build/micro_hbm_patterns   (or by hand: nvcc -O3 -std=c++17 -arch=sm_90a ...)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "core/cuda/check.h"  // the library's CUDA check: errors as exceptions naming the call


constexpr int kStages = 4, kThreads = 128;

__device__ __forceinline__ void cp16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// W: [experts][rows][row_bytes]. Work item = (expert, block of R rows); K walked in S-byte stages.
__global__ void __launch_bounds__(kThreads) pattern_kernel(const uint8_t* W, int experts, int rows, int row_bytes,
                                                           int R, int S, unsigned* sink) {
  extern __shared__ __align__(1024) uint8_t sm[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(sm));
  const int stage_bytes = R * S, chunks = stage_bytes / 16, cpr = S / 16;
  const int nb = rows / R, KT = row_bytes / S;
  const int total = experts * nb;
  const int mine = int(blockIdx.x) < total ? (total - 1 - int(blockIdx.x)) / int(gridDim.x) + 1 : 0;
  const int64_t steps = int64_t(mine) * KT;
  auto load = [&](int64_t s) {
    const int item = int(blockIdx.x) + int(s / KT) * int(gridDim.x);
    const int e = item / nb, r0 = (item % nb) * R, kt = int(s % KT);
    const uint8_t* src = W + (int64_t(e) * rows + r0) * row_bytes + int64_t(kt) * S;
    const uint32_t dst = base + uint32_t(s % kStages) * stage_bytes;
    for (int i = threadIdx.x; i < chunks; i += kThreads) {
      const int r = i / cpr, c = i % cpr;
      cp16(dst + i * 16, src + int64_t(r) * row_bytes + c * 16);
    }
  };
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) load(s);
    commit();
  }
  unsigned acc = 0;
  for (int64_t s = 0; s < steps; ++s) {
    wait<kStages - 2>();
    __syncthreads();
    if (s + kStages - 1 < steps) load(s + kStages - 1);
    commit();
    acc += sm[(s % kStages) * stage_bytes + threadIdx.x * 16];
  }
  wait<0>();
  if (acc == 0x12345678u) sink[0] = acc;
}

__global__ void contiguous_kernel(const uint4* p, int64_t n, unsigned* sink) {
  unsigned acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.w;
  }
  if (acc == 0x12345678u) sink[0] = acc;
}

template <class F>
float time_ms(F f, int reps = 5) {
  cudaEvent_t a, b;
  EPMOE_CUDA_CHECK(cudaEventCreate(&a));
  EPMOE_CUDA_CHECK(cudaEventCreate(&b));
  f();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    EPMOE_CUDA_CHECK(cudaEventRecord(a));
    f();
    EPMOE_CUDA_CHECK(cudaEventRecord(b));
    EPMOE_CUDA_CHECK(cudaEventSynchronize(b));
    float ms;
    EPMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main() {
  int sms;
  EPMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // GEMM1 of DeepSeek-V3 bf16: 128 experts x 4096 rows x 14336 bytes = 7.5 GB.
  const int experts = 128, rows = 4096, row_bytes = 14336;
  const size_t bytes = size_t(experts) * rows * row_bytes;
  uint8_t* W;
  unsigned* sink;
  EPMOE_CUDA_CHECK(cudaMalloc(&W, bytes + (1 << 20)));
  EPMOE_CUDA_CHECK(cudaMalloc(&sink, 64));
  EPMOE_CUDA_CHECK(cudaMemset(W, 1, bytes));
  uint8_t* dst;
  const size_t cbytes = size_t(2) << 30;
  EPMOE_CUDA_CHECK(cudaMalloc(&dst, cbytes));
  const float copy_ms = time_ms([&] { EPMOE_CUDA_CHECK(cudaMemcpyAsync(dst, W, cbytes, cudaMemcpyDeviceToDevice)); });
  std::printf("D2D copy 2 GiB: %.0f GB/s (read+write)\n", 2.0 * cbytes / copy_ms / 1e6);
  const float c_ms = time_ms([&] {
    contiguous_kernel<<<sms * 8, 512>>>(reinterpret_cast<const uint4*>(W), int64_t(bytes / 16), sink);
  });
  std::printf("contiguous read (ld.global.cs 16 B): %.0f GB/s\n", bytes / c_ms / 1e6);
  struct P {
    int R, S, ctas;
  };
  const P ps[] = {{128, 128, 2}, {64, 256, 2}, {32, 512, 2}, {16, 1024, 2}, {128, 256, 1}, {64, 128, 3},
                  {128, 128, 1}, {64, 512, 1}, {256, 64, 2}};
  for (const P& p : ps) {
    const int smem = kStages * p.R * p.S;
    EPMOE_CUDA_CHECK(cudaFuncSetAttribute(pattern_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const float ms = time_ms([&] {
      pattern_kernel<<<sms * p.ctas, kThreads, smem>>>(W, experts, rows, row_bytes, p.R, p.S, sink);
    });
    EPMOE_CUDA_CHECK(cudaGetLastError());
    std::printf("pattern R=%3d rows x S=%4d B per stage (%2d KB), %d CTA/SM: %.0f GB/s\n", p.R, p.S,
                p.R * p.S / 1024, p.ctas, bytes / ms / 1e6);
  }
  EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
  return 0;
}
