// The decode wgmma engine's two pipelines (engine_wgmma.cuh: plain, and deferred wait with a fifth
// ring slot) at the grouped-GEMM level: the same arithmetic in the same order, so the outputs must
// be equal bit for bit, for bf16 and fp8 x fp8, fused (GEMM1 + SwiGLU) and plain (GEMM2) GEMMs,
// several m-tiles per expert, partial m-tiles, empty experts, partial n-tiles. Outputs are poisoned
// first, every valid element must be written, and sampled rows are checked against a host
// computation from the same quantized operands, so two identically broken variants cannot pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "epmoe/numeric.h"
#include "epmoe/quant.h"
#include "common/gpu_test_util.h"
#include "run/cuda/engine.h"
#include "run/cuda/runner.h"

namespace epmoe::test {
namespace {

struct Case {
  const char* name;
  bool fp8, fused;
  int rows_w, K;                 // weight matrix [E][rows_w][K]; fused: N = rows_w / 2
  std::vector<int> expert_rows;  // token rows per expert (E = size)
};

float silu_mul(float g, float u) { return (g / (1.0f + std::exp(-g))) * u; }

void run_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE(std::string(c.name) + " seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const int E = int(c.expert_rows.size()), K = c.K, N = c.fused ? c.rows_w / 2 : c.rows_w;
  int total = 0;
  std::vector<cuda::MTile> tiles;
  std::vector<int> row0(E);
  for (int e = 0; e < E; ++e) {
    row0[e] = total;
    for (int m = 0; m < c.expert_rows[e]; m += cuda::kWgmmaBlockM)
      tiles.push_back({e, total + m, std::min(cuda::kWgmmaBlockM, c.expert_rows[e] - m), 0});
    total += c.expert_rows[e];
  }

  // Weights: normal values quantized by the library's own rule (bf16 RNE, or fp8 128x128 tiles).
  std::normal_distribution<float> nd(0.f, 0.05f);
  std::vector<float> wf(size_t(E) * c.rows_w * K);
  for (float& x : wf) x = nd(rng);
  const HostMatrix hw = quantize_matrix(wf.data(), E, c.rows_w, K, c.fp8 ? WeightFormat::fp8 : WeightFormat::bf16);
  Dev<uint8_t> wdata(hw.data), wscales(hw.scales.empty() ? std::vector<uint8_t>(4) : hw.scales);
  MatrixView wv = hw.view();
  wv.device = DeviceKind::cuda;
  wv.data = wdata.get();
  wv.scales = hw.scales.empty() ? nullptr : wscales.get();

  // Activations: bf16 rows, or e4m3 codes (no NaN codes) with transposed power-of-two scales.
  const std::vector<bf16_raw> a16 = random_bf16(rng, std::max(total, 1), K);
  std::vector<uint8_t> a8(size_t(std::max(total, 1)) * K);
  for (uint8_t& b : a8) b = uint8_t(rng() % 0x7E) | uint8_t((rng() & 1) << 7);
  const int kb = K / 128, ld = std::max(total, 1);
  std::vector<float> as(size_t(kb) * ld);
  for (float& s : as) s = std::ldexp(1.f, int(rng() % 9) - 4);
  Dev<bf16_raw> dA(a16);
  Dev<uint8_t> dA8(a8);
  Dev<float> dAs(as);
  Dev<cuda::MTile> dT(tiles.empty() ? std::vector<cuda::MTile>(1) : tiles);
  Dev<int32_t> dNT(std::vector<int32_t>{int32_t(tiles.size())});

  cuda::GemmArgs g;
  g.K = K;
  g.W = wv;
  g.fused = c.fused;
  g.N = N;
  g.tiles = dT.get();
  g.num_tiles = dNT.get();
  g.max_tiles = int(tiles.size());
  if (c.fp8) {
    g.A8 = dA8.get();
    g.a_scales = dAs.get();
    g.a_scales_ld = ld;
  } else {
    g.A = dA.get();
  }

  auto run = [&](bool defer) {
    Dev<bf16_raw> out(size_t(std::max(total, 1)) * N);
    out.poison();
    g.out = out.get();
    g.wgmma_defer = defer;
    if (c.fp8) cuda::launch_grouped_gemm_wgmma_fp8(g, nullptr);
    else cuda::launch_grouped_gemm_wgmma_bf16(g, nullptr);
    EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
    return out.download();
  };
  const std::vector<bf16_raw> plain = run(false), deferred = run(true);

  ASSERT_EQ(plain.size(), deferred.size());
  size_t differ = 0, unwritten = 0;
  for (size_t i = 0; i < size_t(total) * N; ++i) {
    differ += plain[i] != deferred[i];
    unwritten += !std::isfinite(num::bf16_to_f32(plain[i]));
  }
  EXPECT_EQ(differ, 0u) << "deferred pipeline differs from the plain one";
  EXPECT_EQ(unwritten, 0u) << "outputs left poisoned (or non-finite)";

  // Host check of the first row of every expert with rows, from the same quantized operands.
  std::vector<float> wrow(K);
  auto act = [&](int row, int k) {
    return c.fp8 ? num::e4m3_to_f32(a8[size_t(row) * K + k]) * as[size_t(k / 128) * ld + row]
                 : num::bf16_to_f32(a16[size_t(row) * K + k]);
  };
  auto dot = [&](int e, int wr, int row) {
    dequantize_matrix_rows(hw.view(), e, wr, 1, wrow.data());
    double s = 0;
    for (int k = 0; k < K; ++k) s += double(wrow[k]) * act(row, k);
    return s;
  };
  double max_err = 0, max_ref = 0;
  for (int e = 0; e < E; ++e) {
    if (c.expert_rows[e] == 0) continue;
    const int row = row0[e];
    for (int n = 0; n < N; n += 7) {
      const double ref = c.fused ? silu_mul(float(dot(e, n, row)), float(dot(e, N + n, row))) : dot(e, n, row);
      max_err = std::max(max_err, std::fabs(num::bf16_to_f32(plain[size_t(row) * N + n]) - ref));
      max_ref = std::max(max_ref, std::fabs(ref));
    }
  }
  EXPECT_GT(max_ref, 0.0);
  EXPECT_LE(max_err, 2e-2 * max_ref) << "plain pipeline vs host: " << max_err << " of " << max_ref;
}

TEST(WgmmaPipeline, DeferredEqualsPlainBitwise) {
  EPMOE_REQUIRE_GPU();
  uint32_t seed = std::random_device{}();
  const std::vector<Case> cases = {
      // Several m-tiles (33, 70 rows), one row, an empty expert; GEMM1 shape with 8 k-stages (bf16).
      {"bf16 fused", false, true, 512, 1024, {1, 33, 0, 70}},
      // GEMM2: N = 640 = 5 n-tiles, K = 256 (4 stages: tiles end every 4 steps).
      {"bf16 plain", false, false, 640, 256, {5, 64, 31, 0}},
      // N not a multiple of 128: a partial last n-tile.
      {"bf16 partial n", false, false, 320, 128, {17, 3}},
      {"fp8 fused", true, true, 512, 1024, {40, 1, 32}},
      {"fp8 plain", true, false, 384, 512, {65, 7, 0}},
      // DeepSeek-V3's GEMM1 K (56 fp8 stages, 112 bf16 stages) with few rows.
      {"bf16 fused K=7168", false, true, 256, 7168, {3, 40}},
      {"fp8 fused K=7168", true, true, 256, 7168, {3, 40}},
  };
  for (const Case& c : cases) run_case(c, seed++);
}

TEST(WgmmaPipeline, SetterOverridesTheDefault) {
  // The pipeline is a launch argument (no process state): deferred by default, as
  // Tuning::wgmma_defer; the runner passes tuning.wgmma_defer and set_wgmma_defer overrides it.
  EXPECT_TRUE(cuda::GemmArgs{}.wgmma_defer);
  EXPECT_TRUE(Tuning{}.wgmma_defer);
  for (const bool on : {false, true}) {
    MoeConfig cfg;
    cfg.tuning.wgmma_defer = on;
    cuda::CudaRunner r(cfg, 0);
    EXPECT_EQ(r.wgmma_defer(), on);
    r.set_wgmma_defer(true);
    EXPECT_TRUE(r.wgmma_defer());
    r.set_wgmma_defer(false);
    EXPECT_FALSE(r.wgmma_defer());
  }
}

}  // namespace
}  // namespace epmoe::test
