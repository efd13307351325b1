// Runner "cuda"'s mixed-input CUTLASS GEMMs (engine_cutlass_fp8w.cuh, engine_cutlass_nvfp4w.cuh):
// quantized weights decoded in the main loop, against the widened path (the same weight values, so
// the same bits) and against the CPU reference within the bound of test_runner.cpp. The other
// CUTLASS runs are test_runner_cutlass.cu, whose problems (cutlass_problem.h) these share.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/gpu_test_util.h"
#include "run/cuda/cutlass_problem.h"
#include "run/cuda/engine_cutlass.h"
#include "run/cuda/policy.h"
#include "run/cuda/runner.h"
#include "run/cuda/runner_test_util.h"
#include "run/reference.h"

namespace epmoe::test {
namespace {

using Engine = cuda::CudaRunner::Engine;
using A = ActFormat;
using W = WeightFormat;
constexpr auto kNone = IntermediateQuant::none;
constexpr auto kFp8 = IntermediateQuant::fp8;

// The first `ref_tokens` tokens (all: -1) of y against the CPU reference, within the bound.
void expect_near_reference(const Problem& p, const ProblemData& data, const std::vector<bf16_raw>& y,
                           const char* tag) {
  const int n = data.n;
  const int nref = p.ref_tokens < 0 ? n : std::min(n, p.ref_tokens);
  detail::HostRecvBuffers sub = data.recv;
  sub.counts[0] = nref;
  std::vector<bf16_raw> y_ref(size_t(p.C) * p.H, 0);
  detail::ReferenceRunner ref(data.cfg);
  ref.run(sub.view(data.cfg.quant_params()), data.wt.on_host, y_ref.data(), nullptr);
  const Diff d = compare_rows(y, y_ref, nref, p.H);
  std::printf("[%s] %-22s vs reference n=%d ref=%d  max|a-b|/max|ref| %.3e  1-cos %.3e\n", tag, p.name, n, nref,
              d.rel(), d.one_minus_cos);
  expect_within_bound(d, p.iq);
}

// What both mixed-input tests check, given run(mixed, swap, pdl, &engines) -> the output: the mixed
// run's engines (`expect`) and untouched slots past the valid rows; its output equal bit for bit to
// the widened path's (run with `mixed` off, swapped at the same token tile, or 128 for 256: a
// tile's width does not change an element's sums) and to its own run without PDL; and the
// reference within the bound.
template <class Run>
void expect_mixed_equals_widened(const Problem& p, const ProblemData& data, int tile, const std::string& expect,
                                 const char* widened, const char* tag, Run run) {
  const int n = data.n, H = p.H;
  std::string em, ew, ep;
  const auto ym = run(true, CutlassSwap::automatic, true, &em);
  EXPECT_EQ(em, expect);
  expect_poison_after(ym, n, H);
  const auto yw = run(false, tile == 64 ? CutlassSwap::n64 : CutlassSwap::n128, true, &ew);
  EXPECT_NE(ew.find(widened), std::string::npos) << ew;
  size_t equal = 0;
  for (size_t i = 0; i < size_t(n) * H; ++i) equal += ym[i] == yw[i];
  std::printf("[%s] %-22s %-44s vs %-44s n=%d identical %.6f\n", tag, p.name, em.c_str(), ew.c_str(), n,
              n ? double(equal) / (double(n) * H) : 1.0);
  EXPECT_EQ(first_diff(ym, yw), -1) << "the mixed-input GEMM differs from the widened one";
  const auto yp = run(true, CutlassSwap::automatic, false, &ep);
  EXPECT_EQ(first_diff(yp, ym), -1) << "pdl on and off differ";
  expect_near_reference(p, data, ym, tag);
}

// fp8 weights with a bf16 operand on the mixed-input GEMM (tuning.fp8_mixed, the default;
// engine_cutlass_fp8w.cuh): the weights decoded in the main loop to the values widen::to_bf16
// writes, so the output equals the widened path's swapped run bit for bit (the same weight values
// as the register operand instead of shared memory, the same k16 order; 256-wide tiles against the
// widened 128-wide ones: a tile's width does not change an element's sums), and the reference
// within the bound. Each token-tile width (64 / 128 / 256 by expected rows), either GEMM alone
// (the other on the fp8 GEMM), W13's scale grid split at I (I % 128 != 0), every row on one
// expert, T = 1, and DeepSeek-V3 expert shapes at large M.
void run_fp8w_problem(const Problem& p, uint32_t seed) {
  SCOPED_TRACE(problem_trace(p, seed));
  const ProblemData data(p, seed);
  const MoeConfig& cfg = data.cfg;
  const int H = p.H, C = p.C;
  const TestWeights& wt = data.wt;
  const DispatchOutput& dout = data.dd.view;
  const int tile = cuda::policy::fp8w_tile_n(cuda::policy::expected_rows(cfg, dout));

  auto run = [&](bool mixed, CutlassSwap swap, bool pdl, std::string* engines) {
    Dev<bf16_raw> y(size_t(C) * H);
    y.poison();
    cuda::CudaRunner runner(cfg, 0);
    runner.set_engine(Engine::cutlass);
    runner.set_fp8_mixed(mixed);
    runner.set_cutlass_swap(swap);
    runner.set_pdl(pdl);
    runner.run(dout, wt.on_device, y.get(), nullptr);
    EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
    *engines = runner.last_engines();
    EXPECT_EQ(runner.last_widen_chunks(), mixed ? 0 : int(p.act == A::bf16) + int(p.iq == kNone));
    return y.download();
  };
  const std::string mixed = "cutlass-fp8w-swap" + std::to_string(tile);
  const std::string direct = "cutlass-fp8-swap128";  // the other GEMM on the fp8 GEMM (these small experts)
  expect_mixed_equals_widened(p, data, tile, (p.act == A::bf16 ? mixed : direct) + "/" + (p.iq == kNone ? mixed : direct),
                              "(widened fp8)", "fp8w", run);
}

TEST(CutlassEngine, Fp8WeightsDecodedInMainLoop) {
  EPMOE_REQUIRE_GPU();
  EPMOE_REQUIRE_CUTLASS();
  const std::vector<Problem> problems = {
      // 50 / 100 / 150 expected rows per expert: token tiles 64 / 128 / 256.
      {1024, 512, 8, 2, 200, A::bf16, W::fp8, kNone, Load::uneven, -1, -1, false, "", "tile 64"},
      {1024, 512, 8, 2, 400, A::bf16, W::fp8, kNone, Load::uneven, -1, -1, false, "", "tile 128"},
      {1024, 512, 8, 2, 600, A::bf16, W::fp8, kNone, Load::uneven, -1, -1, false, "", "tile 256"},
      // 256-wide tiles with every Grouped::Part: head and tail launches, whole and after a head (small
      // experts: no mid launch), and with the mid launch (experts of 18.9 M weights).
      {1024, 512, 8, 1, 2000, A::bf16, W::fp8, kNone, Load::listed_wide, -1, -1, false, "", "parts, no mid"},
      {2048, 3072, 8, 1, 2000, A::bf16, W::fp8, kNone, Load::listed_wide, -1, 256, false, "", "every part"},
      // One GEMM mixed, the other on the fp8 GEMM.
      {1024, 512, 8, 2, 600, A::fp8, W::fp8, kNone, Load::uneven, -1, -1, false, "", "W2 only"},
      {1024, 512, 8, 2, 600, A::bf16, W::fp8, kFp8, Load::uneven, -1, -1, false, "", "W13 only"},
      // H 2880 (partial 128-blocks of K and N), I 576: W13's scale grid restarts at row 576.
      {2880, 576, 4, 2, 200, A::bf16, W::fp8, kNone, Load::uneven, -1, -1, false, "", "odd tiles"},
      {1024, 512, 8, 4, 300, A::bf16, W::fp8, kNone, Load::one_expert, -1, -1, false, "", "one expert"},
      {1024, 512, 8, 2, 16, A::bf16, W::fp8, kNone, Load::uniform, 1, -1, false, "", "T=1"},
      {7168, 2048, 8, 2, 4096, A::bf16, W::fp8, kNone, Load::uniform, -1, 24, false, "", "deepseek-v3 large M"},
  };
  uint32_t seed = 900;
  for (const Problem& p : problems) run_fp8w_problem(p, seed++);
}

// nvfp4 weights on the mixed-input GEMM from their paired copies (prepare with
// tuning.nvfp4_mixed; engine_cutlass_nvfp4w.cuh): the decoded weights are the widened values times
// 2^-8 and alpha 2^8 / gs, so the output equals the widened path's swapped run bit for bit, and the
// reference within the bound. GEMM1 runs SwiGLU in its epilogue (W13's copy in GLU order) except
// with the fp8 intermediate (iq=fp8): against the widened GEMM1 and the SwiGLU pass, the same bits.
// Each token-tile width, bf16 / fp8 / nvfp4 dispatch, gpt-oss-like
// shapes (H 2880, I 576), Qwen3-30B and Mixtral expert shapes, every row on one expert, T = 1
// (T = 0 returns before any engine), experts without rows, DeepSeek-V3 expert shapes at large M.
void run_nvfp4w_problem(const Problem& p, uint32_t seed) {
  SCOPED_TRACE(problem_trace(p, seed));
  const ProblemData data(p, seed);
  const int H = p.H, C = p.C;
  const DispatchOutput& dout = data.dd.view;
  const int tile = cuda::policy::fp8w_tile_n(cuda::policy::expected_rows(data.cfg, dout));

  auto run = [&](bool paired, CutlassSwap swap, bool pdl, std::string* engines) {
    Dev<bf16_raw> y(size_t(C) * H);
    y.poison();
    MoeConfig cfg = data.cfg;
    cfg.tuning.nvfp4_mixed = paired;
    cuda::CudaRunner runner(cfg, 0);
    runner.set_engine(Engine::cutlass);
    runner.set_cutlass_swap(swap);
    runner.set_pdl(pdl);
    ExpertWeights w = data.wt.on_device;
    runner.prepare(w, nullptr);
    runner.run(dout, w, y.get(), nullptr);
    EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
    *engines = runner.last_engines();
    EXPECT_EQ(runner.last_widen_chunks(), paired ? 0 : 2);
    // The paired GEMM1 runs SwiGLU in its epilogue unless the intermediate takes the fp8 round trip.
    if (paired) EXPECT_EQ(runner.last_swiglu_fused(), p.iq == kNone);
    return y.download();
  };
  const std::string mixed = "cutlass-nvfp4w-swap" + std::to_string(tile);
  expect_mixed_equals_widened(p, data, tile, mixed + "/" + mixed, "(widened nvfp4)", "nvfp4w", run);
}

TEST(CutlassEngine, Nvfp4WeightsDecodedInMainLoop) {
  EPMOE_REQUIRE_GPU();
  EPMOE_REQUIRE_CUTLASS();
  const std::vector<Problem> problems = {
      // 50 / 100 / 150 expected rows per expert: token tiles 64 / 128 / 256.
      {1024, 512, 8, 2, 200, A::bf16, W::nvfp4, kNone, Load::uneven, -1, -1, false, "", "tile 64"},
      {1024, 512, 8, 2, 400, A::bf16, W::nvfp4, kNone, Load::uneven, -1, -1, false, "", "tile 128"},
      {1024, 512, 8, 2, 600, A::bf16, W::nvfp4, kNone, Load::uneven, -1, -1, false, "", "tile 256"},
      {1024, 512, 8, 1, 2000, A::bf16, W::nvfp4, kNone, Load::listed_wide, -1, -1, false, "", "parts, no mid"},
      {2048, 3072, 8, 1, 2000, A::bf16, W::nvfp4, kNone, Load::listed_wide, -1, 256, false, "", "every part"},
      {2048, 3072, 8, 1, 2000, A::fp8, W::nvfp4, kFp8, Load::listed_wide, -1, 256, false, "", "every part iq=fp8"},
      {1024, 512, 8, 2, 600, A::nvfp4, W::nvfp4, kNone, Load::uneven, -1, -1, false, "", "nvfp4 dispatch"},
      {1024, 512, 8, 2, 600, A::fp8, W::nvfp4, kFp8, Load::uneven, -1, -1, false, "", "fp8 dispatch iq=fp8"},
      {2880, 576, 4, 2, 200, A::bf16, W::nvfp4, kNone, Load::uneven, -1, -1, false, "", "odd tiles"},
      {2048, 768, 16, 8, 600, A::fp8, W::nvfp4, kNone, Load::uneven, -1, -1, false, "", "qwen3-30b"},
      {4096, 14336, 2, 1, 300, A::bf16, W::nvfp4, kNone, Load::uniform, -1, 16, false, "", "mixtral"},
      {1024, 512, 8, 4, 300, A::bf16, W::nvfp4, kNone, Load::one_expert, -1, -1, false, "", "one expert"},
      {1024, 512, 8, 2, 16, A::bf16, W::nvfp4, kNone, Load::uniform, 1, -1, false, "", "T=1"},
      {7168, 2048, 8, 2, 4096, A::bf16, W::nvfp4, kNone, Load::uniform, -1, 24, false, "", "deepseek-v3 large M"},
  };
  uint32_t seed = 1900;
  for (const Problem& p : problems) run_nvfp4w_problem(p, seed++);
}

// The automatic choice with paired copies (prepare, tuning.nvfp4_mixed), on small experts (H 256,
// I 128): the wide engine up to policy::kNvfp4WideMaxRowsPairedSmall (96) expected rows per expert,
// nvfp4w above at any M, and with few local experts (4, under kSplitMinExperts) nvfp4w right after
// the decode engine; without the copies the wide engine keeps its own bound (512 for small experts)
// and widened CUTLASS follows. Each run also against the reference.
TEST(CutlassEngine, PairedNvfp4AutomaticChoice) {
  EPMOE_REQUIRE_GPU();
  EPMOE_REQUIRE_CUTLASS();
  struct Case {
    int E, C;  // expected rows per expert C * 2 / E
    bool mixed;
    const char* expect;
  };
  const char* wide = "wgmma-nvfp4w/wgmma-nvfp4w";
  const std::vector<Case> cases = {
      {16, 768, true, wide},  // 96 rows
      {16, 784, true, "cutlass-nvfp4w-swap128/cutlass-nvfp4w-swap128"},  // 98 rows
      {16, 784, false, wide},
      {4, 80, true, "cutlass-nvfp4w-swap64/cutlass-nvfp4w-swap64"},  // 40 rows, few experts
      {4, 80, false, wide},
      {16, 4800, true, "cutlass-nvfp4w-swap256/cutlass-nvfp4w-swap256"},  // 600 rows
      {16, 4800, false, "cutlass-bf16(widened nvfp4)/cutlass-bf16(widened nvfp4)"},
  };
  uint32_t seed = 2900;
  for (const Case& c : cases) {
    const Problem p{256, 128, c.E, 2, c.C, A::bf16, W::nvfp4, kNone, Load::uniform, -1, -1, false, "", "choice"};
    SCOPED_TRACE("E " + std::to_string(c.E) + " C " + std::to_string(c.C) + (c.mixed ? " paired" : " no paired copy"));
    const ProblemData data(p, seed++);
    MoeConfig cfg = data.cfg;
    cfg.tuning.nvfp4_mixed = c.mixed;
    cuda::CudaRunner runner(cfg, 0);
    ExpertWeights w = data.wt.on_device;
    runner.prepare(w, nullptr);
    Dev<bf16_raw> y(size_t(p.C) * p.H);
    y.poison();
    runner.run(data.dd.view, w, y.get(), nullptr);
    EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(std::string(runner.last_engines()), c.expect);
    const auto out = y.download();
    expect_poison_after(out, data.n, p.H);
    expect_near_reference(p, data, out, "nvfp4 choice");
  }
}

}  // namespace
}  // namespace epmoe::test
