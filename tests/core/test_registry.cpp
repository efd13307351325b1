// Registry: legal and illegal (dispatcher, runner) pairs and the messages that list the legal ones.
#include <gtest/gtest.h>

#include "epmoe/error.h"
#include "epmoe/registry.h"

namespace epmoe {
namespace {

// A registry with made-up backends, so the tests do not depend on which backends this build has.
Registry fake_registry() {
  Registry reg;
  DispatcherInfo local{"local", {"local"}, DeviceKind::cpu, {ActFormat::bf16, ActFormat::fp8}, {ActFormat::bf16}, {}};
  DispatcherInfo gpu{"nvlink", {"nccl"}, DeviceKind::cuda, {ActFormat::bf16, ActFormat::nvfp4},
                     {ActFormat::bf16, ActFormat::fp8}, {}};
  reg.add(local);
  reg.add(gpu);
  reg.add(RunnerInfo{"ref", DeviceKind::cpu, {ActFormat::bf16, ActFormat::fp8, ActFormat::nvfp4},
                     {WeightFormat::bf16, WeightFormat::fp8}, {}});
  reg.add(RunnerInfo{"gemm", DeviceKind::cuda, {ActFormat::bf16, ActFormat::nvfp4}, {WeightFormat::nvfp4}, {}});
  reg.add_pair("local", "ref");
  reg.add_pair("nvlink", "gemm");
  return reg;
}

MoeConfig cfg_for(const char* d, const char* r) {
  MoeConfig c;
  c.dispatcher = d;
  c.runner = r;
  return c;
}

const ConfigIssue* find_field(const std::vector<ConfigIssue>& v, const std::string& field) {
  for (const auto& i : v)
    if (i.field == field) return &i;
  return nullptr;
}

TEST(Registry, LegalPairPasses) {
  const Registry reg = fake_registry();
  EXPECT_TRUE(reg.check(cfg_for("local", "ref")).empty());
  MoeConfig c = cfg_for("nvlink", "gemm");
  c.dispatch_format = ActFormat::nvfp4;
  c.weight_format = WeightFormat::nvfp4;
  c.combine_format = ActFormat::fp8;
  EXPECT_TRUE(reg.check(c).empty());
  const Registry::Pair p = reg.resolve(c);
  ASSERT_NE(p.dispatcher, nullptr);
  EXPECT_EQ(p.dispatcher->device, DeviceKind::cuda);
  EXPECT_EQ(p.runner->name, "gemm");
  EXPECT_TRUE(bool(p.step));  // default_step when none was registered
}

TEST(Registry, UndeclaredPairListsLegalPairs) {
  const Registry reg = fake_registry();
  const auto issues = reg.check(cfg_for("nvlink", "ref"));
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].field, "dispatcher");
  EXPECT_EQ(issues[0].value, "nvlink");
  EXPECT_NE(issues[0].message.find("dispatcher=nvlink with runner=ref is not a legal pair; legal pairs: local+ref, nvlink+gemm"),
            std::string::npos)
      << issues[0].message;
  try {
    reg.resolve(cfg_for("nvlink", "ref"));
    FAIL() << "resolve accepted an illegal pair";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("legal pairs: local+ref, nvlink+gemm"), std::string::npos) << e.what();
  }
}

TEST(Registry, UnknownNames) {
  const Registry reg = fake_registry();
  auto issues = reg.check(cfg_for("carrier-pigeon", "ref"));
  ASSERT_NE(find_field(issues, "dispatcher"), nullptr);
  EXPECT_NE(find_field(issues, "dispatcher")->message.find("known: local, nvlink"), std::string::npos);
  issues = reg.check(cfg_for("local", "abacus"));
  ASSERT_NE(find_field(issues, "runner"), nullptr);
  EXPECT_NE(find_field(issues, "runner")->message.find("legal pairs: local+ref"), std::string::npos);
}

TEST(Registry, FormatsMustBeCarriedAndAccepted) {
  const Registry reg = fake_registry();
  MoeConfig c = cfg_for("local", "ref");
  c.dispatch_format = ActFormat::nvfp4;  // runner reads it, the local dispatcher does not carry it
  auto issues = reg.check(c);
  ASSERT_NE(find_field(issues, "dispatch_format"), nullptr);
  EXPECT_NE(find_field(issues, "dispatch_format")->message.find("use one of: bf16/fp8"), std::string::npos);

  c = cfg_for("local", "ref");
  c.weight_format = WeightFormat::nvfp4;
  issues = reg.check(c);
  ASSERT_NE(find_field(issues, "weight_format"), nullptr);
  EXPECT_EQ(find_field(issues, "weight_format")->value, "nvfp4");

  c = cfg_for("local", "ref");
  c.combine_format = ActFormat::fp8;
  issues = reg.check(c);
  ASSERT_NE(find_field(issues, "combine_format"), nullptr);
  EXPECT_THROW(reg.resolve(c), UsageError);
}

TEST(Registry, DeviceOfDispatcherMustMatchRunner) {
  Registry reg = fake_registry();
  reg.add_pair("nvlink", "ref");  // declared, but nvlink exists only for cuda and ref runs on cpu
  const auto issues = reg.check(cfg_for("nvlink", "ref"));
  ASSERT_NE(find_field(issues, "dispatcher"), nullptr);
  EXPECT_NE(find_field(issues, "dispatcher")->message.find("no cpu implementation"), std::string::npos);
}

TEST(Registry, FusedStepReplacesDefaultAndDuplicatesAreRejected) {
  Registry reg = fake_registry();
  bool called = false;
  reg.add_pair("local", "ref", [&](StepContext&, const DispatchInput&, bf16_raw*) { called = true; });
  const Registry::Pair p = reg.resolve(cfg_for("local", "ref"));
  struct NoDispatcher : Dispatcher {
    const char* name() const override { return "none"; }
    DispatchOutput dispatch(const DispatchInput&) override { return {}; }
    void combine(const CombineInput&, bf16_raw*) override {}
  } d;
  struct NoRunner : Runner {
    const char* name() const override { return "none"; }
    void run(const DispatchOutput&, const ExpertWeights&, bf16_raw*, Stream) override {}
  } r;
  ExpertWeights w;
  StepContext ctx{d, r, w, nullptr};
  p.step(ctx, DispatchInput{}, nullptr);
  EXPECT_TRUE(called);
  EXPECT_THROW(reg.add(RunnerInfo{"ref", DeviceKind::cpu, {}, {}, {}}), UsageError);
  EXPECT_EQ(reg.describe_pairs().size(), 2u);
  EXPECT_EQ(reg.describe_pairs()[0], "local+ref (bf16/fp8; bf16/fp8)");
}

TEST(Registry, GlobalHasReferencePairsAndValidateReportsIllegalPairs) {
  const Registry& reg = Registry::global();
  ASSERT_NE(reg.find_runner("reference"), nullptr);
  ASSERT_NE(reg.find_dispatcher("cpu"), nullptr);
  ASSERT_NE(reg.find_dispatcher("local"), nullptr);
  bool local = false, cpu = false;
  for (const auto& s : reg.describe_pairs()) {
    local |= s.rfind("local+reference", 0) == 0;
    cpu |= s.rfind("cpu+reference", 0) == 0;
  }
  EXPECT_TRUE(local && cpu);

  MoeConfig c;
  c.hidden = 128, c.intermediate = 128, c.num_experts = 8, c.top_k = 2, c.num_ranks = 2, c.capacity = 4;
  c.dispatcher = "cpu";
  c.runner = "reference";
  EXPECT_TRUE(validate(c).empty());
  c.runner = "no-such-runner";
  const auto issues = validate(c);
  ASSERT_NE(find_field(issues, "runner"), nullptr);
  EXPECT_NE(find_field(issues, "runner")->message.find("cpu+reference"), std::string::npos);
}

}  // namespace
}  // namespace epmoe

namespace epmoe {
namespace {

// A name may have a CPU and a CUDA implementation ("local"): the lookup by device finds the right one.
TEST(Registry, FindsADispatcherByNameAndDevice) {
  const Registry& reg = Registry::global();
  const DispatcherInfo* cpu = reg.find_dispatcher("local", DeviceKind::cpu);
  ASSERT_NE(cpu, nullptr);
  EXPECT_EQ(cpu->device, DeviceKind::cpu);
  EXPECT_EQ(reg.find_dispatcher("nope", DeviceKind::cpu), nullptr);
#if defined(EPMOE_WITH_CUDA)
  const DispatcherInfo* gpu = reg.find_dispatcher("local", DeviceKind::cuda);
  ASSERT_NE(gpu, nullptr);
  EXPECT_EQ(gpu->device, DeviceKind::cuda);
#else
  EXPECT_EQ(reg.find_dispatcher("local", DeviceKind::cuda), nullptr);
#endif
}

}  // namespace
}  // namespace epmoe
