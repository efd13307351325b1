// What a register-A wgmma (m64nNk16 bf16, the nvfp4 decode engines' instruction) costs by its
// width N, not part of the library. The 32-row nvfp4 engines issue 16 of them per 128-K weight
// stage; at decode sizes (one or two tokens per expert) only the first few of their 32 token
// columns hold tokens, so whether the tensor pipe's time per instruction falls with N decides
// whether a narrower wgmma for small tiles can shorten the weight stream's waits
// (engine_wgmma_nvfp4.cuh, narrow_width).
//
// Each CTA (one warpgroup, as the engines) issues batches of 8 wgmmas (one 64-K sub-block: two m64
// halves x four k16 steps) and waits for each batch, as the engines do, for `iters` batches; the
// grid is C CTAs per SM. Printed per N and C: the tensor-pipe cycles per wgmma per SM (kernel time
// x SM clock / wgmmas per SM) and, for reference, a batch's latency in one CTA's clock64.
// Usage: cmake -S . -B build -DEPMOE_BUILD_MICRO=ON && cmake --build build --target micro_wgmma_width
//        && build/micro_wgmma_width [iters]
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/cuda/check.h"
#include "run/cuda/engine_wgmma.cuh"
#include "run/cuda/wgmma_rs.cuh"

namespace {

using namespace epmoe::cuda;

template <int N>
__global__ void __launch_bounds__(128) batches(int iters, long long* cycles, float* sink) {
  __shared__ alignas(1024) uint8_t tokens[2][64 * 128];  // two sub-blocks' SW128 atoms, up to 64 rows
  for (int i = threadIdx.x; i < int(sizeof(tokens)); i += blockDim.x) (&tokens[0][0])[i] = uint8_t(i * 7);
  __syncthreads();
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  float acc[2][N / 2 > 0 ? N / 2 : 1] = {};
  const uint32_t a[4] = {0x3f803f80u ^ threadIdx.x, 0x3f803f80u, 0x3e803e80u, 0x3f003f00u};
  const uint32_t base = gemm::smem_u32(&tokens[0][0]);
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
    const uint32_t st = base + (it & 1) * (64 * 128);
    wg::wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint64_t db = wg::desc_sw128(st + j * 32);
#pragma unroll
      for (int h = 0; h < 2; ++h) wgrs::wgmma_bf16_rA<N>(acc[h], a, db);
    }
    wg::wgmma_commit();
    wg::wgmma_wait0();
  }
  const long long t1 = clock64();
  float s = 0.f;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < N / 2; ++i) s += acc[h][i];
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
  if (s == 1.2345f) sink[0] = s;  // keeps the wgmmas
}

template <int N>
void run(int iters, int sms, int mhz) {
  long long* d_cycles = nullptr;
  float* d_sink = nullptr;
  EPMOE_CUDA_CHECK(cudaMalloc(&d_cycles, sizeof(long long) * sms * 8));
  EPMOE_CUDA_CHECK(cudaMalloc(&d_sink, sizeof(float)));
  cudaEvent_t a, b;
  EPMOE_CUDA_CHECK(cudaEventCreate(&a));
  EPMOE_CUDA_CHECK(cudaEventCreate(&b));
  for (int per_sm : {1, 2, 3, 4}) {
    const int grid = sms * per_sm;
    batches<N><<<grid, 128>>>(iters / 10, d_cycles, d_sink);  // warm-up
    EPMOE_CUDA_CHECK(cudaEventRecord(a));
    batches<N><<<grid, 128>>>(iters, d_cycles, d_sink);
    EPMOE_CUDA_CHECK(cudaEventRecord(b));
    EPMOE_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    EPMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    std::vector<long long> cyc(grid);
    EPMOE_CUDA_CHECK(cudaMemcpy(cyc.data(), d_cycles, sizeof(long long) * grid, cudaMemcpyDeviceToHost));
    double mean = 0;
    for (long long c : cyc) mean += double(c) / grid;
    const double wgmmas_per_sm = double(iters) * 8 * per_sm;
    std::printf("| %3d | %d | %.1f | %.1f | %.3f |\n", N, per_sm, ms * 1e-3 * mhz * 1e6 / wgmmas_per_sm,
                mean / iters, ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFree(d_cycles);
  cudaFree(d_sink);
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 20000;
  if (iters <= 0) {
    std::fprintf(stderr, "micro_wgmma_width: iters=%s must be a positive count of batches\n", argv[1]);
    return 2;
  }
  cudaDeviceProp prop{};
  EPMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9) {
    std::fprintf(stderr, "micro_wgmma_width: needs a Hopper GPU (sm_90), found %s (sm_%d%d)\n", prop.name, prop.major,
                 prop.minor);
    return 2;
  }
  int khz = 0;
  EPMOE_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  const int mhz = khz / 1000;
  std::printf("# wgmma m64nNk16 bf16, A from registers, batches of 8 then wait: %s, %d SMs, %d batches per CTA\n",
              prop.name, prop.multiProcessorCount, iters);
  std::printf("# cycles at the %d MHz peak clock (kernel time x clock / wgmmas per SM)\n", mhz);
  std::printf("| N | CTAs per SM | SM cycles per wgmma | one CTA's cycles per batch | ms |\n|---|---|---|---|---|\n");
  run<8>(iters, prop.multiProcessorCount, mhz);
  run<16>(iters, prop.multiProcessorCount, mhz);
  run<32>(iters, prop.multiProcessorCount, mhz);
  run<64>(iters, prop.multiProcessorCount, mhz);
  return 0;
}
