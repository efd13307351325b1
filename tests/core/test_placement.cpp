// Expert placement: contiguous layout, explicit maps, the --placement syntax, the copy rule and
// problem reports.
#include <gtest/gtest.h>

#include <string>

#include "epmoe/error.h"
#include "epmoe/placement.h"

namespace {

using namespace epmoe;

bool any_contains(const std::vector<std::string>& v, const std::string& s) {
  for (const auto& x : v)
    if (x.find(s) != std::string::npos) return true;
  return false;
}

TEST(CorePlacement, Contiguous) {
  ExpertPlacement p = ExpertPlacement::contiguous(16, 4);
  EXPECT_TRUE(p.is_contiguous());
  EXPECT_EQ(p.num_experts(), 16);
  EXPECT_EQ(p.slots_per_rank(), 4);
  EXPECT_EQ(p.copies(13).size(), 1u);
  EXPECT_EQ(p.copies(13)[0], (ExpertCopy{3, 1}));
  EXPECT_EQ(p.choose(6, 0, 99), (ExpertCopy{1, 2}));
  EXPECT_TRUE(p.problems().empty());
  EXPECT_THROW(ExpertPlacement::contiguous(10, 4), UsageError);
  EXPECT_THROW(ExpertPlacement::contiguous(8, 0), UsageError);
}

TEST(CorePlacement, ParseAndChooseRule) {
  // Expert 0 has copies on ranks 0, 1 and 2; the other experts have one copy each.
  ExpertPlacement p = ExpertPlacement::parse("0:0.0,1.2,2.2; 1:0.1; 2:1.0; 3:1.1; 4:2.0; 5:2.1", 6, 4, 3);
  EXPECT_FALSE(p.is_contiguous());
  EXPECT_TRUE(p.problems().empty()) << p.problems()[0];
  ASSERT_EQ(p.copies(0).size(), 3u);
  EXPECT_EQ(p.copies(0)[1], (ExpertCopy{1, 2}));
  // A source rank that holds a copy always uses its own.
  for (int t = 0; t < 5; ++t) {
    EXPECT_EQ(p.choose(0, 1, t), (ExpertCopy{1, 2}));
    EXPECT_EQ(p.choose(0, 2, t), (ExpertCopy{2, 2}));
  }
  // Rank 3 holds none: copy (3 + t) mod 3.
  EXPECT_EQ(p.choose(0, 3, 0), (ExpertCopy{0, 0}));
  EXPECT_EQ(p.choose(0, 3, 1), (ExpertCopy{1, 2}));
  EXPECT_EQ(p.choose(0, 3, 2), (ExpertCopy{2, 2}));
  EXPECT_EQ(p.choose(0, 3, 3), (ExpertCopy{0, 0}));
  EXPECT_EQ(p.choose(4, 3, 7), (ExpertCopy{2, 0}));
  EXPECT_THROW(p.choose(6, 0, 0), UsageError);

  ExpertPlacement::Flat f = p.flatten();
  EXPECT_EQ(f.offsets, (std::vector<int32_t>{0, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(f.ranks, (std::vector<int32_t>{0, 1, 2, 0, 1, 1, 2, 2}));
  EXPECT_EQ(f.slots, (std::vector<int32_t>{0, 2, 2, 1, 0, 1, 0, 1}));
}

TEST(CorePlacement, ParseErrors) {
  auto msg = [](const std::string& spec) -> std::string {
    try {
      ExpertPlacement::parse(spec, 4, 2, 2);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(msg("0:0.0;1").find("expected ':'"), std::string::npos);
  EXPECT_NE(msg("0:0").find("expected '.'"), std::string::npos);
  EXPECT_NE(msg("7:0.0").find("expert 7 is outside [0, 4)"), std::string::npos);
  EXPECT_NE(msg("0:0.0;0:1.0").find("listed twice"), std::string::npos);
  EXPECT_NE(msg("0:0.0 x").find("syntax"), std::string::npos);
}

TEST(CorePlacement, ExplicitMapEqualToContiguousIsContiguous) {
  ExpertPlacement p = ExpertPlacement::parse("0:0.0;1:0.1;2:1.0;3:1.1", 4, 2, 2);
  EXPECT_TRUE(p.is_contiguous());
  ExpertPlacement q = ExpertPlacement::parse("0:0.0;1:0.1;2:1.1;3:1.0", 4, 2, 2);
  EXPECT_FALSE(q.is_contiguous());
}

TEST(CorePlacement, Problems) {
  // Expert 1 missing, expert 2's copy on a rank that does not exist, expert 3 in expert 0's slot,
  // slot out of range.
  ExpertPlacement p = ExpertPlacement::explicit_map(
      2, 2, {{{0, 0}}, {}, {{5, 0}}, {{0, 0}, {1, 7}}});
  const auto pr = p.problems();
  EXPECT_EQ(pr.size(), 4u);
  EXPECT_TRUE(any_contains(pr, "expert 1 has no copy"));
  EXPECT_TRUE(any_contains(pr, "expert 2 copy on rank 5 slot 0: rank is outside [0, 2)"));
  EXPECT_TRUE(any_contains(pr, "expert 3 copy on rank 0 slot 0: the slot already holds expert 0"));
  EXPECT_TRUE(any_contains(pr, "expert 3 copy on rank 1 slot 7: slot is outside [0, 2)"));
  ExpertPlacement dup = ExpertPlacement::explicit_map(1, 2, {{{0, 1}, {0, 1}}});
  EXPECT_TRUE(any_contains(dup.problems(), "listed twice"));
  ExpertPlacement none = ExpertPlacement::explicit_map(0, 0, {});
  EXPECT_FALSE(none.problems().empty());
}

}  // namespace
