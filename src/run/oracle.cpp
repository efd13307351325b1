// float64 whole-layer computation. Deliberately the most literal form of the formula: it is the
// yardstick, so it must be obviously right rather than fast (tests keep its sizes small). The only
// concession to speed: tokens are spread over the CPU pool, each token still computed serially.
#include "run/oracle.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/parallel.h"
#include "epmoe/error.h"
#include "epmoe/numeric.h"

namespace epmoe::oracle {

namespace {

std::vector<double> widen(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

std::vector<double> requantize(const float* w, int E, int rows, int cols, WeightFormat f, int row_split) {
  const HostMatrix m = quantize_matrix(w, E, rows, cols, f, row_split);
  const MatrixView v = m.view();
  std::vector<double> out(size_t(E) * rows * cols);
  // Dequantization is elementwise, so any split into row ranges gives the same values.
  constexpr int kRows = 128;
  const int64_t chunks = (rows + kRows - 1) / kRows;
  detail::parallel_for(int64_t(E) * chunks, [&](int64_t t) {
    const int e = int(t / chunks), r0 = int(t % chunks) * kRows, n = std::min(kRows, rows - r0);
    std::vector<float> tmp(size_t(n) * cols);
    dequantize_matrix_rows(v, e, r0, n, tmp.data());
    std::copy(tmp.begin(), tmp.end(), out.begin() + (size_t(e) * rows + r0) * cols);
  });
  return out;
}

}  // namespace

DenseExperts DenseExperts::from_fp32(const float* w13, const float* w2, int E, int H, int I) {
  DenseExperts d;
  d.num_experts = E, d.hidden = H, d.intermediate = I;
  d.w13.assign(w13, w13 + size_t(E) * 2 * I * H);
  d.w2.assign(w2, w2 + size_t(E) * H * I);
  return d;
}

DenseExperts DenseExperts::quantized(const float* w13, const float* w2, int E, int H, int I, WeightFormat f) {
  DenseExperts d;
  d.num_experts = E, d.hidden = H, d.intermediate = I;
  d.w13 = requantize(w13, E, 2 * I, H, f, I);  // fp8: gate and up tiled apart, as the runners get W13
  d.w2 = requantize(w2, E, H, I, f, 0);
  return d;
}

void moe_forward(const DenseExperts& ex, const double* x, int64_t T, const int32_t* ids, const float* w, int K,
                 double* out) {
  const int H = ex.hidden, I = ex.intermediate, E = ex.num_experts;
  // Ids are checked before any work so the error (the first bad id) does not depend on threads.
  for (int64_t t = 0; t < T; ++t)
    for (int k = 0; k < K; ++k) {
      const int e = ids[t * K + k];
      if (e < -1 || e >= E)
        throw UsageError("oracle: topk_ids[" + std::to_string(t) + "][" + std::to_string(k) + "]=" + std::to_string(e) +
                         " is outside [-1, " + std::to_string(E) + ")");
    }
  // Tokens are independent: each task owns whole tokens and runs the serial per-token loop.
  constexpr int64_t kTokensPerTask = 4;
  detail::parallel_for((T + kTokensPerTask - 1) / kTokensPerTask, [&](int64_t b) {
    std::vector<double> a(I);
    for (int64_t t = b * kTokensPerTask; t < std::min(T, (b + 1) * kTokensPerTask); ++t) {
      const double* xt = x + t * H;
      double* ot = out + t * H;
      for (int h = 0; h < H; ++h) ot[h] = 0.0;
      for (int k = 0; k < K; ++k) {
        const int e = ids[t * K + k];
        if (e == -1) continue;
        const double* w13 = ex.w13.data() + size_t(e) * 2 * I * H;
        const double* w2 = ex.w2.data() + size_t(e) * H * I;
        for (int i = 0; i < I; ++i) {
          double g = 0, u = 0;
          for (int h = 0; h < H; ++h) {
            g += w13[size_t(i) * H + h] * xt[h];
            u += w13[size_t(I + i) * H + h] * xt[h];
          }
          a[i] = g / (1.0 + std::exp(-g)) * u;
        }
        const double wk = w[t * K + k];
        for (int h = 0; h < H; ++h) {
          double o = 0;
          for (int i = 0; i < I; ++i) o += w2[size_t(h) * I + i] * a[i];
          ot[h] += wk * o;
        }
      }
    }
  });
}

std::vector<double> widen_bf16(const bf16_raw* x, size_t n) {
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = num::bf16_to_f32(x[i]);
  return out;
}

std::vector<double> dispatched_activations(ActFormat f, const QuantParams& p, const bf16_raw* x, int64_t T, int H) {
  std::vector<uint8_t> payload(size_t(T) * payload_bytes(f, H)), scales(size_t(T) * scale_bytes(f, H));
  quantize_rows(f, p, x, T, H, payload.data(), scales.data());
  std::vector<float> back(size_t(T) * H);
  dequantize_rows(f, p, payload.data(), scales.data(), T, H, back.data());
  return widen(back);
}

ErrorStats compare(const double* got, const double* ref, size_t n) {
  ErrorStats s;
  double dot = 0, gg = 0, rr = 0, ref_max = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(ref[i])) {
      ++s.nonfinite;
      continue;
    }
    s.max_abs = std::max(s.max_abs, std::abs(got[i] - ref[i]));
    ref_max = std::max(ref_max, std::abs(ref[i]));
    dot += got[i] * ref[i];
    gg += got[i] * got[i];
    rr += ref[i] * ref[i];
  }
  s.max_rel = ref_max > 0 ? s.max_abs / ref_max : (s.max_abs > 0 ? INFINITY : 0.0);
  if (gg > 0 && rr > 0) s.one_minus_cos = 1.0 - dot / (std::sqrt(gg) * std::sqrt(rr));
  else s.one_minus_cos = (gg == 0 && rr == 0) ? 0.0 : 1.0;
  return s;
}

ErrorStats compare_bf16(const bf16_raw* got, const double* ref, size_t n) {
  const std::vector<double> g = widen_bf16(got, n);
  return compare(g.data(), ref, n);
}

}  // namespace epmoe::oracle
