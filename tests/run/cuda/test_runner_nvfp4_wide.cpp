// The wide nvfp4 engine (engine_wgmma_nvfp4_wide.cu): past one 32-row m-tile per expert, prepared
// nvfp4 weights run on it by default (policy::use_nvfp4_wide). With either token-tile height (128,
// 160) and with the height chosen per expert (tuning.nvfp4_wide_rows = 0: two tile tables, two
// launches per GEMM) it must give the same bits as the 32-row prepared decode engine
// on the same call (the same decode, K order and k16 steps), match
// the CPU reference within the runner's bound, and leave invalid slots alone, on DeepSeek-V3,
// Qwen3 and Mixtral expert shapes, with uneven and empty experts, every partial-tile width (1-31,
// 33-63 rows in an expert's last tile) and T = 0 and 1; gpt-oss (K % 128 == 64: a last half stage,
// an odd number of weight tiles per GEMM) too.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/gpu_test_util.h"
#include "epmoe/quant.h"
#include "run/cuda/engine.h"
#include "run/cuda/engine_cutlass.h"
#include "run/cuda/policy.h"
#include "run/cuda/runner.h"
#include "run/cuda/runner_test_util.h"
#include "run/reference.h"

namespace epmoe::test {
namespace {

struct Problem {
  int H, I, E, K, C;
  ActFormat act;
  WeightFormat wf = WeightFormat::nvfp4;
  IntermediateQuant iq = IntermediateQuant::none;
  int64_t T = -1;  // tokens (-1 = C)
  const char* name = "";
};

// Token t picks K distinct experts with probability ~ (e + 1)^2 (uneven loads), never the last
// expert where E > K + 1 (an empty group); 5% of the entries are -1.
std::vector<int32_t> uneven_ids(std::mt19937& rng, int64_t T, int E, int K) {
  std::vector<int32_t> ids(size_t(T) * K);
  std::vector<double> wts(E);
  for (int e = 0; e < E; ++e) wts[e] = e == E - 1 && E > K + 1 ? 0.0 : double(e + 1) * (e + 1);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> w = wts;
    for (int k = 0; k < K; ++k) {
      std::discrete_distribution<int> pick(w.begin(), w.end());
      const int e = pick(rng);
      w[e] = 0.0;
      ids[t * K + k] = u(rng) < 0.05f ? -1 : e;
    }
  }
  return ids;
}

// Runs one call four times on prepared weights: the 32-row decode engine everywhere
// (decode_max_rows huge), then with decode_max_rows = wide_limit (0: the default choice, the wide
// engine when the rows per expert pass one m-tile) at both token-tile heights and by rows, then
// checks each against the reference and the decode engine's bits.
void compare_engines(const char* name, const MoeConfig& cfg, const TestWeights& wt, const std::vector<bf16_raw>& x,
                     int64_t T, const std::vector<int32_t>& ids, const std::vector<float>& tw, int wide_limit,
                     bool expect_wide) {
  const int H = cfg.hidden, C = cfg.capacity;
  const detail::HostRecvBuffers recv = local_receive(cfg, x, T, ids, tw);
  const int n = recv.counts[0];
  std::vector<bf16_raw> y_ref(size_t(C) * H, 0);
  detail::ReferenceRunner ref(cfg);
  ref.run(recv.view(cfg.quant_params()), wt.on_host, y_ref.data(), nullptr);
  DevDispatch dd(recv, cfg.quant_params());

  constexpr int kRuns = 4;
  const int heights[kRuns] = {0, cuda::kWgmmaWideBlockM, cuda::kWgmmaWide160BlockM, 0};
  std::vector<bf16_raw> out[kRuns];
  std::string engines[kRuns];
  int bms[kRuns] = {};
  for (int wide = 0; wide < kRuns; ++wide) {
    MoeConfig c = cfg;
    c.tuning.decode_max_rows = wide ? wide_limit : 65536;
    // Without the paired copies, so that the wide engine keeps its own bound (kNvfp4WideMaxRows);
    // with them CUTLASS takes over above 128 rows (test_runner_mixed.cu covers that path).
    c.tuning.nvfp4_mixed = false;
    c.tuning.nvfp4_wide_rows = heights[wide];
    cuda::CudaRunner runner(c, 0);
    ExpertWeights w = wt.on_device;
    runner.prepare(w, nullptr);
    Dev<bf16_raw> y(size_t(C) * H);
    y.poison();
    runner.run(dd.view, w, y.get(), nullptr);
    EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
    out[wide] = y.download();
    engines[wide] = runner.last_engines();
    bms[wide] = runner.last_block_m();
    const Diff d = compare_rows(out[wide], y_ref, n, H);
    std::printf("[nvfp4 wide] %-18s T=%-5lld %-28s bm %4d  max|a-b|/max|ref| %.3e  1-cos %.3e\n", name,
                static_cast<long long>(T), engines[wide].c_str(), runner.last_block_m(), d.rel(), d.one_minus_cos);
    if (n > 0) expect_within_bound(d, c.effective_intermediate_quant());
    expect_poison_after(out[wide], n, H);
  }
  for (int v = 1; v < kRuns; ++v) EXPECT_EQ(engines[v] == "wgmma-nvfp4w/wgmma-nvfp4w", expect_wide) << engines[v];
  if (expect_wide) {
    EXPECT_EQ(engines[0], "wgmma-nvfp4p/wgmma-nvfp4p");
    EXPECT_EQ(bms[1], cuda::kWgmmaWideBlockM);
    EXPECT_EQ(bms[2], cuda::kWgmmaWide160BlockM);
    EXPECT_EQ(bms[3], cuda::policy::kByRows);
  }
  for (int v = 1; v < kRuns; ++v) {
    size_t differ = 0;
    for (size_t i = 0; i < size_t(n) * H; ++i) differ += out[0][i] != out[v][i];
    if (engines[0] == "wgmma-nvfp4p/wgmma-nvfp4p")
      EXPECT_EQ(differ, 0u) << "of " << size_t(n) * H << " outputs differ between " << engines[0] << " and "
                            << engines[v] << " (m-tile " << bms[v] << ")";
  }
}

// p with uneven_ids routing and the default engine choice.
void run_problem(const Problem& p, uint32_t seed, bool expect_wide) {
  SCOPED_TRACE(std::string(p.name) + " seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const int64_t T = p.T < 0 ? p.C : p.T;
  const TestWeights wt(rng, p.E, p.H, p.I, p.wf);
  const auto x = random_bf16(rng, T, p.H);
  const std::vector<int32_t> ids = uneven_ids(rng, T, p.E, p.K);
  std::vector<float> tw(ids.size());
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (auto& v : tw) v = u(rng);
  compare_engines(p.name, make_cfg(p), wt, x, T, ids, tw, 0, expect_wide);
}

// The choice itself (host rules, no GPU): past the decode engine's one m-tile and up to
// kNvfp4WideMaxRows on prepared weights with both GEMMs on the nvfp4 decode engine; never when
// CUTLASS is forced, on natural weights, or where a GEMM lacks the decode engine.
TEST(CudaRunnerNvfp4WideRules, WhenTheWideEngineRuns) {
  using cuda::policy::use_nvfp4_wide;
  cuda::policy::DecodeEngines both;
  both.nvfp4_1 = both.nvfp4_2 = true;
  cuda::policy::DecodeEngines one = both;
  one.nvfp4_2 = false;
  const int limit = cuda::policy::decode_max_rows(WeightFormat::nvfp4, both, 0, true);
  EXPECT_EQ(limit, cuda::policy::kDecodeMaxRowsNvfp4Wide);
  EXPECT_EQ(cuda::policy::decode_max_rows(WeightFormat::nvfp4, both, 0, false), cuda::policy::kDecodeMaxRowsNvfp4);
  const RunnerEngine a = RunnerEngine::automatic;
  const double kMax = cuda::policy::kNvfp4WideMaxRows;
  EXPECT_FALSE(use_nvfp4_wide(a, both, true, limit, limit, kMax));  // one 32-row m-tile: decode engine
  EXPECT_TRUE(use_nvfp4_wide(a, both, true, limit + 1, limit, kMax));
  EXPECT_TRUE(use_nvfp4_wide(a, both, true, cuda::policy::kNvfp4WideMaxRows, limit, kMax));
  EXPECT_FALSE(use_nvfp4_wide(a, both, true, cuda::policy::kNvfp4WideMaxRows + 1, limit, kMax));  // widened CUTLASS
  EXPECT_TRUE(use_nvfp4_wide(RunnerEngine::mma, both, true, 100, limit, kMax));
  EXPECT_FALSE(use_nvfp4_wide(RunnerEngine::cutlass, both, true, 100, limit, kMax));
  EXPECT_FALSE(use_nvfp4_wide(a, both, false, 100, limit, kMax));
  EXPECT_FALSE(use_nvfp4_wide(a, one, true, 100, limit, kMax));
  // Small experts hand over to widened CUTLASS sooner (Qwen3-30B-A3B); the model presets' shapes.
  using cuda::policy::nvfp4_wide_max_rows;
  EXPECT_EQ(nvfp4_wide_max_rows(2048, 768), cuda::policy::kNvfp4WideMaxRowsSmall);     // Qwen3-30B-A3B
  EXPECT_EQ(nvfp4_wide_max_rows(4096, 1536), cuda::policy::kNvfp4WideMaxRows);         // Qwen3-235B-A22B
  EXPECT_EQ(nvfp4_wide_max_rows(2880, 2880), cuda::policy::kNvfp4WideMaxRows);         // gpt-oss-120b
  EXPECT_EQ(nvfp4_wide_max_rows(7168, 2048), cuda::policy::kNvfp4WideMaxRows);         // DeepSeek-V3
  EXPECT_EQ(nvfp4_wide_max_rows(4096, 14336), cuda::policy::kNvfp4WideMaxRows);        // Mixtral-8x7B
  // tuning.nvfp4_wide_max_rows > 0 replaces the bound for any shape (re-measuring the crossover).
  EXPECT_EQ(nvfp4_wide_max_rows(2048, 768, 1000), 1000.0);
  EXPECT_EQ(nvfp4_wide_max_rows(7168, 2048, 200), 200.0);
  EXPECT_EQ(nvfp4_wide_max_rows(7168, 2048, 0), cuda::policy::kNvfp4WideMaxRows);
  const double small = cuda::policy::kNvfp4WideMaxRowsSmall;
  EXPECT_TRUE(use_nvfp4_wide(a, both, true, small, limit, small));
  EXPECT_FALSE(use_nvfp4_wide(a, both, true, small + 1, limit, small));
  // Above the wide range CUTLASS takes the call (use_cutlass with the same limit).
  EXPECT_TRUE(cuda::policy::use_cutlass(a, WeightFormat::nvfp4, cuda::policy::kNvfp4WideMaxRows + 1, limit) ||
              !cuda::cutlass_engine::available());
}

// GEMM2's staged epilogue writes 8 output columns per 16-byte store: the launcher refuses an output
// it cannot store that way, naming N, before any CUDA call (host only; the pointers are never read).
TEST(CudaRunnerNvfp4WideRules, GemmTwoOutputMustTakeSixteenByteStores) {
  alignas(16) static uint16_t dummy[64];
  const float gs = 1.f;
  cuda::GemmArgs a;
  a.A = reinterpret_cast<const bf16_raw*>(dummy);
  a.W.prepared = dummy;
  a.W.global_scale = &gs;
  a.fused = false;
  a.N = 7168;
  a.out = reinterpret_cast<bf16_raw*>(dummy) + 1;  // 2-byte aligned only
  try {
    cuda::launch_grouped_gemm_wgmma_nvfp4_wide(a, cuda::kWgmmaWideBlockM, nullptr);
    FAIL() << "a misaligned GEMM2 output was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("16-byte aligned"), std::string::npos) << e.what();
  }
  a.out = reinterpret_cast<bf16_raw*>(dummy);
  a.N = 7164;  // not a multiple of 8
  try {
    cuda::launch_grouped_gemm_wgmma_nvfp4_wide(a, cuda::kWgmmaWideBlockM, nullptr);
    FAIL() << "N = 7164 was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("N = 7164"), std::string::npos) << e.what();
  }
}

TEST(CudaRunnerNvfp4Wide, EqualsDecodeEngineAndReference) {
  EPMOE_REQUIRE_GPU();
  using A = ActFormat;
  const std::vector<Problem> problems = {
      // 50-150 rows per expert on average, 0 to ~2x that by expert: many partial last tiles.
      {7168, 2048, 6, 4, 100, A::bf16, WeightFormat::nvfp4, IntermediateQuant::none, -1, "deepseek-v3"},
      {2048, 768, 16, 8, 300, A::nvfp4, WeightFormat::nvfp4, IntermediateQuant::none, -1, "qwen3-30b nvfp4-act"},
      {2048, 768, 16, 8, 300, A::bf16, WeightFormat::nvfp4, IntermediateQuant::fp8, -1, "qwen3-30b iq=fp8"},
      {4096, 14336, 2, 1, 100, A::fp8, WeightFormat::nvfp4, IntermediateQuant::none, -1, "mixtral"},
      // H = I = 2880: K % 128 == 64 in both GEMMs, 45 fused and 23 GEMM2 weight tiles (odd).
      {2880, 2880, 4, 2, 100, A::bf16, WeightFormat::nvfp4, IntermediateQuant::none, -1, "gpt-oss"},
  };
  uint32_t seed = 11;
  for (const Problem& p : problems) run_problem(p, seed++, true);
}

TEST(CudaRunnerNvfp4Wide, EveryPartialTileWidth) {
  EPMOE_REQUIRE_GPU();
  // Expert 0 gets rows0 rows (around each boundary of the 32 / 64 / 96 / 128 / 160 token-tile
  // widths, one and two tiles of either height; by rows, 129-160 and 300 rows take the 160-row
  // table, the others the 128-row one), experts 1-3 get 40 each.
  const int H = 256, I = 128, E = 4, K = 1;
  for (const int rows0 : {33, 63, 64, 65, 95, 97, 127, 128, 129, 159, 160, 161, 193, 300, 321}) {
    const int C = rows0 + 3 * 40;
    Problem p{H, I, E, K, C, ActFormat::bf16};
    p.name = "widths";
    SCOPED_TRACE("expert 0 rows " + std::to_string(rows0));
    std::mt19937 rng{static_cast<uint32_t>(rows0)};
    const TestWeights wt(rng, E, H, I, p.wf);
    const auto x = random_bf16(rng, C, H);
    std::vector<int32_t> ids(C);
    for (int t = 0; t < C; ++t) ids[t] = t < rows0 ? 0 : 1 + (t - rows0) % 3;
    const std::vector<float> tw(C, 0.75f);
    compare_engines(p.name, make_cfg(p), wt, x, C, ids, tw, 1, true);
  }
}

TEST(CudaRunnerNvfp4Wide, TinyBatches) {
  EPMOE_REQUIRE_GPU();
  using A = ActFormat;
  uint32_t seed = 41;
  // T = 0 and T = 1 (capacity 64: 32 expected rows per expert, so the decode engine runs): nothing
  // is written past the valid rows.
  for (const int64_t T : {int64_t(0), int64_t(1)}) {
    Problem p{2048, 768, 16, 8, 64, A::bf16};
    p.T = T;
    p.name = T == 0 ? "T=0" : "T=1";
    run_problem(p, seed++, false);
  }
}

}  // namespace
}  // namespace epmoe::test
