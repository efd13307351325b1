// Runner "cuda" on its CUTLASS engine (runner_cutlass.cu, engine_cutlass_*.cu) vs the CPU reference runner, with
// the bound of test_runner.cpp (max|a-b|/max|ref| <= 3e-2, 1-cos <= 1e-3): bf16 weights (bf16,
// fp8 and nvfp4 dispatch), fp8 weights with an fp8 dispatch (GEMM1 on e4m3 x e4m3 with block
// scales; GEMM2 fp8 with intermediate_quant = fp8, else bf16 on W2 widened to bf16), fp8 weights
// with a bf16 dispatch (W13 widened), nvfp4 weights (both widened, 1/gs as the epilogue alpha) with
// bf16, fp8 and nvfp4 dispatch; the widening alone bitwise vs the host dequantization; widening in
// several scratch chunks bitwise equal to one chunk; uneven expert loads,
// experts with no rows, everything on one expert (odd m-tile counts, so a cluster of two m-tiles
// has an empty half), T = 1 and tokens with no expert. Large M at DeepSeek-V3 expert shapes: the
// whole output against the mma engine (itself checked against the reference in
// test_runner.cpp) and the first tokens against the reference. Every runner problem runs
// unswapped, swap-AB with 64-, 128- and 192-wide token tiles, split by rows per expert and
// automatic (tuning.cutlass_swap 0, 64, 128, 192, byrows, auto; automatic runs these small experts
// as one launch, policy::kSplitMinWeightBytes), each against the reference and the others
// against the unswapped within the same bound; SwapAbRowsPerExpert adds exact per-expert loads of
// 0, 1, 33, 64, 100, 150 and 257 rows and DeepSeek-V3 shapes at 64 rows per expert. The engine and
// tile rules on the host (policy.h) are test_policy.cpp. These runs widen fp8 weights with a bf16
// operand (tuning.fp8_mixed off); Fp8WeightsDecodedInMainLoop checks the mixed-input GEMM that
// replaces that by default against them bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "epmoe/error.h"
#include "epmoe/quant.h"
#include "common/gpu_test_util.h"
#include "run/cuda/engine_cutlass.h"
#include "run/cuda/policy.h"
#include "run/cuda/runner.h"
#include "run/cuda/cutlass_problem.h"
#include "run/cuda/runner_test_util.h"
#include "run/cuda/widen.h"
#include "run/reference.h"

namespace epmoe::test {
namespace {

using Engine = cuda::CudaRunner::Engine;

void run_problem(const Problem& p, uint32_t seed) {
  SCOPED_TRACE(problem_trace(p, seed));
  const ProblemData data(p, seed);
  const MoeConfig& cfg = data.cfg;
  const int H = p.H, I = p.I, E = p.E, C = p.C;
  const ExpertWeights &hw = data.wt.on_host, &dw = data.wt.on_device;
  const detail::HostRecvBuffers& recv = data.recv;
  const int n = data.n;
  const DispatchOutput& dout = data.dd.view;

  bool fused = false, swapped = false, glu_split = false;  // what the last run_engine call chose
  auto run_engine = [&](Engine eng, std::string* engines, size_t scratch = 0, int* chunks = nullptr,
                        bool fuse = true, CutlassSwap swap = CutlassSwap::off, bool pdl = true) {
    Dev<bf16_raw> y(size_t(C) * H);
    y.poison();
    cuda::CudaRunner runner(cfg, 0);
    runner.set_engine(eng);
    runner.set_pdl(pdl);
    runner.set_fp8_mixed(false);  // fp8 weights with a bf16 operand widened; fp8w: Fp8WeightsDecodedInMainLoop
    runner.set_fused_swiglu(fuse);
    runner.set_cutlass_swap(swap);
    if (scratch) runner.set_widen_scratch_bytes(scratch);
    runner.run(dout, dw, y.get(), nullptr);
    EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
    *engines = runner.last_engines();
    fused = runner.last_swiglu_fused();
    glu_split = runner.last_glu_split();
    swapped = runner.last_swap_ab();
    if (chunks) *chunks = runner.last_widen_chunks();
    return y.download();
  };
  // The CUTLASS engine unswapped, swap-AB with 64-, 128- and 192-wide token tiles
  // (tuning.cutlass_swap 0, 64, 128, 192), split by rows per expert (byrows: the direct GEMMs one
  // launch per policy::row_buckets range; widened ones take one width) and automatic (these experts
  // are all under policy::kSplitMinWeightBytes, so one launch of policy::single_tile_n), each
  // checked on its own below, then the others against the unswapped.
  constexpr int kForms = 6;
  const CutlassSwap forms[kForms] = {CutlassSwap::off,  CutlassSwap::n64,    CutlassSwap::n128,
                                     CutlassSwap::n192, CutlassSwap::byrows, CutlassSwap::automatic};
  const double er = cuda::policy::expected_rows(cfg, dout);
  ASSERT_LT(3.0 * E * H * I * 2, cuda::policy::kSplitMinWeightBytes) << "automatic would split these experts";
  const int auto_direct = cuda::policy::single_tile_n(er);
  const int auto_widened = cuda::policy::swap_tile_n(CutlassSwap::automatic, er);
  const int tiles[kForms] = {0, 64, 128, 192, cuda::policy::kByRows, auto_direct};
  const auto by_policy = [](CutlassSwap sw) { return sw == CutlassSwap::automatic || sw == CutlassSwap::byrows; };
  std::vector<bf16_raw> ycs[kForms];
  std::string names[kForms];
  for (int f = 0; f < kForms; ++f) {
    const CutlassSwap sw = forms[f];
    const bool swap = tiles[f] != 0;
    SCOPED_TRACE(std::string("cutlass_swap ") + cutlass_swap_name(sw));
    std::string& engines = names[f];
    int chunks = -1;
    const auto yc = run_engine(Engine::cutlass, &engines, 0, &chunks, true, sw);
    const std::string expect = by_policy(sw) ? tiled_engines(p.expect, tiles[f], auto_widened)
                               : swap        ? swapped_engines(p.expect, tiles[f])
                                             : std::string(p.expect);
    EXPECT_EQ(engines, expect);
    // A run with a direct GEMM reports its tile; one with both widened, theirs.
    const bool both_widened = widened_gemm(p.expect, 1) && widened_gemm(p.expect, 2);
    EXPECT_EQ(swapped, by_policy(sw) && both_widened ? auto_widened != 0 : swap);
    // SwiGLU goes into GEMM1's epilogue exactly when GEMM1 runs unswapped on the bf16 GEMM (bf16 or
    // widened weights) and the intermediate stays bf16; then the unfused path must agree within the
    // bound (it rounds the up half to bf16 before the product, the fused one does not).
    const bool expect_fused =
        !swapped && expect.rfind("cutlass-bf16", 0) == 0 && p.iq == IntermediateQuant::none;
    EXPECT_EQ(fused, expect_fused);
    if (expect_fused) {
      std::string eu;
      const auto yu = run_engine(Engine::cutlass, &eu, 0, nullptr, false, sw);
      // Unasked, SwiGLU is still fused where GEMM1 is one unswapped launch of bf16 weights and
      // I % 128 == 0 (the one-GEMM form, the unfused bits).
      const bool auto_glu =
          p.wf == WeightFormat::bf16 && cuda::cutlass_engine::glu_fits(I) && eu.rfind("cutlass-bf16/", 0) == 0;
      EXPECT_EQ(fused, auto_glu) << eu;
      const Diff d = compare_rows(yc, yu, n, H);
      std::printf("[cutlass] %-24s SwiGLU fused vs pass   n=%d  max|a-b|/max|ref| %.3e  1-cos %.3e\n", p.name, n,
                  d.rel(), d.one_minus_cos);
      expect_within_bound(d);
      expect_poison_after(yu, n, H);
    }
    // Split by rows (byrows: several ranges, some unswapped), bf16 GEMM1 fuses SwiGLU in its
    // unswapped launches where the intermediate stays bf16 and I % 128 == 0; the output is checked
    // against the reference and the unswapped run below.
    const bool expect_glu_split = sw == CutlassSwap::byrows && p.wf == WeightFormat::bf16 &&
                                  p.iq == IntermediateQuant::none && cuda::cutlass_engine::glu_fits(I);
    EXPECT_EQ(glu_split, expect_glu_split);
    // One chunk per widened GEMM with the default 1 GiB scratch (these problems are far smaller).
    const bool wide1 = widened_gemm(expect, 1), wide2 = widened_gemm(expect, 2);
    EXPECT_EQ(chunks, int(wide1) + int(wide2));
    if (p.chunk_check) {
      // Scratch = one W13 expert: W13 goes one expert per chunk, W2 (half the size) two.
      std::string e2;
      int small_chunks = -1;
      const auto ys = run_engine(Engine::cutlass, &e2, size_t(2) * I * H * sizeof(bf16_raw), &small_chunks, true, sw);
      EXPECT_EQ(e2, expect);
      EXPECT_EQ(small_chunks, (wide1 ? E : 0) + (wide2 ? (E + 1) / 2 : 0));
      EXPECT_GT(small_chunks, 1);
      EXPECT_EQ(first_diff(ys, yc), -1) << "several widening chunks differ from one chunk";
    }
    expect_poison_after(yc, n, H);
    if (sw == CutlassSwap::off || sw == CutlassSwap::automatic) {
      // Programmatic dependent launch (on by default: the row passes, the table fills and the GEMMs
      // through detail::gemm_kernel) only moves launches: without it, the same bits.
      std::string ep;
      const auto yp = run_engine(Engine::cutlass, &ep, 0, nullptr, true, sw, false);
      EXPECT_EQ(ep, engines);
      EXPECT_EQ(first_diff(yp, yc), -1) << "pdl on and off differ";
    }
    ycs[f] = yc;
  }

  // Reference on the first ref_tokens slots (a slot's result does not depend on the others).
  const int nref = p.ref_tokens < 0 ? n : std::min(n, p.ref_tokens);
  {
    detail::HostRecvBuffers sub = recv;
    sub.counts[0] = nref;
    std::vector<bf16_raw> y_ref(size_t(C) * H, 0);
    detail::ReferenceRunner ref(cfg);
    ref.run(sub.view(cfg.quant_params()), hw, y_ref.data(), nullptr);
    for (int f = 0; f < kForms; ++f) {
      const Diff d = compare_rows(ycs[f], y_ref, nref, H);
      std::printf("[cutlass] %-24s act %-5s w %-5s %-40s n=%d ref=%d  max|a-b|/max|ref| %.3e  1-cos %.3e\n", p.name,
                  format_name(p.act), format_name(p.wf), names[f].c_str(), n, nref, d.rel(), d.one_minus_cos);
      SCOPED_TRACE(names[f]);
      expect_within_bound(d, p.iq);
    }
  }
  // Swapped against unswapped: the same products per output element, but the tensor cores may sum
  // a wgmma's K slice in another order, so they agree within the bound rather than bitwise (the
  // share of identical elements is printed).
  for (int f = 1; f < kForms; ++f) {
    const Diff d = compare_rows(ycs[f], ycs[0], n, H);
    size_t same = 0;
    for (size_t i = 0; i < size_t(n) * H; ++i) same += ycs[f][i] == ycs[0][i];
    std::printf("[cutlass] %-24s swap-AB %3d vs unswapped  n=%d  max|a-b|/max|ref| %.3e  1-cos %.3e  identical %.4f\n",
                p.name, tiles[f], n, d.rel(), d.one_minus_cos, n ? double(same) / (double(n) * H) : 1.0);
    expect_within_bound(d, p.iq);
  }
  if (p.vs_mma) {
    std::string mma_engines;
    const auto ym = run_engine(Engine::mma, &mma_engines);
    for (int f = 0; f < kForms; ++f) {
      const Diff d = compare_rows(ycs[f], ym, n, H);
      std::printf("[cutlass] %-24s %-40s vs %-20s n=%d  max|a-b|/max|ref| %.3e  1-cos %.3e\n", p.name,
                  names[f].c_str(), mma_engines.c_str(), n, d.rel(), d.one_minus_cos);
      expect_within_bound(d, p.iq);
    }
  }
}

using A = ActFormat;
using W = WeightFormat;
constexpr auto kNone = IntermediateQuant::none;
constexpr auto kFp8 = IntermediateQuant::fp8;
constexpr const char* kBf16 = "cutlass-bf16/cutlass-bf16";
constexpr const char* kFp8Both = "cutlass-fp8/cutlass-fp8";
constexpr const char* kFp8W2 = "cutlass-fp8/cutlass-bf16(widened fp8)";
constexpr const char* kW8W8 = "cutlass-bf16(widened fp8)/cutlass-bf16(widened fp8)";
constexpr const char* kW8Fp8 = "cutlass-bf16(widened fp8)/cutlass-fp8";
constexpr const char* kW4 = "cutlass-bf16(widened nvfp4)/cutlass-bf16(widened nvfp4)";

TEST(CutlassEngine, MatchesReference) {
  EPMOE_REQUIRE_GPU();
  EPMOE_REQUIRE_CUTLASS();
  uint32_t seed = std::random_device{}();
  const std::vector<Problem> problems = {
      // Several m-tiles per expert, uneven, two experts without rows.
      {1024, 512, 8, 2, 700, A::bf16, W::bf16, kNone, Load::uneven, -1, -1, false, kBf16, "uneven"},
      {1024, 512, 8, 2, 700, A::fp8, W::fp8, kFp8, Load::uneven, -1, -1, false, kFp8Both, "uneven"},
      {1024, 512, 8, 2, 700, A::fp8, W::fp8, kNone, Load::uneven, -1, -1, false, kFp8W2, "uneven"},
      {1024, 512, 8, 2, 700, A::fp8, W::bf16, kFp8, Load::uneven, -1, -1, false, kBf16, "uneven iq=fp8"},
      {1024, 512, 8, 2, 500, A::nvfp4, W::bf16, kNone, Load::uneven, -1, -1, false, kBf16, "uneven"},
      // Widened weights: fp8 with a bf16 operand, nvfp4 always (also against the mma engine, which
      // widens to the same bf16 values in its B fragments).
      {1024, 512, 8, 2, 600, A::bf16, W::fp8, kNone, Load::uneven, -1, -1, true, kW8W8, "uneven"},
      {1024, 512, 8, 2, 600, A::nvfp4, W::fp8, kFp8, Load::uneven, -1, -1, false, kW8Fp8, "uneven iq=fp8"},
      {1024, 512, 8, 2, 600, A::bf16, W::nvfp4, kNone, Load::uneven, -1, -1, true, kW4, "uneven"},
      {1024, 512, 8, 2, 600, A::nvfp4, W::nvfp4, kNone, Load::uneven, -1, -1, false, kW4, "uneven"},
      {1024, 512, 8, 2, 600, A::fp8, W::nvfp4, kFp8, Load::uneven, -1, -1, false, kW4, "uneven iq=fp8"},
      // 300 rows on expert 0 = 3 m-tiles (a cluster pair with an empty half), 7 empty experts.
      {1024, 512, 8, 4, 300, A::bf16, W::bf16, kNone, Load::one_expert, -1, -1, false, kBf16, "one expert"},
      {1024, 512, 8, 4, 300, A::fp8, W::fp8, kFp8, Load::one_expert, -1, -1, false, kFp8Both, "one expert"},
      {1024, 512, 8, 4, 300, A::bf16, W::nvfp4, kNone, Load::one_expert, -1, -1, false, kW4, "one expert"},
      {1024, 512, 8, 4, 300, A::fp8, W::fp8, kNone, Load::one_expert, -1, -1, false, kFp8W2, "one expert"},
      // Partial tiles: GEMM1 N = 2I = 1152 is 4.5 n-tiles of 256, GEMM2 K = I = 576 is 9 k-steps of 64.
      {2880, 576, 4, 2, 200, A::bf16, W::bf16, kNone, Load::uneven, -1, -1, false, kBf16, "odd tiles"},
      // fp8 weights whose dims are not whole 128-tiles (H 2880 = 22.5 tiles): widened, partial scale tiles.
      {2880, 576, 4, 2, 200, A::bf16, W::fp8, kNone, Load::uneven, -1, -1, false, kW8W8, "odd tiles"},
      {2880, 576, 4, 2, 200, A::bf16, W::nvfp4, kNone, Load::uneven, -1, -1, false, kW4, "odd tiles"},
      // fp8 x fp8 with partial 128-tiles (gpt-oss-120b's rule: H and I multiples of 16): K and N
      // residues of both GEMMs, W13 (I % 128 == 64) as its gate and up halves, the partial blocks'
      // own scales; and H % 128 == 64 with whole I (one GEMM1 launch, K residue only).
      {2880, 576, 4, 2, 200, A::fp8, W::fp8, kFp8, Load::uneven, -1, -1, false, kFp8Both, "odd tiles fp8"},
      {2880, 576, 4, 2, 200, A::fp8, W::fp8, kNone, Load::uneven, -1, -1, false, kFp8W2, "odd tiles fp8"},
      {2880, 512, 4, 2, 200, A::fp8, W::fp8, kFp8, Load::uneven, -1, -1, false, kFp8Both, "odd H fp8"},
      // Qwen3-30B experts, top-8.
      {2048, 768, 16, 8, 256, A::fp8, W::fp8, kFp8, Load::uneven, -1, -1, false, kFp8Both, "qwen3-30b"},
      {2048, 768, 16, 8, 256, A::bf16, W::bf16, kNone, Load::uniform, -1, -1, false, kBf16, "qwen3-30b"},
      // One token; a batch whose tokens all miss (T = 0 is a no-op before any engine runs).
      {1024, 512, 8, 2, 16, A::fp8, W::fp8, kFp8, Load::uniform, 1, -1, false, kFp8Both, "T=1"},
      {1024, 512, 8, 2, 16, A::bf16, W::bf16, kNone, Load::uniform, 1, -1, false, kBf16, "T=1"},
      {1024, 512, 8, 2, 16, A::bf16, W::nvfp4, kNone, Load::uniform, 1, -1, false, kW4, "T=1"},
  };
  for (const Problem& p : problems) run_problem(p, seed++);
}

// Swap-AB where it is made for and at its edges: exactly 0, 1, 33, 64, 100, 150, 200 and 257 rows
// on the experts of one call (Load::listed: an empty expert, one row, partial 64-wide token tiles,
// several token tiles per weight tile, and experts in five of the split's row ranges, one of them
// unswapped, where bf16 GEMM1 fuses SwiGLU inside the split) on
// every operand path, partial 128-row weight tiles (H 2880; with fp8 also I 576), and DeepSeek-V3 expert shapes at about
// 64 rows per expert (uniform and skewed), the first tokens against the reference. run_problem
// runs each problem unswapped, swapped (every token-tile width), split by rows and automatic, and
// checks each against the reference and the others against the unswapped.
TEST(CutlassEngine, SwapAbRowsPerExpert) {
  EPMOE_REQUIRE_GPU();
  EPMOE_REQUIRE_CUTLASS();
  uint32_t seed = std::random_device{}();
  const int C = 805 + 9;  // the listed rows plus tokens that route nowhere
  const std::vector<Problem> problems = {
      {1024, 512, 8, 1, C, A::bf16, W::bf16, kNone, Load::listed, -1, -1, false, kBf16, "listed rows"},
      {1024, 512, 8, 1, C, A::fp8, W::fp8, kFp8, Load::listed, -1, -1, false, kFp8Both, "listed rows"},
      {1024, 512, 8, 1, C, A::fp8, W::fp8, kNone, Load::listed, -1, -1, false, kFp8W2, "listed rows"},
      {1024, 512, 8, 1, C, A::bf16, W::fp8, kFp8, Load::listed, -1, -1, false, kW8Fp8, "listed rows iq=fp8"},
      {1024, 512, 8, 1, C, A::bf16, W::nvfp4, kNone, Load::listed, -1, -1, true, kW4, "listed rows", true},
      // GEMM2's weight rows H = 2880 are 22.5 tiles of 128, GEMM1's 2I = 1152 nine.
      {2880, 576, 8, 1, C, A::bf16, W::bf16, kNone, Load::listed, -1, -1, false, kBf16, "listed odd tiles"},
      {2880, 576, 8, 1, C, A::fp8, W::fp8, kFp8, Load::listed, -1, -1, false, kFp8Both, "listed odd tiles fp8"},
      {7168, 2048, 8, 4, 128, A::fp8, W::fp8, kFp8, Load::uniform, -1, 8, false, kFp8Both, "deepseek-v3 64 rows"},
      {7168, 2048, 8, 4, 128, A::bf16, W::bf16, kNone, Load::uneven, -1, 8, false, kBf16, "deepseek-v3 skewed"},
  };
  for (const Problem& p : problems) run_problem(p, seed++);
}

// Widening in several scratch chunks (one W13 expert of scratch: 8 + 4 chunks) gives the same
// output bitwise as one chunk: a chunk is the same grouped GEMM on fewer groups, each output tile
// computed whole by one CTA in the same K order. Uneven loads (two experts without rows, which the
// widening skips) and everything on one expert.
TEST(CutlassEngine, WidenChunksEqualOneChunk) {
  EPMOE_REQUIRE_GPU();
  EPMOE_REQUIRE_CUTLASS();
  uint32_t seed = std::random_device{}();
  const std::vector<Problem> problems = {
      {1024, 512, 8, 2, 400, A::bf16, W::nvfp4, kNone, Load::uneven, -1, 16, false, kW4, "chunks", true},
      {1024, 512, 8, 2, 400, A::nvfp4, W::nvfp4, kFp8, Load::uneven, -1, 16, false, kW4, "chunks iq=fp8", true},
      {1024, 512, 8, 2, 400, A::fp8, W::fp8, kNone, Load::uneven, -1, 16, false, kFp8W2, "chunks", true},
      {1024, 512, 8, 2, 400, A::bf16, W::fp8, kNone, Load::uneven, -1, 16, false, kW8W8, "chunks", true},
      {1024, 512, 8, 4, 200, A::bf16, W::nvfp4, kNone, Load::one_expert, -1, 16, false, kW4, "chunks one expert", true},
  };
  for (const Problem& p : problems) run_problem(p, seed++);
}

// The widening kernels alone, bitwise against the host: fp8 -> bf16(e4m3 * tile scale) (partial
// 128-tiles: 200 x 320; one scale grid, and rows split at 72 into two grids as W13's gate and up
// are), nvfp4 -> bf16(e2m1 * e4m3 scale); a chunk that starts at expert 1; experts whose row count
// is 0 are skipped (their scratch stays as it was).
TEST(CutlassEngine, WidenMatchesHostDequant) {
  EPMOE_REQUIRE_GPU();
  const int E = 4, rows = 200, cols = 320, e0 = 1, n = 3;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> w(size_t(E) * rows * cols);
  for (size_t i = 0; i < w.size(); ++i) w[i] = nd(rng) * std::ldexp(1.f, int(i / cols % 9) - 4);
  const std::vector<int32_t> cnt = {5, 3, 0, 7};  // expert 2 has no rows
  Dev<int32_t> dcnt(cnt);
  for (const auto& [wf, split] : {std::pair{W::fp8, 0}, std::pair{W::fp8, 72}, std::pair{W::nvfp4, 0}}) {
    SCOPED_TRACE(std::string(format_name(wf)) + " row_split " + std::to_string(split));
    const HostMatrix h = quantize_matrix(w.data(), E, rows, cols, wf, split);
    DevMatrix d(h);
    Dev<bf16_raw> out(size_t(n) * rows * cols);
    out.poison();
    cuda::widen::to_bf16(d.view, e0, n, dcnt.get(), out.get(), nullptr);
    EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
    const auto o = out.download();
    const int rb = fp8_tile_rows(rows, split), cb = (cols + 127) / 128;
    int64_t bad = -1;
    for (int j = 0; j < n && bad < 0; ++j) {
      const int e = e0 + j;
      for (int r = 0; r < rows && bad < 0; ++r)
        for (int c = 0; c < cols; ++c) {
          const size_t i = (size_t(e) * rows + r) * cols + c;
          bf16_raw want = 0xffff;  // untouched
          if (cnt[e] != 0) {
            if (wf == W::fp8) {
              float s;
              std::memcpy(&s, &h.scales[((size_t(e) * rb + fp8_tile_row(r, split)) * cb + c / 128) * 4], 4);
              want = num::f32_to_bf16(num::e4m3_to_f32(h.data[i]) * s);
            } else {
              const uint8_t b = h.data[i / 2];
              const float q = num::e2m1_to_f32((c & 1) ? b >> 4 : b & 0xf);
              want = num::f32_to_bf16(q * num::e4m3_to_f32(h.scales[i / 16]));
            }
          }
          const size_t oi = (size_t(j) * rows + r) * cols + c;
          if (o[oi] != want) {
            bad = int64_t(oi);
            ADD_FAILURE() << "expert " << e << " row " << r << " col " << c << ": got " << o[oi] << " want " << want;
            break;
          }
        }
    }
  }
  // Chunk sizing: whole experts, at least one, at most all.
  EXPECT_EQ(cuda::widen::chunk_experts(size_t(1) << 30, size_t(2) * 2048 * 7168 * 2, 128), 18);
  EXPECT_EQ(cuda::widen::chunk_experts(100, 200, 8), 1);
  EXPECT_EQ(cuda::widen::chunk_experts(5000, 100, 8), 8);
}

// DeepSeek-V3 expert shapes (H 7168, I 2048) at large M: 8 experts, top-2, 8192 tokens (about
// 2000 rows per expert, uneven): all rows vs the mma engine, the first 24 tokens vs the reference.
TEST(CutlassEngine, LargeMDeepSeekShapes) {
  EPMOE_REQUIRE_GPU();
  EPMOE_REQUIRE_CUTLASS();
  uint32_t seed = std::random_device{}();
  const std::vector<Problem> problems = {
      {7168, 2048, 8, 2, 8192, A::bf16, W::bf16, kNone, Load::uneven, -1, 24, true, kBf16, "deepseek-v3 large M"},
      {7168, 2048, 8, 2, 8192, A::fp8, W::fp8, kFp8, Load::uneven, -1, 24, true, kFp8Both, "deepseek-v3 large M"},
      {7168, 2048, 8, 2, 4096, A::fp8, W::fp8, kNone, Load::uniform, -1, 24, true, kFp8W2, "deepseek-v3 large M"},
      {7168, 2048, 8, 2, 4096, A::bf16, W::nvfp4, kNone, Load::uneven, -1, 24, true, kW4, "deepseek-v3 large M"},
  };
  for (const Problem& p : problems) run_problem(p, seed++);
}

// The automatic rule: CUTLASS from R*C*K / E_loc >= policy::kCutlassMinRows on, for every weight format
// (nvfp4 weights widened, fp8 weights with a bf16 operand on the mixed-input GEMM), except where
// policy::decode_max_rows moves the crossover (both GEMMs on wgmma decode engines, or fp8 weights
// with a bf16 operand on both).
TEST(CutlassEngine, AutomaticChoice) {
  EPMOE_REQUIRE_GPU();
  EPMOE_REQUIRE_CUTLASS();
  struct Case {
    int C;
    A act;
    W wf;
    bool cutlass;
  };
  const int H = 256, I = 128, E = 4, K = 2;
  const std::vector<Case> cases = {
      {64, A::bf16, W::bf16, false},  // 64*2/4 = 32 rows per expert: one decode m-tile
      // bf16 weights on few experts (E 4 < policy::kSplitMinExperts): decode up to
      // policy::kDecodeMaxRowsFewBf16 (64) rows per expert, CUTLASS above.
      {66, A::bf16, W::bf16, false},  {128, A::bf16, W::bf16, false}, {130, A::bf16, W::bf16, true},
      {66, A::fp8, W::fp8, true},     {66, A::bf16, W::fp8, true},
      // fp8 weights with a bf16 operand on both GEMMs (bf16 dispatch, iq none): the mixed-input
      // GEMM at every M (policy::kDecodeNever).
      {64, A::bf16, W::fp8, true},    {4, A::bf16, W::fp8, true},    {1, A::bf16, W::fp8, true},
      // nvfp4 with both GEMMs on the register-decode wgmma engine: decode up to
      // policy::kDecodeMaxRowsNvfp4 (192) rows per expert, CUTLASS (widened) above.
      {386, A::fp8, W::nvfp4, true},  {384, A::fp8, W::nvfp4, false}, {256, A::fp8, W::nvfp4, false},
      {130, A::nvfp4, W::bf16, true},
      {386, A::bf16, W::bf16, true},  // 193 rows per expert: past policy::kSwapMaxRows, unswapped
  };
  std::mt19937 rng(7);
  for (const Case& c : cases) {
    Problem p{H, I, E, K, c.C, c.act, c.wf, kNone, Load::uniform, 8, 0, false, "", "auto"};
    const MoeConfig cfg = make_cfg(p);
    std::vector<float> w(size_t(E) * 2 * I * H, 0.01f);
    const HostMatrix h13 = quantize_matrix(w.data(), E, 2 * I, H, c.wf);
    const HostMatrix h2 = quantize_matrix(w.data(), E, H, I, c.wf);
    DevMatrix d13(h13), d2(h2);
    ExpertWeights dw{E, H, I, d13.view, d2.view};
    detail::HostRecvBuffers recv;
    recv.allocate(1, c.C, H, K, E, c.act);
    const int slots = std::min(8, c.C);
    recv.counts[0] = slots;
    for (int j = 0; j < slots; ++j)
      for (int k = 0; k < K; ++k) recv.local_ids[size_t(j) * K + k] = (j + k) % E;
    // expert_counts stays null, which a DispatchOutput allows: recv was never finalized.
    DevDispatch dd(recv, cfg.quant_params(), false);
    const DispatchOutput& dout = dd.view;
    Dev<bf16_raw> y(size_t(c.C) * H);
    cuda::CudaRunner runner(cfg, 0);
    runner.set_engine(Engine::automatic);
    runner.run(dout, dw, y.get(), nullptr);
    EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
    const std::string engines = runner.last_engines();
    EXPECT_EQ(engines.rfind("cutlass", 0) == 0, c.cutlass)
        << "C=" << c.C << " act " << format_name(c.act) << " weights " << format_name(c.wf) << ": " << engines;
    // tuning.cutlass_swap auto: swap-AB up to kSwapMaxRows expected rows per expert. The direct
    // GEMMs of these small experts run one launch with 128-wide token tiles (single_tile_n); with
    // both GEMMs widened, 64-wide token tiles up to kSwapNarrowMaxRows, else 128.
    // fp8 weights with a bf16 operand on both GEMMs: the mixed-input GEMM, always swapped, its tile
    // by expected rows (policy::fp8w_tile_n).
    const double rows = double(c.C) * K / E;
    const bool both_widened = widened_gemm(engines, 1) && widened_gemm(engines, 2);
    const bool fp8w = engines.rfind("cutlass-fp8w", 0) == 0;
    EXPECT_EQ(fp8w, c.cutlass && c.act == A::bf16 && c.wf == W::fp8) << engines;
    EXPECT_EQ(runner.last_swap_ab(), c.cutlass && (fp8w || rows <= cuda::policy::kSwapMaxRows)) << engines;
    if (fp8w)
      EXPECT_EQ(runner.last_swap_tile_n(), cuda::policy::fp8w_tile_n(rows)) << engines;
    else if (runner.last_swap_ab())
      EXPECT_EQ(runner.last_swap_tile_n(), !both_widened || rows > cuda::policy::kSwapNarrowMaxRows ? 128 : 64)
          << engines;
    runner.set_engine(Engine::mma);
    runner.run(dout, dw, y.get(), nullptr);
    EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_NE(std::string(runner.last_engines()).rfind("cutlass", 0), 0u) << runner.last_engines();
  }
}

// The CUTLASS engine inside a CUDA graph (no host synchronization, device-side shapes): replays
// equal the eager run bitwise, also after the routing changes in place. Widened weights run with a
// small scratch (several chunks), whose count depends on the configuration only; paired nvfp4
// weights (the prepare step) on the mixed-input GEMM, with its head and tail launches.
TEST(CutlassEngine, GraphReplayEqualsEager) {
  EPMOE_REQUIRE_GPU();
  EPMOE_REQUIRE_CUTLASS();
  struct Case {
    A act;
    W wf;
    IntermediateQuant iq;
    size_t scratch;  // 0 = default
    const char* name;
    bool mixed = false;  // tuning.fp8_mixed (fp8 weights with a bf16 operand decoded in the main loop)
    // nvfp4 weights through the prepare step: paired copies, nvfp4w, and at 150 rows per expert
    // the head and tail launches (Grouped::Part)
    bool paired = false;
  };
  const size_t one13 = size_t(2) * 512 * 1024 * 2;
  for (const Case& c : {Case{A::bf16, W::bf16, kNone, 0, "bf16"}, Case{A::fp8, W::fp8, kFp8, 0, "fp8"},
                        Case{A::fp8, W::fp8, kNone, one13, "fp8 widened W2"},
                        Case{A::bf16, W::fp8, kNone, 0, "fp8w both", true},
                        Case{A::bf16, W::nvfp4, kNone, one13, "nvfp4 widened"},
                        Case{A::bf16, W::nvfp4, kNone, 0, "nvfp4w paired", false, true}}) {
    SCOPED_TRACE(c.name);
    const bool fp8 = c.act == A::fp8;
    Problem p{1024, 512, 8, 2, c.paired ? 600 : 400, c.act, c.wf, c.iq, Load::uneven, -1, 0, false, "", "graph"};
    const MoeConfig cfg = make_cfg(p);
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> w(size_t(p.E) * 2 * p.I * p.H);
    for (auto& v : w) v = nd(rng) / 32;
    const HostMatrix h13 = quantize_matrix(w.data(), p.E, 2 * p.I, p.H, p.wf);
    const HostMatrix h2 = quantize_matrix(w.data(), p.E, p.H, p.I, p.wf);
    DevMatrix d13(h13), d2(h2);
    ExpertWeights dw{p.E, p.H, p.I, d13.view, d2.view};
    const auto x = random_bf16(rng, p.C, p.H);
    std::vector<uint8_t> ep(size_t(p.C) * payload_bytes(p.act, p.H)), es(size_t(p.C) * scale_bytes(p.act, p.H) + 4);
    quantize_rows(p.act, cfg.quant_params(), x.data(), p.C, p.H, ep.data(), es.data());
    std::vector<int32_t> ids1 = make_ids(p, p.C, rng), ids2 = make_ids(p, p.C, rng);
    std::vector<float> tw(size_t(p.C) * p.K, 0.5f);
    Dev<uint8_t> pay(ep), sc(es);
    Dev<int32_t> lid(ids1), cnt(std::vector<int32_t>{p.C});
    Dev<float> wts(tw);
    DispatchOutput d;
    d.num_ranks = 1;
    d.capacity = p.C;
    d.hidden = p.H;
    d.top_k = p.K;
    d.num_local_experts = p.E;
    d.format = p.act;
    d.quant = cfg.quant_params();
    d.device = DeviceKind::cuda;
    d.payload = pay.get();
    d.scales = fp8 ? sc.get() : nullptr;
    d.local_ids = lid.get();
    d.weights = wts.get();
    d.counts = cnt.get();
    for (const CutlassSwap sw :
         {CutlassSwap::off, CutlassSwap::n64, CutlassSwap::n128, CutlassSwap::byrows, CutlassSwap::automatic}) {
      SCOPED_TRACE(cutlass_swap_name(sw));
      lid.upload(ids1);
      cuda::CudaRunner runner(cfg, 0);
      runner.set_engine(Engine::cutlass);
      runner.set_cutlass_swap(sw);
      runner.set_fp8_mixed(c.mixed);
      if (c.scratch) runner.set_widen_scratch_bytes(c.scratch);
      ExpertWeights rw = dw;  // the prepare step's copies belong to `runner`
      if (c.paired) runner.prepare(rw, nullptr);
      Dev<bf16_raw> y(size_t(p.C) * p.H);
      cudaStream_t st;
      EPMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      auto eager = [&] {
        runner.run(d, rw, y.get(), st);
        EPMOE_CUDA_CHECK(cudaStreamSynchronize(st));
        return y.download();
      };
      const auto e1 = eager();  // also grows every workspace to this step's size
      {
        // The launches per row range one after the other on the stream (tuning.concurrent_buckets
        // off) write the same bytes as the overlapping ones (on, the default).
        cuda::CudaRunner seq(cfg, 0);
        seq.set_engine(Engine::cutlass);
        seq.set_cutlass_swap(sw);
        seq.set_concurrent_buckets(false);
        seq.set_fp8_mixed(c.mixed);
        if (c.scratch) seq.set_widen_scratch_bytes(c.scratch);
        ExpertWeights sw2 = dw;
        if (c.paired) seq.prepare(sw2, nullptr);
        y.poison();
        seq.run(d, sw2, y.get(), st);
        EPMOE_CUDA_CHECK(cudaStreamSynchronize(st));
        EXPECT_EQ(first_diff(y.download(), e1), -1) << "concurrent launches per row range differ from sequential";
      }
      if (c.scratch) EXPECT_GT(runner.last_widen_chunks(), 2);
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      if (c.paired) EXPECT_NE(std::string(runner.last_engines()).find("nvfp4w"), std::string::npos);
      EPMOE_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      runner.run(d, rw, y.get(), st);
      EPMOE_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
      EPMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      y.poison();
      EPMOE_CUDA_CHECK(cudaGraphLaunch(exec, st));
      EPMOE_CUDA_CHECK(cudaStreamSynchronize(st));
      EXPECT_EQ(first_diff(y.download(), e1), -1);
      lid.upload(ids2);  // new routing in place: other counts per expert, same pointers
      const auto e2 = eager();
      y.poison();
      EPMOE_CUDA_CHECK(cudaGraphLaunch(exec, st));
      EPMOE_CUDA_CHECK(cudaStreamSynchronize(st));
      EXPECT_EQ(first_diff(y.download(), e2), -1);
      EXPECT_NE(first_diff(e1, e2), -1);
      // byrows: 100 expected rows per expert, the uneven load 38..228 per expert, so the direct
      // GEMMs split by rows (and the split changes with the routing; the replay must follow it);
      // both GEMMs widened (nvfp4) take the one width by expected rows instead. automatic: these
      // small experts run one launch, 128-wide.
      // The mixed-input GEMMs ignore cutlass_swap: 128-wide tiles for 100 expected rows, 256-wide
      // (and the tail launch) for the paired case's 150.
      const int want_byrows = c.wf == W::nvfp4 ? 128 : cuda::policy::kByRows;
      EXPECT_EQ(runner.last_swap_tile_n(), c.mixed                                             ? 128
                                           : c.paired                                            ? 256
                                           : sw == CutlassSwap::n64                               ? 64
                                           : sw == CutlassSwap::n128 || sw == CutlassSwap::automatic ? 128
                                           : sw == CutlassSwap::byrows                           ? want_byrows
                                                                                                 : 0);
      EPMOE_CUDA_CHECK(cudaGraphExecDestroy(exec));
      EPMOE_CUDA_CHECK(cudaGraphDestroy(graph));
      EPMOE_CUDA_CHECK(cudaStreamDestroy(st));
    }
  }
}

}  // namespace
}  // namespace epmoe::test
