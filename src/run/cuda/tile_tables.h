// Which m-tile height each expert's rows get when the wide nvfp4 engine runs two heights (rows.cu
// writes the two tile tables, the runner launches the engine once per table), as plain integer
// code the host runs too: tests/run/test_tile_tables.cpp checks the rule without a GPU.
#pragma once

#include "epmoe/numeric.h"  // EPMOE_HD

namespace epmoe::cuda::tile_tables {

// m-tiles of at most bm rows that cover `rows` rows.
EPMOE_HD constexpr int tiles_of(int rows, int bm) { return (rows + bm - 1) / bm; }

// An expert goes to the second table (height bm2) only where that makes it fewer tiles: each tile
// decodes the expert's weights once, so a tile saved is a full weight decode saved, while the
// bm2 = 160 kernel is ~14% slower than bm = 128 on the same rows. Ties stay with bm; bm2 = 0: one
// table.
EPMOE_HD constexpr bool in_second(int rows, int bm, int bm2) {
  return bm2 > 0 && tiles_of(rows, bm2) < tiles_of(rows, bm);
}

}  // namespace epmoe::cuda::tile_tables
