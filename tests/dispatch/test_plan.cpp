// The shared dispatch plan (src/dispatch/plan.h) that GPU backends use as their oracle: slots in
// ascending token order per destination, one copy per rank, translated rows.
#include <gtest/gtest.h>

#include "dispatch/plan.h"

namespace epmoe::detail {
namespace {

TEST(DispatchPlan, SlotsFollowTokenOrderPerDestination) {
  // 8 experts on 4 ranks (2 each), K = 2, source rank 1.
  const ExpertPlacement p = ExpertPlacement::contiguous(8, 4);
  const std::vector<int32_t> ids = {
      0, 7,    // t0 -> ranks 0 (slot 0), 3 (slot 0)
      1, 0,    // t1 -> rank 0 only (slot 1), both ids there
      -1, -1,  // t2 -> nowhere
      6, 2,    // t3 -> ranks 3 (slot 1), 1 (slot 0)
  };
  const DispatchPlan plan = make_dispatch_plan(p, 1, ids.data(), 4, 2);
  EXPECT_EQ(plan.send_counts, (std::vector<int32_t>{2, 1, 0, 2}));
  EXPECT_EQ(plan.slot, (std::vector<int32_t>{0, -1, -1, 0, 1, -1, -1, -1, -1, -1, -1, -1, -1, 0, -1, 1}));
  int32_t row[2];
  plan.translated_row(1, 0, row);
  EXPECT_EQ(row[0], 1);
  EXPECT_EQ(row[1], 0);
  plan.translated_row(3, 3, row);
  EXPECT_EQ(row[0], 0);
  EXPECT_EQ(row[1], -1);
  plan.translated_row(3, 1, row);
  EXPECT_EQ(row[0], -1);
  EXPECT_EQ(row[1], 0);
}

TEST(DispatchPlan, RedundantCopiesFollowThePlacementRule) {
  // Expert 0 has copies on ranks 0 and 2; source 1 has none, so token t uses copy (1 + t) % 2.
  std::vector<std::vector<ExpertCopy>> copies = {{{0, 0}, {2, 1}}, {{1, 0}}, {{2, 0}}, {{0, 1}}};
  const ExpertPlacement p = ExpertPlacement::explicit_map(3, 2, copies);
  const std::vector<int32_t> ids = {0, 0, 0, 0};  // K = 1, 4 tokens
  const DispatchPlan plan = make_dispatch_plan(p, 1, ids.data(), 4, 1);
  EXPECT_EQ(plan.send_counts, (std::vector<int32_t>{2, 0, 2}));
  EXPECT_EQ(plan.copy_rank, (std::vector<int32_t>{2, 0, 2, 0}));
  EXPECT_EQ(plan.copy_slot, (std::vector<int32_t>{1, 0, 1, 0}));
  // Source 2 holds a copy itself and always uses it.
  const DispatchPlan own = make_dispatch_plan(p, 2, ids.data(), 4, 1);
  EXPECT_EQ(own.send_counts, (std::vector<int32_t>{0, 0, 4}));
}

TEST(HostRecvBuffers, FinalizeInvalidatesSlotsBeyondCountsAndCountsPairs) {
  HostRecvBuffers b;
  b.allocate(2, 3, 128, 2, 4, ActFormat::bf16);
  b.local_ids = {0, 1, 2, 2, 3, 3, /* region 1 */ 1, -1, 0, 0, 3, 1};
  b.weights.assign(12, 1.f);
  b.counts = {2, 1};
  finalize_receive(b);
  EXPECT_EQ(b.local_ids, (std::vector<int32_t>{0, 1, 2, 2, -1, -1, 1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(b.weights, (std::vector<float>{1, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0}));
  EXPECT_EQ(b.expert_counts, (std::vector<int32_t>{1, 2, 2, 0}));
  const DispatchOutput o = b.view(QuantParams{});
  EXPECT_EQ(o.slots(), 6);
  EXPECT_EQ(o.scales, nullptr);
  EXPECT_EQ(o.counts[1], 1);
}

}  // namespace
}  // namespace epmoe::detail
