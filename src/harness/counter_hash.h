// The counter hash behind every synthetic value (synthetic.h), written once for the host and the
// device so that harness/cuda/synthetic.h produces the host generator's floats bit for bit.
// splitmix64: cheap, and every element is an independent function of its coordinates.
#pragma once
#include <cmath>
#include <cstdint>

#include "epmoe/numeric.h"  // EPMOE_HD

namespace epmoe::harness::hash {

EPMOE_HD uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The matrices of one layer the generator draws.
enum Which : uint64_t { kW13 = 0, kW2 = 1, kRouter = 2, kBias = 3 };

// The counter base of matrix `which` of expert `e` in layer `l`; element i (= row * cols + col)
// hashes base + i.
EPMOE_HD uint64_t matrix_base(uint64_t seed, int l, int e, Which which) {
  return mix64(mix64(mix64(seed) ^ uint64_t(l)) ^ (uint64_t(e) << 2 | which));
}

// Element i of the stream at `base`: a * u for an integer u uniform in [-2^23, 2^23), where
// a = amplitude * 2^-23 (amplitude_step). u converts to float exactly and a * u rounds once,
// written as an explicit round-to-nearest product on the device so that nothing can fuse it.
EPMOE_HD float element(uint64_t base, float a, uint64_t i) {
  const float u = float(int64_t(mix64(base + i) >> 40) - (int64_t(1) << 23));
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, u);
#else
  return a * u;
#endif
}

// The step a of values uniform in [-amplitude, amplitude).
inline float amplitude_step(float amplitude) { return amplitude * 0x1p-23f; }
// The step of uniform values with standard deviation `stddev` (amplitude sqrt(3) stddev).
inline float stddev_step(double stddev) { return amplitude_step(float(std::sqrt(3.0) * stddev)); }
// The standard deviation of a weight row over `fan_in` inputs (keeps unit-variance inputs so).
inline double row_stddev(int fan_in) { return 1.0 / std::sqrt(double(fan_in)); }

}  // namespace epmoe::harness::hash
