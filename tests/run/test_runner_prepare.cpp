// The runner's prepare step (Runner::prepare, include/epmoe/runner.h): MoeLayer calls it once,
// before any run, for whatever runner the registry resolves, and every run then receives the
// weights as prepare left them. A probe runner (the reference runner underneath) registered for
// this test records the calls; the reference runner's own prepare is the no-op default.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "epmoe/comm.h"
#include "epmoe/layer.h"
#include "epmoe/numeric.h"
#include "epmoe/registry.h"
#include "layer/stack_model.h"
#include "run/reference.h"

namespace epmoe {
namespace {

struct ProbeLog {
  int prepares = 0, runs = 0, runs_seeing_prepared = 0;
};
ProbeLog g_log;
// What the probe's prepare marks the weights with: any non-null address the reference runner
// ignores (it reads data and scales only).
const int kMark = 0;

class ProbeRunner final : public Runner {
 public:
  explicit ProbeRunner(const MoeConfig& cfg) : ref_(cfg) {}
  const char* name() const override { return "prepare_probe"; }
  size_t prepare(ExpertWeights& w, Stream) override {
    EXPECT_EQ(g_log.runs, 0) << "prepare after a run";
    ++g_log.prepares;
    w.w13.prepared = &kMark;
    return 64;
  }
  void run(const DispatchOutput& in, const ExpertWeights& w, bf16_raw* y, Stream s) override {
    ++g_log.runs;
    g_log.runs_seeing_prepared += w.w13.prepared == &kMark;
    ref_.run(in, w, y, s);
  }

 private:
  detail::ReferenceRunner ref_;
};

void register_probe() {
  static const bool once = [] {
    Registry& reg = Registry::global();
    RunnerInfo info = *reg.find_runner("reference");
    info.name = "prepare_probe";
    info.check = {};
    info.create = [](const MoeConfig& cfg, int) -> std::unique_ptr<Runner> {
      return std::make_unique<ProbeRunner>(cfg);
    };
    reg.add(std::move(info));
    reg.add_pair("local", "prepare_probe");
    return true;
  }();
  (void)once;
}

MoeConfig small_config(const char* runner) {
  MoeConfig c;
  c.hidden = 128, c.intermediate = 128, c.num_experts = 4, c.top_k = 2;
  c.num_ranks = 1, c.capacity = 8;
  c.dispatcher = "local";
  c.runner = runner;
  return c;
}

TEST(RunnerPrepare, MoeLayerPreparesOnceBeforeAnyRunAndRunsThePreparedWeights) {
  register_probe();
  g_log = {};
  const MoeConfig c = small_config("prepare_probe");
  const Model m(c, 1, 7);
  const ExpertWeights w = m.rank_weights(0, 0);
  auto comm = make_local_comm();
  MoeLayer layer(c, *comm, w);
  EXPECT_EQ(g_log.prepares, 1);
  EXPECT_EQ(g_log.runs, 0);
  EXPECT_EQ(w.w13.prepared, nullptr) << "the caller's weights must not change";

  const int64_t T = 3;
  std::vector<bf16_raw> x(size_t(T) * c.hidden, num::f32_to_bf16(1.f)), out(x.size());
  std::vector<int32_t> ids = {0, 1, 2, 3, 1, 2};
  std::vector<float> tw(ids.size(), 0.5f);
  layer.forward_routed(TensorView::of(x.data(), DType::bf16, {T, c.hidden}),
                       TensorView::of(ids.data(), DType::i32, {T, c.top_k}),
                       TensorView::of(tw.data(), DType::f32, {T, c.top_k}),
                       TensorView::of(out.data(), DType::bf16, {T, c.hidden}));
  layer.forward_routed(TensorView::of(x.data(), DType::bf16, {T, c.hidden}),
                       TensorView::of(ids.data(), DType::i32, {T, c.top_k}),
                       TensorView::of(tw.data(), DType::f32, {T, c.top_k}),
                       TensorView::of(out.data(), DType::bf16, {T, c.hidden}));
  EXPECT_EQ(g_log.prepares, 1) << "prepare runs once per layer, not per forward";
  EXPECT_EQ(g_log.runs, 2);
  EXPECT_EQ(g_log.runs_seeing_prepared, 2);
}

TEST(RunnerPrepare, DefaultIsANoOp) {
  const MoeConfig c = small_config("reference");
  const Model m(c, 1, 7);
  ExpertWeights w = m.rank_weights(0, 0);
  const ExpertWeights before = w;
  detail::ReferenceRunner ref(c);
  EXPECT_EQ(ref.prepare(w, nullptr), 0u);
  EXPECT_EQ(w.w13.data, before.w13.data);
  EXPECT_EQ(w.w13.prepared, nullptr);
  EXPECT_EQ(w.w2.prepared, nullptr);
}

}  // namespace
}  // namespace epmoe
