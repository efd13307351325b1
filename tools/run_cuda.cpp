// The GPU driver of `epmoe run` (CUDA builds only): the same stack and table as the CPU path, on
// one GPU with dispatcher "local" and runner "cuda". Weights and activations live on the device;
// router logits are computed on the host from the (downloaded) hidden state, so the float64
// comparison can reuse the routing decisions exactly as on the CPU (route_cpu and the CUDA router
// give the same ids and bitwise-equal weights by design).
#if defined(EPMOE_WITH_CUDA)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"
#include "epmoe/comm.h"
#include "epmoe/error.h"
#include "epmoe/layer.h"
#include "epmoe/numeric.h"
#include "epmoe/registry.h"
#include "epmoe/router.h"
#include "layer/model.h"
#include "device_arena.h"
#include "setup.h"

namespace epmoe::cli {
namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw BackendError(std::string("epmoe run (cuda): ") + what + ": " + cudaGetErrorString(e));
}

MatrixView upload(DeviceArena& a, const HostMatrix& m) {
  MatrixView v = m.view();
  v.data = a.put(m.data.data(), m.data.size());
  v.scales = m.scales.empty() ? nullptr : a.put(m.scales.data(), m.scales.size());
  v.global_scale = m.global_scale.empty() ? nullptr
                                          : static_cast<const float*>(a.put(m.global_scale.data(), m.global_scale.size() * 4));
  v.device = DeviceKind::cuda;
  return v;
}

// One stack on GPU 0; prints one table row.
void run_row(const RunSetup& s, ActFormat act, WeightFormat wf) {
  MoeConfig c = s.cfg;
  c.dispatch_format = act;
  c.weight_format = wf;
  if (c.num_ranks != 1)
    throw UsageError("--ranks=" + std::to_string(c.num_ranks) + ": the GPU driver of epmoe run uses one GPU; use --ranks 1");
  const int H = c.hidden, E = c.num_experts, K = c.top_k;
  const int64_t T = s.tokens.at(0);
  const std::string tag = std::string("dispatch=") + format_name(act) + " weights=" + format_name(wf);
  std::fprintf(stderr, "[epmoe run] %s: building %d layers\n", tag.c_str(), s.layers);
  const Model model(c, s.layers, s.seed);
  auto comm = make_local_comm(DeviceKind::cuda, 0);

  std::vector<bf16_raw> h = random_hidden(T, H, s.seed * 7919 + 17);
  std::vector<double> ref = oracle::widen_bf16(h.data(), h.size());
  std::vector<float> logits(size_t(T) * E), w(size_t(T) * K);
  std::vector<int32_t> ids(size_t(T) * K);
  std::vector<bf16_raw> out(size_t(T) * H);
  bf16_raw *h_dev = nullptr, *out_dev = nullptr;
  float* logits_dev = nullptr;
  ck(cudaMalloc(&h_dev, std::max<size_t>(h.size() * 2, 2)), "cudaMalloc hidden");
  ck(cudaMalloc(&out_dev, std::max<size_t>(out.size() * 2, 2)), "cudaMalloc out");
  ck(cudaMalloc(&logits_dev, std::max<size_t>(logits.size() * 4, 4)), "cudaMalloc logits");
  struct Free {
    void* p[3];
    ~Free() {
      for (void* q : p) cudaFree(q);
    }
  } freer{{h_dev, out_dev, logits_dev}};

  double seconds = 0;
  for (int l = 0; l < model.num_layers(); ++l) {
    const ModelLayer& L = model.layer(l);
    MoeConfig cl = c;
    if (act == ActFormat::nvfp4) cl.nvfp4_global_scale = T ? nvfp4_global_scale_bf16(h.data(), h.size()) : 1.f;
    DeviceArena arena;
    const ExpertWeights ew{L.rank_w13[0].experts, H, c.intermediate, upload(arena, L.rank_w13[0]),
                           upload(arena, L.rank_w2[0])};
    const auto* bias_dev = static_cast<const float*>(arena.put(L.bias.data(), L.bias.size() * 4));
    MoeLayer layer(cl, *comm, ew, bias_dev);

    model.router_logits(l, h.data(), T, logits.data());
    route_cpu(cl.router, TensorView::of(logits.data(), DType::f32, {T, E}), L.bias.data(), K, ids.data(), w.data());
    ck(cudaMemcpy(h_dev, h.data(), h.size() * 2, cudaMemcpyHostToDevice), "upload hidden");
    ck(cudaMemcpy(logits_dev, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice), "upload logits");
    const auto dv = [](void* p, DType t, int64_t a, int64_t b) { return TensorView::of(p, t, {a, b}, DeviceKind::cuda, 0); };
    layer.forward(dv(h_dev, DType::bf16, T, H), dv(logits_dev, DType::f32, T, E), dv(out_dev, DType::bf16, T, H));
    ck(cudaDeviceSynchronize(), "warm-up forward");
    const auto t0 = std::chrono::steady_clock::now();
    layer.forward(dv(h_dev, DType::bf16, T, H), dv(logits_dev, DType::f32, T, E), dv(out_dev, DType::bf16, T, H));
    ck(cudaDeviceSynchronize(), "forward");
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ck(cudaMemcpy(out.data(), out_dev, out.size() * 2, cudaMemcpyDeviceToHost), "download out");
    for (size_t i = 0; i < out.size(); ++i) h[i] = num::f32_to_bf16(num::bf16_to_f32(h[i]) + num::bf16_to_f32(out[i]));

    const auto dense = oracle::DenseExperts::from_fp32(L.w13.data(), L.w2.data(), E, H, c.intermediate);
    std::vector<double> moe(size_t(T) * H);
    oracle::moe_forward(dense, ref.data(), T, ids.data(), w.data(), K, moe.data());
    for (size_t i = 0; i < moe.size(); ++i) ref[i] += moe[i];
    std::fprintf(stderr, "[epmoe run] %s: layer %d/%d done\n", tag.c_str(), l + 1, model.num_layers());
  }
  const auto err = oracle::compare_bf16(h.data(), ref.data(), ref.size());
  std::printf("%-9s %-8s %-8s %7lld %12.3e %12.3e %12.3e %10.3f\n", format_name(act), format_name(wf),
              format_name(c.combine_format), static_cast<long long>(T), err.max_abs, err.max_rel, err.one_minus_cos,
              seconds * 1e3);
  std::fflush(stdout);
}

int run_cuda(const RunSetup& s) {
  std::printf("epmoe run (GPU 0): preset %s, H=%d I=%d E=%d K=%d, %d layers, dispatcher %s, runner %s, %lld tokens\n\n",
              s.preset.c_str(), s.cfg.hidden, s.cfg.intermediate, s.cfg.num_experts, s.cfg.top_k, s.layers,
              s.cfg.dispatcher.c_str(), s.cfg.runner.c_str(), static_cast<long long>(s.tokens.at(0)));
  std::printf("%-9s %-8s %-8s %7s %12s %12s %12s %10s\n", "dispatch", "weights", "combine", "tokens", "max_abs_err",
              "max_rel_err", "1-cosine", "time_ms");
  std::fflush(stdout);  // before the progress lines on stderr
  std::vector<std::pair<ActFormat, WeightFormat>> rows;
  if (s.dispatch_given) rows.push_back({s.cfg.dispatch_format, s.weights_given ? s.cfg.weight_format : weight_family(s.cfg.dispatch_format)});
  else
    for (ActFormat f : {ActFormat::bf16, ActFormat::fp8, ActFormat::nvfp4})
      rows.push_back({f, s.weights_given ? s.cfg.weight_format : weight_family(f)});
  int failed = 0;
  for (const auto& [a, wf] : rows) {
    try {
      run_row(s, a, wf);
    } catch (const UsageError& e) {
      std::printf("%-9s %-8s  skipped: %s\n", format_name(a), format_name(wf), e.what());
      ++failed;
    }
  }
  return failed == int(rows.size()) ? 2 : 0;
}

bool gpu_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return false;
  return Registry::global().find_runner("cuda") != nullptr;
}

const CudaRunRegistrar reg{CudaRunHook{gpu_available, run_cuda}};

}  // namespace
}  // namespace epmoe::cli
#endif  // EPMOE_WITH_CUDA
