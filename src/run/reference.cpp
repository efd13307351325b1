// CPU reference runner: the oracle every other runner is tested against. Tokens are grouped by
// local expert so each expert's weights are dequantized once and streamed once per block of rows;
// every slot's arithmetic is still exactly the per-row sequence documented in reference.h.
#include "run/reference.h"

#include <algorithm>
#include <string>

#include "epmoe/error.h"
#include "epmoe/numeric.h"
#include "epmoe/quant.h"

namespace epmoe::detail {

namespace {

// Rows of X processed against one weight row at a time: the weight row stays in L1 while it is
// reused, and the block of X rows stays in L2.
constexpr int kRowBlock = 8;

// out[m][n] = dot_f32(W[n], X[m]) for m < M, n < N; W [N][Kd], X [M][Kd], out row stride ldo.
void gemm_rows(const float* W, int N, const float* X, int M, int Kd, float* out, int ldo) {
  for (int m0 = 0; m0 < M; m0 += kRowBlock) {
    const int mb = std::min(kRowBlock, M - m0);
    for (int n = 0; n < N; ++n) {
      const float* w = W + size_t(n) * Kd;
      for (int m = 0; m < mb; ++m) out[size_t(m0 + m) * ldo + n] = dot_f32(w, X + size_t(m0 + m) * Kd, Kd);
    }
  }
}

void require(bool ok, const std::string& msg) {
  if (!ok) throw UsageError("reference runner: " + msg);
}

void check_matrix(const MatrixView& m, const char* what, WeightFormat f, int experts, int rows, int cols) {
  require(m.device == DeviceKind::cpu, std::string(what) + " is on " + device_name(m.device) +
                                           "; the reference runner needs host weights");
  require(m.format == f, std::string(what) + " has format " + format_name(m.format) + " but weight_format is " +
                             format_name(f) + "; quantize the weights to the configured format");
  require(m.experts == experts && m.rows == rows && m.cols == cols,
          std::string(what) + " is [" + std::to_string(m.experts) + "][" + std::to_string(m.rows) + "][" +
              std::to_string(m.cols) + "], expected [" + std::to_string(experts) + "][" + std::to_string(rows) +
              "][" + std::to_string(cols) + "] (E_loc, rows, cols)");
  require(m.data != nullptr || experts == 0, std::string(what) + ".data is null");
}

}  // namespace

float dot_f32(const float* a, const float* b, int n) {
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  const int n8 = n / 8 * 8;
  for (int i = 0; i < n8; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (int i = n8; i < n; ++i) s += a[i] * b[i];
  return s;
}

void swiglu_row(const float* gate, const float* up, int n, IntermediateQuant iq, bool ue8m0, float* a) {
  for (int i = 0; i < n; ++i) a[i] = (gate[i] * num::sigmoid_f32(gate[i])) * up[i];
  if (iq == IntermediateQuant::fp8) {
    uint8_t q[128];
    for (int b = 0; b < n; b += 128) {
      const int len = std::min(128, n - b);
      const float scale = quantize_fp8_block(a + b, len, ue8m0, q);
      for (int i = 0; i < len; ++i) a[b + i] = num::e4m3_to_f32(q[i]) * scale;
    }
  }
}

void expert_ffn_row(const float* w13, const float* w2, int H, int I, const float* x, IntermediateQuant iq,
                    bool ue8m0, float* scratch, float* o) {
  float* gu = scratch;  // [2I]
  float* a = scratch + 2 * size_t(I);
  gemm_rows(w13, 2 * I, x, 1, H, gu, 2 * I);
  swiglu_row(gu, gu + I, I, iq, ue8m0, a);
  gemm_rows(w2, H, a, 1, I, o, H);
}

ReferenceRunner::ReferenceRunner(const MoeConfig& cfg) : cfg_(cfg) {
  if (cfg.intermediate_quant == IntermediateQuant::fp8 && cfg.intermediate % 128 != 0)
    throw UsageError("intermediate=" + std::to_string(cfg.intermediate) +
                     " is not a multiple of 128, which intermediate_quant=fp8 needs (block-128 scales); "
                     "use intermediate_quant=none or a multiple of 128");
}

const float* ReferenceRunner::dense(const MatrixView& m, int e) {
  const Key key{m.data, m.scales, m.global_scale, int(m.format), m.rows, m.cols, e};
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    std::vector<float> w(size_t(m.rows) * m.cols);
    dequantize_matrix_rows(m, e, 0, m.rows, w.data());
    it = cache_.emplace(key, std::move(w)).first;
  }
  return it->second.data();
}

void ReferenceRunner::run(const DispatchOutput& in, const ExpertWeights& w, bf16_raw* y, Stream) {
  const int H = cfg_.hidden, I = cfg_.intermediate, K = in.top_k, El = w.num_local_experts;
  require(in.device == DeviceKind::cpu, std::string("dispatch output is on ") + device_name(in.device) +
                                            "; pair runner=reference with a cpu dispatcher");
  require(in.hidden == H && w.hidden == H && w.intermediate == I,
          "shape mismatch: dispatch hidden=" + std::to_string(in.hidden) + ", weights hidden=" +
              std::to_string(w.hidden) + " intermediate=" + std::to_string(w.intermediate) + ", config hidden=" +
              std::to_string(H) + " intermediate=" + std::to_string(I));
  require(in.num_local_experts == El, "dispatch output has " + std::to_string(in.num_local_experts) +
                                          " local experts but the weights have " + std::to_string(El));
  check_matrix(w.w13, "w13", cfg_.weight_format, El, 2 * I, H);
  check_matrix(w.w2, "w2", cfg_.weight_format, El, H, I);
  const int64_t C = in.capacity;

  // Valid slots and, per expert, the (row, k) pairs it serves, in ascending slot order.
  std::vector<int64_t> slots;
  for (int s = 0; s < in.num_ranks; ++s) {
    const int n = in.counts[s];
    require(n >= 0 && n <= C, "counts[" + std::to_string(s) + "]=" + std::to_string(n) + " is outside [0, " +
                                  std::to_string(C) + "]");
    for (int j = 0; j < n; ++j) slots.push_back(s * C + j);
  }
  const int64_t M = int64_t(slots.size());
  if (M == 0) return;

  std::vector<std::vector<int64_t>> by_expert(El);  // entries: row * K + k
  int64_t npairs = 0;
  for (int64_t r = 0; r < M; ++r) {
    const int32_t* ids = in.local_ids + slots[r] * K;
    for (int k = 0; k < K; ++k) {
      if (ids[k] < 0) continue;
      require(ids[k] < El, "local expert id " + std::to_string(ids[k]) + " at slot " + std::to_string(slots[r]) +
                               " is outside [0, " + std::to_string(El) + ")");
      by_expert[ids[k]].push_back(r * K + k);
      ++npairs;
    }
  }

  // Dequantized activations of the valid slots, compacted.
  std::vector<float> x(size_t(M) * H);
  const size_t ps = in.payload_stride(), ss = in.scale_stride();
  for (int64_t r = 0; r < M; ++r)
    dequantize_rows(in.format, in.quant, in.payload + slots[r] * ps, ss ? in.scales + slots[r] * ss : nullptr, 1, H,
                    x.data() + size_t(r) * H);

  // Expert outputs per (row, k) pair, grouped by expert.
  std::vector<float> o(size_t(npairs) * H);
  std::vector<int64_t> pair_of(size_t(M) * K, -1);
  std::vector<float> xe, gu, a;
  int64_t next = 0;
  for (int e = 0; e < El; ++e) {
    const auto& list = by_expert[e];
    if (list.empty()) continue;
    const int m = int(list.size());
    const float* w13 = dense(w.w13, e);
    const float* w2 = dense(w.w2, e);
    xe.resize(size_t(m) * H);
    for (int i = 0; i < m; ++i) std::copy_n(x.data() + size_t(list[i] / K) * H, H, xe.data() + size_t(i) * H);
    gu.resize(size_t(m) * 2 * I);
    a.resize(size_t(m) * I);
    gemm_rows(w13, 2 * I, xe.data(), m, H, gu.data(), 2 * I);
    for (int i = 0; i < m; ++i) {
      const float* g = gu.data() + size_t(i) * 2 * I;
      swiglu_row(g, g + I, I, cfg_.intermediate_quant, cfg_.fp8_ue8m0, a.data() + size_t(i) * I);
    }
    gemm_rows(w2, H, a.data(), m, I, o.data() + size_t(next) * H, H);
    for (int i = 0; i < m; ++i) pair_of[list[i]] = next + i;
    next += m;
  }

  // y = sum over k ascending of w_k * o_k, fp32, then bf16.
  std::vector<float> acc(H);
  for (int64_t r = 0; r < M; ++r) {
    std::fill(acc.begin(), acc.end(), 0.f);
    const float* wk = in.weights + slots[r] * K;
    for (int k = 0; k < K; ++k) {
      const int64_t p = pair_of[size_t(r) * K + k];
      if (p < 0) continue;
      const float* op = o.data() + size_t(p) * H;
      for (int h = 0; h < H; ++h) acc[h] += wk[k] * op[h];
    }
    bf16_raw* yr = y + slots[r] * H;
    for (int h = 0; h < H; ++h) yr[h] = num::f32_to_bf16(acc[h]);
  }
}

}  // namespace epmoe::detail
