// CPU reference runner: the oracle every other runner is tested against. Tokens are grouped by
// local expert so each expert's weights are dequantized once and streamed once per block of rows;
// every slot's arithmetic is still exactly the per-row sequence documented in reference.h.
//
// The work is cut into tasks for the shared CPU pool (core/parallel.h). The cut depends only on
// the problem's shape, never on the thread count, and each output element is produced by one
// task with the serial arithmetic, so the result is bitwise the same with 1 thread or 64.
#include "run/reference.h"

#include <algorithm>
#include <string>

#include "core/parallel.h"
#include "epmoe/error.h"
#include "epmoe/numeric.h"
#include "epmoe/quant.h"

namespace epmoe::detail {

namespace {

// Rows of X processed against one weight row at a time: the weight row stays in L1 while it is
// reused, and the block of X rows stays in L2.
constexpr int kRowBlock = 8;
// Task sizes. A GEMM task covers at most kTaskRows rows and enough weight rows for about
// kTaskMacs multiply-adds (a few ms of work: large enough to amortize scheduling, small enough
// that a decode batch of a few rows on one expert still spreads over every core).
constexpr int kTaskRows = 64;
constexpr int64_t kTaskMacs = int64_t(1) << 21;
constexpr int64_t kRowsPerTask = 16;     // dequantize / SwiGLU / weighted-sum tasks
constexpr int kDequantRowsPerTask = 128;  // weight dequantization tasks

int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

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

// For every used expert e and its pairs p in [first[e], first[e+1]):
//   out[p][n] = dot_f32(W[e][n], rows[p]) for n < N (W[e] is [N][Kd], out row stride N).
void run_gemm_tasks(const std::vector<int>& used, const std::vector<int64_t>& first, const float* const* W, int N,
                    const float* const* rows, int Kd, float* out) {
  struct Task {
    int e;
    int64_t p0;
    int mb, n0, n1;
  };
  std::vector<Task> tasks;
  for (int e : used) {
    for (int64_t p0 = first[e]; p0 < first[e + 1]; p0 += kTaskRows) {
      const int mb = int(std::min<int64_t>(kTaskRows, first[e + 1] - p0));
      int64_t nc = kTaskMacs / (int64_t(mb) * std::max(Kd, 1));
      nc = std::clamp<int64_t>((nc + 15) / 16 * 16, 16, std::max(N, 1));
      for (int n0 = 0; n0 < N; n0 += int(nc)) tasks.push_back({e, p0, mb, n0, int(std::min<int64_t>(N, n0 + nc))});
    }
  }
  parallel_for(int64_t(tasks.size()), [&](int64_t t) {
    const Task& k = tasks[size_t(t)];
    for (int m0 = 0; m0 < k.mb; m0 += kRowBlock) {
      const int mb = std::min(kRowBlock, k.mb - m0);
      for (int n = k.n0; n < k.n1; ++n) {
        const float* w = W[k.e] + size_t(n) * Kd;
        for (int m = 0; m < mb; ++m) {
          const int64_t p = k.p0 + m0 + m;
          out[size_t(p) * N + n] = dot_f32(w, rows[p], Kd);
        }
      }
    }
  });
}

void require(bool ok, const std::string& msg) {
  if (!ok) throw UsageError("reference runner: " + msg);
}

void check_matrix(const MatrixView& m, const char* what, WeightFormat f, int experts, int rows, int cols, int split) {
  require(m.device == DeviceKind::cpu, std::string(what) + " is on " + device_name(m.device) +
                                           "; the reference runner needs host weights");
  require(m.format == f, std::string(what) + " has format " + format_name(m.format) + " but weight_format is " +
                             format_name(f) + "; quantize the weights to the configured format");
  require(m.experts == experts && m.rows == rows && m.cols == cols,
          std::string(what) + " is [" + std::to_string(m.experts) + "][" + std::to_string(m.rows) + "][" +
              std::to_string(m.cols) + "], expected [" + std::to_string(experts) + "][" + std::to_string(rows) +
              "][" + std::to_string(cols) + "] (E_loc, rows, cols)");
  require(m.data != nullptr || experts == 0, std::string(what) + ".data is null");
  require(row_split_ok(m, split), row_split_error(what, m, split));
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
  if (iq == IntermediateQuant::automatic)
    throw UsageError("swiglu_row: iq=auto is not resolved; pass MoeConfig::effective_intermediate_quant()");
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
  if (cfg.effective_intermediate_quant() == IntermediateQuant::fp8 && cfg.intermediate % 16 != 0)
    throw UsageError("intermediate=" + std::to_string(cfg.intermediate) +
                     " is not a multiple of 16, which intermediate_quant=fp8 needs (block-128 scales, the last "
                     "block partial); use intermediate_quant=none or a multiple of 16");
}

void ReferenceRunner::dense_all(const MatrixView& m, const std::vector<int>& experts, std::vector<const float*>& out) {
  struct Todo {
    Key key;
    int e;
    float* dst;
  };
  std::vector<Todo> todo;
  for (int e : experts) {
    const Key key{m.data, m.scales, m.global_scale, int(m.format), m.rows, m.cols, e};
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      it = cache_.emplace(key, std::unique_ptr<float[]>(new float[size_t(m.rows) * m.cols])).first;
      todo.push_back({key, e, it->second.get()});
    }
    out[e] = it->second.get();
  }
  const int64_t chunks = ceil_div64(m.rows, kDequantRowsPerTask);
  try {
    parallel_for(int64_t(todo.size()) * chunks, [&](int64_t t) {
      const Todo& d = todo[size_t(t / chunks)];
      const int r0 = int(t % chunks) * kDequantRowsPerTask;
      const int n = std::min(kDequantRowsPerTask, m.rows - r0);
      dequantize_matrix_rows(m, d.e, r0, n, d.dst + size_t(r0) * m.cols);
    });
  } catch (...) {
    for (const Todo& d : todo) cache_.erase(d.key);  // never keep a half-filled entry
    throw;
  }
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
  check_matrix(w.w13, "w13", cfg_.weight_format, El, 2 * I, H, I);
  check_matrix(w.w2, "w2", cfg_.weight_format, El, H, I, 0);
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
  for (int64_t r = 0; r < M; ++r) {
    const int32_t* ids = in.local_ids + slots[r] * K;
    for (int k = 0; k < K; ++k) {
      if (ids[k] < 0) continue;
      require(ids[k] < El, "local expert id " + std::to_string(ids[k]) + " at slot " + std::to_string(slots[r]) +
                               " is outside [0, " + std::to_string(El) + ")");
      by_expert[ids[k]].push_back(r * K + k);
    }
  }

  // Pairs are numbered expert by expert: expert e owns pairs [first[e], first[e+1]).
  std::vector<int64_t> first(size_t(El) + 1, 0);
  for (int e = 0; e < El; ++e) first[e + 1] = first[e] + int64_t(by_expert[e].size());
  const int64_t npairs = first[El];
  std::vector<int64_t> pair_of(size_t(M) * K, -1);
  for (int e = 0; e < El; ++e)
    for (size_t i = 0; i < by_expert[e].size(); ++i) pair_of[by_expert[e][i]] = first[e] + int64_t(i);

  // Weights first, on this thread: the cache is not shared with the tasks below, only read.
  std::vector<const float*> w13(El, nullptr), w2(El, nullptr);
  std::vector<int> used;
  for (int e = 0; e < El; ++e)
    if (!by_expert[e].empty()) used.push_back(e);
  dense_all(w.w13, used, w13);
  dense_all(w.w2, used, w2);

  // Dequantized activations of the valid slots, compacted.
  std::vector<float> x(size_t(M) * H);
  const size_t ps = in.payload_stride(), ss = in.scale_stride();
  parallel_for(ceil_div64(M, kRowsPerTask), [&](int64_t b) {
    for (int64_t r = b * kRowsPerTask; r < std::min(M, (b + 1) * kRowsPerTask); ++r)
      dequantize_rows(in.format, in.quant, in.payload + slots[r] * ps, ss ? in.scales + slots[r] * ss : nullptr, 1,
                      H, x.data() + size_t(r) * H);
  });

  // GEMM1, SwiGLU and GEMM2, each over all experts at once: GEMM tasks are (expert, row block,
  // column block), and every element is one dot_f32 whichever task computes it.
  std::vector<const float*> xrow(static_cast<size_t>(npairs)), arow(static_cast<size_t>(npairs));
  std::vector<float> gu(size_t(npairs) * 2 * I), a(size_t(npairs) * I), o(size_t(npairs) * H);
  for (int e = 0; e < El; ++e)
    for (size_t i = 0; i < by_expert[e].size(); ++i) {
      const int64_t p = first[e] + int64_t(i);
      xrow[p] = x.data() + size_t(by_expert[e][i] / K) * H;
      arow[p] = a.data() + size_t(p) * I;
    }
  run_gemm_tasks(used, first, w13.data(), 2 * I, xrow.data(), H, gu.data());
  parallel_for(ceil_div64(npairs, kRowsPerTask), [&](int64_t b) {
    for (int64_t p = b * kRowsPerTask; p < std::min(npairs, (b + 1) * kRowsPerTask); ++p) {
      const float* g = gu.data() + size_t(p) * 2 * I;
      swiglu_row(g, g + I, I, cfg_.effective_intermediate_quant(), cfg_.fp8_ue8m0, a.data() + size_t(p) * I);
    }
  });
  run_gemm_tasks(used, first, w2.data(), H, arow.data(), I, o.data());

  // y = sum over k ascending of w_k * o_k, fp32, then bf16.
  parallel_for(ceil_div64(M, kRowsPerTask), [&](int64_t b) {
    std::vector<float> acc(H);
    for (int64_t r = b * kRowsPerTask; r < std::min(M, (b + 1) * kRowsPerTask); ++r) {
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
  });
}

}  // namespace epmoe::detail
