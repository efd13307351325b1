// The wide nvfp4 engine's choice of tile height per expert (src/run/cuda/tile_tables.h), on the
// host: the rule rows.cu's scan applies on the device when tuning.nvfp4_wide_rows = 0.
#include "run/cuda/tile_tables.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace epmoe::test {
namespace {

namespace tt = cuda::tile_tables;
// kWgmmaWideBlockM and kWgmmaWide160BlockM (run/cuda/engine.h, which needs the CUDA headers that a
// CPU-only build lacks).
constexpr int kBm = 128, kBm2 = 160;

TEST(TileTables, TheSecondHeightOnlyWhereItSavesATile) {
  // 129-160 rows: one 160-row tile instead of two 128-row ones; 161-256: two either way (ties stay
  // with 128); 257-320: two instead of three; 321-384: three either way; 385-480: three vs four.
  for (int rows : {0, 1, 64, 127, 128, 161, 200, 256, 321, 384}) EXPECT_FALSE(tt::in_second(rows, kBm, kBm2)) << rows;
  for (int rows : {129, 140, 159, 160, 257, 300, 320, 385, 480}) EXPECT_TRUE(tt::in_second(rows, kBm, kBm2)) << rows;
  // One table: nothing goes to the second.
  for (int rows : {129, 160, 300}) EXPECT_FALSE(tt::in_second(rows, kBm, 0)) << rows;
}

TEST(TileTables, EveryExpertGetsTheFewerTiles) {
  // Over every row count up to 64K, the chosen table's tiles are the minimum of the two heights',
  // and a tie keeps the 128-row tiles (the faster kernel on the same rows).
  for (int rows = 0; rows <= 65536; ++rows) {
    const int t1 = tt::tiles_of(rows, kBm), t2 = tt::tiles_of(rows, kBm2);
    const bool second = tt::in_second(rows, kBm, kBm2);
    ASSERT_EQ(second ? t2 : t1, std::min(t1, t2)) << rows;
    if (t1 == t2) ASSERT_FALSE(second) << rows;
  }
  EXPECT_EQ(tt::tiles_of(0, kBm), 0);
  EXPECT_EQ(tt::tiles_of(1, kBm), 1);
  EXPECT_EQ(tt::tiles_of(160, kBm2), 1);
  EXPECT_EQ(tt::tiles_of(161, kBm2), 2);
}

}  // namespace
}  // namespace epmoe::test
