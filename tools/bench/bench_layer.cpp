// `epmoe bench layer`: the whole MoE layer (route + quantize + dispatch + run + combine, i.e.
// MoeLayer::forward) on every GPU of the job, per dispatch format (weights of the same family) and
// tokens per rank, with in the same run:
//   - the runner alone on the same dispatched input (its own dispatcher of the same configuration
//     dispatches once, then only Runner::run is timed), so layer/runner shows what routing and
//     communication add;
//   - accuracy against float64 on a token subset (the first --check-tokens tokens of every rank),
//     computed with the stored weights dequantized and the activations unquantized, so the number
//     is the error of activation quantization, the runner's arithmetic and the bf16 outputs.
// Times are medians of CUDA-event-timed repetitions queued back to back, each a CUDA graph replay
// when the dispatcher is capturable ("nvlink", "local"), else eager calls ("nccl"); the layer and
// the runner alone are timed in alternating rounds, so that both see the same clocks.
// Weights: the harness's synthetic model (harness/cuda/synthetic.h), built on the device.
// --decode: L stacked layers (one weight set shared by all layers: at these shapes each layer's
// weights exceed L2 many times over, so sharing does not change the bytes read) with N sequences per
// rank; one step = L forwards, captured as one graph; prints the step latency and output tokens/s
// per GPU (MoE layers only).
// Ranks: one process with a thread per visible GPU, or one process per GPU under mpirun; rank 0
// prints.
#include "commands.h"

#if defined(EPMOE_WITH_CUDA)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "args.h"
#include "bench_timer.h"
#include "bench_util.h"
#include "comm/launch.h"
#include "setup.h"
#include "core/cuda/check.h"
#include "dispatch/nvlink/grid.h"
#include "epmoe/epmoe.h"
#include "harness/cuda/synthetic.h"
#include "route/cuda/route.h"
#include "run/oracle.h"
#if defined(EPMOE_WITH_NCCL)
#include "dispatch/a2a/host.h"
#include "epmoe/nccl_comm.h"
#endif

namespace epmoe::cli {
namespace {

using cuda::DeviceBuffer;

// Activations are uniform in [-sqrt(3), sqrt(3)] (unit variance), so this nvfp4 global scale
// (448*6/amax) never saturates a block scale.
constexpr float kActAmax = 1.7320508f;

struct Opts {
  MoeConfig base;  // preset + ranks, dispatcher, runner, comm_sms
  std::string preset;
  std::vector<long long> tokens;
  std::vector<ActFormat> formats;
  int reps = 20;
  int check = 64;
  bool graph = true;  // when the dispatcher allows it
  bool decode = false;
  int layers = 8, seqs = 64;
  uint64_t seed = 1;
};

bool capturable(const std::string& dispatcher) { return dispatcher == "nvlink" || dispatcher == "local"; }

// ---- weights ------------------------------------------------------------------------------------
// The harness's synthetic model (harness/synthetic.h), this rank's experts of layer 0, generated
// and quantized on the device.
using DeviceWeights = harness::cuda::DeviceRankWeights;

// Expert e of a device matrix, copied to the host (experts = 1).
HostMatrix download_expert(const MatrixView& m, int e) {
  HostMatrix h;
  h.format = m.format;
  h.experts = 1;
  h.rows = m.rows;
  h.cols = m.cols;
  h.row_split = m.row_split;
  const size_t db = m.data_bytes() / m.experts, sb = m.scale_bytes() / m.experts;
  h.data.resize(db);
  EPMOE_CUDA_CHECK(cudaMemcpy(h.data.data(), static_cast<const uint8_t*>(m.data) + db * e, db, cudaMemcpyDeviceToHost));
  if (sb) {
    h.scales.resize(sb);
    EPMOE_CUDA_CHECK(
        cudaMemcpy(h.scales.data(), static_cast<const uint8_t*>(m.scales) + sb * e, sb, cudaMemcpyDeviceToHost));
  }
  if (m.global_scale) {
    h.global_scale.resize(1);
    EPMOE_CUDA_CHECK(cudaMemcpy(h.global_scale.data(), m.global_scale + e, 4, cudaMemcpyDeviceToHost));
  }
  return h;
}

std::vector<float> dequantize_all(const HostMatrix& h) {
  std::vector<float> out(size_t(h.rows) * h.cols);
  dequantize_matrix_rows(h.view(), 0, 0, h.rows, out.data());
  return out;
}

// ---- float64 reference on the token subset --------------------------------------------------------
// xs [R*S][H] and logits [R*S][E] (bf16 values widened) are every rank's subset, in rank order. Each
// rank adds the contributions of its own experts; the sums over ranks give out[R*S][H]. Collective.
std::vector<double> reference(Communicator& comm, const MoeConfig& cfg, const ExpertWeights& w,
                              const std::vector<double>& xs, const std::vector<double>& lg, int64_t S, int threads) {
  const int R = comm.size(), r = comm.rank(), H = cfg.hidden, I = cfg.intermediate, E = cfg.num_experts, K = cfg.top_k;
  const int El = cfg.experts_per_rank(), dev = comm.device_index();
  const int64_t NT = int64_t(R) * S;
  // route_cpu gives the ids the CUDA router computes (bitwise, by design).
  std::vector<bf16_raw> lg16(lg.size());
  for (size_t i = 0; i < lg.size(); ++i) lg16[i] = num::f32_to_bf16(float(lg[i]));
  std::vector<int32_t> ids(size_t(NT) * K);
  std::vector<float> wts(size_t(NT) * K);
  route_cpu(cfg.router, TensorView::of(lg16.data(), DType::bf16, {NT, E}), nullptr, K, ids.data(), wts.data());
  std::vector<std::vector<int64_t>> pairs(El);
  for (int64_t p = 0; p < NT * K; ++p)
    if (ids[p] >= 0 && ids[p] / El == r) pairs[ids[p] % El].push_back(p);
  std::vector<int> used;
  for (int s = 0; s < El; ++s)
    if (!pairs[s].empty()) used.push_back(s);
  std::vector<double> contrib(size_t(NT) * K * H, 0.0);
  parallel_for(int64_t(used.size()), threads, [&](int64_t i) {
    EPMOE_CUDA_CHECK(cudaSetDevice(dev));
    const int s = used[i];
    const std::vector<float> w13 = dequantize_all(download_expert(w.w13, s));
    const std::vector<float> w2 = dequantize_all(download_expert(w.w2, s));
    const oracle::DenseExperts dense = oracle::DenseExperts::from_fp32(w13.data(), w2.data(), 1, H, I);
    const auto& ps = pairs[s];
    const int64_t n = int64_t(ps.size());
    std::vector<double> xg(size_t(n) * H), og(size_t(n) * H);
    std::vector<int32_t> id0(n, 0);
    std::vector<float> wg(n);
    for (int64_t j = 0; j < n; ++j) {
      std::copy_n(xs.data() + size_t(ps[j] / K) * H, H, xg.data() + size_t(j) * H);
      wg[j] = wts[ps[j]];
    }
    oracle::moe_forward(dense, xg.data(), n, id0.data(), wg.data(), 1, og.data());
    for (int64_t j = 0; j < n; ++j) std::copy_n(og.data() + size_t(j) * H, H, contrib.data() + size_t(ps[j]) * H);
  });
  std::vector<double> partial(size_t(NT) * H, 0.0);
  for (int64_t t = 0; t < NT; ++t)
    for (int k = 0; k < K; ++k)
      for (int i = 0; i < H; ++i) partial[size_t(t) * H + i] += contrib[(size_t(t) * K + k) * H + i];
  const std::vector<double> all = allgather(comm, partial);
  std::vector<double> ref(partial.size(), 0.0);
  for (int q = 0; q < R; ++q)
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += all[size_t(q) * ref.size() + i];
  return ref;
}

// Tokens of the checked subset whose row is far off (max |got - ref| over the row above a quarter
// of max |ref| over all rows: far beyond quantization error), with the first few named, so that a
// wrong output says which rank and tokens it hit. g and ref: [R][S][H].
void report_bad_tokens(const std::vector<double>& g, const std::vector<double>& ref, int64_t S, int H, const char* fmt,
                       long long T) {
  double amax = 0;
  for (double v : ref) amax = std::max(amax, std::fabs(v));
  const int64_t rows = int64_t(ref.size()) / H;
  int64_t bad = 0;
  std::string first;
  for (int64_t t = 0; t < rows; ++t) {
    double m = 0;
    for (int h = 0; h < H; ++h) m = std::max(m, std::fabs(g[size_t(t) * H + h] - ref[size_t(t) * H + h]));
    if (!(m <= 0.25 * amax)) {
      if (++bad <= 8) first += " r" + std::to_string(t / S) + ":t" + std::to_string(t % S);
    }
  }
  if (bad)
    std::fprintf(stderr, "[bench layer] %s T=%lld: %lld of %lld checked tokens are far off (row error > 0.25 max|ref|):%s\n",
                 fmt, T, static_cast<long long>(bad), static_cast<long long>(rows), first.c_str());
}

// ---- timing -------------------------------------------------------------------------------------
// Median microseconds of `reps` calls of fn on `st`, queued back to back: replays of one captured
// graph when `graph`, else eager calls. fn must already have run eagerly (workspaces grown) before
// a capture.
double time_us(cudaStream_t st, bool graph, int reps, const std::function<void()>& fn) {
  return median_us(st, TimeSpec{0, reps, graph, false}, fn);
}

// The medians of a and b timed in alternating rounds (a, b, a, b, ...; `reps` calls of each in
// all), so that a clock the power cap moves during the measurement weighs on both alike: timed one
// after the other, the layer / runner ratio moved 1.07-1.14x between calls of one session while
// neither the layer nor the runner changed (session 36).
constexpr int kTimingRounds = 4;
std::pair<double, double> interleaved_us(cudaStream_t st, bool graph, int reps, const std::function<void()>& a,
                                         const std::function<void()>& b) {
  std::vector<double> ta, tb;
  for (int round = 0; round < kTimingRounds; ++round) {
    const int n = reps / kTimingRounds + (round < reps % kTimingRounds ? 1 : 0);
    if (n == 0) continue;
    for (double t : time_each_us(st, TimeSpec{0, n, graph, false}, a)) ta.push_back(t);
    for (double t : time_each_us(st, TimeSpec{0, n, graph, false}, b)) tb.push_back(t);
  }
  return {median(ta), median(tb)};
}

// Waits for this rank's last dispatcher call and raises what its kernels recorded.
void dispatcher_sync(Dispatcher& d, cudaStream_t st) {
#if defined(EPMOE_WITH_NCCL)
  detail::gpu_dispatcher_sync(d, st);
#else
  (void)d;
#endif
  EPMOE_CUDA_CHECK(cudaStreamSynchronize(st));
}

struct OwnedStream {
  cudaStream_t st = nullptr;
  OwnedStream() { EPMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking)); }
  ~OwnedStream() { cudaStreamDestroy(st); }
};

MoeConfig format_config(const Opts& o, ActFormat f, int64_t capacity) {
  MoeConfig c = o.base;
  c.dispatch_format = f;
  c.weight_format = weight_family(f);
  c.capacity = int(std::max<int64_t>(capacity, 1));
  c.nvfp4_global_scale = 448.f * 6.f / kActAmax;
  return c;
}

// The header's iq: the value each format runs with, e.g. "auto (bf16 none, fp8 fp8, nvfp4 none)".
std::string iq_header(const Opts& o) {
  std::string s = intermediate_quant_name(o.base.intermediate_quant);
  if (o.base.intermediate_quant != IntermediateQuant::automatic) return s;
  s += " (";
  for (size_t i = 0; i < o.formats.size(); ++i)
    s += std::string(i ? ", " : "") + format_name(o.formats[i]) + " " +
         intermediate_quant_name(format_config(o, o.formats[i], 1).effective_intermediate_quant());
  return s + ")";
}

// ---- layer mode -----------------------------------------------------------------------------------
void layer_rank(Communicator& comm, const Opts& o) {
  const int R = comm.size(), r = comm.rank(), dev = comm.device_index();
  const MoeConfig& b = o.base;
  const int H = b.hidden, E = b.num_experts, K = b.top_k;
  const int64_t maxT = *std::max_element(o.tokens.begin(), o.tokens.end());
  const int64_t minT = *std::min_element(o.tokens.begin(), o.tokens.end());
  const int64_t S = std::min<int64_t>(o.check, minT);
  const int threads = host_threads_per_rank(ranks_in_this_process(R));
  const bool talk = r == 0 && rank0_process();
  const bool graph = o.graph && capturable(b.dispatcher);
  OwnedStream stream;
  cudaStream_t st = stream.st;

  // Inputs of maxT tokens; each T uses a prefix, so the subset (the first S tokens) is the same at
  // every T and its reference is computed once per format.
  DeviceBuffer hidden(size_t(maxT) * H * 2 + 2), logits(size_t(maxT) * E * 2 + 2), out(size_t(maxT) * H * 2 + 2);
  DeviceBuffer ids(size_t(maxT) * K * 4 + 4), wts(size_t(maxT) * K * 4 + 4), y(size_t(R) * maxT * H * 2 + 2);
  harness::cuda::uniform_bf16(hidden.get<bf16_raw>(), size_t(maxT) * H, kActAmax, o.seed * 1000 + r, st);
  harness::cuda::uniform_bf16(logits.get<bf16_raw>(), size_t(maxT) * E, 4.f, o.seed * 1000 + 500 + r, st);
  EPMOE_CUDA_CHECK(cudaStreamSynchronize(st));

  std::vector<double> xs, lg;  // every rank's subset, widened
  if (S > 0) {
    std::vector<bf16_raw> hx(size_t(S) * H), hl(size_t(S) * E);
    EPMOE_CUDA_CHECK(cudaMemcpy(hx.data(), hidden.get(), hx.size() * 2, cudaMemcpyDeviceToHost));
    EPMOE_CUDA_CHECK(cudaMemcpy(hl.data(), logits.get(), hl.size() * 2, cudaMemcpyDeviceToHost));
    xs = allgather(comm, oracle::widen_bf16(hx.data(), hx.size()));
    lg = allgather(comm, oracle::widen_bf16(hl.data(), hl.size()));
  }

  for (ActFormat f : o.formats) {
    DeviceWeights dw;
    harness::cuda::rank_weights(format_config(o, f, maxT), o.seed, 0, r, dw, st);
    std::vector<double> ref;
    if (S > 0) {
      if (talk) std::fprintf(stderr, "[bench layer] %s: float64 reference of %lld tokens\n", format_name(f),
                             static_cast<long long>(S * R));
      ref = reference(comm, format_config(o, f, maxT), dw.w, xs, lg, S, threads);
    }
    for (long long T : o.tokens) {
      const MoeConfig cfg = format_config(o, f, T);
      const auto tv = [&](void* p, DType t, int64_t a, int64_t c) {
        return TensorView::of(p, t, {a, c}, DeviceKind::cuda, dev);
      };
      const TensorView hv = tv(hidden.get(), DType::bf16, T, H), lv = tv(logits.get(), DType::bf16, T, E),
                       ov = tv(out.get(), DType::bf16, T, H);
      double layer_us = 0, runner_us = 0, rerun_diff = 0;
      std::vector<double> got(1 + size_t(S) * H, 0.0);
      MoeLayer layer(cfg, comm, dw.w, nullptr);
      for (int i = 0; i < 3; ++i) layer.forward(hv, lv, ov, st);
      EPMOE_CUDA_CHECK(cudaStreamSynchronize(st));
      {
        // The runner alone, on the input a dispatcher of the same configuration delivers, timed in
        // rounds alternating with the layer's.
        const Registry::Pair pair = Registry::global().resolve(cfg);
        std::unique_ptr<Dispatcher> disp = pair.dispatcher->create(cfg, comm);
        std::unique_ptr<Runner> runner = pair.runner->create(cfg, dev);
        cuda::route(cfg.router, lv, nullptr, K, ids.get<int32_t>(), wts.get<float>(), st);
        DispatchInput in;
        in.num_tokens = T;
        in.hidden = hidden.get<bf16_raw>();
        in.topk_ids = ids.get<int32_t>();
        in.topk_weights = wts.get<float>();
        in.stream = st;
        const DispatchOutput d = disp->dispatch(in);
        // With the prepare step MoeLayer runs (e.g. nvfp4 weights in the decode engines' layout),
        // so that both columns time the same engines.
        ExpertWeights w = dw.w;
        runner->prepare(w, st);
        for (int i = 0; i < 2; ++i) runner->run(d, w, y.get<bf16_raw>(), st);
        EPMOE_CUDA_CHECK(cudaStreamSynchronize(st));
        std::tie(layer_us, runner_us) =
            interleaved_us(st, graph, o.reps, [&] { layer.forward(hv, lv, ov, st); },
                           [&] { runner->run(d, w, y.get<bf16_raw>(), st); });
        CombineInput ci;
        ci.y = y.get<bf16_raw>();
        ci.stream = st;
        disp->combine(ci, out.get<bf16_raw>());
        dispatcher_sync(*disp, st);
        comm.check_same(uint64_t(T), "bench layer: runner timing finished on every rank");
      }
      {
        // Two eager forwards on the same input: a layer without races gives the same bytes (a
        // difference points at stream or cross-rank ordering).
        std::vector<bf16_raw> first(size_t(T) * H), again(size_t(T) * H);
        layer.forward(hv, lv, ov, st);
        EPMOE_CUDA_CHECK(cudaMemcpyAsync(first.data(), out.get(), first.size() * 2, cudaMemcpyDeviceToHost, st));
        EPMOE_CUDA_CHECK(cudaStreamSynchronize(st));
        layer.forward(hv, lv, ov, st);
        EPMOE_CUDA_CHECK(cudaMemcpyAsync(again.data(), out.get(), again.size() * 2, cudaMemcpyDeviceToHost, st));
        EPMOE_CUDA_CHECK(cudaStreamSynchronize(st));
        for (int64_t t = 0; t < T; ++t)
          rerun_diff += std::memcmp(&first[size_t(t) * H], &again[size_t(t) * H], size_t(H) * 2) != 0;
        for (size_t i = 0; i < size_t(S) * H; ++i) got[1 + i] = num::bf16_to_f32(first[i]);
        comm.check_same(uint64_t(T), "bench layer: forward finished on every rank");
      }
      const std::vector<double> times = allgather(comm, {layer_us, runner_us, rerun_diff});
      const std::vector<double> outs = S > 0 ? allgather(comm, got) : std::vector<double>{};
      if (!talk) continue;
      double lay = 0, run = 0, differ = 0;
      for (int q = 0; q < R; ++q) {
        lay = std::max(lay, times[3 * q]);
        run = std::max(run, times[3 * q + 1]);
        differ += times[3 * q + 2];
      }
      char acc[64] = "- | -";
      if (S > 0) {
        std::vector<double> g;
        for (int q = 0; q < R; ++q)
          g.insert(g.end(), outs.begin() + size_t(q) * got.size() + 1, outs.begin() + size_t(q + 1) * got.size());
        const oracle::ErrorStats e = oracle::compare(g.data(), ref.data(), g.size());
        std::snprintf(acc, sizeof acc, "%.2e | %.2e%s", e.max_rel, e.one_minus_cos, e.nonfinite ? " (non-finite!)" : "");
        report_bad_tokens(g, ref, S, H, format_name(f), T);
      }
      const std::string rerun = differ == 0 ? "same" : std::to_string(int64_t(differ)) + " tokens differ";
      std::printf("| %s | %s | %lld | %.1f | %.0f | %.1f | %.2fx | %s | %s |\n", b.dispatcher.c_str(), format_name(f), T,
                  lay, lay > 0 ? double(T) / (lay * 1e-6) : 0.0, run, run > 0 ? lay / run : 0.0, acc, rerun.c_str());
      std::fflush(stdout);
    }
  }
}

// ---- decode mode ----------------------------------------------------------------------------------
void decode_rank(Communicator& comm, const Opts& o) {
  const int R = comm.size(), r = comm.rank(), dev = comm.device_index();
  const MoeConfig& b = o.base;
  const int H = b.hidden, E = b.num_experts;
  const int64_t N = o.seqs;
  const int L = o.layers;
  const bool talk = r == 0 && rank0_process();
  const bool graph = o.graph && capturable(b.dispatcher);
  OwnedStream stream;
  cudaStream_t st = stream.st;
  DeviceBuffer h0(size_t(N) * H * 2 + 2), h1(size_t(N) * H * 2 + 2), logits(size_t(L) * N * E * 2 + 2);
  harness::cuda::uniform_bf16(h0.get<bf16_raw>(), size_t(N) * H, kActAmax, o.seed * 1000 + r, st);
  harness::cuda::uniform_bf16(logits.get<bf16_raw>(), size_t(L) * N * E, 4.f, o.seed * 1000 + 500 + r, st);
  for (ActFormat f : o.formats) {
    const MoeConfig cfg = format_config(o, f, N);
    DeviceWeights dw;
    harness::cuda::rank_weights(cfg, o.seed, 0, r, dw, st);
    std::vector<std::unique_ptr<MoeLayer>> layers;
    for (int l = 0; l < L; ++l) layers.push_back(std::make_unique<MoeLayer>(cfg, comm, dw.w, nullptr));
    // Layer l reads one buffer and writes the other; routing comes from per-layer logits.
    const auto step = [&] {
      for (int l = 0; l < L; ++l) {
        bf16_raw* in = (l % 2 ? h1 : h0).get<bf16_raw>();
        bf16_raw* outp = (l % 2 ? h0 : h1).get<bf16_raw>();
        layers[l]->forward(TensorView::of(in, DType::bf16, {N, H}, DeviceKind::cuda, dev),
                           TensorView::of(logits.get<bf16_raw>() + size_t(l) * N * E, DType::bf16, {N, E},
                                          DeviceKind::cuda, dev),
                           TensorView::of(outp, DType::bf16, {N, H}, DeviceKind::cuda, dev), st);
      }
    };
    for (int i = 0; i < 2; ++i) step();
    EPMOE_CUDA_CHECK(cudaStreamSynchronize(st));
    const double us = time_us(st, graph, o.reps, step);
    comm.check_same(uint64_t(f), "bench layer --decode: steps finished on every rank");
    layers.clear();
    const std::vector<double> times = allgather(comm, {us});
    if (!talk) continue;
    double step_us = 0;
    for (double t : times) step_us = std::max(step_us, t);
    std::printf("| %s | %s | %d | %lld | %.1f | %.1f | %.0f |\n", b.dispatcher.c_str(), format_name(f), L,
                static_cast<long long>(N), step_us / 1e3, step_us / L, step_us > 0 ? double(N) / (step_us * 1e-6) : 0.0);
    std::fflush(stdout);
  }
}

int bench_layer(const std::vector<std::string>& args) {
  Flags flags("bench layer");
  flags.add("preset", "NAME", "model shape (default deepseek-v3)");
  flags.add("tokens", "LIST", "tokens per rank (default 128,512,4096,16384; quick 128,4096)");
  flags.add("formats", "LIST", "dispatch formats, weights of the same family (default bf16,fp8,nvfp4)");
  flags.add("reps", "N", "timed repetitions, median reported (default 20, quick 10)");
  flags.add("check-tokens", "N", "tokens per rank compared with float64 (default 64; 0 = none)");
  flags.add("no-graph", "", "time eager calls even where a CUDA graph is possible");
  flags.add("quick", "", "tokens 128,4096 and fewer repetitions");
  flags.add("decode", "", "decode mode: --layers stacked layers, --seqs sequences per rank per step");
  flags.add("layers", "L", "decode: stacked layers (default 8)");
  flags.add("seqs", "N", "decode: concurrent sequences per rank (default 64)");
  flags.add("seed", "N", "random seed (default 1)");
  // Every configuration field the sweep leaves free (--ranks: default every visible GPU, or the
  // mpirun world; --dispatcher: nvlink on several GPUs, local on one), and every tuning option.
  add_config_flags(flags, {"dispatch", "weights", "capacity", "placement", "slots-per-rank", "runner", "nvfp4-global-scale"});
  add_tuning_flags(flags);
  if (wants_help(args)) {
    std::printf("usage: epmoe bench layer [flags]\n\nThe full MoE layer (route, quantize, dispatch, run, combine) on "
                "every GPU (one process, or one per GPU under mpirun),\nnext to the runner alone on the same "
                "dispatched input, with accuracy vs float64 on a token subset.\n\nflags:\n%s",
                flags.help().c_str());
    return 0;
  }
  flags.parse(args);
  Opts o;
  const bool quick = flags.get_bool("quick", false);
  o.decode = flags.get_bool("decode", false);
  o.reps = flags.get_int("reps", quick ? 10 : 20);
  o.check = flags.get_int("check-tokens", 64);
  o.graph = !flags.get_bool("no-graph", false);
  o.layers = flags.get_int("layers", 8);
  o.seqs = flags.get_int("seqs", 64);
  o.seed = uint64_t(flags.get_int("seed", 1));
  if (o.reps < 1) throw UsageError("--reps=" + std::to_string(o.reps) + " must be at least 1");
  if (o.check < 0) throw UsageError("--check-tokens=" + std::to_string(o.check) + " must be 0 or more");
  if (o.layers < 1) throw UsageError("--layers=" + std::to_string(o.layers) + " must be at least 1");
  if (o.seqs < 1) throw UsageError("--seqs=" + std::to_string(o.seqs) + " must be at least 1");
  o.tokens = quick ? std::vector<long long>{128, 4096} : std::vector<long long>{128, 512, 4096, 16384};
  if (flags.has("tokens")) o.tokens = parse_int_list(flags.get("tokens"), "tokens");
  for (long long t : o.tokens)
    if (t < 0 || t > (1 << 30)) throw UsageError("--tokens: " + std::to_string(t) + " is not a token count");
  o.formats = parse_act_formats(flags.has("formats") ? flags.get("formats") : "bf16,fp8,nvfp4", "formats");
  o.preset = flags.has("preset") ? flags.get("preset") : "deepseek-v3";

  MoeConfig& b = o.base;
  b = preset(o.preset).config;
  b.num_ranks = default_gpu_ranks();
  b.dispatcher.clear();
  b.runner = "cuda";
  apply_config_flags(flags, b);
  b.placement.reset();
  const int R = b.num_ranks;
  if (R < 1) throw UsageError("bench layer needs a CUDA GPU and this machine shows none (--ranks=" + std::to_string(R) + ")");
  if (b.dispatcher.empty()) b.dispatcher = R == 1 ? "local" : "nvlink";
  if ((R == 1) != (b.dispatcher == "local"))
    throw UsageError("--dispatcher=" + b.dispatcher + " with " + std::to_string(R) + " rank" + (R == 1 ? "" : "s") +
                     ": one GPU runs dispatcher local, several run nvlink or nccl");
  // Every configuration is checked here, the same way on every rank, before any collective.
  const int64_t maxT = o.decode ? o.seqs : *std::max_element(o.tokens.begin(), o.tokens.end());
  for (ActFormat f : o.formats) {
    const MoeConfig c = format_config(o, f, maxT);
    validate_or_throw(c);
    Registry::global().resolve(c);
  }

  if (rank0_process()) {
    cudaDeviceProp prop{};
    EPMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::string nccl;
#if defined(EPMOE_WITH_NCCL)
    if (R > 1) nccl = ", NCCL " + nccl_runtime_version();
#endif
    const std::string grid = b.dispatcher == "nvlink" ? " (grid " + std::to_string(nvlink::comm_grid(
                                                            b.tuning.comm_sms, prop.multiProcessorCount)) + " CTAs)"
                                                      : "";
    std::printf("# epmoe bench layer%s: %d x %s (%s), %s H=%d I=%d E=%d K=%d, dispatcher %s%s + runner cuda, "
                "combine %s, iq %s%s, median of %d%s\n",
                o.decode ? " --decode" : "", R, prop.name,
                under_mpirun() ? "one process per GPU" : (R > 1 ? "one process, a thread per GPU" : "one process"),
                o.preset.c_str(), b.hidden, b.intermediate, b.num_experts, b.top_k, b.dispatcher.c_str(), grid.c_str(),
                format_name(b.combine_format),
                iq_header(o).c_str(), nccl.c_str(), o.reps,
                o.graph && capturable(b.dispatcher) ? " (CUDA graph replays)" : " (eager calls)");
    if (o.decode) {
      std::printf("# %d stacked layers sharing one weight set per format, %d sequences per rank per step; tok/s/GPU "
                  "counts the MoE layers only\n\n| disp | format | layers | seqs/rank | step ms | per layer us | "
                  "out tok/s/GPU |\n|---|---|---|---|---|---|---|\n",
                  o.layers, o.seqs);
    } else {
      std::printf("# layer: MoeLayer::forward (route+quantize+dispatch+run+combine), slowest rank; runner: Runner::run "
                  "alone on the same dispatched input, slowest rank; errors: first %lld tokens of every rank vs "
                  "float64 (stored weights dequantized, activations unquantized); rerun: one more eager forward on the same input "
                  "gives the same bytes on every rank, or how many tokens differ\n\n| disp | format | T/rank | layer "
                  "us | tok/s/GPU | runner us | layer/runner | max rel err | 1-cos | rerun |\n|---|---|---|---|---|---|---|---|---"
                  "|---|\n",
                  static_cast<long long>(std::min<long long>(o.check, *std::min_element(o.tokens.begin(), o.tokens.end()))));
    }
    std::fflush(stdout);
  }
  launch_gpu_ranks(R, 120000, [&](Communicator& comm) { o.decode ? decode_rank(comm, o) : layer_rank(comm, o); });
  if (rank0_process() && !o.decode)
    std::printf("\nTarget: layer/runner <= 1.10x at fp8, 4096 tokens per rank. Weights: random, generated on the "
                "device in their storage format (bf16/fp8/nvfp4 of the dispatch format's family).\n");
  return 0;
}

const BenchRegistrar reg{{"layer", "the full MoE layer on every GPU vs the runner alone, with accuracy (and --decode)",
                          bench_layer}};

}  // namespace
}  // namespace epmoe::cli
#endif  // EPMOE_WITH_CUDA
