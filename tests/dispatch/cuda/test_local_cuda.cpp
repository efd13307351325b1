// The "local" CUDA dispatcher vs the CPU plan oracle (src/dispatch/plan.h): payload, scales, ids,
// weights, counts and expert_counts bitwise equal; combine vs combine_sum bitwise. Contiguous and
// explicit placements, all formats, tokens with no expert, a smaller second dispatch (stale slots
// must turn invalid), T = 0, T = 1, skewed routing, bad ids and T > C.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "combine/reduce.h"
#include "dispatch/cuda/local.h"
#include "dispatch/plan.h"
#include "epmoe/error.h"
#include "epmoe/quant.h"
#include "common/gpu_test_util.h"

namespace epmoe::test {
namespace {

struct Inputs {
  int64_t T;
  std::vector<bf16_raw> x;
  std::vector<int32_t> ids;
  std::vector<float> w;
};

Inputs make_inputs(const MoeConfig& cfg, int64_t T, std::mt19937& rng, bool skew) {
  Inputs in{T, random_bf16(rng, T, cfg.hidden), {}, {}};
  std::uniform_real_distribution<float> u(0.f, 1.f);
  in.ids.resize(size_t(T) * cfg.top_k);
  in.w.resize(size_t(T) * cfg.top_k);
  for (int64_t t = 0; t < T; ++t) {
    const bool none = u(rng) < 0.1f;  // a token that goes nowhere
    std::vector<int32_t> perm(cfg.num_experts);
    for (int e = 0; e < cfg.num_experts; ++e) perm[e] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int k = 0; k < cfg.top_k; ++k) {
      int32_t id = none || u(rng) < 0.1f ? -1 : perm[k];
      if (skew && id >= 0) id = k == 0 ? 0 : -1;  // everything to expert 0
      in.ids[t * cfg.top_k + k] = id;
      in.w[t * cfg.top_k + k] = u(rng);
    }
  }
  return in;
}

MoeConfig config(int E, int K, int H, int C, ActFormat f, ActFormat comb, bool ue8m0) {
  MoeConfig c;
  c.hidden = H;
  c.intermediate = 128;
  c.num_experts = E;
  c.top_k = K;
  c.num_ranks = 1;
  c.capacity = C;
  c.dispatch_format = f;
  c.combine_format = comb;
  c.fp8_ue8m0 = ue8m0;
  c.nvfp4_global_scale = 448.f * 6.f / 30.f;
  c.dispatcher = "local";
  c.runner = "cuda";
  return c;
}

void check_round(cuda::LocalCudaDispatcher& d, const MoeConfig& cfg, const Inputs& in, std::mt19937& rng) {
  const int H = cfg.hidden, K = cfg.top_k, C = cfg.capacity;
  const ExpertPlacement place = cfg.resolved_placement();
  const int E_loc = place.slots_per_rank();
  const ActFormat f = cfg.dispatch_format;
  const QuantParams qp = cfg.quant_params();
  // Oracle.
  const detail::DispatchPlan plan = detail::make_dispatch_plan(place, 0, in.ids.data(), in.T, K);
  std::vector<uint8_t> enc_p(size_t(in.T) * payload_bytes(f, H)), enc_s(size_t(in.T) * scale_bytes(f, H));
  quantize_rows(f, qp, in.x.data(), in.T, H, enc_p.data(), enc_s.data());
  detail::HostRecvBuffers ref;
  ref.allocate(1, C, H, K, E_loc, f);
  detail::write_region(plan, 0, 0, enc_p.data(), f == ActFormat::bf16 ? nullptr : enc_s.data(), in.w.data(), ref);
  ref.counts[0] = plan.send_counts[0];
  detail::finalize_receive(ref);

  Dev<bf16_raw> x(in.x);
  Dev<int32_t> ids(in.ids);
  Dev<float> w(in.w);
  DispatchInput di;
  di.num_tokens = in.T;
  di.hidden = x.get();
  di.topk_ids = ids.get();
  di.topk_weights = w.get();
  const DispatchOutput out = d.dispatch(di);
  EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
  d.check_errors(true);
  auto dl = [](const void* p, size_t bytes) {
    std::vector<uint8_t> h(bytes);
    if (bytes) EPMOE_CUDA_CHECK(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost));
    return h;
  };
  const int32_t n = ref.counts[0];
  std::vector<int32_t> counts(1);
  EPMOE_CUDA_CHECK(cudaMemcpy(counts.data(), out.counts, 4, cudaMemcpyDeviceToHost));
  ASSERT_EQ(counts[0], n);
  const auto pay = dl(out.payload, size_t(n) * out.payload_stride());
  EXPECT_EQ(first_diff(pay, std::vector<uint8_t>(ref.payload.begin(), ref.payload.begin() + pay.size())), -1);
  if (f != ActFormat::bf16) {
    const auto sc = dl(out.scales, size_t(n) * out.scale_stride());
    EXPECT_EQ(first_diff(sc, std::vector<uint8_t>(ref.scales.begin(), ref.scales.begin() + sc.size())), -1);
  }
  std::vector<int32_t> lid(size_t(C) * K), ec(E_loc);
  std::vector<float> lw(size_t(C) * K);
  EPMOE_CUDA_CHECK(cudaMemcpy(lid.data(), out.local_ids, lid.size() * 4, cudaMemcpyDeviceToHost));
  EPMOE_CUDA_CHECK(cudaMemcpy(lw.data(), out.weights, lw.size() * 4, cudaMemcpyDeviceToHost));
  EPMOE_CUDA_CHECK(cudaMemcpy(ec.data(), out.expert_counts, ec.size() * 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(first_diff(lid, ref.local_ids), -1);
  EXPECT_EQ(first_diff(lw, ref.weights), -1);
  EXPECT_EQ(ec, ref.expert_counts);

  // Combine: random y in every slot (invalid ones must not matter), poisoned output.
  const auto y = random_bf16(rng, C, H);
  Dev<bf16_raw> dy(y), dout(size_t(in.T) * H);
  dout.poison();
  CombineInput ci;
  ci.y = dy.get();
  d.combine(ci, dout.get());
  EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
  const ActFormat cf = cfg.combine_format;
  std::vector<uint8_t> cp(size_t(C) * payload_bytes(cf, H)), cs(std::max<size_t>(1, size_t(C) * scale_bytes(cf, H)));
  detail::encode_combine_rows(cf, qp, y.data(), C, H, cp.data(), cs.data());
  std::vector<bf16_raw> out_ref(size_t(in.T) * H);
  detail::combine_sum(cf, qp, H, C, plan, cp.data(), cs.data(), out_ref.data());
  EXPECT_EQ(first_diff(dout.download(), out_ref), -1) << "combine";
}

TEST(CudaLocalDispatch, MatchesPlanOracleBitwise) {
  EPMOE_REQUIRE_GPU();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  struct Shape {
    int E, K, H, C;
  };
  // gpt-oss's H = 2880: a partial last fp8 block in dispatch and combine.
  for (const Shape s : {Shape{256, 8, 7168, 96}, Shape{128, 8, 4096, 64}, Shape{8, 2, 4096, 50}, Shape{16, 4, 2880, 40}}) {
    for (ActFormat f : {ActFormat::bf16, ActFormat::fp8, ActFormat::nvfp4}) {
      const ActFormat comb = f == ActFormat::fp8 ? ActFormat::fp8 : ActFormat::bf16;
      MoeConfig cfg = config(s.E, s.K, s.H, s.C, f, comb, f == ActFormat::fp8 && s.E == 128);
      SCOPED_TRACE(std::string(format_name(f)) + " E=" + std::to_string(s.E));
      cuda::LocalCudaDispatcher d(cfg, 0);
      check_round(d, cfg, make_inputs(cfg, s.C, rng, false), rng);      // full
      check_round(d, cfg, make_inputs(cfg, s.C / 3, rng, false), rng);  // fewer: stale slots invalid
      check_round(d, cfg, make_inputs(cfg, 1, rng, false), rng);
      check_round(d, cfg, make_inputs(cfg, 0, rng, false), rng);
      check_round(d, cfg, make_inputs(cfg, s.C, rng, true), rng);       // skewed
    }
  }
}

TEST(CudaLocalDispatch, ExplicitPlacementWithRedundantCopies) {
  EPMOE_REQUIRE_GPU();
  std::mt19937 rng(7);
  MoeConfig cfg = config(16, 4, 2048, 40, ActFormat::fp8, ActFormat::bf16, false);
  std::vector<std::vector<ExpertCopy>> copies(16);
  for (int e = 0; e < 16; ++e) copies[e] = {ExpertCopy{0, 15 - e}};
  copies[3].push_back(ExpertCopy{0, 16});  // a second copy of a hot expert
  copies[5].push_back(ExpertCopy{0, 17});
  cfg.placement = ExpertPlacement::explicit_map(1, 18, copies);
  cuda::LocalCudaDispatcher d(cfg, 0);
  check_round(d, cfg, make_inputs(cfg, 40, rng, false), rng);
  check_round(d, cfg, make_inputs(cfg, 13, rng, false), rng);
}

TEST(CudaLocalDispatch, RejectsBadInput) {
  EPMOE_REQUIRE_GPU();
  std::mt19937 rng(3);
  MoeConfig cfg = config(16, 2, 256, 8, ActFormat::bf16, ActFormat::bf16, false);
  cuda::LocalCudaDispatcher d(cfg, 0);
  Inputs in = make_inputs(cfg, 8, rng, false);
  in.ids[5] = 16;  // out of range
  Dev<bf16_raw> x(in.x);
  Dev<int32_t> ids(in.ids);
  Dev<float> w(in.w);
  DispatchInput di;
  di.num_tokens = 8;
  di.hidden = x.get();
  di.topk_ids = ids.get();
  di.topk_weights = w.get();
  d.dispatch(di);
  EXPECT_THROW(d.check_errors(true), UsageError);
  di.num_tokens = 9;  // > C
  EXPECT_THROW(d.dispatch(di), UsageError);
}

}  // namespace
}  // namespace epmoe::test
