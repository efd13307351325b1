// The m-tile tables of the decode engines as plain integer code the host runs too
// (tests/run/test_tile_tables.cpp checks it without a GPU): which height each expert's rows get
// when the wide nvfp4 engine runs two heights (rows.cu writes the two tables, the runner launches
// the engine once per table), and the order in which the engines walk (m-tile, weight tile) items.
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

// ---- walk order --------------------------------------------------------------------------------
// A decode engine's persistent grid walks the items (m-tile q, weight-tile group g) of a flat index
// t, CTA b taking b, b + grid, ...; neighbouring indices run at the same time on neighbouring CTAs.
// Row-major (q = t / ng, g = t % ng), an expert with c > 1 m-tiles streams each weight tile c times,
// ng items apart: where ng is larger than the grid covers (Mixtral-8x7B GEMM1: 224 weight tiles per
// m-tile, 264 CTAs) the repeat comes after the tile has left L2, so the expert's weights come from
// HBM c times. Within such an expert the walk goes weight tile by weight tile instead, its c
// m-tiles side by side (t = s * ng + g * c + j for m-tile s + j), so the c reads of one weight
// tile are concurrent and all but one are served by L2. The expert's items keep their index range
// [s * ng, (s + c) * ng), so q = t / ng still lands in the expert, and an expert of one m-tile
// (every uniform decode load) keeps the row-major order.
//
// rows.cu tags each m-tile (MTile::walk) with its index j within the expert and the expert's count
// c; an untagged tile (0), or an expert of more than kWalkMaxTiles m-tiles, walks row-major.
constexpr int kWalkMaxTiles = 0x7fff;
EPMOE_HD constexpr int walk_tag(int j, int count) {
  return count > 1 && count <= kWalkMaxTiles ? (j << 16) | count : 0;
}
struct WalkItem {
  int q, g;  // m-tile index in the table, weight-tile group
};
// Item t of a walk over ng groups per m-tile, where `tag_of_q` is the tag of m-tile t / ng.
EPMOE_HD constexpr WalkItem walk_item(int t, int ng, int tag_of_q) {
  const int q = t / ng;
  const int c = tag_of_q & 0xffff;
  if (c <= 1) return WalkItem{q, t - q * ng};
  const int s = q - (tag_of_q >> 16);  // the expert's first m-tile
  const int local = t - s * ng;
  return WalkItem{s + local % c, local / c};
}

}  // namespace epmoe::cuda::tile_tables
