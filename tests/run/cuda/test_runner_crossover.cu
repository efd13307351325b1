// Runner "cuda"'s engine crossover under tuning.decode_max_rows (policy::decode_max_rows): the
// decode engines (m-tile 32) up to that many expected rows per expert, CUTLASS above, for every
// weight format, and the decode engines against the CPU reference with several m-tiles per expert.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "common/gpu_test_util.h"
#include "epmoe/quant.h"
#include "run/cuda/engine_cutlass.h"
#include "run/cuda/runner.h"
#include "run/cuda/runner_test_util.h"
#include "run/reference.h"

namespace epmoe::test {
namespace {

struct Shape {
  int H, I, E, K, C;
  ActFormat act;
  WeightFormat wf;
  IntermediateQuant iq;
};

// tuning.decode_max_rows replaces the crossover: decode engines (m-tile 32) up to that many
// expected rows per expert, CUTLASS above, whatever the format; the decode engines then match the
// reference with several m-tiles per expert (nvfp4: 99 rows, where the built-in rule takes mma.sync).
TEST(CutlassEngine, DecodeMaxRowsMovesTheCrossover) {
  EPMOE_REQUIRE_GPU();
  if (!cuda::cutlass_engine::available()) GTEST_SKIP() << "built without CUTLASS";
  struct Case {
    int C;
    WeightFormat wf;
    bool cutlass;
  };
  const int H = 256, I = 128, E = 4, K = 2;
  const std::vector<Case> cases = {
      {66, WeightFormat::bf16, false}, {202, WeightFormat::bf16, true},  // 33 and 101 rows per expert
      {198, WeightFormat::nvfp4, false}, {256, WeightFormat::nvfp4, true}, {198, WeightFormat::fp8, false},
  };
  std::mt19937 rng(9);
  for (const Case& c : cases) {
    const Shape p{H, I, E, K, c.C, ActFormat::bf16, c.wf, IntermediateQuant::none};
    MoeConfig cfg = make_cfg(p);
    cfg.tuning.decode_max_rows = 100;
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> w13(size_t(E) * 2 * I * H), w2(size_t(E) * H * I);
    for (auto& v : w13) v = nd(rng) / 16.f;
    for (auto& v : w2) v = nd(rng) / 11.f;
    const HostMatrix h13 = quantize_matrix(w13.data(), E, 2 * I, H, c.wf);
    const HostMatrix h2 = quantize_matrix(w2.data(), E, H, I, c.wf);
    DevMatrix d13(h13), d2(h2);
    ExpertWeights dw{E, H, I, d13.view, d2.view};
    const ExpertWeights hw{E, H, I, h13.view(), h2.view()};
    // Every slot full, each token on K distinct experts: C*K/E rows per expert.
    const auto x = random_bf16(rng, c.C, H);
    std::vector<int32_t> ids(size_t(c.C) * K);
    std::vector<float> tw(ids.size(), 0.5f);
    for (int t = 0; t < c.C; ++t)
      for (int k = 0; k < K; ++k) ids[size_t(t) * K + k] = (t + k) % E;
    const detail::HostRecvBuffers recv = local_receive(cfg, x, c.C, ids, tw);
    std::vector<bf16_raw> y_ref(size_t(c.C) * H, 0);
    detail::ReferenceRunner ref(cfg);
    ref.run(recv.view(cfg.quant_params()), hw, y_ref.data(), nullptr);
    DevDispatch dd(recv, cfg.quant_params());
    Dev<bf16_raw> y(size_t(c.C) * H);
    cuda::CudaRunner runner(cfg, 0);
    runner.run(dd.view, dw, y.get(), nullptr);
    EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
    const std::string engines = runner.last_engines();
    SCOPED_TRACE("C=" + std::to_string(c.C) + " weights " + format_name(c.wf) + ": " + engines);
    EXPECT_EQ(engines.rfind("cutlass", 0) == 0, c.cutlass);
    if (!c.cutlass) EXPECT_EQ(runner.last_block_m(), 32);
    const Diff d = compare_rows(y.download(), y_ref, c.C, H);
    expect_within_bound(d, cfg.effective_intermediate_quant());
  }
}

}  // namespace
}  // namespace epmoe::test
