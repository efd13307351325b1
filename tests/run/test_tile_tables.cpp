// The decode engines' m-tile tables (src/run/cuda/tile_tables.h) on the host: the wide nvfp4
// engine's tile height per expert (the rule rows.cu's scan applies on the device when
// tuning.nvfp4_wide_rows = 0), and the order in which the engines walk (m-tile, weight tile) items.
#include "run/cuda/tile_tables.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

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

// The tags rows.cu writes: for each expert its m-tiles of bm rows, tagged (index, count).
struct Table {
  std::vector<int> expert, tag;
};
Table tagged_table(const std::vector<int>& rows_per_expert, int bm) {
  Table t;
  for (int e = 0; e < int(rows_per_expert.size()); ++e) {
    const int c = tt::tiles_of(rows_per_expert[e], bm);
    for (int j = 0; j < c; ++j) {
      t.expert.push_back(e);
      t.tag.push_back(tt::walk_tag(j, c));
    }
  }
  return t;
}

TEST(TileTables, TheWalkVisitsEveryItemOnceAndStaysInItsExpert) {
  // Experts of 0-5 m-tiles (bm 32), for several numbers of weight-tile groups.
  const std::vector<int> rows = {32, 40, 0, 1, 64, 65, 150, 33, 96, 7};
  const Table t = tagged_table(rows, 32);
  const int mt = int(t.expert.size());
  for (int ng : {1, 2, 3, 7, 56, 224}) {
    std::vector<int> seen(size_t(mt) * ng, 0);
    for (int i = 0; i < mt * ng; ++i) {
      const tt::WalkItem it = tt::walk_item(i, ng, t.tag[i / ng]);
      ASSERT_GE(it.q, 0);
      ASSERT_LT(it.q, mt);
      ASSERT_GE(it.g, 0);
      ASSERT_LT(it.g, ng);
      // The item is one of the expert whose index range holds i (the range row-major gives it).
      ASSERT_EQ(t.expert[it.q], t.expert[i / ng]) << "item " << i << " ng " << ng;
      ++seen[size_t(it.q) * ng + it.g];
    }
    for (size_t k = 0; k < seen.size(); ++k) ASSERT_EQ(seen[k], 1) << "item (q, g) " << k << " ng " << ng;
  }
}

TEST(TileTables, AnExpertsMTilesShareEachWeightTileSideBySide) {
  // 150 rows at bm 32: five m-tiles (indices 0-4). Its items go weight tile by weight tile, the
  // five m-tiles of one weight tile at neighbouring indices; a one-tile expert keeps row-major.
  const Table t = tagged_table({150, 20}, 32);
  ASSERT_EQ(t.expert.size(), 6u);
  const int ng = 4;
  for (int i = 0; i < 5 * ng; ++i) {
    const tt::WalkItem it = tt::walk_item(i, ng, t.tag[i / ng]);
    EXPECT_EQ(it.g, i / 5) << i;
    EXPECT_EQ(it.q, i % 5) << i;
  }
  for (int i = 5 * ng; i < 6 * ng; ++i) {
    const tt::WalkItem it = tt::walk_item(i, ng, t.tag[i / ng]);
    EXPECT_EQ(it.q, 5);
    EXPECT_EQ(it.g, i - 5 * ng);
  }
}

TEST(TileTables, UntaggedAndHugeExpertsWalkRowMajor) {
  // Tag 0 (a table nobody tagged, or an expert past kWalkMaxTiles m-tiles): q = i / ng, g = i % ng.
  EXPECT_EQ(tt::walk_tag(0, 1), 0);
  EXPECT_EQ(tt::walk_tag(3, tt::kWalkMaxTiles + 1), 0);
  EXPECT_NE(tt::walk_tag(tt::kWalkMaxTiles - 1, tt::kWalkMaxTiles), 0);
  for (int i = 0; i < 100; ++i) {
    const tt::WalkItem it = tt::walk_item(i, 7, 0);
    EXPECT_EQ(it.q, i / 7);
    EXPECT_EQ(it.g, i % 7);
  }
  // The largest tag stays positive (bit 31 clear), so the index decodes back.
  const int big = tt::walk_tag(tt::kWalkMaxTiles - 1, tt::kWalkMaxTiles);
  EXPECT_GT(big, 0);
  EXPECT_EQ(big >> 16, tt::kWalkMaxTiles - 1);
  EXPECT_EQ(big & 0xffff, tt::kWalkMaxTiles);
}

}  // namespace
}  // namespace epmoe::test
