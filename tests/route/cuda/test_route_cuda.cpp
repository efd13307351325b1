// CUDA router vs route_cpu: ids and weights bitwise equal on fresh random logits of real model
// shapes, bf16 and f32 logits, ties, NaN rows, T = 0 and T = 1.
#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <string>
#include <vector>

#include "epmoe/error.h"
#include "epmoe/router.h"
#include "common/gpu_test_util.h"
#include "route/cuda/route.h"

namespace epmoe::test {
namespace {

struct Case {
  std::string name;
  RouterConfig cfg;
  int E, K;
  int64_t T;
  bool bf16_logits;
  int tie_levels;  // > 0: logits drawn from this few values (many ties)
  bool nan_rows;
  float offset = 0.f;  // added to every logit: -95 / -200 make every sigmoid underflow to 0
};

RouterConfig softmax(bool renorm) {
  RouterConfig c;
  c.kind = RouterKind::softmax_topk;
  c.renormalize = renorm;
  return c;
}
RouterConfig grouped(int ng, int tg, float rsf, bool renorm = true) {
  RouterConfig c;
  c.kind = RouterKind::sigmoid_grouped_topk;
  c.n_group = ng;
  c.topk_group = tg;
  c.routed_scaling_factor = rsf;
  c.renormalize = renorm;
  return c;
}

void run_case(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<float> lf(size_t(c.T) * c.E);
  for (auto& x : lf) x = (c.tie_levels ? float(int(rng() % c.tie_levels)) * 0.25f : nd(rng)) + c.offset;
  if (c.nan_rows && c.T > 2) {
    for (int e = 0; e < c.E; ++e) lf[size_t(1) * c.E + e] = std::numeric_limits<float>::quiet_NaN();  // all NaN
    for (int e = 0; e < c.E; e += 3) lf[size_t(2) * c.E + e] = std::numeric_limits<float>::quiet_NaN();  // some NaN
  }
  std::vector<bf16_raw> lb(lf.size());
  for (size_t i = 0; i < lf.size(); ++i) lb[i] = num::f32_to_bf16(lf[i]);
  std::vector<float> bias(c.E);
  for (auto& b : bias) b = nd(rng) * 0.05f;
  const bool use_bias = c.cfg.kind == RouterKind::sigmoid_grouped_topk;

  const TensorView host = c.bf16_logits ? TensorView::of(lb.data(), DType::bf16, {c.T, c.E})
                                        : TensorView::of(lf.data(), DType::f32, {c.T, c.E});
  std::vector<int32_t> ids_ref(size_t(c.T) * c.K);
  std::vector<float> w_ref(size_t(c.T) * c.K);
  route_cpu(c.cfg, host, use_bias ? bias.data() : nullptr, c.K, ids_ref.data(), w_ref.data());

  Dev<float> dlf(lf);
  Dev<bf16_raw> dlb(lb);
  Dev<float> dbias(bias);
  Dev<int32_t> ids(size_t(c.T) * c.K);
  Dev<float> w(size_t(c.T) * c.K);
  ids.poison();
  w.poison();
  const TensorView dev = c.bf16_logits ? TensorView::of(dlb.get(), DType::bf16, {c.T, c.E}, DeviceKind::cuda)
                                       : TensorView::of(dlf.get(), DType::f32, {c.T, c.E}, DeviceKind::cuda);
  cuda::route(c.cfg, dev, use_bias ? dbias.get() : nullptr, c.K, ids.get(), w.get(), nullptr);
  EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
  const auto ids_gpu = ids.download();
  const auto w_gpu = w.download();
  const int64_t di = first_diff(ids_gpu, ids_ref);
  EXPECT_EQ(di, -1) << c.name << ": id " << di << " gpu " << ids_gpu[di] << " cpu " << ids_ref[di];
  const int64_t dw = first_diff(w_gpu, w_ref);
  EXPECT_EQ(dw, -1) << c.name << ": weight " << dw << " gpu " << w_gpu[dw] << " cpu " << w_ref[dw];
}

TEST(CudaRoute, BitwiseEqualToCpuOnModelShapes) {
  EPMOE_REQUIRE_GPU();
  const std::vector<Case> cases = {
      {"deepseek-v3 f32", grouped(8, 4, 2.5f), 256, 8, 777, false, 0, false},
      {"deepseek-v3 bf16", grouped(8, 4, 2.5f), 256, 8, 513, true, 0, true},
      {"deepseek-v3 ties", grouped(8, 4, 2.5f), 256, 8, 200, false, 5, false},
      {"qwen3 softmax renorm", softmax(true), 128, 8, 1000, false, 0, true},
      {"qwen3 bf16 ties", softmax(true), 128, 8, 300, true, 3, false},
      {"mixtral", softmax(true), 8, 2, 999, true, 0, false},
      {"no renorm", softmax(false), 64, 6, 100, false, 0, false},
      {"E=512 K=16", softmax(true), 512, 16, 257, false, 0, true},
      {"E=512 grouped", grouped(16, 8, 1.0f, false), 512, 16, 129, true, 0, false},
      {"group of one", grouped(32, 8, 1.5f), 32, 4, 64, false, 0, false},
      {"E=7 odd", softmax(true), 7, 3, 65, false, 0, false},
      {"T=1", grouped(8, 4, 2.5f), 256, 8, 1, false, 0, false},
      {"T=0", softmax(true), 128, 8, 0, false, 0, false},
      {"sigmoid underflow", grouped(8, 4, 2.5f), 256, 8, 300, false, 0, false, -200.f},
      {"sigmoid underflow bf16", grouped(8, 4, 2.5f), 256, 8, 300, true, 0, false, -95.f},
      {"sigmoid underflow no renorm", grouped(8, 4, 2.5f, false), 256, 8, 100, false, 0, false, -200.f},
  };
  uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const Case& c : cases) run_case(c, seed++);
}

TEST(CudaRoute, RejectsBadArguments) {
  EPMOE_REQUIRE_GPU();
  Dev<float> l(4 * 600);
  Dev<int32_t> ids(64);
  Dev<float> w(64);
  const TensorView big = TensorView::of(l.get(), DType::f32, {4, 600}, DeviceKind::cuda);
  EXPECT_THROW(cuda::route(softmax(true), big, nullptr, 4, ids.get(), w.get(), nullptr), UsageError);
  const TensorView ok = TensorView::of(l.get(), DType::f32, {4, 64}, DeviceKind::cuda);
  EXPECT_THROW(cuda::route(softmax(true), ok, nullptr, 17, ids.get(), w.get(), nullptr), UsageError);
  std::vector<float> host(4 * 64);
  const TensorView on_host = TensorView::of(host.data(), DType::f32, {4, 64});
  EXPECT_THROW(cuda::route(softmax(true), on_host, nullptr, 4, ids.get(), w.get(), nullptr), UsageError);
}

}  // namespace
}  // namespace epmoe::test
