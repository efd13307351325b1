#include "run/cuda/fill.h"

#include "core/cuda/check.h"
#include "epmoe/numeric.h"

namespace epmoe::cuda {
namespace {

__device__ __forceinline__ uint64_t mix(uint64_t x) {  // splitmix64 finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void bf16_kernel(bf16_raw* p, size_t n, float scale, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t h = mix(seed + i * 0x9e3779b97f4a7c15ull);
    const float u = float(h >> 40) * (1.0f / 16777216.0f) * 2.f - 1.f;
    p[i] = num::f32_to_bf16(u * scale);
  }
}

__global__ void e4m3_kernel(uint8_t* p, size_t n, int lo, int hi, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t h = mix(seed + i * 0x9e3779b97f4a7c15ull);
    const int e = lo + int(h % uint64_t(hi - lo + 1));
    const int m = int((h >> 8) & 7);
    const int s = int((h >> 12) & 1);
    uint8_t code = uint8_t((s << 7) | (e << 3) | m);
    if ((code & 0x7f) == 0x7f) code &= 0xfe;
    p[i] = code;
  }
}

__global__ void u8_kernel(uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = uint8_t(mix(seed + i * 0x9e3779b97f4a7c15ull) >> 17);
}

__global__ void f32_kernel(float* p, size_t n, float v) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) p[i] = v;
}

constexpr int kGrid = 4096, kBlock = 256;

}  // namespace

void fill_random_bf16(bf16_raw* p, size_t n, float scale, uint64_t seed, cudaStream_t stream) {
  if (!n) return;
  bf16_kernel<<<kGrid, kBlock, 0, stream>>>(p, n, scale, seed);
  EPMOE_CUDA_CHECK_LAUNCH();
}
void fill_random_e4m3(uint8_t* p, size_t n, int lo_exp, int hi_exp, uint64_t seed, cudaStream_t stream) {
  if (!n) return;
  e4m3_kernel<<<kGrid, kBlock, 0, stream>>>(p, n, lo_exp, hi_exp, seed);
  EPMOE_CUDA_CHECK_LAUNCH();
}
void fill_random_u8(uint8_t* p, size_t n, uint64_t seed, cudaStream_t stream) {
  if (!n) return;
  u8_kernel<<<kGrid, kBlock, 0, stream>>>(p, n, seed);
  EPMOE_CUDA_CHECK_LAUNCH();
}
void fill_f32(float* p, size_t n, float value, cudaStream_t stream) {
  if (!n) return;
  f32_kernel<<<kGrid, kBlock, 0, stream>>>(p, n, value);
  EPMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace epmoe::cuda
