// Activation and weight quantization (DESIGN.md §2, §4.2), CPU reference. The operation order is
// part of the format: the CUDA quantizers follow it exactly and match bitwise.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "epmoe/format.h"
#include "epmoe/numeric.h"
#include "epmoe/tensor.h"

namespace epmoe {

// ---- single blocks -------------------------------------------------------------------------
// fp8 block of n <= 128 values (fewer only in a row's last block, when its length is not a
// multiple of 128): writes n e4m3 codes, returns the fp32 scale.
float quantize_fp8_block(const float* x, int n, bool ue8m0, uint8_t* q);
// nvfp4 block of 16: writes 8 packed bytes (element 2i low nibble), returns the e4m3 scale code.
uint8_t quantize_nvfp4_block(const float* x16, float global_scale, uint8_t* packed8);
// gs = 448 * 6 / amax over `n` values (amax of 0 gives gs = 1).
float nvfp4_global_scale(const float* x, size_t n);
float nvfp4_global_scale_bf16(const bf16_raw* x, size_t n);

// ---- rows of activations ---------------------------------------------------------------------
// in: [T, H] bf16. payload: [T][payload_bytes(f, H)], scales: [T][scale_bytes(f, H)].
void quantize_rows(ActFormat f, const QuantParams& p, const bf16_raw* in, int64_t T, int H,
                   uint8_t* payload, uint8_t* scales);
// Inverse: out [T, H] fp32. For bf16 this is an exact widening.
void dequantize_rows(ActFormat f, const QuantParams& p, const uint8_t* payload, const uint8_t* scales,
                     int64_t T, int H, float* out);

// ---- weights ---------------------------------------------------------------------------------
// One weight matrix for all experts of a rank: [E_loc][rows][cols], K (= cols) contiguous.
struct MatrixView {
  WeightFormat format = WeightFormat::bf16;
  int experts = 0, rows = 0, cols = 0;
  // fp8: rows [0, row_split) and [row_split, rows) are scaled as two stacked matrices, each with
  // its own 128x128 tile grid (W13 with row_split = I: gate and up, as checkpoints store them, so
  // that no tile mixes the two when I % 128 != 0); 0 = one grid over all rows. Both give the same
  // bytes when row_split % 128 == 0. Ignored by bf16 and nvfp4.
  int row_split = 0;
  const void* data = nullptr;           // bf16: u16 [E][rows][cols]; fp8: e4m3 [E][rows][cols];
                                        // nvfp4: packed [E][rows][cols/2]
  const void* scales = nullptr;         // fp8: f32 [E][fp8_tile_rows(rows, row_split)][ceil(cols/128)]
                                        // (edge tiles partial); nvfp4: e4m3 [E][rows][cols/16]
  const float* global_scale = nullptr;  // nvfp4: [E]
  // Optional, made once by the cuda runner's prepare step (Runner::prepare; run/cuda/prepare.h): nvfp4:
  // the weights in the decode engine's tile order; fp8 W13: its scales in the one-GEMM SwiGLU's order.
  // data and scales stay required (other engines read them). Rebuild it if data or scales change.
  const void* prepared = nullptr;
  DeviceKind device = DeviceKind::cpu;

  size_t data_bytes() const;
  size_t scale_bytes() const;
};

// fp8 weight scale grid: tile rows of a matrix of `rows` rows split at `row_split` (MatrixView), and
// the tile row of row r.
EPMOE_HD int fp8_tile_rows(int rows, int row_split) {
  return row_split > 0 ? (row_split + 127) / 128 + (rows - row_split + 127) / 128 : (rows + 127) / 128;
}
EPMOE_HD int fp8_tile_row(int r, int row_split) {
  return row_split > 0 && r >= row_split ? (row_split + 127) / 128 + (r - row_split) / 128 : r / 128;
}
// The rows [begin, end) that scale tile row t covers (fewer than 128 at the end of a part).
EPMOE_HD int fp8_tile_row_begin(int t, int row_split) {
  const int first = (row_split + 127) / 128;  // tile rows of the first part
  return row_split > 0 && t >= first ? row_split + (t - first) * 128 : t * 128;
}
EPMOE_HD int fp8_tile_row_end(int t, int rows, int row_split) {
  const int b = fp8_tile_row_begin(t, row_split);
  const int part_end = row_split > 0 && b < row_split ? row_split : rows;
  return b + 128 < part_end ? b + 128 : part_end;
}

// Whether a runner takes m's row_split: 0, or for fp8 `part` (W13: the intermediate size I; W2: 0).
inline bool row_split_ok(const MatrixView& m, int part) {
  return m.row_split == 0 || (m.format == WeightFormat::fp8 && m.row_split == part);
}
// The error text for a row_split that row_split_ok refuses ("w13", I).
std::string row_split_error(const char* what, const MatrixView& m, int part);

// Host-owned quantized matrix.
struct HostMatrix {
  WeightFormat format = WeightFormat::bf16;
  int experts = 0, rows = 0, cols = 0;
  int row_split = 0;  // as MatrixView::row_split
  std::vector<uint8_t> data, scales;
  std::vector<float> global_scale;
  MatrixView view() const;
};

// Quantizes fp32 weights [E][rows][cols]: bf16 by RNE; fp8 per 128x128 tile with the fp8 rule of
// 3.2 (amax over the tile), rows [0, row_split) and [row_split, rows) as two stacked matrices when
// row_split > 0 (W13: pass I); nvfp4 per 16 along cols with gs computed per expert from its data.
HostMatrix quantize_matrix(const float* w, int experts, int rows, int cols, WeightFormat f, int row_split = 0);
// Dequantizes expert `e`, rows [r0, r0+n) into out [n][cols] fp32.
void dequantize_matrix_rows(const MatrixView& m, int e, int r0, int n, float* out);

}  // namespace epmoe
