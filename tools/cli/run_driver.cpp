// The one driver of `epmoe run` (run_driver.h).
//
// The stack is h_{l+1} = bf16(h_l + MoE_l(h_l)). The float64 check keeps h in double and uses the
// unquantized master weights, but reuses the routing decisions the path under test made at each
// layer (harness/check.h), for the first --check-tokens tokens of every rank.
#include "run_driver.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "bench_util.h"
#include "comm/launch.h"
#include "epmoe/comm.h"
#include "epmoe/error.h"
#include "epmoe/layer.h"
#include "epmoe/numeric.h"
#include "epmoe/router.h"
#include "harness/check.h"
#include "harness/synthetic.h"
#include "rank_io.h"
#include "run/oracle.h"

namespace epmoe::cli {
namespace {

// allgather for ranks that are threads of this process (cpu, or a thread per GPU); under mpirun
// each process holds one rank and the exchange goes over NCCL (bench_util's allgather).
class Exchange {
 public:
  Exchange(int ranks, int timeout_ms) : ranks_(ranks), timeout_ms_(timeout_ms), slots_(ranks) {}

  std::vector<double> allgather(Communicator& comm, const std::vector<double>& mine) {
    if (comm.size() > 1 && under_mpirun()) return epmoe::allgather(comm, mine);
    std::unique_lock<std::mutex> lock(mu_);
    slots_[comm.rank()] = mine;
    const uint64_t gen = gen_;
    if (++arrived_ == ranks_) {
      result_.clear();
      for (const auto& v : slots_) result_.insert(result_.end(), v.begin(), v.end());
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
    } else if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms_), [&] { return gen_ != gen; })) {
      throw TimeoutError("a rank did not reach the result exchange within --timeout-ms", -1);
    }
    return result_;
  }

 private:
  int ranks_, timeout_ms_;
  std::vector<std::vector<double>> slots_;
  std::vector<double> result_;
  int arrived_ = 0;
  uint64_t gen_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
};

struct RowResult {
  oracle::ErrorStats err;
  int64_t checked = 0;  // values compared
  double total_ms = 0;  // sum over layers of the slowest rank's forward
};

// Runs estimated to take longer than this print a progress line per layer.
constexpr double kProgressSeconds = 5.0;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One row, this rank's part. Collective. Fills `res` on the rank that prints.
void run_row_rank(Communicator& comm, RankIO& io, Exchange& ex, const RunSetup& s, const RunPlan& plan,
                  const MoeConfig& c, const std::string& tag, bool talk, RowResult& res) {
  const int R = c.num_ranks, r = comm.rank(), H = c.hidden, E = c.num_experts, K = c.top_k, I = c.intermediate;
  const int64_t T = s.tokens.at(r), S = plan.check_per_rank.at(r);
  const int64_t Smax = *std::max_element(plan.check_per_rank.begin(), plan.check_per_rank.end());
  const bool gpu = s.device == DeviceKind::cuda;
  const bool calibrate = c.dispatch_format == ActFormat::nvfp4 && s.calibrate_nvfp4;
  const auto t0 = std::chrono::steady_clock::now();

  std::vector<bf16_raw> h = harness::random_hidden(T, H, s.seed * 7919 + 17 + uint64_t(r)), out;
  std::vector<double> ref = oracle::widen_bf16(h.data(), size_t(S) * H), moe;
  std::vector<float> logits(size_t(T) * E), sub_w(size_t(S) * K);
  std::vector<int32_t> sub_ids(size_t(S) * K);
  std::vector<double> layer_ms;
  for (int l = 0; l < s.layers; ++l) {
    MoeConfig cl = c;
    if (calibrate) {
      // gs = 448*6/amax falls with amax: the group's scale is the smallest rank scale.
      const auto all = ex.allgather(comm, {T ? double(nvfp4_global_scale_bf16(h.data(), h.size())) : 0.0});
      double gs = 0;
      for (double g : all)
        if (g > 0) gs = gs == 0 ? g : std::min(gs, g);
      cl.nvfp4_global_scale = gs > 0 ? float(gs) : 1.f;
    }
    const harness::RouterWeights rt = harness::router_weights(c, s.seed, l);
    {
      harness::RankWeights rw = harness::rank_weights(cl, s.seed, l, r);
      const ExpertWeights ew{rw.w13.experts, H, I, io.put(rw.w13), io.put(rw.w2)};
      rw = {};
      MoeLayer layer(cl, comm, ew, io.put(rt.bias));
      harness::router_logits(rt, H, E, h.data(), T, logits.data());
      layer_ms.push_back(io.forward(layer, h, logits, out, T, H, E, gpu ? 3 : 1, gpu));
      // Every rank is done with this layer's buffers before any rank frees them.
      comm.check_same(uint64_t(l), "epmoe run: layer finished on every rank");
    }
    io.release();
    for (size_t i = 0; i < out.size(); ++i) h[i] = num::f32_to_bf16(num::bf16_to_f32(h[i]) + num::bf16_to_f32(out[i]));
    if (S > 0) {
      route_cpu(cl.router, TensorView::of(logits.data(), DType::f32, {S, E}), rt.bias.data(), K, sub_ids.data(),
                sub_w.data());
      harness::moe_f64(c, s.seed, l, ref, S, sub_ids, sub_w, moe);
      for (size_t i = 0; i < moe.size(); ++i) ref[i] += moe[i];
    }
    // Ranks check different token counts: meet here, under the host-side timeout, so that no rank
    // waits for a slower one's float64 inside the next forward (under --timeout-ms).
    ex.allgather(comm, {0.0});  // one value: NCCL treats an empty allgather as no collective
    // Progress only for long runs: the setup's estimate (cpu), or this row's pace so far.
    const double elapsed = seconds_since(t0), row_estimate = elapsed / (l + 1) * s.layers;
    if (talk && (plan.seconds > kProgressSeconds || row_estimate > kProgressSeconds))
      std::fprintf(stderr, "[epmoe run] %s: layer %d/%d done (%.1f s)\n", tag.c_str(), l + 1, s.layers, elapsed);
  }

  if (!s.dump.empty()) {  // the bytes the Python front end's parity test compares with
    const std::string path = s.dump + "." + format_name(c.dispatch_format) + "-" + format_name(c.weight_format) +
                             ".rank" + std::to_string(r) + ".bin";
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f || std::fwrite(h.data(), 2, h.size(), f) != h.size() || std::fclose(f) != 0)
      throw UsageError("--dump: cannot write " + path + "; give a writable path prefix");
  }

  // Results to the printing rank: [S, got S x H padded to Smax x H, ref likewise], layer times.
  std::vector<double> mine(1 + 2 * size_t(Smax) * H, 0.0);
  mine[0] = double(S);
  for (size_t i = 0; i < size_t(S) * H; ++i) {
    mine[1 + i] = num::bf16_to_f32(h[i]);
    mine[1 + size_t(Smax) * H + i] = ref[i];
  }
  const std::vector<double> all = ex.allgather(comm, mine), all_ms = ex.allgather(comm, layer_ms);
  if (!talk) return;
  std::vector<double> got, want;
  const size_t stride = mine.size();
  for (int q = 0; q < R; ++q) {
    const double* base = all.data() + q * stride;
    const size_t n = size_t(base[0]) * H;
    got.insert(got.end(), base + 1, base + 1 + n);
    want.insert(want.end(), base + 1 + size_t(Smax) * H, base + 1 + size_t(Smax) * H + n);
  }
  res.err = oracle::compare(got.data(), want.data(), got.size());
  res.checked = int64_t(got.size());
  res.total_ms = 0;
  for (int l = 0; l < s.layers; ++l) {
    double m = 0;
    for (int q = 0; q < R; ++q) m = std::max(m, all_ms[size_t(q) * s.layers + l]);
    res.total_ms += m;
  }
}

const char* kHeaderFmt = "%-9s %-8s %-8s %8s %8s %12s %15s %12s %10s %11s  %s\n";

void print_row(const RunSetup& s, const Row& row, const MoeConfig& c, int64_t tokens, const RowResult& r, bool& failed) {
  char err[3][32];
  if (r.checked == r.err.nonfinite) {  // nothing finite compared: no error to show
    for (auto& e : err) std::snprintf(e, sizeof e, "-");
  } else {
    std::snprintf(err[0], 32, "%.3e", r.err.max_abs);
    std::snprintf(err[1], 32, "%.3e", r.err.max_rel);
    std::snprintf(err[2], 32, "%.3e", r.err.one_minus_cos);
  }
  char tok_s[32] = "-";
  if (s.device == DeviceKind::cuda && r.total_ms > 0)
    std::snprintf(tok_s, sizeof tok_s, "%.0f", double(tokens) * s.layers / (r.total_ms * 1e-3) / c.num_ranks);
  std::string status = "ok";
  if (r.err.nonfinite > 0) {
    failed = true;
    status = "FAIL: " + std::to_string(r.err.nonfinite) + " of " + std::to_string(r.checked) +
             " checked values are NaN/Inf";
  }
  char ms[32];
  std::snprintf(ms, sizeof ms, "%.3f", r.total_ms);
  std::printf(kHeaderFmt, format_name(row.dispatch), format_name(row.weights), format_name(c.combine_format),
              std::to_string(tokens).c_str(), std::to_string(r.checked / std::max(1, c.hidden)).c_str(), err[0], err[1],
              err[2], ms, tok_s, status.c_str());
  std::fflush(stdout);
}

}  // namespace

int run_driver(const RunSetup& s, const SetupCheck& k) {
  const MoeConfig& c = s.cfg;
  const int R = c.num_ranks;
  const bool printer = rank0_process();
  const std::vector<Row> rows = run_rows(s);
  int64_t tokens = 0;
  for (int64_t t : s.tokens) tokens += t;

  if (printer) {
    std::printf("%-9s %-8s %-8s %8s %8s %12s %15s %12s %10s %11s  %s\n", "dispatch", "weights", "combine", "tokens",
                "checked", "max_abs_err", "max_err/max_ref", "1-cosine", "time_ms", "tok/s/GPU", "status");
    std::fflush(stdout);  // before the progress lines on stderr
  }
  std::vector<size_t> runnable;
  int rc = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (k.per_row[i].empty()) {
      runnable.push_back(i);
      continue;
    }
    rc = 2;
    if (printer)
      std::printf("%-9s %-8s  refused: %s\n", format_name(rows[i].dispatch), format_name(rows[i].weights),
                  k.per_row[i][0].message.c_str());
  }
  if (runnable.empty()) return rc;

  bool failed = false;
  const auto t_start = std::chrono::steady_clock::now();
  Exchange ex(R, int(std::min(2e9, std::max({double(c.timeout_ms), 120000.0, 10e3 * k.plan.seconds}))));
  auto rank_fn = [&](Communicator& comm) {
    const bool talk = comm.rank() == 0 && printer;
    auto io = s.device == DeviceKind::cuda ? make_cuda_io(comm.device_index()) : make_host_io();
    for (size_t n = 0; n < runnable.size(); ++n) {
      const Row& row = rows[runnable[n]];
      const MoeConfig rc_cfg = row_config(s, row);
      const std::string tag = "row " + std::to_string(n + 1) + "/" + std::to_string(runnable.size()) + " dispatch=" +
                              format_name(row.dispatch) + " weights=" + format_name(row.weights);
      RowResult res;
      run_row_rank(comm, *io, ex, s, k.plan, rc_cfg, tag, talk, res);
      if (talk) print_row(s, row, rc_cfg, tokens, res, failed);
    }
  };
  if (s.device == DeviceKind::cpu) {
    auto comms = R == 1 ? [] {
      std::vector<std::unique_ptr<Communicator>> one;
      one.push_back(make_local_comm(DeviceKind::cpu));
      return one;
    }()
                        : make_cpu_group(R, c.timeout_ms);
    run_ranks(comms, rank_fn);
  } else {
    // Host-side waits get minutes: between collectives a rank builds weights and float64 references,
    // which take seconds and differ between ranks. The kernels' own waits keep --timeout-ms.
    launch_gpu_ranks(R, std::max(c.timeout_ms, 120000), rank_fn);
  }
  if (printer && seconds_since(t_start) > 2)
    std::fprintf(stderr, "[epmoe run] done in %.1f s\n", seconds_since(t_start));
  if (failed) rc = std::max(rc, 1);
  return rc;
}

}  // namespace epmoe::cli
