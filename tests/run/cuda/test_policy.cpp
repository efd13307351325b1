// Runner "cuda"'s host-side rules (src/run/cuda/policy.*) and the tuning options that reach them:
// engine names, the swap-AB and per-expert tile rules (row_buckets), the CUTLASS crossover and its
// override, the fused-SwiGLU switch. No GPU needed (the CudaRunner constructor touches none); they
// live with the GPU tests because policy.cpp is built with the CUDA sources.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "epmoe/options.h"
#include "run/cuda/engine_cutlass.h"
#include "run/cuda/policy.h"
#include "run/cuda/runner.h"
#include "run/cuda/runner_test_util.h"

namespace epmoe::test {
namespace {

using Engine = cuda::CudaRunner::Engine;
constexpr const char* kW8Fp8 = "cutlass-bf16(widened fp8)/cutlass-fp8";

// The fields make_cfg reads: a small bf16 problem.
struct Shape {
  int H = 1024, I = 512, E = 8, K = 2, C = 16;
  ActFormat act = ActFormat::bf16;
  WeightFormat wf = WeightFormat::bf16;
  IntermediateQuant iq = IntermediateQuant::none;
};

// What cutlass_plan reads of a call: E local experts of H x I, weights in `wf` (with non-null
// scales where `scales`: the plan only checks that they exist), rows in `act`, top_k 8.
struct PlanInputs {
  DispatchOutput in;
  ExpertWeights w;
  float scale = 1.f;
  PlanInputs(int E, int H, int I, WeightFormat wf, ActFormat act, bool scales) {
    in.num_local_experts = E;
    in.hidden = H;
    in.top_k = 8;
    in.format = act;
    w.num_local_experts = E;
    w.hidden = H;
    w.intermediate = I;
    w.w13 = MatrixView{wf, E, 2 * I, H};
    w.w2 = MatrixView{wf, E, H, I};
    if (scales) w.w13.scales = w.w2.scales = &scale;
  }
  PlanInputs(const PlanInputs&) = delete;  // w points at scale
};

// The engine names of tuning.engine (options.h; the environment reader and the CLI use the same
// parser), and the bound of tuning.widen_scratch_mb: whole MiB, positive, at most 2^24.
TEST(CudaPolicy, EngineNames) {
  RunnerEngine e = RunnerEngine::mma;
  ASSERT_TRUE(parse_engine("auto", e));
  EXPECT_EQ(e, Engine::automatic);
  ASSERT_TRUE(parse_engine("mma", e));
  EXPECT_EQ(e, Engine::mma);
  ASSERT_TRUE(parse_engine("cutlass", e));
  EXPECT_EQ(e, Engine::cutlass);
  EXPECT_FALSE(parse_engine("cublas", e));
  EXPECT_EQ(e, Engine::cutlass) << "a failed parse leaves the value";
  Tuning t;
  t.widen_scratch_mb = 1024;
  EXPECT_TRUE(validate(t).empty());
  const MoeConfig cfg = [] {
    MoeConfig c;
    c.tuning.widen_scratch_mb = 3;
    return c;
  }();
  EXPECT_EQ(cuda::CudaRunner(cfg, 0).widen_scratch_bytes(), size_t(3) << 20);
  for (const int bad : {0, -5, (1 << 24) + 1}) {
    t.widen_scratch_mb = bad;
    const std::vector<ConfigIssue> is = validate(t);
    ASSERT_EQ(is.size(), 1u) << bad;
    EXPECT_EQ(is[0].field, "tuning.widen_scratch_mb");
    EXPECT_NE(is[0].message.find(std::to_string(bad)), std::string::npos) << is[0].message;
  }
}

// The swap-AB rule (policy.h) and the crossover override, on the host: tuning.cutlass_swap auto
// swaps up to kSwapMaxRows expected rows per expert (64-wide token tiles up to kSwapNarrowMaxRows,
// else 128, for widened GEMMs; the others split by rows per expert, row_buckets), 0/1 force it
// off/on, 64/128/192 on with that width; a positive decode limit
// (tuning.decode_max_rows) moves engine auto's CUTLASS crossover to above that many rows. Both reach the runner from the configuration.
TEST(CudaPolicy, SwapAndCrossoverRules) {
  namespace pol = cuda::policy;
  EXPECT_TRUE(pol::use_swap_ab(CutlassSwap::automatic, 1));
  EXPECT_TRUE(pol::use_swap_ab(CutlassSwap::automatic, pol::kSwapMaxRows));
  EXPECT_FALSE(pol::use_swap_ab(CutlassSwap::automatic, pol::kSwapMaxRows + 0.5));
  EXPECT_TRUE(pol::use_swap_ab(CutlassSwap::on, 1e6));
  EXPECT_FALSE(pol::use_swap_ab(CutlassSwap::off, 1));
  EXPECT_EQ(pol::swap_tile_n(CutlassSwap::automatic, pol::kSwapNarrowMaxRows), 64);
  EXPECT_EQ(pol::swap_tile_n(CutlassSwap::automatic, pol::kSwapNarrowMaxRows + 1), 128);
  EXPECT_EQ(pol::swap_tile_n(CutlassSwap::automatic, pol::kSwapMaxRows + 1), 0);
  EXPECT_EQ(pol::swap_tile_n(CutlassSwap::on, 1e6), 128);
  EXPECT_EQ(pol::swap_tile_n(CutlassSwap::on, 3), 64);
  EXPECT_EQ(pol::swap_tile_n(CutlassSwap::n64, 1e6), 64);
  EXPECT_EQ(pol::swap_tile_n(CutlassSwap::n128, 1), 128);
  EXPECT_EQ(pol::swap_tile_n(CutlassSwap::n192, 1), 192);
  // The split by rows (byrows, and automatic for experts of at least kSplitMinWeightBytes up to
  // split_max_rows expected rows): the ranges cover every row count once, in order; bf16 and fp8 tables as
  // documented in policy.h. Smaller or fewer experts under automatic: one launch, swap-AB 128 up
  // to kSwapMaxRows expected rows, unswapped above.
  using RB = pol::RowBucket;
  constexpr int kAll = RB{}.hi;
  auto same = [](const std::vector<RB>& got, const std::vector<RB>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].lo, want[i].lo) << i;
      EXPECT_EQ(got[i].hi, want[i].hi) << i;
      EXPECT_EQ(got[i].tile_n, want[i].tile_n) << i;
      if (i) EXPECT_EQ(got[i].lo, got[i - 1].hi + 1) << i;
    }
  };
  const double big = pol::kSplitMinWeightBytes, small = pol::kSplitMinWeightBytes - 1;
  for (const double rows : {1.0, 64.0, pol::kSwapMaxRows + 1, pol::kSplitMaxRowsFp8, pol::kSplitMaxRowsFp8 + 1,
                            pol::kSplitMaxRowsBf16, 1e5}) {
    for (const auto& [sw, bytes] : {std::pair{CutlassSwap::automatic, big}, std::pair{CutlassSwap::byrows, big},
                                    std::pair{CutlassSwap::byrows, 1.0}}) {
      // Above split_max_rows expected rows (fp8 384, bf16 576) automatic runs one unswapped launch;
      // byrows still splits.
      const bool one8 = sw == CutlassSwap::automatic && rows > pol::split_max_rows(true);
      const bool one16 = sw == CutlassSwap::automatic && rows > pol::split_max_rows(false);
      // Up to kSplitNarrowMaxRows automatic keeps two tiles, bf16 and fp8 alike.
      if (sw == CutlassSwap::automatic && rows <= pol::kSplitNarrowMaxRows) {
        for (const bool fp8 : {false, true})
          same(pol::row_buckets(sw, rows, fp8, bytes), {{0, 64, 64}, {65, kAll, 128}});
        continue;
      }
      if (one16)
        same(pol::row_buckets(sw, rows, false, bytes), {{0, kAll, 0}});
      else
        same(pol::row_buckets(sw, rows, false, bytes), {{0, 64, 64},
                                                        {65, 128, 128},
                                                        {129, 192, 192},
                                                        {193, 256, 0},
                                                        {257, 384, 192},
                                                        {385, 512, 0},
                                                        {513, 576, 192},
                                                        {577, kAll, 0}});
      if (one8)
        same(pol::row_buckets(sw, rows, true, bytes), {{0, kAll, 0}});
      else
        same(pol::row_buckets(sw, rows, true, bytes), {{0, 64, 64},
                                                       {65, 128, 128},
                                                       {129, 192, 96},
                                                       {193, 256, 0},
                                                       {257, 288, 96},
                                                       {289, 384, 128},
                                                       {385, kAll, 0}});
    }
    const int single = rows <= pol::kSwapMaxRows ? 128 : 0;
    EXPECT_EQ(pol::single_tile_n(rows), single);
    for (const bool fp8 : {false, true}) {
      same(pol::row_buckets(CutlassSwap::automatic, rows, fp8, small), {{0, kAll, single}});
      same(pol::row_buckets(CutlassSwap::automatic, rows, fp8, big, pol::kSplitMinExperts - 1), {{0, kAll, single}});
      EXPECT_EQ(pol::row_buckets(CutlassSwap::automatic, rows, fp8, big, pol::kSplitMinExperts).size() > 1,
                rows <= pol::split_max_rows(fp8));
      EXPECT_GT(pol::row_buckets(CutlassSwap::byrows, rows, fp8, small, 1).size(), 1u);
    }
  }
  // Which side of the bounds the presets fall on (3 E H I weights of 1 or 2 bytes): Qwen3-30B-A3B
  // (64 local experts, H 2048, I 768) one launch in bf16 and fp8, Mixtral-8x7B (4 experts) by its
  // expert count; DeepSeek-V3 (128, 7168, 2048) and gpt-oss-120b (64, 2880, 2880) split in both.
  EXPECT_LT(64.0 * 3 * 2048 * 768 * 2, pol::kSplitMinWeightBytes);
  EXPECT_GE(128.0 * 3 * 7168 * 2048, pol::kSplitMinWeightBytes);
  EXPECT_GE(64.0 * 3 * 2880 * 2880, pol::kSplitMinWeightBytes);
  for (const auto& [sw, rows, tile] : {std::tuple{CutlassSwap::off, 10.0, 0}, std::tuple{CutlassSwap::n64, 1e5, 64},
                                       std::tuple{CutlassSwap::n192, 1.0, 192}, std::tuple{CutlassSwap::on, 100.0, 128}})
    same(pol::row_buckets(sw, rows), {{0, kAll, tile}});
  EXPECT_EQ(pol::path_name(pol::CutlassPath::bf16, WeightFormat::bf16, pol::kByRows), "cutlass-bf16-byrows");
  EXPECT_EQ(tiled_engines(kW8Fp8, pol::kByRows, 128), "cutlass-bf16-swap128(widened fp8)/cutlass-fp8-byrows");
  EXPECT_EQ(pol::path_name(pol::CutlassPath::fp8, WeightFormat::fp8, 64), "cutlass-fp8-swap64");
  EXPECT_EQ(pol::path_name(pol::CutlassPath::widened, WeightFormat::nvfp4, 128), "cutlass-bf16-swap128(widened nvfp4)");
  EXPECT_EQ(pol::path_name(pol::CutlassPath::widened, WeightFormat::fp8), "cutlass-bf16(widened fp8)");
  EXPECT_EQ(pol::path_name(pol::CutlassPath::fp8w, WeightFormat::fp8, 256), "cutlass-fp8w-swap256");
  EXPECT_EQ(swapped_engines(kW8Fp8, 64), "cutlass-bf16-swap64(widened fp8)/cutlass-fp8-swap64");
  const Shape p;
  for (const CutlassSwap sw :
       {CutlassSwap::automatic, CutlassSwap::off, CutlassSwap::on, CutlassSwap::n64, CutlassSwap::n128,
        CutlassSwap::n192, CutlassSwap::byrows}) {
    MoeConfig cfg = make_cfg(p);
    cfg.tuning.cutlass_swap = sw;
    EXPECT_TRUE(validate(cfg.tuning).empty());
    EXPECT_EQ(cuda::CudaRunner(cfg, 0).cutlass_swap(), sw);
  }
  if (!cuda::cutlass_engine::available()) GTEST_SKIP() << "built without CUTLASS (the crossover needs it)";
  EXPECT_FALSE(pol::use_cutlass(Engine::automatic, WeightFormat::bf16, pol::kCutlassMinRows - 1));
  EXPECT_TRUE(pol::use_cutlass(Engine::automatic, WeightFormat::bf16, pol::kCutlassMinRows));
  EXPECT_TRUE(pol::use_cutlass(Engine::automatic, WeightFormat::bf16, 17, 16));
  EXPECT_FALSE(pol::use_cutlass(Engine::automatic, WeightFormat::bf16, 63, 63));
  EXPECT_TRUE(pol::use_cutlass(Engine::automatic, WeightFormat::nvfp4, 64, 63));
  EXPECT_FALSE(pol::use_cutlass(Engine::mma, WeightFormat::bf16, 1000, 1));
}

// A split table as text (CudaRunner::set_row_buckets, bench runner --row-buckets): parsed into the
// same buckets as the policy's own; every malformed table is a UsageError naming the part; 96 only
// on the fp8 GEMM.
// bf16 weights on few local experts keep the decode engine up to two m-tiles (policy.h,
// kDecodeMaxRowsFewBf16); fp8, many experts and a tuned value keep their rules.
TEST(CudaPolicy, FewBf16ExpertsDecodeToTwoTiles) {
  namespace pol = cuda::policy;
  const auto d32 = [](WeightFormat wf, ActFormat act) {
    return pol::decode_engines(true, cuda::kWgmmaBlockM, wf, act, IntermediateQuant::fp8, 4096, 14336);
  };
  const pol::DecodeEngines bf = d32(WeightFormat::bf16, ActFormat::bf16), f8 = d32(WeightFormat::fp8, ActFormat::fp8);
  ASSERT_TRUE(bf.bf16);
  EXPECT_EQ(pol::decode_max_rows(WeightFormat::bf16, bf, 0, false, 4), pol::kDecodeMaxRowsFewBf16);
  EXPECT_EQ(pol::decode_max_rows(WeightFormat::bf16, bf, 0, false, pol::kSplitMinExperts), 0);
  EXPECT_EQ(pol::decode_max_rows(WeightFormat::fp8, f8, 0, false, 4), 0);
  EXPECT_EQ(pol::decode_max_rows(WeightFormat::bf16, bf, 48, false, 4), 48);
  // The decode m-tile up to 64 expected rows, CUTLASS above.
  const int lim = pol::decode_max_rows(WeightFormat::bf16, bf, 0, false, 4);
  EXPECT_EQ(pol::block_m(64, 0, lim), cuda::kWgmmaBlockM);
  EXPECT_EQ(pol::block_m(65, 0, lim), 128);
  if (cuda::cutlass_engine::available()) {
    EXPECT_FALSE(pol::use_cutlass(RunnerEngine::automatic, WeightFormat::bf16, 64, lim));
    EXPECT_TRUE(pol::use_cutlass(RunnerEngine::automatic, WeightFormat::bf16, 65, lim));
  }
}

TEST(CudaPolicy, RowBucketsFromText) {
  namespace pol = cuda::policy;
  constexpr int kAll = pol::RowBucket{}.hi;
  const auto b = pol::parse_row_buckets("0-64:64,65-128:96,129-384:192,385-:0");
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(b[0].lo, 0);
  EXPECT_EQ(b[0].hi, 64);
  EXPECT_EQ(b[0].tile_n, 64);
  EXPECT_EQ(b[1].tile_n, 96);
  EXPECT_EQ(b[2].lo, 129);
  EXPECT_EQ(b[2].hi, 384);
  EXPECT_EQ(b[3].lo, 385);
  EXPECT_EQ(b[3].hi, kAll);
  EXPECT_EQ(b[3].tile_n, 0);
  const auto one = pol::parse_row_buckets("0-:128");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].hi, kAll);
  for (const auto& [bad, part] : {std::pair{"", ""}, std::pair{"0-64:64", "0-64:64"}, std::pair{"1-:0", "1-:0"},
                                  std::pair{"0-64:64,66-:0", "66-:0"}, std::pair{"0-64:80,65-:0", "0-64:80"},
                                  std::pair{"0-:0,1-:0", "1-:0"}, std::pair{"0-x:64,65-:0", "0-x:64"},
                                  std::pair{"0-64,65-:0", "0-64"}, std::pair{"0-64:64,65-60:0", "65-60:0"}}) {
    try {
      pol::parse_row_buckets(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + part + "'"), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(pol::check_row_buckets(b, true));
  EXPECT_THROW(pol::check_row_buckets(b, false), UsageError);
  EXPECT_NO_THROW(pol::check_row_buckets(pol::parse_row_buckets("0-:192"), false));
}

// Concurrent launches per range are issued from the range of the expected rows outwards, each
// range once.
TEST(CudaPolicy, BucketOrderFromTheMean) {
  namespace pol = cuda::policy;
  const auto b = pol::parse_row_buckets("0-64:64,65-128:128,129-192:192,193-256:0,257-384:192,385-:0");
  EXPECT_EQ(pol::bucket_order(b, 256.0), (std::vector<int>{3, 4, 2, 1, 5, 0}));  // distances 0, 1, 64, 128, 129, 192
  EXPECT_EQ(pol::bucket_order(b, 32.0), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(pol::bucket_order(b, 1e6), (std::vector<int>{5, 4, 3, 2, 1, 0}));
  // Between two ranges (128.5): the nearer first; at equal distance the lower one.
  EXPECT_EQ(pol::bucket_order(b, 128.5).front(), 1);
  EXPECT_EQ(pol::bucket_order(pol::parse_row_buckets("0-10:64,11-:0"), 10.5), (std::vector<int>{0, 1}));
  EXPECT_EQ(pol::bucket_order(pol::parse_row_buckets("0-:0"), 7.0), (std::vector<int>{0}));
}

// The ranges of one launch (Grouped::ranges) and of a SwiGLU skip: every expert by default, none
// from none(), inclusive bounds, at most kMax ranges (one more is refused naming the limit).
TEST(CudaPolicy, RowRangesContainTheirRows) {
  namespace ce = cuda::cutlass_engine;
  const ce::RowRanges all;
  EXPECT_TRUE(all.contains(0));
  EXPECT_TRUE(all.contains(0x7fffffff));
  EXPECT_FALSE(ce::RowRanges::none().contains(0));
  ce::RowRanges r = ce::RowRanges::one(1, 1);
  r.add(129, 200);
  for (const auto& [rows, in] : {std::pair{0, false}, std::pair{1, true}, std::pair{2, false},
                                 std::pair{128, false}, std::pair{129, true}, std::pair{200, true},
                                 std::pair{201, false}})
    EXPECT_EQ(r.contains(rows), in) << rows;
  ce::RowRanges full = ce::RowRanges::none();
  for (int i = 0; i < ce::RowRanges::kMax; ++i) full.add(2 * i, 2 * i);
  EXPECT_TRUE(full.contains(2 * (ce::RowRanges::kMax - 1)));
  EXPECT_FALSE(full.contains(1));
  try {
    full.add(100, 101);
    ADD_FAILURE() << "a ninth range was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(ce::RowRanges::kMax)), std::string::npos) << e.what();
  }
}

// One launch per tile: the ranges of a tile together (ascending), launches in the order of their
// nearest range, never more than max_ranges ranges in one; every range in exactly one launch.
TEST(CudaPolicy, BucketLaunchesOnePerTile) {
  namespace pol = cuda::policy;
  using V = std::vector<std::vector<int>>;
  const auto b = pol::parse_row_buckets("0-64:64,65-128:128,129-192:192,193-256:0,257-384:192,385-:0");
  EXPECT_EQ(pol::bucket_launches(b, 256.0, 8), (V{{3, 5}, {2, 4}, {1}, {0}}));
  EXPECT_EQ(pol::bucket_launches(b, 32.0, 8), (V{{0}, {1}, {2, 4}, {3, 5}}));
  EXPECT_EQ(pol::bucket_launches(b, 256.0, 1), (V{{3}, {4}, {2}, {1}, {5}, {0}}));  // bucket_order
  // The automatic tables: fp8's 7 ranges in 4 launches, bf16's 8 in 4, one tile each.
  for (const bool fp8 : {true, false}) {
    const auto a = pol::row_buckets(CutlassSwap::byrows, 256.0, fp8);
    const V l = pol::bucket_launches(a, 256.0, 8);
    EXPECT_EQ(l.size(), 4u) << fp8;
    std::vector<int> seen(a.size(), 0);
    for (const auto& launch : l)
      for (const int i : launch) {
        ++seen[size_t(i)];
        EXPECT_EQ(a[size_t(i)].tile_n, a[size_t(launch.front())].tile_n);
      }
    EXPECT_EQ(seen, std::vector<int>(a.size(), 1));
  }
  const auto many = pol::parse_row_buckets("0-1:0,2-3:0,4-5:0,6-:0");
  EXPECT_EQ(pol::bucket_launches(many, 0.0, 3), (V{{0, 1, 2}, {3}}));
  EXPECT_THROW(pol::bucket_launches(many, 0.0, 0), UsageError);
}

// The one-GEMM SwiGLU (engine_cutlass_glu.cu) is chosen without being asked exactly where GEMM1 is
// one unswapped launch of bf16 weights with I % 128 == 0, so it never takes a split away;
// fused_swiglu on fuses every unswapped bf16 GEMM1 and gives the split up above 192 rows.
TEST(CudaPolicy, OneGemmSwigluWhereOneLaunch) {
  namespace pol = cuda::policy;
  auto plan = [](int E, int H, int I, WeightFormat wf, bool fused, double rows,
                 IntermediateQuant iq = IntermediateQuant::none) {
    const PlanInputs a(E, H, I, wf, ActFormat::bf16, false);
    return pol::cutlass_plan(a.in, a.w, iq, fused, CutlassSwap::automatic, rows, size_t(1) << 30);
  };
  const auto bf16 = WeightFormat::bf16;
  // Qwen3-30B (64 local experts, under the split's weight bound): one launch, fused unasked.
  const auto q30 = plan(64, 2048, 768, bf16, false, 512);
  ASSERT_EQ(q30.buckets.size(), 1u);
  EXPECT_EQ(q30.buckets[0].tile_n, 0);
  EXPECT_TRUE(q30.fused_swiglu);
  // ... but not on a swapped launch (a small mean), nor with the fp8 intermediate, nor fp8 weights.
  EXPECT_FALSE(plan(64, 2048, 768, bf16, false, 100).fused_swiglu);
  EXPECT_FALSE(plan(64, 2048, 768, bf16, false, 512, IntermediateQuant::fp8).fused_swiglu);
  EXPECT_FALSE(plan(64, 2048, 768, WeightFormat::fp8, false, 512).fused_swiglu);
  // DeepSeek-V3 (128 experts) at a 256-row mean: split by rows, so not fused unless asked; asked,
  // one unswapped launch.
  const auto ds = plan(128, 7168, 2048, bf16, false, 256);
  EXPECT_GT(ds.buckets.size(), 1u);
  EXPECT_FALSE(ds.fused_swiglu);
  const auto ds_on = plan(128, 7168, 2048, bf16, true, 256);
  EXPECT_EQ(ds_on.buckets.size(), 1u);
  EXPECT_TRUE(ds_on.fused_swiglu);
  // Above the split's bound (a 1024-row mean) one launch again: fused unasked.
  EXPECT_TRUE(plan(128, 7168, 2048, bf16, false, 1024).fused_swiglu);
  // gpt-oss-120b (I 2880, not a multiple of 128): only when asked (the two-GEMM form).
  EXPECT_FALSE(plan(64, 2880, 2880, bf16, false, 1024).fused_swiglu);
  EXPECT_TRUE(plan(64, 2880, 2880, bf16, true, 1024).fused_swiglu);

  // Inside the split: DeepSeek-V3 at a 256-row mean keeps its split and fuses in its unswapped
  // launches; never where the plan fused whole, is one launch, has no unswapped bucket or more than
  // the pass's skip holds, nor with fp8 weights, the fp8 intermediate or I % 128 != 0.
  EXPECT_TRUE(ds.glu_split);
  EXPECT_FALSE(ds_on.glu_split);
  EXPECT_FALSE(q30.glu_split);
  EXPECT_FALSE(plan(128, 7168, 2048, bf16, false, 256, IntermediateQuant::fp8).glu_split);
  EXPECT_FALSE(plan(128, 7168, 2048, WeightFormat::fp8, false, 256).glu_split);
  EXPECT_FALSE(plan(128, 2880, 2880, bf16, false, 256).glu_split);
  auto split = ds;
  split.buckets = pol::parse_row_buckets("0-64:64,65-:128");
  EXPECT_FALSE(pol::glu_in_split(split, 2048, IntermediateQuant::none));
  split.buckets = pol::parse_row_buckets("0-64:64,65-:0");
  EXPECT_TRUE(pol::glu_in_split(split, 2048, IntermediateQuant::none));
  split.buckets = pol::parse_row_buckets("0-1:0,2-3:64,4-5:0,6-7:0,8-9:0,10-:0");
  EXPECT_TRUE(pol::glu_in_split(split, 2048, IntermediateQuant::none));  // five unswapped ranges
  split.buckets = pol::parse_row_buckets("0-1:0,2-3:0,4-5:0,6-7:0,8-9:0,10-11:0,12-13:0,14-15:0,16-17:64,18-:0");
  EXPECT_FALSE(pol::glu_in_split(split, 2048, IntermediateQuant::none));  // nine: more than the pass can skip
}

// The fp8 one-GEMM SwiGLU (engine_cutlass_glu_fp8.cu) replaces GEMM1 + the pass exactly where both
// GEMMs are on the fp8 GEMM (fp8 dispatch and weights, intermediate_quant = fp8) in one unswapped
// launch and I % 64 == 0, partial 128-blocks of I included (where split_w13 would otherwise run).
TEST(CudaPolicy, Fp8OneGemmSwigluWhereOneLaunch) {
  namespace pol = cuda::policy;
  auto plan = [&](int E, int H, int I, double rows, IntermediateQuant iq = IntermediateQuant::fp8,
                  ActFormat af = ActFormat::fp8) {
    const PlanInputs a(E, H, I, WeightFormat::fp8, af, true);
    return pol::cutlass_plan(a.in, a.w, iq, false, CutlassSwap::automatic, rows, size_t(1) << 30);
  };
  const auto q30 = plan(64, 2048, 768, 512);
  ASSERT_EQ(q30.buckets.size(), 1u);
  EXPECT_EQ(q30.buckets[0].tile_n, 0);
  EXPECT_EQ(q30.gemm1, pol::CutlassPath::fp8);
  EXPECT_TRUE(q30.fp8_glu);
  EXPECT_FALSE(q30.fused_swiglu);  // the bf16 forms' flag stays off
  // Not on a swapped launch, nor with a bf16 intermediate (GEMM2 widened), nor bf16 rows (GEMM1
  // widened).
  EXPECT_FALSE(plan(64, 2048, 768, 100).fp8_glu);
  EXPECT_FALSE(plan(64, 2048, 768, 512, IntermediateQuant::none).fp8_glu);
  EXPECT_FALSE(plan(64, 2048, 768, 512, IntermediateQuant::fp8, ActFormat::bf16).fp8_glu);
  // gpt-oss-120b (I 2880 = 45 x 64, a partial 128-block): taken; I % 64 != 0: the halves.
  const auto oss = plan(64, 2880, 2880, 1024);
  EXPECT_TRUE(oss.fp8_glu);
  const auto odd = plan(64, 2048, 2880 - 32, 1024);
  EXPECT_FALSE(odd.fp8_glu);
  EXPECT_TRUE(odd.split_w13);
  // Split by rows or not, it follows the one-unswapped-launch rule.
  for (const double rows : {128.0, 256.0, 1024.0}) {
    const auto ds = plan(128, 7168, 2048, rows);
    EXPECT_EQ(ds.fp8_glu, ds.buckets.size() == 1 && ds.buckets[0].tile_n == 0) << rows;
  }
}

// fp8 weights with a bf16 operand (bf16 dispatch for GEMM1, intermediate_quant none for GEMM2) run
// on the mixed-input GEMM (fp8w) unless tuning.fp8_mixed is off (then widened); an e4m3 operand
// keeps the fp8 GEMM; nvfp4 without paired copies is widened. fp8w is one launch whose token tile follows the
// expected rows, never fused with SwiGLU.
TEST(CudaPolicy, Fp8WeightsWithBf16OperandDecodedInGemm) {
  namespace pol = cuda::policy;
  auto plan = [&](WeightFormat wf, ActFormat af, IntermediateQuant iq, double rows, bool mixed, bool fused = false) {
    const PlanInputs a(128, 7168, 2048, wf, af, true);  // DeepSeek-V3 over 2 ranks
    return pol::cutlass_plan(a.in, a.w, iq, fused, CutlassSwap::automatic, rows, size_t(1) << 30, mixed);
  };
  using P = pol::CutlassPath;
  const auto none = IntermediateQuant::none, fp8 = IntermediateQuant::fp8;
  const auto both = plan(WeightFormat::fp8, ActFormat::bf16, none, 256, true, true);
  EXPECT_EQ(both.gemm1, P::fp8w);
  EXPECT_EQ(both.gemm2, P::fp8w);
  EXPECT_FALSE(both.fused_swiglu);  // asked for, but the SwiGLU epilogue is the bf16 GEMM's
  EXPECT_EQ(both.scratch_bytes(), 0u);
  EXPECT_EQ(both.tile_n(P::fp8w), 256);
  const auto off = plan(WeightFormat::fp8, ActFormat::bf16, none, 256, false);
  EXPECT_EQ(off.gemm1, P::widened);
  EXPECT_EQ(off.gemm2, P::widened);
  EXPECT_GT(off.scratch_bytes(), 0u);
  const auto w2 = plan(WeightFormat::fp8, ActFormat::fp8, none, 256, true);
  EXPECT_EQ(w2.gemm1, P::fp8);
  EXPECT_EQ(w2.gemm2, P::fp8w);
  const auto w13 = plan(WeightFormat::fp8, ActFormat::bf16, fp8, 256, true);
  EXPECT_EQ(w13.gemm1, P::fp8w);
  EXPECT_EQ(w13.gemm2, P::fp8);
  const auto nv = plan(WeightFormat::nvfp4, ActFormat::bf16, none, 1024, true);
  EXPECT_EQ(nv.gemm1, P::widened);
  EXPECT_EQ(nv.gemm2, P::widened);
  for (const auto& [rows, tile] : {std::pair{1.0, 64}, std::pair{64.0, 64}, std::pair{64.5, 128}, std::pair{128.0, 128},
                                   std::pair{129.0, 256}, std::pair{5000.0, 256}}) {
    EXPECT_EQ(pol::fp8w_tile_n(rows), tile) << rows;
    EXPECT_TRUE(cuda::cutlass_engine::fp8w_tile_exists(tile));
  }
}

// nvfp4 weights with their paired copies (prepare with tuning.nvfp4_mixed) run both GEMMs on the
// mixed-input GEMM (nvfp4w) at every M, never fused; without the copies widened; the wide
// engine's bound drops to kNvfp4WideMaxRowsPaired.
TEST(CudaPolicy, PairedNvfp4OnTheMixedInputGemm) {
  namespace pol = cuda::policy;
  using P = pol::CutlassPath;
  auto plan = [&](ActFormat af, double rows, bool paired) {
    const PlanInputs a(128, 7168, 2048, WeightFormat::nvfp4, af, true);
    return pol::cutlass_plan(a.in, a.w, IntermediateQuant::none, true, CutlassSwap::automatic, rows, size_t(1) << 30,
                             true, paired);
  };
  for (const ActFormat af : {ActFormat::bf16, ActFormat::fp8, ActFormat::nvfp4}) {
    const auto p = plan(af, 256, true);
    EXPECT_EQ(p.gemm1, P::nvfp4w);
    EXPECT_EQ(p.gemm2, P::nvfp4w);
    EXPECT_FALSE(p.fused_swiglu);
    EXPECT_EQ(p.scratch_bytes(), 0u);
    EXPECT_EQ(p.tile_n(P::nvfp4w), 256);
    EXPECT_EQ(pol::path_name(P::nvfp4w, WeightFormat::nvfp4, 256), "cutlass-nvfp4w-swap256");
  }
  EXPECT_EQ(plan(ActFormat::bf16, 100, true).tile_n(P::nvfp4w), 128);
  const auto big = plan(ActFormat::bf16, 8192, true);
  EXPECT_EQ(big.gemm1, P::nvfp4w);
  EXPECT_EQ(big.gemm2, P::nvfp4w);
  const auto none = plan(ActFormat::bf16, 256, false);
  EXPECT_EQ(none.gemm1, P::widened);
  EXPECT_EQ(none.gemm2, P::widened);
  // The wide engine's bound with the copies: 128 rows, 96 for small experts (Qwen3-30B), none for
  // few local experts (Mixtral's 4); a tuned bound still wins.
  EXPECT_EQ(pol::nvfp4_wide_max_rows(7168, 2048, 0, true, 128), pol::kNvfp4WideMaxRowsPaired);
  EXPECT_EQ(pol::nvfp4_wide_max_rows(2880, 2880, 0, true, 64), pol::kNvfp4WideMaxRowsPaired);
  EXPECT_EQ(pol::nvfp4_wide_max_rows(2048, 768, 0, true, 64), pol::kNvfp4WideMaxRowsPairedSmall);
  EXPECT_EQ(pol::nvfp4_wide_max_rows(4096, 14336, 0, true, 4), 0.0);
  EXPECT_EQ(pol::nvfp4_wide_max_rows(4096, 14336, 0, false, 4), pol::kNvfp4WideMaxRows);
  EXPECT_EQ(pol::nvfp4_wide_max_rows(2048, 768, 300, true), 300.0);
  EXPECT_EQ(pol::nvfp4_wide_max_rows(4096, 14336, 300, true, 4), 300.0);
  EXPECT_EQ(pol::nvfp4_wide_max_rows(7168, 2048, 0, false), pol::kNvfp4WideMaxRows);
}

// fp8 weights with a bf16 operand on both decode GEMMs, or on one where experts are large (>=
// kFp8MixedDecodeMinExpert weights), never run the decode engines (kDecodeNever: the mixed-input
// CUTLASS GEMM at every M) when tuning.fp8_mixed is on; fp8 x fp8 on both GEMMs, one bf16 operand
// on small experts and a tuned value keep their rules.
TEST(CudaPolicy, Fp8MixedLeavesDecodeEarlyForLargeExperts) {
  namespace pol = cuda::policy;
  const auto d32 = [](ActFormat act, IntermediateQuant iq) {
    return pol::decode_engines(true, cuda::kWgmmaBlockM, WeightFormat::fp8, act, iq, 7168, 2048);
  };
  const int64_t ds = 3LL * 7168 * 2048, q30 = 3LL * 2048 * 768;
  const auto none = IntermediateQuant::none, fp8 = IntermediateQuant::fp8;
  const auto w2_bf16 = d32(ActFormat::fp8, none), w13_bf16 = d32(ActFormat::bf16, fp8), both8 = d32(ActFormat::fp8, fp8);
  const auto both16 = d32(ActFormat::bf16, none);
  ASSERT_TRUE(w2_bf16.fp8_1 && !w2_bf16.fp8_2 && !w13_bf16.fp8_1 && w13_bf16.fp8_2 && both8.fp8_1 && both8.fp8_2);
  ASSERT_TRUE(!both16.fp8_1 && !both16.fp8_2);
  const auto lim = [](const pol::DecodeEngines& d, int64_t weights, bool mixed, int tuned = 0) {
    return pol::decode_max_rows(WeightFormat::fp8, d, tuned, false, 128, weights, mixed);
  };
  EXPECT_EQ(lim(w2_bf16, ds, true), pol::kDecodeNever);
  EXPECT_EQ(lim(w13_bf16, ds, true), pol::kDecodeNever);
  EXPECT_EQ(lim(both8, ds, true), 0);
  EXPECT_EQ(lim(w2_bf16, ds, false), 0);
  EXPECT_EQ(lim(w2_bf16, q30, true), 0);
  EXPECT_EQ(lim(w13_bf16, q30, true), 0);
  EXPECT_EQ(lim(both16, q30, true), pol::kDecodeNever);  // both on mma.sync: any size
  EXPECT_EQ(lim(both16, q30, false), 0);
  EXPECT_EQ(lim(w2_bf16, ds, true, 48), 48);
  if (cuda::cutlass_engine::available()) {
    EXPECT_TRUE(pol::use_cutlass(RunnerEngine::automatic, WeightFormat::fp8, 0.5, lim(w2_bf16, ds, true)));
    EXPECT_FALSE(pol::use_cutlass(RunnerEngine::mma, WeightFormat::fp8, 0.5, lim(w2_bf16, ds, true)));
    EXPECT_FALSE(pol::use_cutlass(RunnerEngine::automatic, WeightFormat::fp8, 2, lim(w2_bf16, q30, true)));
  }
}

// tuning.fused_swiglu reaches the runner (the constructor touches no GPU and throws nothing);
// set_fused_swiglu overrides it.
TEST(CudaPolicy, FusedSwigluSwitch) {
  const Shape p;
  for (const bool on : {false, true}) {
    MoeConfig cfg = make_cfg(p);
    cfg.tuning.fused_swiglu = on;
    EXPECT_TRUE(validate(cfg.tuning).empty());
    cuda::CudaRunner r(cfg, 0);
    EXPECT_EQ(r.fused_swiglu(), on);
    r.set_fused_swiglu(!on);
    EXPECT_EQ(r.fused_swiglu(), !on);
  }
}

// tuning.concurrent_buckets reaches the runner (on by default); set_concurrent_buckets overrides it.
TEST(CudaPolicy, ConcurrentBucketsSwitch) {
  const Shape p;
  EXPECT_TRUE(Tuning{}.concurrent_buckets);
  for (const bool on : {false, true}) {
    MoeConfig cfg = make_cfg(p);
    cfg.tuning.concurrent_buckets = on;
    cuda::CudaRunner r(cfg, 0);
    EXPECT_EQ(r.concurrent_buckets(), on);
    r.set_concurrent_buckets(!on);
    EXPECT_EQ(r.concurrent_buckets(), !on);
  }
}

}  // namespace
}  // namespace epmoe::test

namespace epmoe::test {
namespace {

// The mixed-input GEMMs refuse what they cannot run before any CUDA call, naming the GEMM, the
// argument and its value (host only: the pointers are never read).
TEST(CudaPolicy, MixedInputGemmsRefuseBadArguments) {
  if (!cuda::cutlass_engine::available()) GTEST_SKIP() << "built without CUTLASS";
  namespace ce = cuda::cutlass_engine;
  auto message = [](auto&& call) {
    try {
      call();
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  static const float fake_alpha = 1.f;
  ce::Grouped g;
  g.experts = 4;
  g.N = 256;
  g.K = 256;
  g.alpha = &fake_alpha;
  g.swap_tile_n = 96;
  std::string m = message([&] { ce::grouped_gemm_nvfp4w(g, nullptr); });
  EXPECT_NE(m.find("nvfp4-weight"), std::string::npos) << m;
  EXPECT_NE(m.find("swap_tile_n=96"), std::string::npos) << m;
  g.swap_tile_n = 256;
  g.K = 100;
  m = message([&] { ce::grouped_gemm_nvfp4w(g, nullptr); });
  EXPECT_NE(m.find("K=100"), std::string::npos) << m;
  g.K = 256;
  g.alpha = nullptr;
  m = message([&] { ce::grouped_gemm_nvfp4w(g, nullptr); });
  EXPECT_NE(m.find("alpha"), std::string::npos) << m;
  g.swap_tile_n = 192;
  m = message([&] { ce::grouped_gemm_fp8w(g, nullptr); });
  EXPECT_NE(m.find("fp8-weight"), std::string::npos) << m;
  EXPECT_NE(m.find("swap_tile_n=192"), std::string::npos) << m;
  g.swap_tile_n = 256;
  g.alpha = &fake_alpha;
  g.glu = true;
  g.halves = true;
  m = message([&] { ce::grouped_gemm_nvfp4w(g, nullptr); });
  EXPECT_NE(m.find("halves"), std::string::npos) << m;
  // W13's paired copy in GLU order needs whole 16-row groups of 8 gate and 8 up rows.
  alignas(16) static uint8_t fake[16];
  static int fake_flag = 0;
  MatrixView w13;
  w13.format = WeightFormat::nvfp4;
  w13.device = DeviceKind::cuda;
  w13.experts = 1;
  w13.rows = 24;
  w13.cols = 64;
  w13.data = w13.scales = fake;
  m = message([&] { ce::write_nvfp4_paired(w13, fake, &fake_flag, nullptr, true); });
  EXPECT_NE(m.find("rows=24"), std::string::npos) << m;
}

// Which launch of a 256-wide mixed-input GEMM takes an expert's remainder past its last multiple of
// 256 (Grouped::Part; the fill computes each launch's rows from it on the device), with and without
// the mid launch, and which shapes have one.
TEST(CudaPolicy, MixedInputRemainderParts) {
  using G = cuda::cutlass_engine::Grouped;
  using P = G::Part;
  struct Case {
    int rows;
    P with_mid, without;
  };
  for (const Case& c : {Case{0, P::head, P::head}, Case{1, P::tail, P::tail}, Case{64, P::tail, P::tail},
                        Case{65, P::mid, P::head}, Case{128, P::mid, P::head}, Case{129, P::head, P::head},
                        Case{255, P::head, P::head}, Case{256, P::head, P::head}, Case{300, P::tail, P::tail},
                        Case{320, P::tail, P::tail}, Case{321, P::mid, P::head}, Case{384, P::mid, P::head},
                        Case{385, P::head, P::head}, Case{512, P::head, P::head}, Case{600, P::mid, P::head}}) {
    SCOPED_TRACE("rows " + std::to_string(c.rows));
    EXPECT_EQ(G::remainder_part(c.rows % G::kPartRows, true), c.with_mid);
    EXPECT_EQ(G::remainder_part(c.rows % G::kPartRows, false), c.without);
  }
  static_assert(G::kPartTail < G::kPartMid && G::kPartMid < G::kPartRows && G::kMaxFill == 3);
  // The rows each launch takes (part_rows, the fill's rule): every row once, the head whole 256-row
  // tiles unless it owns the remainder, the tail and mid within their tiles, after the head's rows.
  for (const bool mid : {true, false})
    for (int m = 0; m <= 1100; ++m) {
      SCOPED_TRACE("rows " + std::to_string(m) + (mid ? " with mid" : " without"));
      const G::PartRows all = G::part_rows(m, P::all, mid), head = G::part_rows(m, P::head, mid),
                        tail = G::part_rows(m, P::tail, mid), middle = G::part_rows(m, P::mid, mid);
      ASSERT_EQ(all.rows, m);
      ASSERT_EQ(all.skip, 0);
      ASSERT_EQ(head.skip, 0);
      ASSERT_EQ(head.rows + tail.rows + middle.rows, m);
      const P owner = G::remainder_part(m % G::kPartRows, mid);
      ASSERT_TRUE(owner == P::head || head.rows % G::kPartRows == 0);
      ASSERT_LE(tail.rows, G::kPartTail);
      ASSERT_LE(middle.rows, mid ? G::kPartMid : 0);
      if (tail.rows) ASSERT_EQ(tail.skip, head.rows);
      if (middle.rows) ASSERT_EQ(middle.skip, head.rows);
    }
  // Large experts only (kMixedMidMinExpert): DeepSeek-V3, Qwen3-235B, gpt-oss-120b, not Qwen3-30B.
  struct Shape {
    int H, I;
    bool mid;
  };
  for (const Shape& sh : {Shape{7168, 2048, true}, Shape{4096, 1536, true}, Shape{2880, 2880, true},
                          Shape{2048, 768, false}}) {
    const PlanInputs pi(64, sh.H, sh.I, WeightFormat::nvfp4, ActFormat::bf16, true);
    const auto plan = cuda::policy::cutlass_plan(pi.in, pi.w, IntermediateQuant::none, false, CutlassSwap::automatic,
                                                 512.0, 0, true, true);
    EXPECT_EQ(plan.gemm1, cuda::policy::CutlassPath::nvfp4w);
    EXPECT_EQ(plan.fp8w_tile_n, 256);
    EXPECT_EQ(plan.mixed_mid, sh.mid) << "H " << sh.H << " I " << sh.I;
  }
}

}  // namespace
}  // namespace epmoe::test
