// The staged epilogue's shared-memory layout (src/run/cuda/staged_layout.h), checked on the host by
// playing the warp's stmatrix.trans and 16-byte read-back with the layout's offsets: every
// accumulator must reach the (token, column) that wg::store_tile writes it to, every buffer byte
// must be written once per pass, and no stmatrix phase or read-back quarter-warp may have a bank
// conflict (two 16-byte accesses in the same 16-byte bank group of a 128-byte line).
#include "run/cuda/staged_layout.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

namespace epmoe::test {
namespace {

namespace sl = cuda::staged_layout;

// One accumulator of the m64 fragment: thread (warp, lane), half h, register i.
using Acc = std::tuple<int, int, int, int>;

// The position store_tile writes an accumulator to: weight row 64 h + 16 warp + 8 ((i >> 1) & 1) +
// lane / 4 is the column, token 8 (i >> 2) + 2 (lane % 4) + (i & 1) the row.
std::pair<int, int> direct_position(int warp, int lane, int h, int i) {
  const int col = 64 * h + 16 * warp + 8 * ((i >> 1) & 1) + (lane >> 2);
  const int token = 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
  return {token, col};
}

// stmatrix.x4.trans: register m of every lane holds matrix m's fragment (row lane / 4, columns
// 2 (lane % 4) + 0/1); lane 8 m + r gives the address of stored row r, which receives column r of
// the fragment (8 elements, one from each fragment row).
void stmatrix_trans(const std::vector<Acc> (&reg)[32][4], const int (&addr)[32],
                    std::map<int, Acc>& smem) {
  for (int m = 0; m < 4; ++m)
    for (int r = 0; r < 8; ++r)
      for (int e = 0; e < 8; ++e) {
        const int holder = 4 * e + (r >> 1);  // fragment row e, column r
        smem[addr[8 * m + r] + 2 * e] = reg[holder][m][r & 1];
      }
}

bool conflict_free(const std::vector<int>& offsets16) {
  std::set<int> groups;
  for (int o : offsets16) groups.insert((o / 16) % 8);
  return groups.size() == offsets16.size();
}

TEST(StagedLayout, Gemm2ReachesStoreTilePositionsWithoutBankConflicts) {
  constexpr int kNR = 64;  // the wide engine's 128-token tile: 16 groups of 8 tokens
  for (int warp = 0; warp < 4; ++warp) {
    std::map<std::pair<int, int>, Acc> got;
    for (int pass = 0; pass < kNR / 16; ++pass) {
      std::map<int, Acc> smem;
      for (int jj = 0; jj < 4; ++jj) {
        const int i = 4 * (4 * pass + jj);
        // Registers as store_tile_staged passes them: (h 0, hh 0), (h 0, hh 1), (h 1, hh 0), (h 1, hh 1).
        std::vector<Acc> reg[32][4];
        int addr[32];
        for (int lane = 0; lane < 32; ++lane) {
          const int hs[4] = {0, 0, 1, 1}, is[4] = {i, i + 2, i, i + 2};
          for (int m = 0; m < 4; ++m)
            reg[lane][m] = {Acc{warp, lane, hs[m], is[m]}, Acc{warp, lane, hs[m], is[m] + 1}};
          addr[lane] = sl::gemm2_offset(lane & 7, lane >> 3) + 8 * sl::kRowBytes * jj;
        }
        for (int m = 0; m < 4; ++m) {
          std::vector<int> phase;
          for (int r = 0; r < 8; ++r) phase.push_back(addr[8 * m + r]);
          EXPECT_TRUE(conflict_free(phase)) << "stmatrix matrix " << m << " of group " << jj;
        }
        stmatrix_trans(reg, addr, smem);
      }
      ASSERT_EQ(smem.size(), size_t(sl::kWarpBytes / 2)) << "every buffer element written once a pass";
      for (int k = 0; k < 4; ++k) {
        for (int quarter = 0; quarter < 4; ++quarter) {
          std::vector<int> phase;
          for (int lane = 8 * quarter; lane < 8 * quarter + 8; ++lane)
            phase.push_back(sl::gemm2_offset(lane >> 2, lane & 3) + 8 * sl::kRowBytes * k);
          EXPECT_TRUE(conflict_free(phase)) << "read-back " << k << ", quarter " << quarter;
        }
        for (int lane = 0; lane < 32; ++lane) {
          const int off = sl::gemm2_offset(lane >> 2, lane & 3) + 8 * sl::kRowBytes * k;
          const int token = 32 * pass + 8 * k + (lane >> 2), col = sl::gemm2_column(warp, lane & 3);
          for (int e = 0; e < 8; ++e) got[{token, col + e}] = smem.at(off + 2 * e);
        }
      }
    }
    ASSERT_EQ(got.size(), size_t(32 * 2 * kNR)) << "warp " << warp;
    for (const auto& [pos, acc] : got) {
      const auto [w, lane, h, i] = acc;
      EXPECT_EQ(direct_position(w, lane, h, i), pos) << "warp " << warp << " token " << pos.first << " column "
                                                     << pos.second;
    }
  }
}

}  // namespace
}  // namespace epmoe::test
