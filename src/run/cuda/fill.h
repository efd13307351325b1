// Device-side random fills for benchmarks and large tests: quantizing 100+ experts of real size on
// the host would take minutes, and the GEMM timings do not depend on how the values were drawn
// (only on their not being zeros, which can run faster).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "epmoe/tensor.h"

namespace epmoe::cuda {

// Uniform in (-scale, scale), rounded to bf16.
void fill_random_bf16(bf16_raw* p, size_t n, float scale, uint64_t seed, cudaStream_t stream);
// Random e4m3 codes of either sign with exponent field in [lo_exp, hi_exp] (never NaN).
void fill_random_e4m3(uint8_t* p, size_t n, int lo_exp, int hi_exp, uint64_t seed, cudaStream_t stream);
// Random bytes (packed e2m1 pairs: every byte is valid).
void fill_random_u8(uint8_t* p, size_t n, uint64_t seed, cudaStream_t stream);
void fill_f32(float* p, size_t n, float value, cudaStream_t stream);

}  // namespace epmoe::cuda
