// Data faults on the GPU layer (DESIGN.md §7): the device scan counts what the host scan counts on
// the same inputs, without a host synchronization (it works inside a captured CUDA graph, one
// count per replay); raise mode raises eagerly and refuses capture; a bad id in a device tensor is
// counted, treated as -1, and reported by the local dispatcher at its next call.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "epmoe/comm.h"
#include "epmoe/error.h"
#include "epmoe/layer.h"
#include "epmoe/quant.h"
#include "layer/faults.h"

namespace epmoe::test {
namespace {

constexpr int H = 256, I = 128, E = 16, K = 4, C = 96;

struct Fixture {
  MoeConfig cfg;
  HostMatrix h13, h2;
  Dev<uint8_t> d13, d2;
  std::unique_ptr<Communicator> comm;

  explicit Fixture(FaultCheck mode, std::mt19937& rng) {
    cfg.hidden = H, cfg.intermediate = I, cfg.num_experts = E, cfg.top_k = K, cfg.capacity = C;
    cfg.dispatcher = "local", cfg.runner = "cuda";
    cfg.tuning.fault_check = mode;
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> w13(size_t(E) * 2 * I * H), w2(size_t(E) * H * I);
    for (auto& v : w13) v = nd(rng) / 16.f;
    for (auto& v : w2) v = nd(rng) / 11.f;
    h13 = quantize_matrix(w13.data(), E, 2 * I, H, WeightFormat::bf16);
    h2 = quantize_matrix(w2.data(), E, H, I, WeightFormat::bf16);
    d13 = Dev<uint8_t>(h13.data);
    d2 = Dev<uint8_t>(h2.data);
    comm = make_local_comm(DeviceKind::cuda, 0);
  }
  ExpertWeights weights() const {
    MatrixView a = h13.view(), b = h2.view();
    a.device = b.device = DeviceKind::cuda;
    a.data = d13.get();
    b.data = d2.get();
    return ExpertWeights{E, H, I, a, b};
  }
};

TensorView dev_view(void* p, DType t, int64_t rows, int64_t cols) {
  return TensorView::of(p, t, {rows, cols}, DeviceKind::cuda);
}

TEST(CudaLayerFaults, DeviceCountsEqualHostScanAndGraphReplaysCount) {
  EPMOE_REQUIRE_GPU();
  std::mt19937 rng(7);
  Fixture f(FaultCheck::count, rng);
  MoeLayer layer(f.cfg, *f.comm, f.weights());
  for (int64_t T : {int64_t(1), int64_t(37), int64_t(C)}) {
    auto x = random_bf16(rng, T, H);
    std::vector<float> logits(size_t(T) * E);
    std::normal_distribution<float> nd(0.f, 2.f);
    for (auto& l : logits) l = nd(rng);
    std::uniform_int_distribution<int64_t> tok(0, T - 1);
    for (int n = 0; n < 3; ++n) x[size_t(tok(rng)) * H + rng() % H] = (n & 1) ? 0x7f80 : 0xffc1;
    logits[size_t(tok(rng)) * E + rng() % E] = std::numeric_limits<float>::infinity();
    logits[size_t(tok(rng)) * E + rng() % E] = -1e35f;  // finite: never a fault
    // The host scan's answer; the router's weights are NaN exactly for tokens with a +inf logit
    // (softmax), so nonfinite_weights counts those tokens.
    detail::FaultScan s;
    s.tokens = T, s.hidden = H, s.x = x.data(), s.logits = logits.data(), s.num_experts = E;
    int64_t want[detail::kFaultKinds] = {};
    detail::scan_faults_host(s, want);

    Dev<bf16_raw> dx(x), out(size_t(T) * H);
    Dev<float> dl(logits);
    layer.reset_fault_counts();
    layer.forward(dev_view(dx.get(), DType::bf16, T, H), dev_view(dl.get(), DType::f32, T, E),
                  dev_view(out.get(), DType::bf16, T, H));
    const FaultCounts got = layer.fault_counts();
    EXPECT_EQ(got.nonfinite_hidden, want[detail::kNonfiniteHidden]) << "T=" << T;
    EXPECT_EQ(got.nonfinite_logits, want[detail::kNonfiniteLogits]) << "T=" << T;
    EXPECT_EQ(got.nonfinite_weights, want[detail::kNonfiniteLogits]) << "T=" << T;
    EXPECT_EQ(got.bad_ids, 0);

    // Captured once, replayed three times: the counts grow by three forwards' worth.
    cudaStream_t st;
    EPMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    EPMOE_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    layer.forward(dev_view(dx.get(), DType::bf16, T, H), dev_view(dl.get(), DType::f32, T, E),
                  dev_view(out.get(), DType::bf16, T, H), st);
    EPMOE_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
    EPMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    layer.reset_fault_counts(st);
    for (int r = 0; r < 3; ++r) EPMOE_CUDA_CHECK(cudaGraphLaunch(exec, st));
    const FaultCounts g = layer.fault_counts(st);
    EXPECT_EQ(g.nonfinite_hidden, 3 * want[detail::kNonfiniteHidden]);
    EXPECT_EQ(g.nonfinite_logits, 3 * want[detail::kNonfiniteLogits]);
    EPMOE_CUDA_CHECK(cudaGraphExecDestroy(exec));
    EPMOE_CUDA_CHECK(cudaGraphDestroy(graph));
    EPMOE_CUDA_CHECK(cudaStreamDestroy(st));
  }
}

TEST(CudaLayerFaults, RaiseModeRaisesEagerlyAndRefusesCapture) {
  EPMOE_REQUIRE_GPU();
  std::mt19937 rng(11);
  Fixture f(FaultCheck::raise, rng);
  MoeLayer layer(f.cfg, *f.comm, f.weights());
  const int64_t T = 8;
  auto x = random_bf16(rng, T, H);
  std::vector<float> logits(size_t(T) * E, 0.25f);
  Dev<bf16_raw> dx(x), out(size_t(T) * H);
  Dev<float> dl(logits);
  auto call = [&](Stream st) {
    layer.forward(dev_view(dx.get(), DType::bf16, T, H), dev_view(dl.get(), DType::f32, T, E),
                  dev_view(out.get(), DType::bf16, T, H), st);
  };
  EXPECT_NO_THROW(call(nullptr));
  x[5 * H + 1] = 0x7fc0;
  dx.upload(x);
  try {
    call(nullptr);
    ADD_FAILURE() << "a NaN hidden value did not raise in raise mode";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("1 token with NaN/inf in hidden"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(layer.reset_fault_counts());
  cudaStream_t st;
  EPMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  EPMOE_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  EXPECT_THROW(call(st), UsageError);
  cudaGraph_t graph;
  EPMOE_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
  if (graph) EPMOE_CUDA_CHECK(cudaGraphDestroy(graph));
  EPMOE_CUDA_CHECK(cudaStreamDestroy(st));
}

TEST(CudaLayerFaults, BadDeviceIdIsCountedTreatedAsNoneAndReportedNextCall) {
  EPMOE_REQUIRE_GPU();
  std::mt19937 rng(13);
  Fixture f(FaultCheck::count, rng);
  MoeLayer layer(f.cfg, *f.comm, f.weights());
  const int64_t T = 4;
  auto x = random_bf16(rng, T, H);
  std::vector<int32_t> ids = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  std::vector<float> w(ids.size(), 0.25f);
  Dev<bf16_raw> dx(x), out(size_t(T) * H), ref(size_t(T) * H);
  Dev<int32_t> di(ids);
  Dev<float> dw(w);
  auto call = [&](Dev<bf16_raw>& o) {
    layer.forward_routed(dev_view(dx.get(), DType::bf16, T, H), dev_view(di.get(), DType::i32, T, K),
                         dev_view(dw.get(), DType::f32, T, K), dev_view(o.get(), DType::bf16, T, H));
  };
  ids[2 * K + 1] = -1;  // the reference: token 2's second choice is "none"
  di.upload(ids);
  call(ref);
  ids[2 * K + 1] = E + 3;  // out of range inside a device tensor
  di.upload(ids);
  call(out);
  EXPECT_EQ(layer.fault_counts().bad_ids, 1);
  EXPECT_EQ(first_diff(out.download(), ref.download()), -1) << "a bad id must act as -1";
  ids[2 * K + 1] = 9;
  di.upload(ids);
  EXPECT_THROW(call(out), UsageError) << "the local dispatcher reports the bad id at its next call";
}

}  // namespace
}  // namespace epmoe::test

namespace epmoe::test {
namespace {

// A tensor labelled with another GPU than the layer's is refused before any work (one GPU is
// enough: the view's label, not its memory, is what the check reads).
TEST(CudaLayerInputs, TensorOnAnotherDeviceIndexIsAUsageError) {
  EPMOE_REQUIRE_GPU();
  std::mt19937 rng(17);
  Fixture f(FaultCheck::count, rng);
  MoeLayer layer(f.cfg, *f.comm, f.weights());
  const int64_t T = 4;
  Dev<bf16_raw> dx(size_t(T) * H), out(size_t(T) * H);
  Dev<float> dl(size_t(T) * E);
  TensorView x = dev_view(dx.get(), DType::bf16, T, H);
  x.device_index = 1;
  try {
    layer.forward(x, dev_view(dl.get(), DType::f32, T, E), dev_view(out.get(), DType::bf16, T, H));
    ADD_FAILURE() << "a tensor on cuda:1 was accepted by a layer on cuda:0";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("hidden is on cuda:1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace epmoe::test
