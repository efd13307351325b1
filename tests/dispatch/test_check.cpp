// The dispatch input check (src/dispatch/check.h): every problem is found on the host as the CPU
// dispatchers see it, survives the record the GPU dispatchers exchange, and has one message that
// names the rank, the value and the fix.
#include <gtest/gtest.h>

#include "dispatch/check.h"

namespace epmoe::detail {
namespace {

const int32_t kIds[4] = {0, 1, 2, 3};
const float kW[4] = {};
const uint16_t kH[4] = {};

// The record a GPU dispatcher exchanges for `p`, decoded again.
InputProblem round_trip(const InputProblem& p) {
  int32_t rec[input::kRecordInts];
  rec[input::kRecCode] = p.code;
  rec[input::kRecTokens] = static_cast<int32_t>(p.num_tokens);
  rec[input::kRecToken] = static_cast<int32_t>(p.token);
  rec[input::kRecK] = p.k;
  rec[input::kRecValue] = p.value;
  return decode_input_record(rec);
}

std::string message(const InputProblem& p, int rank = 2, int C = 2, int E = 4) {
  const std::string m = input_message(p, rank, C, E);
  EXPECT_EQ(m, input_message(round_trip(p), rank, C, E)) << "the device record loses part of the problem";
  return m;
}

TEST(InputCheck, FineInputsHaveNoProblem) {
  EXPECT_TRUE(check_input(2, 2, 4, 2, kH, kIds, kW).ok());
  EXPECT_TRUE(check_input(0, 2, 4, 2, nullptr, nullptr, nullptr).ok());
  EXPECT_TRUE(check_input_shape(0, 0, nullptr, nullptr, nullptr).ok());
  EXPECT_EQ(input_message(InputProblem{}, 0, 2, 4), "");
  EXPECT_EQ(rejected_dispatch({"", ""}), "");
}

TEST(InputCheck, OverCapacityNamesRankTAndCAndTheFix) {
  const InputProblem p = check_input(3, 2, 4, 2, kH, kIds, kW);
  EXPECT_EQ(p.code, input::kOverCapacity);
  EXPECT_EQ(message(p),
            "rank 2: T=3 tokens exceeds capacity C=2; raise MoeConfig::capacity (--capacity) or send at most 2 tokens "
            "per call");
  EXPECT_EQ(check_input_shape(3, 2, kH, kIds, kW).code, input::kOverCapacity);
}

TEST(InputCheck, NegativeTokenCount) {
  const InputProblem p = check_input_shape(-1, 2, kH, kIds, kW);
  EXPECT_EQ(p.code, input::kNegative);
  EXPECT_EQ(message(p, 0), "rank 0: num_tokens=-1 is negative; pass T >= 0 tokens");
}

TEST(InputCheck, NullPointerNamesTheField) {
  EXPECT_EQ(message(check_input(1, 2, 4, 2, nullptr, kIds, kW)),
            "rank 2: DispatchInput::hidden is null with T=1 > 0; pass [T, H] hidden and [T, K] topk_ids and "
            "topk_weights");
  EXPECT_NE(message(check_input(1, 2, 4, 2, kH, nullptr, kW)).find("rank 2: DispatchInput::topk_ids is null"),
            std::string::npos);
  EXPECT_NE(message(check_input_shape(1, 2, kH, kIds, nullptr)).find("DispatchInput::topk_weights is null"),
            std::string::npos);
}

TEST(InputCheck, BadIdNamesTokenKIdAndRange) {
  const InputProblem p = check_input(2, 2, 3, 2, kH, kIds, kW);  // ids[1][1] = 3 with E = 3
  EXPECT_EQ(p.code, input::kBadId);
  EXPECT_EQ(message(p, 1, 2, 3),
            "rank 1: topk_ids[token 1, k 1] = 3 is outside [-1, E=3); pass expert ids in [0, 3) or -1 for none");
  const int32_t minus2[2] = {-1, -2};
  EXPECT_NE(message(check_input(1, 2, 4, 2, kH, minus2, kW)).find("topk_ids[token 0, k 1] = -2"), std::string::npos);
  // Ids are not read by the shape check (they may live on a device).
  EXPECT_TRUE(check_input_shape(2, 2, kH, kIds, kW).ok());
}

TEST(InputCheck, RejectedDispatchListsEveryRank) {
  EXPECT_EQ(rejected_dispatch({"rank 0: a", "", "rank 2: b"}), "dispatch: rank 0: a; rank 2: b (nothing was sent)");
}

TEST(InputCheck, CombineMessages) {
  EXPECT_NE(combine_without_dispatch().find("without a successful dispatch"), std::string::npos);
  EXPECT_NE(combine_null_y(7).find("CombineInput::y is null but 7 tokens"), std::string::npos);
  EXPECT_NE(combine_null_out(5).find("out is null with T=5"), std::string::npos);
}

}  // namespace
}  // namespace epmoe::detail
