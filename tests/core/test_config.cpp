// Configuration validation (every message names field, value and fix), derived values, the
// cross-rank fingerprint and the presets.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "epmoe/config.h"
#include "epmoe/error.h"
#include "epmoe/presets.h"

namespace {

using namespace epmoe;

MoeConfig base() {
  MoeConfig c;
  c.hidden = 256;
  c.intermediate = 128;
  c.num_experts = 16;
  c.top_k = 4;
  c.num_ranks = 2;
  c.capacity = 64;
  c.dispatcher = "cpu";
  c.runner = "reference";
  return c;
}

std::string issues_text(const std::vector<ConfigIssue>& is) {
  std::string s;
  for (const auto& i : is) s += "  [" + i.field + "=" + i.value + "] " + i.message + "\n";
  return s;
}

// The single issue for `field`; fails when there is not exactly one.
ConfigIssue only_issue(const MoeConfig& c, const std::string& field) {
  const auto is = validate(c);
  ConfigIssue found;
  int n = 0;
  for (const auto& i : is) {
    if (i.field == field) {
      found = i;
      ++n;
    }
  }
  EXPECT_EQ(n, 1) << "issues for " << field << ":\n" << issues_text(is);
  return found;
}

void expect_has(const std::string& msg, const std::string& part) {
  EXPECT_NE(msg.find(part), std::string::npos) << "message: " << msg << "\nmissing: " << part;
}

TEST(CoreConfig, BaseIsValid) {
  const auto is = validate(base());
  EXPECT_TRUE(is.empty()) << issues_text(is);
  EXPECT_EQ(base().experts_per_rank(), 8);
  EXPECT_TRUE(base().resolved_placement().is_contiguous());
  EXPECT_EQ(base().resolved_placement().copies(9)[0], (ExpertCopy{1, 1}));
  validate_or_throw(base());
}

TEST(CoreConfig, HiddenMultiples) {
  MoeConfig c = base();
  c.hidden = 7000;
  c.dispatch_format = ActFormat::fp8;
  ConfigIssue i = only_issue(c, "hidden");
  EXPECT_EQ(i.value, "7000");
  expect_has(i.message, "hidden=7000 is not a multiple of 16, which dispatch format fp8 requires");
  expect_has(i.message, "use dispatch format bf16");
  c.hidden = 2880;  // multiple of 16, not 128: a partial last fp8 block (FORMATS.md)
  EXPECT_TRUE(validate(c).empty()) << issues_text(validate(c));

  c.hidden = 200;
  c.dispatch_format = ActFormat::nvfp4;
  c.nvfp4_global_scale = 1.f;
  expect_has(only_issue(c, "hidden").message, "hidden=200 is not a multiple of 16, which dispatch format nvfp4");

  c = base();
  c.hidden = 2880;  // multiple of 64, not 128: fp8 weights take it (partial edge tiles)
  c.weight_format = WeightFormat::fp8;
  EXPECT_TRUE(validate(c).empty()) << issues_text(validate(c));
  c.hidden = 144;  // multiple of 16, not 128
  c.weight_format = WeightFormat::nvfp4;
  EXPECT_TRUE(validate(c).empty()) << issues_text(validate(c));
  c.weight_format = WeightFormat::bf16;
  c.combine_format = ActFormat::fp8;
  EXPECT_TRUE(validate(c).empty()) << issues_text(validate(c));  // a partial last block
  c.hidden = 200;
  expect_has(only_issue(c, "hidden").message, "which combine format fp8");

  c = base();
  c.hidden = 0;
  expect_has(only_issue(c, "hidden").message, "hidden=0 must be >= 1");
}

TEST(CoreConfig, IntermediateMultiples) {
  MoeConfig c = base();
  c.intermediate = 2880;  // fp8 weights take it: W13's gate and up tiled apart, partial edge tiles
  c.weight_format = WeightFormat::fp8;
  EXPECT_TRUE(validate(c).empty()) << issues_text(validate(c));
  // and the fp8 intermediate, whose last 128-block is partial
  EXPECT_EQ(c.effective_intermediate_quant(), IntermediateQuant::fp8);
  c.weight_format = WeightFormat::nvfp4;
  c.intermediate = 24;
  expect_has(only_issue(c, "intermediate").message, "not a multiple of 16, which weight format nvfp4");
  c.weight_format = WeightFormat::bf16;
  c.intermediate = 192;
  c.intermediate_quant = IntermediateQuant::fp8;
  EXPECT_TRUE(validate(c).empty()) << issues_text(validate(c));  // one whole block and a partial one
  c.intermediate = 200;
  expect_has(only_issue(c, "intermediate").message, "intermediate_quant fp8");
}

TEST(CoreConfig, TopK) {
  MoeConfig c = base();
  c.top_k = 0;
  expect_has(only_issue(c, "top_k").message, "top_k=0 must be >= 1");
  c.top_k = 17;
  c.num_experts = 32;
  expect_has(only_issue(c, "top_k").message, "top_k=17 exceeds 16");
  c.num_experts = 8;
  c.top_k = 9;
  expect_has(only_issue(c, "top_k").message, "top_k=9 exceeds num_experts=8; use top_k <= 8");
}

TEST(CoreConfig, Router) {
  MoeConfig c = base();
  c.router.kind = RouterKind::sigmoid_grouped_topk;
  c.router.n_group = 4;
  c.router.topk_group = 2;
  EXPECT_TRUE(validate(c).empty()) << issues_text(validate(c));

  c.router.n_group = 3;
  ConfigIssue i = only_issue(c, "router.n_group");
  EXPECT_EQ(i.value, "3");
  expect_has(i.message, "router.n_group=3 does not divide num_experts=16");

  c.router.n_group = 16;  // one expert per group
  c.router.topk_group = 4;
  expect_has(only_issue(c, "router.n_group").message, "each group needs >= 2 experts");

  c.router.n_group = 4;
  c.router.topk_group = 5;
  expect_has(only_issue(c, "router.topk_group").message, "router.topk_group=5 is outside [1, n_group=4]");
  c.router.topk_group = 0;
  expect_has(only_issue(c, "router.topk_group").message, "router.topk_group=0 is outside");

  c.router.topk_group = 1;  // keeps 4 experts, top_k 4: fine
  EXPECT_TRUE(validate(c).empty());
  c.top_k = 5;
  expect_has(only_issue(c, "router.topk_group").message, "fewer than top_k=5; raise topk_group or lower top_k");

  c.top_k = 4;
  c.router.routed_scaling_factor = 0.f;
  expect_has(only_issue(c, "router.routed_scaling_factor").message, "must be finite and > 0");

  // softmax ignores the group fields.
  c = base();
  c.router.n_group = 3;
  c.router.topk_group = 9;
  EXPECT_TRUE(validate(c).empty());
}

TEST(CoreConfig, RanksCapacityAndContiguousPlacement) {
  MoeConfig c = base();
  c.num_ranks = 0;
  expect_has(only_issue(c, "num_ranks").message, "num_ranks=0 must be >= 1");
  c = base();
  c.capacity = 0;
  expect_has(only_issue(c, "capacity").message, "capacity=0 must be >= 1");
  c.capacity = 1 << 30;
  expect_has(only_issue(c, "capacity").message, "exceeds 2^31-1 receive slots; lower capacity to <= 1073741823");
  c = base();
  c.num_ranks = 3;
  ConfigIssue i = only_issue(c, "placement");
  expect_has(i.message, "num_experts=16 is not divisible by num_ranks=3");
  expect_has(i.message, "explicit placement");
  EXPECT_THROW(c.resolved_placement(), UsageError);
}

TEST(CoreConfig, ExplicitPlacement) {
  MoeConfig c = base();
  c.num_ranks = 3;
  // 16 experts over 3 ranks with 6 slots: uneven but legal, plus a redundant copy of expert 0.
  std::string spec;
  for (int e = 0; e < 16; ++e) {
    spec += std::to_string(e) + ":" + std::to_string(e / 6) + "." + std::to_string(e % 6);
    spec += e == 0 ? ",2.5;" : ";";
  }
  ExpertPlacement p = ExpertPlacement::parse(spec, 16, 3, 6);
  c.placement = p;
  EXPECT_TRUE(validate(c).empty()) << issues_text(validate(c));
  EXPECT_EQ(c.experts_per_rank(), 6);
  ASSERT_EQ(c.resolved_placement().copies(0).size(), 2u);
  EXPECT_EQ(c.resolved_placement().choose(0, 2, 0), (ExpertCopy{2, 5}));
  EXPECT_FALSE(c.resolved_placement().is_contiguous());

  c.placement = ExpertPlacement::parse("0:0.0;1:0.0", 2, 3, 6);
  const auto is = validate(c);
  int placement_issues = 0;
  for (const auto& x : is) placement_issues += x.field == "placement";
  EXPECT_GE(placement_issues, 2) << issues_text(is);
  bool count = false, overlap = false;
  for (const auto& x : is) {
    count |= x.message.find("placement lists 2 experts but num_experts=16") != std::string::npos;
    overlap |= x.message.find("the slot already holds expert 0") != std::string::npos;
  }
  EXPECT_TRUE(count) << issues_text(is);
  EXPECT_TRUE(overlap) << issues_text(is);

  c.placement = ExpertPlacement::contiguous(16, 4);
  expect_has(only_issue(c, "placement").message, "placement is for 4 ranks but num_ranks=3");
}

TEST(CoreConfig, FormatsAndComm) {
  MoeConfig c = base();
  c.dispatch_format = ActFormat::nvfp4;
  ConfigIssue i = only_issue(c, "nvfp4_global_scale");
  expect_has(i.message, "nvfp4_global_scale=0 must be finite and > 0 for dispatch format nvfp4");
  c.nvfp4_global_scale = 100.f;
  EXPECT_TRUE(validate(c).empty()) << issues_text(validate(c));

  c = base();
  c.combine_format = ActFormat::nvfp4;
  bool found = false;
  for (const auto& x : validate(c)) {
    if (x.field == "combine_format" && x.message.find("use bf16 or fp8") != std::string::npos) found = true;
  }
  EXPECT_TRUE(found) << issues_text(validate(c));

  c = base();
  c.tuning.comm_sms = -1;
  expect_has(only_issue(c, "tuning.comm_sms").message, "tuning.comm_sms=-1 is outside [0, 1024]");
  c = base();
  c.timeout_ms = -5;
  expect_has(only_issue(c, "timeout_ms").message, "timeout_ms=-5 must be >= 1");
}

TEST(CoreConfig, EveryIssueInFieldOrderAndThrown) {
  MoeConfig c = base();
  c.hidden = 100;
  c.dispatch_format = ActFormat::fp8;
  c.top_k = 0;
  c.capacity = 0;
  c.timeout_ms = 0;
  const auto is = validate(c);
  ASSERT_GE(is.size(), 4u) << issues_text(is);
  EXPECT_EQ(is[0].field, "hidden");
  EXPECT_EQ(is[1].field, "top_k");
  EXPECT_EQ(is[2].field, "capacity");
  EXPECT_EQ(is[3].field, "timeout_ms");
  try {
    validate_or_throw(c);
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    const std::string m = e.what();
    expect_has(m, "4 issues");
    expect_has(m, "hidden=100");
    expect_has(m, "top_k=0");
    expect_has(m, "capacity=0");
    expect_has(m, "timeout_ms=0");
  }
}

TEST(CoreConfig, RegistryIssuesAreIncluded) {
  MoeConfig c = base();
  c.runner = "no-such-runner";
  bool found = false;
  for (const auto& x : validate(c)) found |= x.field == "runner";
  EXPECT_TRUE(found) << issues_text(validate(c));
}

TEST(CoreConfig, FingerprintCoversWhatRanksShare) {
  const MoeConfig b = base();
  const uint64_t fb = config_fingerprint(b);
  EXPECT_EQ(fb, config_fingerprint(base()));  // deterministic
  std::set<uint64_t> seen{fb};
  auto differs = [&](const char* what, auto mutate) {
    MoeConfig c = base();
    mutate(c);
    const uint64_t f = config_fingerprint(c);
    EXPECT_NE(f, fb) << what;
    EXPECT_TRUE(seen.insert(f).second) << what << " collides with another variant";
  };
  differs("hidden", [](MoeConfig& c) { c.hidden = 512; });
  differs("intermediate", [](MoeConfig& c) { c.intermediate = 256; });
  differs("num_experts", [](MoeConfig& c) { c.num_experts = 32; });
  differs("top_k", [](MoeConfig& c) { c.top_k = 2; });
  differs("router.kind", [](MoeConfig& c) { c.router.kind = RouterKind::sigmoid_grouped_topk; });
  differs("router.renormalize", [](MoeConfig& c) { c.router.renormalize = false; });
  differs("router.n_group", [](MoeConfig& c) { c.router.n_group = 2; });
  differs("router.topk_group", [](MoeConfig& c) { c.router.topk_group = 2; });
  differs("router.scaling", [](MoeConfig& c) { c.router.routed_scaling_factor = 2.5f; });
  differs("num_ranks", [](MoeConfig& c) { c.num_ranks = 4; });
  differs("capacity", [](MoeConfig& c) { c.capacity = 65; });
  differs("placement", [](MoeConfig& c) {
    c.placement = ExpertPlacement::parse("0:0.0;1:0.1;2:0.2;3:0.3;4:0.4;5:0.5;6:0.6;7:0.7;8:1.0;9:1.1;10:1.2;"
                                         "11:1.3;12:1.4;13:1.5;14:1.7;15:1.6",
                                         16, 2, 8);
  });
  differs("dispatch_format", [](MoeConfig& c) { c.dispatch_format = ActFormat::fp8; });
  differs("fp8_ue8m0", [](MoeConfig& c) { c.fp8_ue8m0 = true; });
  differs("nvfp4_global_scale", [](MoeConfig& c) { c.nvfp4_global_scale = 1.5f; });
  differs("weight_format", [](MoeConfig& c) { c.weight_format = WeightFormat::fp8; });
  differs("combine_format", [](MoeConfig& c) { c.combine_format = ActFormat::fp8; });
  differs("intermediate_quant", [](MoeConfig& c) { c.intermediate_quant = IntermediateQuant::fp8; });
  differs("dispatcher", [](MoeConfig& c) { c.dispatcher = "local"; });
  differs("runner", [](MoeConfig& c) { c.runner = "cuda"; });

  // Local tuning does not have to agree; an explicit map equal to the default agrees with it.
  MoeConfig c = base();
  c.timeout_ms = 5;
  c.tuning.comm_sms = 8;
  c.tuning.push_warps = 9;
  c.tuning.engine = RunnerEngine::mma;
  c.tuning.ce_rows = 7;  // only counts in combine mode ce
  EXPECT_EQ(config_fingerprint(c), fb);
  c.placement = ExpertPlacement::contiguous(16, 2);
  EXPECT_EQ(config_fingerprint(c), fb);
}

TEST(CoreConfig, Describe) {
  MoeConfig c = base();
  c.dispatch_format = ActFormat::fp8;
  c.fp8_ue8m0 = true;
  const std::string d = describe(c);
  expect_has(d, "H=256 I=128 E=16 K=4");
  expect_has(d, "R=2 C=64 experts/rank=8");
  expect_has(d, "fp8 (ue8m0 scales), 264 bytes/token");
  expect_has(d, "dispatcher=cpu runner=reference");
  expect_has(d, "fingerprint:");
  EXPECT_GE(std::count(d.begin(), d.end(), '\n'), 8);
}

// ---- intermediate_quant: auto follows the weights ------------------------------------------------

MoeConfig with_iq(WeightFormat wf, int I, IntermediateQuant iq) {
  MoeConfig c = base();
  c.weight_format = wf;
  c.intermediate = I;
  c.intermediate_quant = iq;
  return c;
}

TEST(CoreConfig, IntermediateQuantDefaultsToAuto) {
  EXPECT_EQ(MoeConfig{}.intermediate_quant, IntermediateQuant::automatic);
}

TEST(CoreConfig, IntermediateQuantAutoResolvesFromTheWeights) {
  using IQ = IntermediateQuant;
  using WF = WeightFormat;
  EXPECT_EQ(with_iq(WF::bf16, 2048, IQ::automatic).effective_intermediate_quant(), IQ::none);
  EXPECT_EQ(with_iq(WF::nvfp4, 2048, IQ::automatic).effective_intermediate_quant(), IQ::none);
  EXPECT_EQ(with_iq(WF::fp8, 2048, IQ::automatic).effective_intermediate_quant(), IQ::fp8);
  EXPECT_EQ(with_iq(WF::fp8, 128, IQ::automatic).effective_intermediate_quant(), IQ::fp8);
  // gpt-oss: I = 2880 ends on a partial 128-block, which the fp8 intermediate takes; I % 16 != 0
  // cannot be blocked, so auto means none there.
  EXPECT_EQ(with_iq(WF::fp8, 2880, IQ::automatic).effective_intermediate_quant(), IQ::fp8);
  EXPECT_EQ(with_iq(WF::fp8, 200, IQ::automatic).effective_intermediate_quant(), IQ::none);
  EXPECT_EQ(with_iq(WF::fp8, 0, IQ::automatic).effective_intermediate_quant(), IQ::none);
  // Explicit values are kept whatever the weights.
  for (WF wf : {WF::bf16, WF::fp8, WF::nvfp4}) {
    EXPECT_EQ(with_iq(wf, 2048, IQ::none).effective_intermediate_quant(), IQ::none) << format_name(wf);
    EXPECT_EQ(with_iq(wf, 2048, IQ::fp8).effective_intermediate_quant(), IQ::fp8) << format_name(wf);
  }
  EXPECT_EQ(with_iq(WF::bf16, 2880, IQ::fp8).effective_intermediate_quant(), IQ::fp8);
}

TEST(CoreConfig, IntermediateQuantNames) {
  using IQ = IntermediateQuant;
  for (IQ q : {IQ::automatic, IQ::none, IQ::fp8}) {
    IQ back = q == IQ::none ? IQ::fp8 : IQ::none;
    EXPECT_TRUE(parse_intermediate_quant(intermediate_quant_name(q), back)) << intermediate_quant_name(q);
    EXPECT_EQ(back, q);
  }
  EXPECT_STREQ(intermediate_quant_name(IQ::automatic), "auto");
  IQ out = IQ::none;
  EXPECT_FALSE(parse_intermediate_quant("automatic", out));
  EXPECT_FALSE(parse_intermediate_quant("FP8", out));
  EXPECT_EQ(out, IQ::none);
}

TEST(CoreConfig, IntermediateQuantAutoIsNeverAnIssue) {
  // auto with an intermediate size fp8 blocks cannot cover (I % 16 != 0) resolves to none instead
  // of failing; an explicit fp8 there stays an issue.
  MoeConfig c = with_iq(WeightFormat::bf16, 200, IntermediateQuant::automatic);
  EXPECT_TRUE(validate(c).empty()) << issues_text(validate(c));
  c.intermediate_quant = IntermediateQuant::fp8;
  expect_has(only_issue(c, "intermediate").message, "intermediate_quant fp8");
  // fp8 weights with I % 16 != 0: valid, and auto resolves to none (no issue for the intermediate).
  c = with_iq(WeightFormat::fp8, 200, IntermediateQuant::automatic);
  EXPECT_TRUE(validate(c).empty()) << issues_text(validate(c));
  EXPECT_EQ(c.effective_intermediate_quant(), IntermediateQuant::none);
}

TEST(CoreConfig, FingerprintHashesTheResolvedIntermediateQuant) {
  using IQ = IntermediateQuant;
  // Ranks that spell the same choice differently agree ...
  EXPECT_EQ(config_fingerprint(with_iq(WeightFormat::fp8, 256, IQ::automatic)),
            config_fingerprint(with_iq(WeightFormat::fp8, 256, IQ::fp8)));
  EXPECT_EQ(config_fingerprint(with_iq(WeightFormat::bf16, 256, IQ::automatic)),
            config_fingerprint(with_iq(WeightFormat::bf16, 256, IQ::none)));
  EXPECT_EQ(config_fingerprint(with_iq(WeightFormat::nvfp4, 256, IQ::automatic)),
            config_fingerprint(with_iq(WeightFormat::nvfp4, 256, IQ::none)));
  // ... and ranks that mean different things do not.
  EXPECT_NE(config_fingerprint(with_iq(WeightFormat::fp8, 256, IQ::automatic)),
            config_fingerprint(with_iq(WeightFormat::fp8, 256, IQ::none)));
  EXPECT_NE(config_fingerprint(with_iq(WeightFormat::bf16, 256, IQ::automatic)),
            config_fingerprint(with_iq(WeightFormat::bf16, 256, IQ::fp8)));
}

TEST(CoreConfig, DescribeShowsTheResolvedIntermediateQuant) {
  using IQ = IntermediateQuant;
  expect_has(describe(with_iq(WeightFormat::fp8, 256, IQ::automatic)), "interm. q:  fp8 (auto:");
  expect_has(describe(with_iq(WeightFormat::bf16, 256, IQ::automatic)), "interm. q:  none (auto:");
  const std::string explicit_none = describe(with_iq(WeightFormat::fp8, 256, IQ::none));
  expect_has(explicit_none, "interm. q:  none\n");
  expect_has(describe(with_iq(WeightFormat::bf16, 256, IQ::fp8)), "interm. q:  fp8\n");
}

// ---- presets ---------------------------------------------------------------------------------

TEST(CorePresets, PublicShapes) {
  const ModelPreset& ds = preset("deepseek-v3");
  EXPECT_EQ(ds.config.hidden, 7168);
  EXPECT_EQ(ds.config.intermediate, 2048);
  EXPECT_EQ(ds.config.num_experts, 256);
  EXPECT_EQ(ds.config.top_k, 8);
  EXPECT_EQ(ds.config.router.kind, RouterKind::sigmoid_grouped_topk);
  EXPECT_EQ(ds.config.router.n_group, 8);
  EXPECT_EQ(ds.config.router.topk_group, 4);
  EXPECT_EQ(ds.config.router.routed_scaling_factor, 2.5f);
  EXPECT_TRUE(ds.config.router.renormalize);
  EXPECT_EQ(ds.num_layers, 58);
  const ModelPreset& q = preset("qwen3-235b-a22b");
  EXPECT_EQ(q.config.hidden, 4096);
  EXPECT_EQ(q.config.intermediate, 1536);
  EXPECT_EQ(q.config.num_experts, 128);
  EXPECT_EQ(q.num_layers, 94);
  EXPECT_EQ(preset("qwen3-30b-a3b").config.intermediate, 768);
  EXPECT_EQ(preset("mixtral-8x7b").config.top_k, 2);
  EXPECT_EQ(preset("gpt-oss-120b").config.hidden, 2880);
  EXPECT_EQ(preset("gpt-oss-120b").config.top_k, 4);
  try {
    preset("llama");
    FAIL();
  } catch (const UsageError& e) {
    expect_has(e.what(), "preset=\"llama\" is unknown");
    expect_has(e.what(), "deepseek-v3");
  }
}

TEST(CorePresets, AllValidateWithTwoRanksBf16) {
  EXPECT_EQ(presets().size(), 6u);
  for (const ModelPreset& p : presets()) {
    MoeConfig c = p.config;
    c.num_ranks = 2;
    c.capacity = 128;
    c.dispatcher = "cpu";
    c.runner = "reference";
    const auto is = validate(c);
    EXPECT_TRUE(is.empty()) << p.name << ":\n" << issues_text(is);
    EXPECT_GT(p.num_layers, 0);
  }
  // tiny must run every format.
  MoeConfig t = preset("tiny").config;
  t.num_ranks = 4;
  t.capacity = 8;
  for (ActFormat f : {ActFormat::bf16, ActFormat::fp8, ActFormat::nvfp4}) {
    t.dispatch_format = f;
    t.nvfp4_global_scale = 100.f;
    EXPECT_TRUE(validate(t).empty()) << format_name(f) << "\n" << issues_text(validate(t));
  }
  // gpt-oss's 2880 is no multiple of 128: fp8 dispatch takes it with a partial last block.
  MoeConfig g = preset("gpt-oss-120b").config;
  g.num_ranks = 2;
  g.capacity = 8;
  g.dispatch_format = ActFormat::fp8;
  EXPECT_TRUE(validate(g).empty()) << issues_text(validate(g));
}

}  // namespace
