// Helpers shared by the GPU tests: skip without a device, typed device buffers, poisoning, random
// data and the comparison metrics of DESIGN.md §6.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "core/cuda/check.h"
#include "epmoe/numeric.h"
#include "epmoe/tensor.h"

#define EPMOE_REQUIRE_GPU()                                              \
  do {                                                                   \
    std::string why_;                                                    \
    if (::epmoe::cuda::device_count(&why_) == 0) {                       \
      GTEST_SKIP() << "no CUDA device: " << why_;                        \
    }                                                                    \
  } while (0)

namespace epmoe::test {

template <class T>
class Dev {
 public:
  Dev() = default;
  explicit Dev(size_t n) : n_(n), buf_(std::max<size_t>(n, 1) * sizeof(T)) {}
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { upload(h); }
  void upload(const std::vector<T>& h) {
    n_ = h.size();
    buf_.reserve(std::max<size_t>(n_, 1) * sizeof(T));
    if (n_) EPMOE_CUDA_CHECK(cudaMemcpy(buf_.get(), h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
    // Complete on return: a pageable copy may still be in DMA when cudaMemcpy returns, and kernels
    // under test may run on non-blocking streams.
    EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    if (n_) EPMOE_CUDA_CHECK(cudaMemcpy(h.data(), buf_.get(), n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  void poison() {
    if (n_) EPMOE_CUDA_CHECK(cudaMemset(buf_.get(), 0xff, n_ * sizeof(T)));
    EPMOE_CUDA_CHECK(cudaDeviceSynchronize());  // cudaMemset is asynchronous to non-blocking streams
  }
  T* get() const { return buf_.get<T>(); }
  size_t size() const { return n_; }

 private:
  size_t n_ = 0;
  cuda::DeviceBuffer buf_;
};

// bf16 values of mixed magnitude (per-row scale 2^[-4, 4]), a few exact zeros.
inline std::vector<bf16_raw> random_bf16(std::mt19937& rng, int64_t rows, int cols, float base = 1.f) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> ex(-4, 4);
  std::vector<bf16_raw> v(size_t(rows) * cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float s = base * std::ldexp(1.f, ex(rng));
    for (int c = 0; c < cols; ++c) {
      const float x = (rng() % 97 == 0) ? 0.f : nd(rng) * s;
      v[size_t(r) * cols + c] = num::f32_to_bf16(x);
    }
  }
  return v;
}

struct Diff {
  double max_abs = 0, max_ref = 0, one_minus_cos = 0;
  size_t nonfinite = 0;
  double rel() const { return max_ref > 0 ? max_abs / max_ref : max_abs; }
};
inline Diff compare(const std::vector<float>& a, const std::vector<float>& ref) {
  Diff d;
  double dot = 0, na = 0, nr = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(ref[i])) {
      ++d.nonfinite;
      continue;
    }
    d.max_abs = std::max(d.max_abs, std::fabs(double(a[i]) - ref[i]));
    d.max_ref = std::max(d.max_ref, std::fabs(double(ref[i])));
    dot += double(a[i]) * ref[i];
    na += double(a[i]) * a[i];
    nr += double(ref[i]) * ref[i];
  }
  d.one_minus_cos = (na > 0 && nr > 0) ? 1.0 - dot / std::sqrt(na * nr) : (na == nr ? 0.0 : 1.0);
  return d;
}
inline std::vector<float> widen(const std::vector<bf16_raw>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = num::bf16_to_f32(v[i]);
  return f;
}

// Index of the first element whose bytes differ, or -1. Floats: any NaN equals any NaN, since
// the NaN a CPU produces (x86 keeps an operand's payload or makes -nan, other CPUs +nan) is not
// part of any format; every non-NaN value must match bit for bit.
template <class T>
int64_t first_diff(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if constexpr (std::is_same_v<T, float>) {
      if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    }
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return int64_t(i);
  }
  return -1;
}

}  // namespace epmoe::test
