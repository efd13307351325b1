// The device generator against the host one: the same fp32 values (uniform_bf16 as bf16) and the
// same quantized bytes as rank_weights() / quantize_matrix for every weight format, on shapes with
// partial fp8 tiles and with a slot no expert occupies.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "common/gpu_test_util.h"
#include "epmoe/placement.h"
#include "harness/cuda/synthetic.h"
#include "harness/synthetic.h"

namespace epmoe {
namespace {

std::vector<uint8_t> download(const void* p, size_t n) {
  std::vector<uint8_t> h(n);
  if (n) EPMOE_CUDA_CHECK(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost));
  return h;
}

void expect_same(const HostMatrix& host, const MatrixView& dev, const char* what) {
  ASSERT_EQ(dev.experts, host.experts) << what;
  ASSERT_EQ(dev.rows, host.rows) << what;
  ASSERT_EQ(dev.cols, host.cols) << what;
  EXPECT_EQ(download(dev.data, host.data.size()), host.data) << what << ": data";
  EXPECT_EQ(download(dev.scales, host.scales.size()), host.scales) << what << ": scales";
  if (!host.global_scale.empty()) {
    std::vector<float> g(host.global_scale.size());
    EPMOE_CUDA_CHECK(cudaMemcpy(g.data(), dev.global_scale, g.size() * 4, cudaMemcpyDeviceToHost));
    for (size_t e = 0; e < g.size(); ++e)
      EXPECT_EQ(num::f32_bits(g[e]), num::f32_bits(host.global_scale[e])) << what << ": global scale " << e;
  }
}

MoeConfig config(WeightFormat f) {
  MoeConfig c;
  c.hidden = 320;        // fp8: 2 full column tiles and one of 64 in w13, rows of w2 likewise
  c.intermediate = 144;  // fp8: w13 rows 288 (2 + 32), w2 cols 144 (1 + 16)
  c.num_experts = 4;
  c.top_k = 2;
  c.num_ranks = 2;
  c.weight_format = f;
  return c;
}

TEST(SyntheticCuda, UniformBf16MatchesHost) {
  EPMOE_REQUIRE_GPU();
  const size_t n = 100003;
  test::Dev<bf16_raw> d(n);
  harness::cuda::uniform_bf16(d.get(), n, 1.7320508f, 11, nullptr);
  EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(d.download(), harness::uniform_bf16(n, 1.7320508f, 11));
}

class SyntheticCudaFormats : public ::testing::TestWithParam<WeightFormat> {};

TEST_P(SyntheticCudaFormats, RankWeightsMatchHostBitwise) {
  EPMOE_REQUIRE_GPU();
  const MoeConfig c = config(GetParam());
  for (int layer : {0, 3})
    for (int rank = 0; rank < c.num_ranks; ++rank) {
      SCOPED_TRACE("layer " + std::to_string(layer) + " rank " + std::to_string(rank));
      const harness::RankWeights host = harness::rank_weights(c, 5, layer, rank);
      harness::cuda::DeviceRankWeights dev;
      harness::cuda::rank_weights(c, 5, layer, rank, dev, nullptr);
      EXPECT_EQ(dev.w.w13.device, DeviceKind::cuda);
      expect_same(host.w13, dev.w.w13, "w13");
      expect_same(host.w2, dev.w.w2, "w2");
    }
}

TEST_P(SyntheticCudaFormats, EmptySlotsMatchHostBitwise) {
  EPMOE_REQUIRE_GPU();
  MoeConfig c = config(GetParam());
  // Rank 0 holds experts 0 and 2 in slots 0 and 2; slot 1 is empty; rank 1 holds 1 and 3.
  c.placement = ExpertPlacement::explicit_map(2, 3, {{{0, 0}}, {{1, 0}}, {{0, 2}}, {{1, 1}}});
  for (int rank = 0; rank < 2; ++rank) {
    const harness::RankWeights host = harness::rank_weights(c, 9, 1, rank);
    harness::cuda::DeviceRankWeights dev;
    harness::cuda::rank_weights(c, 9, 1, rank, dev, nullptr);
    expect_same(host.w13, dev.w.w13, "w13");
    expect_same(host.w2, dev.w.w2, "w2");
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, SyntheticCudaFormats,
                         ::testing::Values(WeightFormat::bf16, WeightFormat::fp8, WeightFormat::nvfp4),
                         [](const auto& i) { return std::string(format_name(i.param)); });

}  // namespace
}  // namespace epmoe
