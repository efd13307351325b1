// CPU reference quantizers (DESIGN.md §2, §4.2; docs/FORMATS.md). The operation order below is part
// of the format: the CUDA quantizers repeat it step by step so that both produce identical bytes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "epmoe/error.h"
#include "epmoe/numeric.h"
#include "epmoe/quant.h"

namespace epmoe {

namespace {

// max(|x|) that skips NaN (fmaxf semantics: a NaN operand loses). Inf is kept: see FORMATS.md.
inline float amax_update(float m, float x) { return std::fmax(m, std::fabs(x)); }

// 2^ceil(log2(v)) for a positive, finite, normal v, read off the bits so that no libm rounding
// enters the format.
inline float pow2_ceil(float v) {
  const uint32_t u = num::f32_bits(v);
  if (u >= 0x7f800000u) return v;          // Inf (only from an Inf amax): propagate
  if ((u & 0x7fffffu) == 0) return v;      // already a power of two
  if (u < 0x00800000u) return std::ldexp(1.0f, -126);  // subnormal: 2^-126 bounds it from above
  return num::bits_f32(((u >> 23) + 1u) << 23);
}

void store_f32(uint8_t* dst, float v) { std::memcpy(dst, &v, 4); }
float load_f32(const uint8_t* src) {
  float v;
  std::memcpy(&v, src, 4);
  return v;
}

void check_act_args(const char* fn, ActFormat f, const QuantParams& p, int H) {
  if (H < 0) throw UsageError(std::string(fn) + ": H=" + std::to_string(H) + " must be >= 0");
  const int m = hidden_multiple(f);
  if (H % m != 0) {
    throw UsageError(std::string(fn) + ": H=" + std::to_string(H) + " is not a multiple of " + std::to_string(m) +
                     ", which format " + format_name(f) + " requires; pad the hidden size or use bf16");
  }
  if (f == ActFormat::nvfp4 && !(p.nvfp4_global_scale > 0.f && std::isfinite(p.nvfp4_global_scale))) {
    throw UsageError(std::string(fn) + ": nvfp4_global_scale=" + std::to_string(p.nvfp4_global_scale) +
                     " must be finite and > 0; compute it with nvfp4_global_scale_bf16()");
  }
}

void check_ptrs(const char* fn, ActFormat f, const void* values, const void* payload, const void* scales) {
  if (values == nullptr || payload == nullptr || (f != ActFormat::bf16 && scales == nullptr)) {
    throw UsageError(std::string(fn) + ": a null " +
                     (values == nullptr ? "row buffer" : payload == nullptr ? "payload buffer" : "scales buffer") +
                     " for format " + format_name(f) + " with T > 0; pass the buffers (scales may be null only for bf16)");
  }
}

}  // namespace

float quantize_fp8_block(const float* x, int n, bool ue8m0, uint8_t* q) {
  float amax = 0.f;
  for (int i = 0; i < n; ++i) amax = amax_update(amax, x[i]);
  const float a = std::max(amax, 1e-4f);
  if (ue8m0) {
    const float scale = pow2_ceil(a / num::kE4m3Max);
    for (int i = 0; i < n; ++i) q[i] = num::f32_to_e4m3(x[i] / scale);
    return scale;
  }
  const float scale = a / num::kE4m3Max;
  const float mul = num::kE4m3Max / a;  // once per block, as the format prescribes
  for (int i = 0; i < n; ++i) q[i] = num::f32_to_e4m3(x[i] * mul);
  return scale;
}

uint8_t quantize_nvfp4_block(const float* x16, float global_scale, uint8_t* packed8) {
  float amax = 0.f;
  for (int i = 0; i < 16; ++i) amax = amax_update(amax, x16[i]);
  const uint8_t s = num::f32_to_e4m3((amax * global_scale) / 6.0f);
  const float sf = num::e4m3_to_f32(s);
  if (sf == 0.f || !(sf == sf)) {
    // A zero (or NaN, from a NaN global scale) block scale has no inverse: the block is all zeros.
    std::memset(packed8, 0, 8);
    return s;
  }
  const float inv = global_scale / sf;
  for (int i = 0; i < 8; ++i) {
    const uint8_t lo = num::f32_to_e2m1(x16[2 * i] * inv);
    const uint8_t hi = num::f32_to_e2m1(x16[2 * i + 1] * inv);
    packed8[i] = static_cast<uint8_t>(lo | (hi << 4));
  }
  return s;
}

namespace {
float global_scale_from_amax(float amax) {
  if (amax == 0.f) return 1.f;
  const float gs = (num::kE4m3Max * 6.0f) / amax;
  // A subnormal amax would overflow gs to Inf, and Inf * 0 would turn zeros into NaN.
  return std::isfinite(gs) ? gs : std::numeric_limits<float>::max();
}
}  // namespace

float nvfp4_global_scale(const float* x, size_t n) {
  // Calibration skips NaN and Inf: one bad value must not zero the whole layer's scale.
  float amax = 0.f;
  for (size_t i = 0; i < n; ++i) {
    if (std::isfinite(x[i])) amax = std::max(amax, std::fabs(x[i]));
  }
  return global_scale_from_amax(amax);
}

float nvfp4_global_scale_bf16(const bf16_raw* x, size_t n) {
  float amax = 0.f;
  for (size_t i = 0; i < n; ++i) {
    const float v = num::bf16_to_f32(x[i]);
    if (std::isfinite(v)) amax = std::max(amax, std::fabs(v));
  }
  return global_scale_from_amax(amax);
}

void quantize_rows(ActFormat f, const QuantParams& p, const bf16_raw* in, int64_t T, int H, uint8_t* payload,
                   uint8_t* scales) {
  check_act_args("quantize_rows", f, p, H);
  if (T < 0) throw UsageError("quantize_rows: T=" + std::to_string(T) + " must be >= 0");
  if (T == 0 || H == 0) return;
  check_ptrs("quantize_rows", f, in, payload, scales);
  const size_t pb = payload_bytes(f, H), sb = scale_bytes(f, H);
  std::vector<float> row(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    const bf16_raw* src = in + t * int64_t(H);
    uint8_t* dst = payload + size_t(t) * pb;
    if (f == ActFormat::bf16) {
      std::memcpy(dst, src, size_t(H) * 2);
      continue;
    }
    for (int i = 0; i < H; ++i) row[i] = num::bf16_to_f32(src[i]);
    uint8_t* sc = scales + size_t(t) * sb;
    if (f == ActFormat::fp8) {
      for (int b = 0; b < fp8_blocks(H); ++b) {
        const int n = std::min(128, H - 128 * b);
        store_f32(sc + 4 * b, quantize_fp8_block(row.data() + 128 * b, n, p.ue8m0, dst + 128 * b));
      }
    } else {
      for (int b = 0; b < H / 16; ++b) {
        sc[b] = quantize_nvfp4_block(row.data() + 16 * b, p.nvfp4_global_scale, dst + 8 * b);
      }
    }
  }
}

void dequantize_rows(ActFormat f, const QuantParams& p, const uint8_t* payload, const uint8_t* scales, int64_t T,
                     int H, float* out) {
  check_act_args("dequantize_rows", f, p, H);
  if (T < 0) throw UsageError("dequantize_rows: T=" + std::to_string(T) + " must be >= 0");
  if (T == 0 || H == 0) return;
  check_ptrs("dequantize_rows", f, out, payload, scales);
  const size_t pb = payload_bytes(f, H), sb = scale_bytes(f, H);
  for (int64_t t = 0; t < T; ++t) {
    const uint8_t* src = payload + size_t(t) * pb;
    float* dst = out + t * int64_t(H);
    if (f == ActFormat::bf16) {
      for (int i = 0; i < H; ++i) {
        bf16_raw b;
        std::memcpy(&b, src + 2 * i, 2);
        dst[i] = num::bf16_to_f32(b);
      }
    } else if (f == ActFormat::fp8) {
      const uint8_t* sc = scales + size_t(t) * sb;
      for (int i = 0; i < H; ++i) dst[i] = num::e4m3_to_f32(src[i]) * load_f32(sc + 4 * (i / 128));
    } else {
      const uint8_t* sc = scales + size_t(t) * sb;
      for (int i = 0; i < H; ++i) {
        const uint8_t code = (i & 1) ? (src[i / 2] >> 4) : (src[i / 2] & 0xf);
        // (q * s) is exact (at most 7 significant bits); the division rounds once.
        dst[i] = (num::e2m1_to_f32(code) * num::e4m3_to_f32(sc[i / 16])) / p.nvfp4_global_scale;
      }
    }
  }
}

// ---- weights ---------------------------------------------------------------------------------

namespace {
size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }
}  // namespace

size_t MatrixView::data_bytes() const {
  const size_t n = size_t(std::max(experts, 0)) * size_t(std::max(rows, 0)) * size_t(std::max(cols, 0));
  switch (format) {
    case WeightFormat::bf16: return n * 2;
    case WeightFormat::fp8: return n;
    case WeightFormat::nvfp4: return n / 2;
  }
  return 0;
}

size_t MatrixView::scale_bytes() const {
  const size_t e = size_t(std::max(experts, 0)), r = size_t(std::max(rows, 0)), c = size_t(std::max(cols, 0));
  switch (format) {
    case WeightFormat::bf16: return 0;
    case WeightFormat::fp8: return e * size_t(fp8_tile_rows(int(r), std::max(row_split, 0))) * ceil_div(c, 128) * 4;
    case WeightFormat::nvfp4: return e * r * ceil_div(c, 16);
  }
  return 0;
}

std::string row_split_error(const char* what, const MatrixView& m, int part) {
  return std::string(what) + ".row_split=" + std::to_string(m.row_split) + " (" + format_name(m.format) +
         "); use 0 (one scale grid)" +
         (part > 0 ? " or " + std::to_string(part) + " (fp8 gate and up rows tiled apart, as checkpoints store W13)"
                   : std::string());
}

MatrixView HostMatrix::view() const {
  MatrixView v;
  v.format = format;
  v.experts = experts;
  v.rows = rows;
  v.cols = cols;
  v.row_split = row_split;
  v.data = data.empty() ? nullptr : data.data();
  v.scales = scales.empty() ? nullptr : scales.data();
  v.global_scale = global_scale.empty() ? nullptr : global_scale.data();
  v.device = DeviceKind::cpu;
  return v;
}

HostMatrix quantize_matrix(const float* w, int experts, int rows, int cols, WeightFormat f, int row_split) {
  if (experts < 0 || rows < 0 || cols < 0) {
    throw UsageError("quantize_matrix: shape [" + std::to_string(experts) + "][" + std::to_string(rows) + "][" +
                     std::to_string(cols) + "] has a negative extent");
  }
  if (row_split < 0 || row_split > rows) {
    throw UsageError("quantize_matrix: row_split=" + std::to_string(row_split) + " is outside [0, rows=" +
                     std::to_string(rows) + "]; pass 0 (one scale grid) or the first part's rows (W13: I)");
  }
  if (f == WeightFormat::nvfp4 && cols % 16 != 0) {
    throw UsageError("quantize_matrix: cols=" + std::to_string(cols) +
                     " is not a multiple of 16, which weight format nvfp4 requires (blocks of 16 along K)");
  }
  HostMatrix m;
  m.format = f;
  m.experts = experts;
  m.rows = rows;
  m.cols = cols;
  m.row_split = f == WeightFormat::fp8 ? row_split : 0;
  const MatrixView shape = m.view();
  m.data.resize(shape.data_bytes());
  m.scales.resize(shape.scale_bytes());
  const size_t per_expert = size_t(rows) * size_t(cols);
  if (f == WeightFormat::bf16) {
    for (size_t i = 0; i < per_expert * size_t(experts); ++i) {
      const bf16_raw b = num::f32_to_bf16(w[i]);
      std::memcpy(m.data.data() + 2 * i, &b, 2);
    }
    return m;
  }
  if (f == WeightFormat::fp8) {
    const int split = m.row_split;
    const int tr = fp8_tile_rows(rows, split), tc = int(ceil_div(size_t(cols), 128));
    std::vector<float> tile(128 * 128);
    std::vector<uint8_t> q(128 * 128);
    for (int e = 0; e < experts; ++e) {
      const float* we = w + size_t(e) * per_expert;
      uint8_t* qe = m.data.data() + size_t(e) * per_expert;
      for (int bi = 0; bi < tr; ++bi) {
        const int r0 = fp8_tile_row_begin(bi, split), nr = fp8_tile_row_end(bi, rows, split) - r0;
        for (int bj = 0; bj < tc; ++bj) {
          const int c0 = bj * 128;
          const int nc = std::min(128, cols - c0);
          // Gather the tile so that the block rule (one amax, one scale) applies to it unchanged.
          for (int r = 0; r < nr; ++r) {
            std::memcpy(tile.data() + size_t(r) * nc, we + size_t(r0 + r) * cols + c0, size_t(nc) * 4);
          }
          const float s = quantize_fp8_block(tile.data(), nr * nc, false, q.data());
          for (int r = 0; r < nr; ++r) {
            std::memcpy(qe + size_t(r0 + r) * cols + c0, q.data() + size_t(r) * nc, size_t(nc));
          }
          store_f32(m.scales.data() + 4 * ((size_t(e) * tr + bi) * tc + bj), s);
        }
      }
    }
    return m;
  }
  // nvfp4
  m.global_scale.resize(size_t(experts));
  const size_t row_bytes = size_t(cols) / 2, row_scales = size_t(cols) / 16;
  for (int e = 0; e < experts; ++e) {
    const float* we = w + size_t(e) * per_expert;
    const float gs = nvfp4_global_scale(we, per_expert);
    m.global_scale[e] = gs;
    for (int r = 0; r < rows; ++r) {
      uint8_t* pd = m.data.data() + (size_t(e) * rows + r) * row_bytes;
      uint8_t* ps = m.scales.data() + (size_t(e) * rows + r) * row_scales;
      for (size_t b = 0; b < row_scales; ++b) {
        ps[b] = quantize_nvfp4_block(we + size_t(r) * cols + 16 * b, gs, pd + 8 * b);
      }
    }
  }
  return m;
}

void dequantize_matrix_rows(const MatrixView& m, int e, int r0, int n, float* out) {
  if (m.device != DeviceKind::cpu) {
    throw UsageError("dequantize_matrix_rows: the matrix lives on cuda; pass a host copy");
  }
  if (e < 0 || e >= m.experts) {
    throw UsageError("dequantize_matrix_rows: expert " + std::to_string(e) + " is outside [0, " +
                     std::to_string(m.experts) + ")");
  }
  if (r0 < 0 || n < 0 || int64_t(r0) + n > m.rows) {
    throw UsageError("dequantize_matrix_rows: rows [" + std::to_string(r0) + ", " + std::to_string(int64_t(r0) + n) +
                     ") are outside [0, " + std::to_string(m.rows) + ")");
  }
  if (n == 0 || m.cols == 0) return;
  if (m.data == nullptr || (m.format != WeightFormat::bf16 && m.scales == nullptr) ||
      (m.format == WeightFormat::nvfp4 && m.global_scale == nullptr)) {
    throw UsageError(std::string("dequantize_matrix_rows: ") + format_name(m.format) +
                     " matrix has a null data, scales or global_scale pointer");
  }
  const size_t cols = size_t(m.cols), rows = size_t(m.rows);
  if (m.format == WeightFormat::bf16) {
    const auto* d = static_cast<const uint8_t*>(m.data) + (size_t(e) * rows + r0) * cols * 2;
    for (size_t i = 0; i < size_t(n) * cols; ++i) {
      bf16_raw b;
      std::memcpy(&b, d + 2 * i, 2);
      out[i] = num::bf16_to_f32(b);
    }
  } else if (m.format == WeightFormat::fp8) {
    const auto* d = static_cast<const uint8_t*>(m.data) + size_t(e) * rows * cols;
    const auto* s = static_cast<const uint8_t*>(m.scales);
    const size_t tr = size_t(fp8_tile_rows(int(rows), m.row_split)), tc = ceil_div(cols, 128);
    for (int r = r0; r < r0 + n; ++r) {
      const uint8_t* srow = s + 4 * ((size_t(e) * tr + size_t(fp8_tile_row(r, m.row_split))) * tc);
      for (size_t c = 0; c < cols; ++c) {
        out[size_t(r - r0) * cols + c] = num::e4m3_to_f32(d[size_t(r) * cols + c]) * load_f32(srow + 4 * (c / 128));
      }
    }
  } else {
    const auto* d = static_cast<const uint8_t*>(m.data);
    const auto* s = static_cast<const uint8_t*>(m.scales);
    const float gs = m.global_scale[e];
    for (int r = r0; r < r0 + n; ++r) {
      const uint8_t* drow = d + (size_t(e) * rows + r) * (cols / 2);
      const uint8_t* srow = s + (size_t(e) * rows + r) * (cols / 16);
      for (size_t c = 0; c < cols; ++c) {
        const uint8_t code = (c & 1) ? (drow[c / 2] >> 4) : (drow[c / 2] & 0xf);
        out[size_t(r - r0) * cols + c] = (num::e2m1_to_f32(code) * num::e4m3_to_f32(srow[c / 16])) / gs;
      }
    }
  }
}

}  // namespace epmoe
