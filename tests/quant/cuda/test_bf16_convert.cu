// bf16x2_exact (the combine's float -> bf16 pair conversion: the hardware's RNE with a software path
// for NaNs) against num::f32_to_bf16, the codec of the CPU reference, on every one of the 2^32
// float bit patterns: the lower half of each pair takes pattern i, the upper half pattern ~i.
#include <gtest/gtest.h>

#include <cstdint>

#include "common/gpu_test_util.h"
#include "quant/cuda/quant_device.cuh"

namespace epmoe::test {
namespace {

__global__ void sweep_kernel(uint64_t begin, uint64_t end, unsigned long long* mismatches, uint32_t* first) {
  for (uint64_t i = begin + blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < end;
       i += uint64_t(gridDim.x) * blockDim.x) {
    const uint32_t a = uint32_t(i), b = ~a;
    const float lo = num::bits_f32(a), hi = num::bits_f32(b);
    const uint32_t got = cuda::dev::bf16x2_exact(lo, hi);
    const uint32_t want = uint32_t(num::f32_to_bf16(lo)) | (uint32_t(num::f32_to_bf16(hi)) << 16);
    if (got != want) {
      if (atomicAdd(mismatches, 1ull) == 0) *first = a;
    }
  }
}

TEST(Bf16Convert, HardwarePairEqualsSoftwareOnEveryFloat) {
  EPMOE_REQUIRE_GPU();
  unsigned long long* mism = nullptr;
  uint32_t* first = nullptr;
  EPMOE_CUDA_CHECK(cudaMalloc(&mism, sizeof *mism));
  EPMOE_CUDA_CHECK(cudaMalloc(&first, sizeof *first));
  EPMOE_CUDA_CHECK(cudaMemset(mism, 0, sizeof *mism));
  EPMOE_CUDA_CHECK(cudaMemset(first, 0, sizeof *first));
  sweep_kernel<<<1024, 256>>>(0, uint64_t(1) << 32, mism, first);
  EPMOE_CUDA_CHECK(cudaGetLastError());
  unsigned long long n = 0;
  uint32_t f = 0;
  EPMOE_CUDA_CHECK(cudaMemcpy(&n, mism, sizeof n, cudaMemcpyDeviceToHost));
  EPMOE_CUDA_CHECK(cudaMemcpy(&f, first, sizeof f, cudaMemcpyDeviceToHost));
  cudaFree(mism);
  cudaFree(first);
  EXPECT_EQ(0ull, n) << "first mismatch at float bits 0x" << std::hex << f;
}

}  // namespace
}  // namespace epmoe::test
