// The multi-GPU driver of `epmoe run` (CUDA + NCCL builds): the same stacked layers and accuracy
// table as the CPU path, on every GPU of the job, with dispatcher "nvlink" (or "nccl") and runner
// "cuda", plus tokens/s per GPU. One process drives all local GPUs (a thread per GPU), or, under
// mpirun, each process drives one GPU; the code below is one rank's part either way and only rank 0
// prints.
//
// The model is generated per (layer, expert) from a counter-based hash, so each rank builds only
// its own experts, the float64 reference regenerates just the experts its tokens use, and no
// E x H x I tensor ever sits on one host (qwen3-30b-a3b has 600M expert weights per layer). The
// reference follows the CPU path's rule (layer/model.h): h kept in float64, unquantized master
// weights, and the routing decisions the GPU path made at each layer. It covers the first
// --check-tokens tokens of every rank: float64 over all tokens of a real shape would take minutes.
#if defined(EPMOE_WITH_NCCL)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.h"
#include "comm/launch.h"
#include "epmoe/comm.h"
#include "epmoe/error.h"
#include "epmoe/layer.h"
#include "epmoe/numeric.h"
#include "epmoe/quant.h"
#include "epmoe/registry.h"
#include "epmoe/router.h"
#include "layer/model.h"
#include "run/oracle.h"
#include "device_arena.h"
#include "setup.h"

namespace epmoe::cli {
namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw BackendError(std::string("epmoe run (multi-GPU): ") + what + ": " + cudaGetErrorString(e));
}

// ---- the random model -----------------------------------------------------------------------------
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

enum Which : uint64_t { kW13 = 0, kW2 = 1, kRouter = 2, kBias = 3 };

// Uniform in [-sqrt(3) s, sqrt(3) s) (standard deviation s), element i of matrix `which` of expert
// `e` in layer `l`. The same on every rank and in every process.
void gen_matrix(uint64_t seed, int l, int e, Which which, float stddev, float* out, size_t n) {
  const uint64_t base = mix64(mix64(mix64(seed) ^ uint64_t(l)) ^ (uint64_t(e) << 2 | which));
  const float a = float(std::sqrt(3.0) * stddev) * 0x1p-23f;
  for (size_t i = 0; i < n; ++i) {
    const int64_t u = int64_t(mix64(base + i) >> 40) - (int64_t(1) << 23);  // [-2^23, 2^23)
    out[i] = a * float(u);
  }
}

struct Masters {
  std::vector<float> w13, w2;  // one expert: [2I][H], [H][I]
};
void gen_expert(const MoeConfig& c, uint64_t seed, int l, int e, Masters& m) {
  const int H = c.hidden, I = c.intermediate;
  m.w13.resize(size_t(2) * I * H);
  m.w2.resize(size_t(H) * I);
  gen_matrix(seed, l, e, kW13, float(1.0 / std::sqrt(double(H))), m.w13.data(), m.w13.size());
  gen_matrix(seed, l, e, kW2, float(1.0 / std::sqrt(double(I))), m.w2.data(), m.w2.size());
}

struct Router {
  std::vector<float> w;     // [E][H]
  std::vector<float> bias;  // [E]
};
Router gen_router(const MoeConfig& c, uint64_t seed, int l) {
  Router r;
  r.w.resize(size_t(c.num_experts) * c.hidden);
  gen_matrix(seed, l, 0, kRouter, float(1.0 / std::sqrt(double(c.hidden))), r.w.data(), r.w.size());
  r.bias.assign(c.num_experts, 0.f);
  if (c.router.kind == RouterKind::sigmoid_grouped_topk) gen_matrix(seed, l, 0, kBias, 0.05f, r.bias.data(), r.bias.size());
  return r;
}

// logits [T][E] = router * h, fp32 accumulation in index order (as Model::router_logits).
void router_logits(const Router& rt, const MoeConfig& c, const bf16_raw* h, int64_t T, float* logits, int threads) {
  const int H = c.hidden, E = c.num_experts;
  const int64_t block = 64;
  parallel_for((T + block - 1) / block, threads, [&](int64_t b) {
    std::vector<float> x(H);
    for (int64_t t = b * block; t < std::min(T, (b + 1) * block); ++t) {
      for (int i = 0; i < H; ++i) x[i] = num::bf16_to_f32(h[t * H + i]);
      for (int e = 0; e < E; ++e) {
        const float* w = rt.w.data() + size_t(e) * H;
        float s = 0.f;
        for (int i = 0; i < H; ++i) s += w[i] * x[i];
        logits[t * E + e] = s;
      }
    }
  });
}

// This rank's experts of layer l in cfg.weight_format, on the current device.
ExpertWeights upload_rank_weights(const MoeConfig& c, const ExpertPlacement& pl, int rank, int l, uint64_t seed,
                                  int threads, DeviceArena& arena) {
  const int H = c.hidden, I = c.intermediate, El = pl.slots_per_rank();
  std::vector<int> slot_expert(El, -1);
  for (int e = 0; e < pl.num_experts(); ++e)
    for (const ExpertCopy& cp : pl.copies(e))
      if (cp.rank == rank) slot_expert[cp.slot] = e;
  // Every quantization block lies inside one expert (fp8 tiles, nvfp4 rows and its per-expert
  // global scale), so quantizing expert by expert gives the bytes quantize_matrix gives for all.
  std::vector<HostMatrix> q13(El), q2(El);
  parallel_for(El, threads, [&](int64_t s) {
    Masters m;
    if (slot_expert[s] >= 0) {
      gen_expert(c, seed, l, slot_expert[s], m);
    } else {  // an explicit map may leave a slot empty: zeros, as in Model
      m.w13.assign(size_t(2) * I * H, 0.f);
      m.w2.assign(size_t(H) * I, 0.f);
    }
    q13[s] = quantize_matrix(m.w13.data(), 1, 2 * I, H, c.weight_format);
    q2[s] = quantize_matrix(m.w2.data(), 1, H, I, c.weight_format);
  });
  auto upload = [&](const std::vector<HostMatrix>& q, int rows, int cols) {
    MatrixView v;
    v.format = c.weight_format;
    v.experts = El;
    v.rows = rows;
    v.cols = cols;
    v.device = DeviceKind::cuda;
    const size_t db = q.empty() ? 0 : q[0].data.size(), sb = q.empty() ? 0 : q[0].scales.size();
    auto* d = static_cast<uint8_t*>(arena.alloc(db * El));
    auto* sc = static_cast<uint8_t*>(arena.alloc(sb * El));
    std::vector<float> gs;
    for (int s = 0; s < El; ++s) {
      ck(cudaMemcpy(d + db * s, q[s].data.data(), db, cudaMemcpyHostToDevice), "upload weights");
      if (sb) ck(cudaMemcpy(sc + sb * s, q[s].scales.data(), sb, cudaMemcpyHostToDevice), "upload scales");
      gs.insert(gs.end(), q[s].global_scale.begin(), q[s].global_scale.end());
    }
    v.data = d;
    v.scales = sb ? sc : nullptr;
    v.global_scale = gs.empty() ? nullptr : static_cast<const float*>(arena.put(gs.data(), gs.size() * 4));
    return v;
  };
  ExpertWeights w;
  w.num_local_experts = El;
  w.hidden = H;
  w.intermediate = I;
  w.w13 = upload(q13, 2 * I, H);
  w.w2 = upload(q2, H, I);
  return w;
}

// moe[t] = sum over k (ascending) of w[t][k] * FFN_{ids[t][k]}(x[t]) in float64 with the master
// weights, for S tokens; each used expert is regenerated once.
void moe_f64(const MoeConfig& c, uint64_t seed, int l, const std::vector<double>& x, int64_t S,
             const std::vector<int32_t>& ids, const std::vector<float>& w, int threads, std::vector<double>& moe) {
  const int H = c.hidden, I = c.intermediate, E = c.num_experts, K = c.top_k;
  std::vector<std::vector<int64_t>> pairs(E);  // (t * K + k) per expert
  for (int64_t p = 0; p < S * K; ++p)
    if (ids[p] >= 0) pairs.at(ids[p]).push_back(p);
  std::vector<int> used;
  for (int e = 0; e < E; ++e)
    if (!pairs[e].empty()) used.push_back(e);
  std::vector<double> contrib(size_t(S) * K * H, 0.0);
  parallel_for(int64_t(used.size()), threads, [&](int64_t i) {
    const int e = used[i];
    Masters m;
    gen_expert(c, seed, l, e, m);
    const oracle::DenseExperts dense = oracle::DenseExperts::from_fp32(m.w13.data(), m.w2.data(), 1, H, I);
    const auto& ps = pairs[e];
    const int64_t n = int64_t(ps.size());
    std::vector<double> xg(size_t(n) * H), og(size_t(n) * H);
    std::vector<int32_t> id0(n, 0);
    std::vector<float> wg(n);
    for (int64_t j = 0; j < n; ++j) {
      std::copy_n(x.data() + size_t(ps[j] / K) * H, H, xg.data() + size_t(j) * H);
      wg[j] = w[ps[j]];
    }
    oracle::moe_forward(dense, xg.data(), n, id0.data(), wg.data(), 1, og.data());
    for (int64_t j = 0; j < n; ++j) std::copy_n(og.data() + size_t(j) * H, H, contrib.data() + size_t(ps[j]) * H);
  });
  moe.assign(size_t(S) * H, 0.0);
  for (int64_t t = 0; t < S; ++t)
    for (int k = 0; k < K; ++k)
      for (int i = 0; i < H; ++i) moe[size_t(t) * H + i] += contrib[(size_t(t) * K + k) * H + i];
}

struct Row {
  ActFormat act;
  WeightFormat wf;
};

// One table row: the stack in one format pair, this rank's part. Collective.
void run_row_rank(Communicator& comm, const RunSetup& s, const Row& row) {
  MoeConfig c = s.cfg;
  c.dispatch_format = row.act;
  c.weight_format = row.wf;
  const int R = c.num_ranks, r = comm.rank(), H = c.hidden, E = c.num_experts, K = c.top_k;
  const int dev = comm.device_index();
  const int64_t T = s.tokens.at(r);
  const int64_t check = s.check_tokens;
  const int64_t S = std::min<int64_t>(T, check);
  const int threads = host_threads_per_rank(ranks_in_this_process(R));
  const ExpertPlacement pl = c.resolved_placement();
  const std::string tag = std::string("dispatch=") + format_name(row.act) + " weights=" + format_name(row.wf);
  const bool talk = r == 0 && rank0_process();

  std::vector<bf16_raw> h = random_hidden(T, H, s.seed * 7919 + 17 + uint64_t(r));
  std::vector<double> ref = oracle::widen_bf16(h.data(), size_t(S) * H);
  std::vector<float> logits(size_t(T) * E), sub_w(size_t(S) * K);
  std::vector<int32_t> sub_ids(size_t(S) * K);
  std::vector<bf16_raw> out(size_t(T) * H);
  std::vector<double> layer_ms;

  cudaStream_t st = nullptr;
  ck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaEvent_t ev[2];
  ck(cudaEventCreate(&ev[0]), "cudaEventCreate");
  ck(cudaEventCreate(&ev[1]), "cudaEventCreate");
  struct Free {
    cudaStream_t st;
    cudaEvent_t* ev;
    ~Free() {
      cudaEventDestroy(ev[0]);
      cudaEventDestroy(ev[1]);
      cudaStreamDestroy(st);
    }
  } freer{st, ev};
  DeviceArena io;
  auto* h_dev = static_cast<bf16_raw*>(io.alloc(h.size() * 2));
  auto* out_dev = static_cast<bf16_raw*>(io.alloc(out.size() * 2));
  auto* logits_dev = static_cast<float*>(io.alloc(logits.size() * 4));
  const auto dv = [&](void* p, DType t, int64_t a, int64_t b) {
    return TensorView::of(p, t, {a, b}, DeviceKind::cuda, dev);
  };

  const auto t_start = std::chrono::steady_clock::now();
  for (int l = 0; l < s.layers; ++l) {
    MoeConfig cl = c;
    if (row.act == ActFormat::nvfp4) {
      // gs = 448*6/amax falls with amax: the group's scale is the smallest rank scale.
      const std::vector<double> all =
          allgather(comm, {T ? double(nvfp4_global_scale_bf16(h.data(), h.size())) : 0.0});
      double gs = 0;
      for (double g : all)
        if (g > 0) gs = gs == 0 ? g : std::min(gs, g);
      cl.nvfp4_global_scale = gs > 0 ? float(gs) : 1.f;
    }
    const Router rt = gen_router(c, s.seed, l);
    {
      DeviceArena arena;
      const ExpertWeights ew = upload_rank_weights(cl, pl, r, l, s.seed, threads, arena);
      const auto* bias_dev = static_cast<const float*>(arena.put(rt.bias.data(), rt.bias.size() * 4));
      MoeLayer layer(cl, comm, ew, bias_dev);

      router_logits(rt, c, h.data(), T, logits.data(), threads);
      if (T) {
        ck(cudaMemcpy(h_dev, h.data(), h.size() * 2, cudaMemcpyHostToDevice), "upload hidden");
        ck(cudaMemcpy(logits_dev, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice), "upload logits");
      }
      // A pageable cudaMemcpy may return before its DMA lands, and our stream does not wait for the
      // legacy stream: make weights and inputs resident before the forward reads them.
      ck(cudaDeviceSynchronize(), "uploads");
      const TensorView hv = dv(h_dev, DType::bf16, T, H), lv = dv(logits_dev, DType::f32, T, E),
                       ov = dv(out_dev, DType::bf16, T, H);
      layer.forward(hv, lv, ov, st);  // warm-up: workspaces grow, kernels load
      ck(cudaStreamSynchronize(st), "warm-up forward");
      std::vector<double> ts;
      for (int i = 0; i < 3; ++i) {
        ck(cudaEventRecord(ev[0], st), "cudaEventRecord");
        layer.forward(hv, lv, ov, st);
        ck(cudaEventRecord(ev[1], st), "cudaEventRecord");
        ck(cudaEventSynchronize(ev[1]), "forward");
        float ms = 0;
        ck(cudaEventElapsedTime(&ms, ev[0], ev[1]), "cudaEventElapsedTime");
        ts.push_back(ms);
      }
      layer_ms.push_back(median(ts));
      if (T) ck(cudaMemcpy(out.data(), out_dev, out.size() * 2, cudaMemcpyDeviceToHost), "download out");
      // Every rank is done with this layer's buffers before any rank frees them.
      comm.check_same(uint64_t(l), "epmoe run: layer finished on every rank");
    }
    for (size_t i = 0; i < out.size(); ++i) h[i] = num::f32_to_bf16(num::bf16_to_f32(h[i]) + num::bf16_to_f32(out[i]));

    if (S > 0) {
      route_cpu(cl.router, TensorView::of(logits.data(), DType::f32, {S, E}), rt.bias.data(), K, sub_ids.data(),
                sub_w.data());
      std::vector<double> moe;
      moe_f64(c, s.seed, l, ref, S, sub_ids, sub_w, threads, moe);
      for (size_t i = 0; i < moe.size(); ++i) ref[i] += moe[i];
    }
    if (talk) {
      const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
      std::fprintf(stderr, "[epmoe run] %s: layer %d/%d done (%.1f s)\n", tag.c_str(), l + 1, s.layers, el);
    }
  }

  // Results to rank 0: [S, the S x H values padded to check x H] per rank, and per-layer times.
  std::vector<double> mine_out(1 + size_t(check) * H, 0.0), mine_ref(1 + size_t(check) * H, 0.0);
  mine_out[0] = mine_ref[0] = double(S);
  for (size_t i = 0; i < size_t(S) * H; ++i) {
    mine_out[1 + i] = num::bf16_to_f32(h[i]);
    mine_ref[1 + i] = ref[i];
  }
  const std::vector<double> all_out = allgather(comm, mine_out), all_ref = allgather(comm, mine_ref);
  const std::vector<double> all_ms = allgather(comm, layer_ms);
  if (!talk) return;
  std::vector<double> got, want;
  const size_t stride = mine_out.size();
  for (int q = 0; q < R; ++q) {
    const size_t n = size_t(all_out[q * stride]) * H;
    got.insert(got.end(), all_out.begin() + q * stride + 1, all_out.begin() + q * stride + 1 + n);
    want.insert(want.end(), all_ref.begin() + q * stride + 1, all_ref.begin() + q * stride + 1 + n);
  }
  double total_ms = 0;
  for (int l = 0; l < s.layers; ++l) {
    double m = 0;
    for (int q = 0; q < R; ++q) m = std::max(m, all_ms[size_t(q) * s.layers + l]);
    total_ms += m;
  }
  int64_t tokens = 0;
  for (int64_t t : s.tokens) tokens += t;
  const double tok_s_gpu = total_ms > 0 ? double(tokens) * s.layers / (total_ms * 1e-3) / R : 0.0;
  if (got.empty()) {
    std::printf("%-9s %-8s %-8s %7lld %12s %12s %12s %10.3f %12.0f\n", format_name(row.act), format_name(row.wf),
                format_name(c.combine_format), static_cast<long long>(tokens), "-", "-", "-", total_ms, tok_s_gpu);
  } else {
    const oracle::ErrorStats err = oracle::compare(got.data(), want.data(), got.size());
    std::printf("%-9s %-8s %-8s %7lld %12.3e %12.3e %12.3e %10.3f %12.0f\n", format_name(row.act), format_name(row.wf),
                format_name(c.combine_format), static_cast<long long>(tokens), err.max_abs, err.max_rel,
                err.one_minus_cos, total_ms, tok_s_gpu);
    if (err.nonfinite) std::printf("  (%lld non-finite values left out)\n", static_cast<long long>(err.nonfinite));
  }
  std::fflush(stdout);
}

int run_multi(const RunSetup& s) {
  const MoeConfig& c = s.cfg;
  const int R = c.num_ranks;
  std::vector<Row> rows;
  if (s.dispatch_given) {
    rows.push_back({c.dispatch_format, s.weights_given ? c.weight_format : weight_family(c.dispatch_format)});
  } else {
    for (ActFormat f : {ActFormat::bf16, ActFormat::fp8, ActFormat::nvfp4})
      rows.push_back({f, s.weights_given ? c.weight_format : weight_family(f)});
  }
  const bool talk = rank0_process();
  if (talk) {
    std::printf("epmoe run (%d GPUs, %s): preset %s, H=%d I=%d E=%d K=%d, %d layer%s, dispatcher %s, runner %s, "
                "tokens",
                R, under_mpirun() ? "one process per GPU (mpirun)" : "one process, a thread per GPU", s.preset.c_str(),
                c.hidden, c.intermediate, c.num_experts, c.top_k, s.layers, s.layers == 1 ? "" : "s",
                c.dispatcher.c_str(), c.runner.c_str());
    for (size_t r = 0; r < s.tokens.size(); ++r)
      std::printf("%s%lld", r ? "," : " ", static_cast<long long>(s.tokens[r]));
    std::printf(" (C=%d), seed %llu\n", c.capacity, static_cast<unsigned long long>(s.seed));
    std::printf("errors: final hidden state vs float64 (unquantized weights, same routing) on the first %d tokens "
                "of each rank; time_ms: sum over layers of the slowest rank's forward (median of 3); tok/s/GPU: all "
                "tokens x layers / time / GPUs\n\n",
                s.check_tokens);
    std::printf("%-9s %-8s %-8s %7s %12s %12s %12s %10s %12s\n", "dispatch", "weights", "combine", "tokens",
                "max_abs_err", "max_rel_err", "1-cosine", "time_ms", "tok/s/GPU");
    std::fflush(stdout);
  }
  // Configuration problems are found here, on the host, identically on every rank, so that a bad
  // row is skipped everywhere instead of leaving the other ranks waiting in a collective.
  std::vector<Row> ok;
  int skipped = 0;
  for (const Row& row : rows) {
    MoeConfig rc = c;
    rc.dispatch_format = row.act;
    rc.weight_format = row.wf;
    try {
      validate_or_throw(rc);
      Registry::global().resolve(rc);
      ok.push_back(row);
    } catch (const UsageError& e) {
      if (talk) std::printf("%-9s %-8s  skipped: %s\n", format_name(row.act), format_name(row.wf), e.what());
      ++skipped;
    }
  }
  if (ok.empty()) return 2;
  // Host-side waits get minutes: between collectives a rank builds weights and float64 references,
  // which take seconds and differ between ranks. The kernels' own waits keep cfg.timeout_ms.
  launch_gpu_ranks(R, std::max(c.timeout_ms, 120000), [&](Communicator& comm) {
    for (const Row& row : ok) {
      if (comm.rank() == 0 && rank0_process())
        std::fprintf(stderr, "[epmoe run] dispatch=%s weights=%s: %d layers\n", format_name(row.act),
                     format_name(row.wf), s.layers);
      run_row_rank(comm, s, row);
    }
  });
  return 0;
}

const MultiGpuRunRegistrar reg{MultiGpuRunHook{
    default_gpu_ranks, [] { return under_mpirun() && default_gpu_ranks() > 1; }, run_multi}};

}  // namespace
}  // namespace epmoe::cli
#endif  // EPMOE_WITH_NCCL
