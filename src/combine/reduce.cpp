#include "combine/reduce.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "epmoe/error.h"
#include "epmoe/numeric.h"
#include "epmoe/quant.h"

namespace epmoe::detail {
namespace {

// Which combine formats exist is validate()'s rule (and the registry's per dispatcher); this guards
// the codec against a caller that skipped it.
void require_combine_codec(ActFormat f) {
  if (f != ActFormat::bf16 && f != ActFormat::fp8)
    throw UsageError(std::string("combine: no combine codec for format ") + format_name(f) +
                     "; pass a configuration that validate() accepts");
}

}  // namespace

void encode_combine_rows(ActFormat f, const QuantParams& p, const bf16_raw* y, int64_t n, int H, uint8_t* payload,
                         uint8_t* scales) {
  require_combine_codec(f);
  if (n <= 0) return;
  if (f == ActFormat::bf16) {
    std::memcpy(payload, y, size_t(n) * H * sizeof(bf16_raw));
    return;
  }
  quantize_rows(f, p, y, n, H, payload, scales);
}

void accumulate_combine_row(ActFormat f, const QuantParams& p, int H, const uint8_t* payload, const uint8_t* scales,
                            float* scratch, float* acc) {
  if (f == ActFormat::bf16) {
    // Widening bf16 is exact: no need to go through dequantize_rows.
    for (int h = 0; h < H; ++h) {
      bf16_raw b;
      std::memcpy(&b, payload + size_t(h) * 2, 2);
      acc[h] = acc[h] + num::bf16_to_f32(b);
    }
    return;
  }
  require_combine_codec(f);
  dequantize_rows(f, p, payload, scales, 1, H, scratch);
  for (int h = 0; h < H; ++h) acc[h] = acc[h] + scratch[h];
}

void combine_sum(ActFormat f, const QuantParams& p, int H, int C, int64_t num_tokens, int num_ranks,
                 const int32_t* slot, const uint8_t* recv_payload, const uint8_t* recv_scales, bf16_raw* out) {
  require_combine_codec(f);
  const size_t pb = combine_payload_bytes(f, H), sb = combine_scale_bytes(f, H);
  std::vector<float> acc(H), scratch(H);
  for (int64_t t = 0; t < num_tokens; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int d = 0; d < num_ranks; ++d) {
      const int32_t j = slot[size_t(t) * num_ranks + d];
      if (j < 0) continue;
      const size_t row = size_t(d) * C + j;
      accumulate_combine_row(f, p, H, recv_payload + row * pb, recv_scales ? recv_scales + row * sb : nullptr,
                             scratch.data(), acc.data());
    }
    bf16_raw* o = out + size_t(t) * H;
    for (int h = 0; h < H; ++h) o[h] = num::f32_to_bf16(acc[h]);
  }
}

}  // namespace epmoe::detail
