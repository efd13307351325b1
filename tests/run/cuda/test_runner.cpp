// Runner "cuda" vs the CPU reference runner on the same DispatchOutput (DESIGN.md §6): fresh random
// data of DeepSeek-V3, Qwen3 and Mixtral expert shapes, every weight format, both m-tile sizes,
// skewed loads (everything on one expert, experts without tokens), T = 0 and T = 1, and the fp8
// intermediate. The bound is stated here: max|a-b|/max|ref| <= 3e-2 and 1-cos <= 1e-3, which
// covers the runner's bf16 roundings (activations, intermediate, expert outputs, fp8 weights times
// their scale) against the reference's fp32; a wrong row, expert or scale is far outside it. With an
// fp8 intermediate the max bound is 6e-2 (runner_test_util.h says why); 1-cos stays 1e-3.
// Slots that are not valid must be left untouched (they keep their poison).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "epmoe/error.h"
#include "epmoe/quant.h"
#include "common/gpu_test_util.h"
#include "run/cuda/engine.h"
#include "run/cuda/runner.h"
#include "run/cuda/runner_test_util.h"
#include "run/reference.h"

namespace epmoe::test {
namespace {

struct Problem {
  int H, I, E, K, C;
  ActFormat act;
  WeightFormat wf;
  IntermediateQuant iq = IntermediateQuant::none;
  int bm = 0;          // 0 = automatic
  int64_t T = -1;      // tokens (-1 = C)
  bool skew = false;   // all pairs on expert 0
  const char* name = "";
  bool wgmma = true;   // decode (m-tile 32) GEMMs on the wgmma engine; false: mma.sync
};

// The nvfp4 decode engine on prepared weights (cuda::prepare_nvfp4_weights) runs the same
// arithmetic in the same order as on the natural layout: the same runner call must give the same
// bits, and say so in its engine names. Prepared copies also exist for K % 128 == 64 (the prepared
// engines run a last half stage), where the natural layout ran mma.sync: there the prepared run is
// held to the reference bound instead.
void expect_prepared_equal(const Problem& p, cuda::CudaRunner& runner, const DispatchOutput& dout,
                           const ExpertWeights& dw, const std::vector<bf16_raw>& natural,
                           const std::vector<bf16_raw>& y_ref, int n) {
  SCOPED_TRACE("prepared nvfp4 weights");
  const int H = p.H, I = p.I;
  const bool nat1 = cuda::wgmma_nvfp4_supports(H, I, true), nat2 = cuda::wgmma_nvfp4_supports(I, H, false);
  const bool ok1 = cuda::wgmma_nvfp4_supports(H, I, true, true), ok2 = cuda::wgmma_nvfp4_supports(I, H, false, true);
  if (!ok1 && !ok2) return;  // neither GEMM is on the engine
  // Through the public helper; its buffers are poisoned first so that every prepared byte it
  // leaves unwritten would show.
  ExpertWeights pw = dw;
  cuda::DeviceBuffer b13, b2;
  if (ok1) b13.reserve(cuda::nvfp4_prepared_bytes(dw.w13, true, I));
  if (ok2) b2.reserve(cuda::nvfp4_prepared_bytes(dw.w2, false, H));
  if (ok1) EPMOE_CUDA_CHECK(cudaMemset(b13.get(), 0xff, b13.size()));
  if (ok2) EPMOE_CUDA_CHECK(cudaMemset(b2.get(), 0xff, b2.size()));
  const size_t bytes = cuda::prepare_nvfp4_weights(pw, b13, b2, nullptr);
  EXPECT_EQ(bytes, (ok1 ? b13.size() : 0) + (ok2 ? b2.size() : 0));
  EXPECT_EQ(pw.w13.prepared != nullptr, ok1);
  EXPECT_EQ(pw.w2.prepared != nullptr, ok2);
  Dev<bf16_raw> y(natural.size());
  y.poison();
  runner.run(dout, pw, y.get(), nullptr);
  EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
  const auto yp = y.download();
  const std::string e = runner.last_engines();
  EXPECT_EQ(e, std::string(ok1 ? "wgmma-nvfp4p" : "mma") + "/" + (ok2 ? "wgmma-nvfp4p" : "mma"));
  if (nat1 == ok1 && nat2 == ok2) {
    size_t differ = 0;
    for (size_t i = 0; i < size_t(n) * H; ++i) differ += yp[i] != natural[i];
    EXPECT_EQ(differ, 0u) << "of " << size_t(n) * H << " outputs differ from the natural-layout engine's";
  } else {
    const Diff d = compare_rows(yp, y_ref, n, H);
    std::printf("[runner] %-22s prepared, half stage: %-26s max|a-b|/max|ref| %.3e  1-cos %.3e\n", p.name, e.c_str(),
                d.rel(), d.one_minus_cos);
    expect_within_bound(d, make_cfg(p).effective_intermediate_quant());
  }
  expect_poison_after(yp, n, H);
}

// both_decode_engines: run the runner twice on the same data and reference, decode GEMMs on the
// wgmma engines and then on mma.sync (the CPU reference, the slow part, is computed once).
void run_problem(const Problem& p, uint32_t seed, bool both_decode_engines = false) {
  SCOPED_TRACE(std::string(p.name) + " act " + format_name(p.act) + " weights " + format_name(p.wf) + " seed " +
               std::to_string(seed));
  std::mt19937 rng(seed);
  const MoeConfig cfg = make_cfg(p);
  const int H = p.H, I = p.I, E = p.E, K = p.K, C = p.C;
  const int64_t T = p.T < 0 ? C : p.T;
  // Weights ~ N(0, 1/sqrt(fan_in)).
  const TestWeights wt(rng, E, H, I, p.wf);
  const ExpertWeights &hw = wt.on_host, &dw = wt.on_device;

  // Tokens: x ~ N(0, 1) (scaled per row), K distinct experts (or all on expert 0), some -1.
  const auto x = random_bf16(rng, T, H);
  std::vector<int32_t> ids(size_t(T) * K);
  std::vector<float> tw(size_t(T) * K);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> perm(E);
    for (int e = 0; e < E; ++e) perm[e] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int k = 0; k < K; ++k) {
      ids[t * K + k] = p.skew ? (k == 0 ? 0 : -1) : (u(rng) < 0.1f ? -1 : perm[k]);
      // Experts E-1 and E-2 get no tokens at all when E > K + 2 (empty groups).
      if (!p.skew && E > K + 2 && ids[t * K + k] >= E - 2) ids[t * K + k] = -1;
      tw[t * K + k] = u(rng);
    }
  }
  const detail::HostRecvBuffers recv = local_receive(cfg, x, T, ids, tw);
  const int n = recv.counts[0];

  // Reference.
  std::vector<bf16_raw> y_ref(size_t(C) * H, 0);
  detail::ReferenceRunner ref(cfg);
  ref.run(recv.view(cfg.quant_params()), hw, y_ref.data(), nullptr);

  // Device copy of the same DispatchOutput.
  DevDispatch dd(recv, cfg.quant_params());
  const DispatchOutput& dout = dd.view;
  const std::vector<bool> modes = both_decode_engines ? std::vector<bool>{true, false} : std::vector<bool>{p.wgmma};
  for (const bool wgmma : modes) {
    SCOPED_TRACE(wgmma ? "decode GEMMs on wgmma" : "decode GEMMs on mma.sync");
    Dev<bf16_raw> y(size_t(C) * H);
    y.poison();
    cuda::CudaRunner runner(cfg, 0);
    runner.set_block_m(p.bm);
    // An explicit m-tile tests the mma.sync / decode wgmma kernels: keep CUTLASS (which the
    // automatic rule picks from 33 rows per expert on) out of it. bm = 0 runs the automatic choice.
    if (p.bm != 0) runner.set_engine(cuda::CudaRunner::Engine::mma);
    runner.set_wgmma_decode(wgmma);
    runner.run(dout, dw, y.get(), nullptr);
    EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
    const auto yg = y.download();

    const Diff d = compare_rows(yg, y_ref, n, H);
    std::printf("[runner] %-22s act %-5s w %-5s bm %3d %-22s n=%d  max|a-b|/max|ref| %.3e  1-cos %.3e\n", p.name,
                format_name(p.act), format_name(p.wf), runner.last_block_m(), runner.last_engines(), n, d.rel(),
                d.one_minus_cos);
    // nvfp4 weights in decode take the register-decode wgmma engine wherever its K % 128 rule allows.
    if (p.wf == WeightFormat::nvfp4 && wgmma && runner.last_block_m() == 32) {
      const std::string e = runner.last_engines();
      EXPECT_EQ(e.substr(0, e.find('/')), H % 128 == 0 ? "wgmma-nvfp4" : "mma");
      EXPECT_EQ(e.substr(e.find('/') + 1), p.I % 128 == 0 ? "wgmma-nvfp4" : "mma");
    }
    // fp8 weights in decode with e4m3 operands take the wgmma fp8 engine, also where K ends on a
    // partial 128-block (H or I % 128 == 64): GEMM1 with an fp8 dispatch, GEMM2 with an fp8
    // intermediate.
    if (p.wf == WeightFormat::fp8 && wgmma && runner.last_block_m() == 32) {
      const std::string e = runner.last_engines();
      if (p.act == ActFormat::fp8) EXPECT_EQ(e.substr(0, e.find('/')), "wgmma-fp8") << e;
      if (cfg.effective_intermediate_quant() == IntermediateQuant::fp8)
        EXPECT_EQ(e.substr(e.find('/') + 1), "wgmma-fp8") << e;
    }
    // intermediate_quant auto on fp8 weights resolves to fp8: GEMM2 on an fp8 x fp8 engine wherever
    // one runs it (decode wgmma at m-tile 32, or CUTLASS, partial 128-tiles included).
    if (p.iq == IntermediateQuant::automatic && p.wf == WeightFormat::fp8) {
      const std::string e = runner.last_engines(), g2 = e.substr(e.find('/') + 1);
      if (wgmma && runner.last_block_m() == 32) EXPECT_EQ(g2, "wgmma-fp8") << e;
      // Swapped or not (cutlass-fp8, -swap64, -swap128), never widened.
      if (g2.rfind("cutlass", 0) == 0) EXPECT_EQ(g2.rfind("cutlass-fp8", 0), 0u) << e;
    }
    expect_within_bound(d, cfg.effective_intermediate_quant());
    expect_poison_after(yg, n, H);
    // The same call again with one switch off (set(false), then back on) gives the same bits.
    auto same_bits_without = [&](const char* what, auto set) {
      SCOPED_TRACE(std::string(what) + " off");
      Dev<bf16_raw> y0(size_t(C) * H);
      y0.poison();
      set(false);
      runner.run(dout, dw, y0.get(), nullptr);
      EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
      set(true);
      EXPECT_EQ(first_diff(y0.download(), yg), -1) << what << ": on and off differ";
    };
    // The decode GEMM1 reads the dispatch buffer where its engine takes the rows as dispatched
    // (wgmma bf16 on a bf16 dispatch, wgmma fp8 on an fp8 one), with the same bits as from the
    // permute.
    const std::string g1 = runner.last_engines();
    const bool direct_expected = wgmma && runner.last_block_m() == 32 &&
                                 ((p.act == ActFormat::bf16 && g1.rfind("wgmma-bf16", 0) == 0) ||
                                  (p.act == ActFormat::fp8 && g1.rfind("wgmma-fp8", 0) == 0));
    EXPECT_EQ(runner.last_direct_rows(), direct_expected) << g1;
    if (runner.last_direct_rows())
      same_bits_without("GEMM1 reading the dispatch buffer", [&](bool on) { runner.set_direct_rows(on); });
    // Programmatic dependent launch (tuning.pdl, on by default) only moves launches.
    ASSERT_TRUE(runner.pdl());
    same_bits_without("pdl", [&](bool on) { runner.set_pdl(on); });
    if (p.wf == WeightFormat::nvfp4 && wgmma && runner.last_block_m() == 32) expect_prepared_equal(p, runner, dout, dw, yg, y_ref, n);
  }
}

TEST(CudaRunner, MatchesReferenceOnModelShapes) {
  EPMOE_REQUIRE_GPU();
  uint32_t seed = std::random_device{}();
  using A = ActFormat;
  using W = WeightFormat;
  const std::vector<Problem> problems = {
      {7168, 2048, 4, 2, 6, A::fp8, W::fp8, IntermediateQuant::none, 0, -1, false, "deepseek-v3"},
      {7168, 2048, 4, 2, 6, A::bf16, W::bf16, IntermediateQuant::none, 0, -1, false, "deepseek-v3"},
      {7168, 2048, 4, 2, 5, A::nvfp4, W::nvfp4, IntermediateQuant::none, 0, -1, false, "deepseek-v3"},
      {2048, 768, 16, 8, 24, A::bf16, W::bf16, IntermediateQuant::none, 0, -1, false, "qwen3-30b"},
      {2048, 768, 16, 8, 24, A::fp8, W::fp8, IntermediateQuant::fp8, 0, -1, false, "qwen3-30b iq=fp8"},
      {2048, 768, 16, 8, 24, A::nvfp4, W::fp8, IntermediateQuant::none, 128, -1, false, "qwen3-30b bm128"},
      {2048, 768, 16, 8, 20, A::fp8, W::nvfp4, IntermediateQuant::none, 0, -1, false, "qwen3-30b"},
      {4096, 1536, 8, 8, 12, A::bf16, W::fp8, IntermediateQuant::none, 0, -1, false, "qwen3-235b"},
      {4096, 14336, 2, 2, 3, A::bf16, W::bf16, IntermediateQuant::none, 0, -1, false, "mixtral"},
      {4096, 14336, 2, 2, 3, A::fp8, W::nvfp4, IntermediateQuant::none, 0, -1, false, "mixtral"},
  };
  for (const Problem& p : problems) run_problem(p, seed++);
}

TEST(CudaRunner, SkewedLoadsAndTinyBatches) {
  EPMOE_REQUIRE_GPU();
  uint32_t seed = std::random_device{}();
  using A = ActFormat;
  using W = WeightFormat;
  const std::vector<Problem> problems = {
      // 300 rows on one expert: several m-tiles of both sizes, 15 experts idle.
      {2048, 768, 16, 4, 300, A::bf16, W::bf16, IntermediateQuant::none, 128, -1, true, "skew bm128"},
      {2048, 768, 16, 4, 300, A::fp8, W::fp8, IntermediateQuant::none, 32, -1, true, "skew bm32"},
      {2048, 768, 16, 4, 200, A::nvfp4, W::nvfp4, IntermediateQuant::none, 128, -1, true, "skew nvfp4"},
      {2048, 768, 16, 8, 16, A::fp8, W::fp8, IntermediateQuant::none, 0, 1, false, "T=1"},
      // The nvfp4 register-decode engine and its token K-order pass, here too so that the
      // compute-sanitizer run of scripts/gpu_check.sh (which takes this test) covers them: one row
      // per expert leaves 31 of 32 token rows of each m-tile uncopied.
      {2048, 768, 16, 8, 16, A::bf16, W::nvfp4, IntermediateQuant::none, 0, 1, false, "T=1 nvfp4"},
      {2048, 768, 16, 8, 16, A::fp8, W::bf16, IntermediateQuant::none, 0, 0, false, "T=0"},
      {256, 128, 16, 4, 64, A::bf16, W::bf16, IntermediateQuant::none, 0, -1, false, "tiny"},
      {2880, 2880, 4, 4, 10, A::bf16, W::fp8, IntermediateQuant::none, 0, -1, false, "gpt-oss (H%128!=0)"},
      // More than 65536 (slot, k) pairs: the multi-CTA count and the separate scan (fewer pairs
      // count and scan in one CTA, every other problem here).
      {256, 128, 16, 8, 9000, A::bf16, W::bf16, IntermediateQuant::none, 0, -1, false, "many pairs"},
  };
  for (const Problem& p : problems) run_problem(p, seed++);
}

// The decode engines (m-tile 32): wgmma bf16, fp8 x fp8 wgmma for GEMM1 (fp8 dispatch) and GEMM2
// (intermediate_quant = fp8), and the mma.sync engine on the same data (one reference for both). Shapes cover several
// m-tiles per expert (up to 70 rows on one expert), a partial last n-tile of GEMM2 (H = 2880 is not
// a multiple of 128, bf16 only), I = 768 (GEMM1 n-tiles of 64 whose up rows start mid 128-block),
// and 64 experts with top-1.
TEST(CudaRunner, DecodeEnginesMatchReference) {
  EPMOE_REQUIRE_GPU();
  uint32_t seed = std::random_device{}();
  using A = ActFormat;
  using W = WeightFormat;
  using IQ = IntermediateQuant;
  const std::vector<Problem> problems = {
      {7168, 2048, 4, 2, 12, A::fp8, W::fp8, IQ::fp8, 32, -1, false, "dsv3 fp8 iq=fp8"},
      {7168, 2048, 4, 2, 12, A::fp8, W::fp8, IQ::none, 32, -1, false, "dsv3 fp8"},
      {7168, 2048, 4, 2, 12, A::bf16, W::bf16, IQ::none, 32, -1, false, "dsv3 bf16"},
      {2048, 768, 16, 8, 40, A::fp8, W::fp8, IQ::fp8, 32, -1, false, "qwen3 fp8 iq=fp8"},
      {2048, 768, 16, 8, 40, A::bf16, W::fp8, IQ::fp8, 32, -1, false, "qwen3 bf16-act iq=fp8"},
      {2048, 768, 16, 8, 40, A::nvfp4, W::bf16, IQ::none, 32, -1, false, "qwen3 nvfp4-act"},
      {2048, 768, 16, 4, 70, A::fp8, W::fp8, IQ::fp8, 32, -1, true, "skew fp8 iq=fp8"},
      {2048, 768, 16, 4, 70, A::bf16, W::bf16, IQ::none, 32, -1, true, "skew bf16"},
      {2880, 2880, 4, 4, 10, A::bf16, W::bf16, IQ::none, 32, -1, false, "gpt-oss bf16"},
      // fp8 W13 with gate and up tiled apart at a partial tile (I % 128 = 64, row_split = I): wgmma
      // fp8 GEMM1 (fp8 dispatch) and the mma.sync engine; gpt-oss with every dimension partial.
      {2048, 576, 4, 2, 12, A::fp8, W::fp8, IQ::none, 32, -1, false, "fp8 I%128=64"},
      {2880, 2880, 4, 4, 10, A::bf16, W::fp8, IQ::none, 32, -1, false, "gpt-oss fp8"},
      // fp8 activations and intermediate with a partial last 128-block (K % 128 == 64 in both
      // GEMMs): the wgmma fp8 engine's partial last stage.
      {2880, 2880, 4, 4, 10, A::fp8, W::fp8, IQ::fp8, 32, -1, false, "gpt-oss fp8-act iq=fp8"},
      {2880, 2880, 4, 4, 10, A::fp8, W::fp8, IQ::none, 32, -1, false, "gpt-oss fp8-act"},
      {320, 192, 8, 2, 24, A::fp8, W::fp8, IQ::fp8, 32, -1, false, "H=320 I=192 fp8-act iq=fp8"},
      {1024, 512, 64, 1, 64, A::fp8, W::fp8, IQ::fp8, 32, -1, false, "E=64 K=1"},
      {7168, 2048, 4, 2, 12, A::bf16, W::nvfp4, IQ::none, 32, -1, false, "dsv3 nvfp4"},
      {7168, 2048, 4, 2, 12, A::nvfp4, W::nvfp4, IQ::none, 32, -1, false, "dsv3 nvfp4 nvfp4-act"},
      {2048, 768, 16, 8, 40, A::nvfp4, W::nvfp4, IQ::none, 32, -1, false, "qwen3 nvfp4 nvfp4-act"},
      {4096, 1536, 16, 8, 20, A::bf16, W::nvfp4, IQ::fp8, 32, 13, false, "qwen3-235b nvfp4 iq=fp8"},
      {2048, 768, 16, 4, 70, A::bf16, W::nvfp4, IQ::none, 32, -1, true, "skew nvfp4"},
      {1024, 576, 8, 2, 16, A::nvfp4, W::nvfp4, IQ::none, 32, -1, false, "nvfp4 wgmma/mma mix"},
      // GEMM1 on mma.sync (H % 128 != 0), GEMM2 on the nvfp4 engine: its tokens (the intermediate)
      // are put into that engine's K order in place instead of by GEMM1's epilogue.
      {2880, 768, 8, 2, 16, A::bf16, W::nvfp4, IQ::fp8, 32, -1, false, "nvfp4 mma/wgmma mix iq=fp8"},
      {2880, 2880, 4, 4, 10, A::bf16, W::nvfp4, IQ::none, 32, -1, false, "gpt-oss nvfp4 (mma)"},
  };
  for (const Problem& p : problems) run_problem(p, seed++, /*both_decode_engines=*/true);
}

// The default intermediate_quant (auto) follows the weights: fp8 weights run GEMM2 on fp8 tensor
// cores (checked in run_problem) against a reference that rounds the intermediate the same way;
// bf16 and nvfp4 weights keep a bf16 intermediate. Decode (m-tile 32, both decode engines) and the
// automatic engine choice at 150 rows per expert (CUTLASS where the build has it).
TEST(CudaRunner, AutoIntermediateQuantFollowsTheWeights) {
  EPMOE_REQUIRE_GPU();
  uint32_t seed = std::random_device{}();
  using A = ActFormat;
  using W = WeightFormat;
  const IntermediateQuant au = IntermediateQuant::automatic;
  const std::vector<Problem> decode = {
      {7168, 2048, 4, 2, 12, A::fp8, W::fp8, au, 32, -1, false, "dsv3 fp8 iq=auto"},
      {2048, 768, 16, 8, 40, A::bf16, W::fp8, au, 32, -1, false, "qwen3 bf16-act fp8 iq=auto"},
      {2048, 768, 16, 8, 40, A::bf16, W::bf16, au, 32, -1, false, "qwen3 bf16 iq=auto"},
      {2048, 768, 16, 8, 40, A::bf16, W::nvfp4, au, 32, -1, false, "qwen3 nvfp4 iq=auto"},
  };
  for (const Problem& p : decode) run_problem(p, seed++, /*both_decode_engines=*/true);
  run_problem({2048, 768, 16, 8, 300, A::fp8, W::fp8, au, 0, -1, false, "qwen3 fp8 iq=auto large M"}, seed++);
  // I % 128 == 64: auto is fp8 there too; past decode both GEMMs run on CUTLASS fp8 with partial
  // tiles (W13 as its gate and up halves) and the SwiGLU pass quantizes a partial last block.
  run_problem({2880, 2880, 4, 4, 60, A::fp8, W::fp8, au, 0, -1, false, "gpt-oss fp8 iq=auto large M"}, seed++);
  run_problem({320, 192, 4, 2, 200, A::fp8, W::fp8, au, 0, -1, false, "H=320 I=192 fp8 iq=auto large M"}, seed++);
}

TEST(CudaRunner, RejectsMismatchedWeights) {
  EPMOE_REQUIRE_GPU();
  Problem p{256, 128, 4, 2, 4, ActFormat::bf16, WeightFormat::bf16};
  const MoeConfig cfg = make_cfg(p);
  cuda::CudaRunner runner(cfg, 0);
  std::vector<float> w(size_t(4) * 256 * 256, 0.01f);
  const HostMatrix h13 = quantize_matrix(w.data(), 4, 256, 256, WeightFormat::bf16);  // rows should be 2I = 256: ok
  const HostMatrix h2 = quantize_matrix(w.data(), 4, 256, 64, WeightFormat::bf16);    // cols should be I = 128
  DevMatrix d13(h13), d2(h2);
  ExpertWeights dw{4, 256, 128, d13.view, d2.view};
  DispatchOutput in;
  in.num_ranks = 1;
  in.capacity = 4;
  in.hidden = 256;
  in.top_k = 2;
  in.num_local_experts = 4;
  in.device = DeviceKind::cuda;
  Dev<bf16_raw> y(4 * 256);
  EXPECT_THROW(runner.run(in, dw, y.get(), nullptr), UsageError);
}


// The prepare step (Runner::prepare, called by MoeLayer): nvfp4 weights get the decode engine's
// prepared copies, owned by the runner, with tuning.nvfp4_prepare; other formats, and nvfp4 with
// the option off, are left as they are. The copies give the same bits as the natural layout
// (expect_prepared_equal) and say so in the engine names.
TEST(CudaRunner, PrepareStep) {
  EPMOE_REQUIRE_GPU();
  std::mt19937 rng(11);
  const int H = 256, I = 128, E = 4;
  for (const WeightFormat wf : {WeightFormat::nvfp4, WeightFormat::bf16, WeightFormat::fp8}) {
    for (const bool on : {true, false}) {
      SCOPED_TRACE(std::string(format_name(wf)) + (on ? " prepare on" : " prepare off"));
      Problem p{H, I, E, 2, 8, ActFormat::bf16, wf};
      MoeConfig cfg = make_cfg(p);
      cfg.tuning.nvfp4_prepare = on;
      cfg.tuning.fp8_mixed = on;
      cfg.tuning.nvfp4_mixed = on;
      const TestWeights wt(rng, E, H, I, wf);
      ExpertWeights w = wt.on_device;
      cuda::CudaRunner runner(cfg, 0);
      const size_t bytes = runner.prepare(w, nullptr);
      if (wf == WeightFormat::nvfp4 && on) {
        // With nvfp4_mixed (and CUTLASS) the paired copies too, one byte per weight, and their
        // GEMMs' alpha (one float per expert and matrix).
        const size_t paired =
            cuda::cutlass_engine::available() ? size_t(E) * 3 * H * I + size_t(E) * 2 * sizeof(float) : 0;
        EXPECT_EQ(bytes, cuda::nvfp4_prepared_bytes(w.w13, true, I) + cuda::nvfp4_prepared_bytes(w.w2, false, H) + paired);
        EXPECT_NE(w.w13.prepared, nullptr);
        EXPECT_NE(w.w2.prepared, nullptr);
        EXPECT_EQ(w.w13.data, wt.on_device.w13.data) << "data and scales stay in use";
      } else if (wf == WeightFormat::fp8) {
        // W13's scales in the one-GEMM SwiGLU's order, whatever nvfp4_prepare says; with
        // fp8_mixed (and CUTLASS) both matrices' scales per weight row too, W2's as w2.prepared.
        const bool rows = on && cuda::cutlass_engine::available();
        const size_t row_bytes = cuda::cutlass_engine::fp8w_scales_bytes(E, 2 * I, H) +
                                 cuda::cutlass_engine::fp8w_scales_bytes(E, H, I);
        EXPECT_EQ(bytes, size_t(E) * 2 * (I / 64) * fp8_blocks(H) * sizeof(float) + (rows ? row_bytes : 0));
        EXPECT_NE(w.w13.prepared, nullptr);
        EXPECT_EQ(w.w2.prepared != nullptr, rows);
        EXPECT_EQ(w.w13.scales, wt.on_device.w13.scales) << "data and scales stay in use";
      } else {
        EXPECT_EQ(bytes, 0u);
        EXPECT_EQ(w.w13.prepared, nullptr);
        EXPECT_EQ(w.w2.prepared, nullptr);
      }
    }
  }
}

// fp8 weights on the CUTLASS one-GEMM SwiGLU: the scales prepare() reordered once give the bits of
// the per-call reordering (I 192: a tile's gate and up halves in different 128-row scale tiles);
// with a bf16 dispatch and intermediate (both GEMMs on the mixed-input GEMM) the row scales
// prepare() wrote give the bits of the per-call expansion.
void prepared_fp8_equal_per_call(ActFormat act, IntermediateQuant iq, const char* expect) {
  SCOPED_TRACE(expect);
  std::mt19937 rng(12);
  // 512 rows per expert: one unswapped launch, where the one-GEMM SwiGLU runs.
  Problem p{256, 192, 4, 2, 1024, act, WeightFormat::fp8, iq};
  const MoeConfig cfg = make_cfg(p);
  const TestWeights wt(rng, p.E, p.H, p.I, p.wf);
  const auto x = random_bf16(rng, p.C, p.H);
  std::vector<int32_t> ids(size_t(p.C) * p.K);
  std::vector<float> tw(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = int32_t((i + i / p.K) % p.E);  // K distinct experts per token
    tw[i] = 0.25f + 0.5f * float(i % 3);
  }
  const detail::HostRecvBuffers recv = local_receive(cfg, x, p.C, ids, tw);
  DevDispatch dd(recv, cfg.quant_params());
  std::vector<std::vector<bf16_raw>> out;
  std::vector<std::string> engines;
  for (const bool prep : {false, true}) {
    SCOPED_TRACE(prep ? "prepared" : "per call");
    ExpertWeights w = wt.on_device;
    cuda::CudaRunner runner(cfg, 0);
    runner.set_engine(cuda::CudaRunner::Engine::cutlass);
    if (prep) {
      ASSERT_GT(runner.prepare(w, nullptr), 0u);
      ASSERT_NE(w.w13.prepared, nullptr);
    }
    Dev<bf16_raw> y(size_t(p.C) * p.H);
    y.poison();
    runner.run(dd.view, w, y.get(), nullptr);
    EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
    out.push_back(y.download());
    engines.push_back(runner.last_engines());
    EXPECT_EQ(runner.last_swap_ab(), act == ActFormat::bf16);  // the mixed-input GEMM is swapped
    if (prep && act == ActFormat::bf16) EXPECT_NE(w.w2.prepared, nullptr);
  }
  EXPECT_EQ(engines[0], engines[1]);
  EXPECT_EQ(engines[0].rfind(expect, 0), 0u) << engines[0];
  const int n = recv.counts[0];
  EXPECT_EQ(std::memcmp(out[0].data(), out[1].data(), size_t(n) * p.H * sizeof(bf16_raw)), 0);
}

TEST(CudaRunner, PreparedFp8ScalesEqualPerCall) {
  EPMOE_REQUIRE_GPU();
  EPMOE_REQUIRE_CUTLASS();
  prepared_fp8_equal_per_call(ActFormat::fp8, IntermediateQuant::automatic, "cutlass-fp8/");
  prepared_fp8_equal_per_call(ActFormat::bf16, IntermediateQuant::none, "cutlass-fp8w-swap256/cutlass-fp8w-swap256");
}

}  // namespace
}  // namespace epmoe::test
