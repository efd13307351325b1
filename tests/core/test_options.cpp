// Tuning options: checks, names, the [agree] fields in the fingerprint, the dump.
#include <gtest/gtest.h>

#include "epmoe/config.h"
#include "epmoe/options.h"

namespace epmoe {
namespace {

bool has_issue(const std::vector<ConfigIssue>& is, const std::string& field, const std::string& text) {
  for (const auto& i : is)
    if (i.field == field && i.message.find(text) != std::string::npos) return true;
  return false;
}

TEST(Tuning, BuiltInDefaultsAreValid) {
  EXPECT_TRUE(validate(Tuning{}).empty());
  const Tuning t;
  EXPECT_EQ(t.engine, RunnerEngine::automatic);
  EXPECT_EQ(t.comm_sms, 0);  // half the device's SMs
  EXPECT_EQ(t.combine, CombineMode::sm);
}

TEST(Tuning, EveryRangeIsChecked) {
  Tuning t;
  t.widen_scratch_mb = 0;
  t.comm_sms = 2000;
  t.push_warps = 3;
  t.ce_rows = 0;
  t.engine = static_cast<RunnerEngine>(7);
  t.combine = static_cast<CombineMode>(9);
  t.cutlass_swap = static_cast<CutlassSwap>(9);
  t.decode_max_rows = -1;
  t.nvfp4_wide_rows = 150;
  t.nvfp4_wide_max_rows = 70000;
  const auto is = validate(t);
  EXPECT_EQ(is.size(), 10u);
  EXPECT_TRUE(has_issue(is, "tuning.nvfp4_wide_max_rows", "outside [0, 65536]"));
  EXPECT_TRUE(has_issue(is, "tuning.nvfp4_wide_rows", "use 0 (the default: by rows), 128 or 160"));
  EXPECT_TRUE(has_issue(is, "tuning.cutlass_swap", "auto, 0, 1, 64, 128, 192"));
  EXPECT_TRUE(has_issue(is, "tuning.decode_max_rows", "outside [0, 65536]"));
  EXPECT_TRUE(has_issue(is, "tuning.widen_scratch_mb", "outside [1, 16777216]"));
  EXPECT_TRUE(has_issue(is, "tuning.comm_sms", "tuning.comm_sms=2000 is outside [0, 1024]"));
  EXPECT_TRUE(has_issue(is, "tuning.push_warps", "outside [4, 12]"));
  EXPECT_TRUE(has_issue(is, "tuning.ce_rows", "outside [1, 1048576]"));
  EXPECT_TRUE(has_issue(is, "tuning.engine", "auto, mma, cutlass"));
  EXPECT_TRUE(has_issue(is, "tuning.combine", "sm, ce"));
}

TEST(Tuning, ValidateOfTheConfigIncludesTuning) {
  MoeConfig c;
  c.hidden = 256; c.intermediate = 128; c.num_experts = 8; c.top_k = 2; c.capacity = 4;
  ASSERT_TRUE(validate(c).empty());
  c.tuning.push_warps = 20;
  const auto is = validate(c);
  ASSERT_EQ(is.size(), 1u);
  EXPECT_EQ(is[0].field, "tuning.push_warps");
  EXPECT_EQ(is[0].value, "20");
}

TEST(Tuning, NamesRoundTrip) {
  for (RunnerEngine e : {RunnerEngine::automatic, RunnerEngine::mma, RunnerEngine::cutlass}) {
    RunnerEngine back{};
    ASSERT_TRUE(parse_engine(engine_name(e), back));
    EXPECT_EQ(back, e);
  }
  for (CombineMode m : {CombineMode::sm, CombineMode::ce}) {
    CombineMode back{};
    ASSERT_TRUE(parse_combine_mode(combine_mode_name(m), back));
    EXPECT_EQ(back, m);
  }
  for (CutlassSwap sw :
       {CutlassSwap::automatic, CutlassSwap::off, CutlassSwap::on, CutlassSwap::n64, CutlassSwap::n128, CutlassSwap::n192,
        CutlassSwap::byrows}) {
    CutlassSwap back{};
    ASSERT_TRUE(parse_cutlass_swap(cutlass_swap_name(sw), back));
    EXPECT_EQ(back, sw);
  }
  CutlassSwap sw{};
  ASSERT_TRUE(parse_cutlass_swap("on", sw));
  EXPECT_EQ(sw, CutlassSwap::on);
  ASSERT_TRUE(parse_cutlass_swap("off", sw));
  EXPECT_EQ(sw, CutlassSwap::off);
  ASSERT_TRUE(parse_cutlass_swap("128", sw));
  EXPECT_EQ(sw, CutlassSwap::n128);
  ASSERT_TRUE(parse_cutlass_swap("192", sw));
  EXPECT_EQ(sw, CutlassSwap::n192);
  ASSERT_TRUE(parse_cutlass_swap("byrows", sw));
  EXPECT_EQ(sw, CutlassSwap::byrows);
  ASSERT_TRUE(parse_cutlass_swap("off", sw));
  EXPECT_FALSE(parse_cutlass_swap("2", sw));
  EXPECT_EQ(sw, CutlassSwap::off) << "a failed parse leaves the value";
  RunnerEngine e{};
  EXPECT_FALSE(parse_engine("fast", e));
  CombineMode m{};
  EXPECT_FALSE(parse_combine_mode("dma", m));
}

TEST(Tuning, AgreeFieldsAreFingerprintedLocalOnesAreNot) {
  MoeConfig c;
  c.hidden = 256; c.intermediate = 128; c.num_experts = 8; c.top_k = 2; c.capacity = 4;
  const uint64_t base = config_fingerprint(c);
  MoeConfig d = c;
  d.tuning.comm_sms = 3;
  d.tuning.push_warps = 4;
  d.tuning.wgmma_defer = !c.tuning.wgmma_defer;
  d.tuning.pdl = !c.tuning.pdl;
  d.tuning.nvfp4_wide_rows = 160;
  d.tuning.fused_swiglu = !c.tuning.fused_swiglu;
  d.tuning.concurrent_buckets = !c.tuning.concurrent_buckets;
  d.tuning.nvfp4_prepare = !c.tuning.nvfp4_prepare;
  d.tuning.fp8_mixed = !c.tuning.fp8_mixed;
  d.tuning.nvfp4_mixed = !c.tuning.nvfp4_mixed;
  d.tuning.widen_scratch_mb = 7;
  d.tuning.cutlass_swap = CutlassSwap::on;
  d.tuning.decode_max_rows = 64;
  d.tuning.nvfp4_wide_max_rows = 512;
  EXPECT_EQ(config_fingerprint(d), base);
  d = c;
  d.tuning.combine = CombineMode::ce;
  const uint64_t ce = config_fingerprint(d);
  EXPECT_NE(ce, base);
  d.tuning.ce_rows = c.tuning.ce_rows + 1;
  EXPECT_NE(config_fingerprint(d), ce);
  // The copy engine moves bf16 rows only: with an fp8 combine the mode changes nothing.
  MoeConfig f = c;
  f.combine_format = ActFormat::fp8;
  MoeConfig g = f;
  g.tuning.combine = CombineMode::ce;
  EXPECT_EQ(config_fingerprint(f), config_fingerprint(g));
}

TEST(Tuning, DescribeListsEveryFieldWithItsAgreement) {
  Tuning t;
  t.engine = RunnerEngine::cutlass;
  const std::string s = describe(t);
  for (const char* f : {"engine", "wgmma_defer", "pdl", "nvfp4_wide_rows", "fused_swiglu", "concurrent_buckets", "widen_scratch_mb", "nvfp4_prepare", "fp8_mixed", "nvfp4_mixed", "cutlass_swap",
                        "decode_max_rows", "nvfp4_wide_max_rows", "comm_sms", "push_warps", "combine", "ce_rows", "fault_check"})
    EXPECT_NE(s.find(f), std::string::npos) << f;
  EXPECT_NE(s.find("cutlass"), std::string::npos);
  EXPECT_NE(s.find("[agree]"), std::string::npos);
  EXPECT_NE(s.find("[local]"), std::string::npos);
}

}  // namespace
}  // namespace epmoe
