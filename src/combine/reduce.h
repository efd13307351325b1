// The combine sum (DESIGN.md §5), CPU reference shared by every dispatcher as its oracle.
//
// Each y row travels home in the combine format: bf16 as is, or fp8 quantized per block of 128 with
// the fp8 rule of quant.h (quantize_rows, same QuantParams as dispatch, so ue8m0 applies here too)
// and dequantized at home. At home, out[t][h] = bf16_rne(acc) with acc = 0.0f, then for every rank d
// that holds a copy of t, ascending: acc = acc + row_d[h] (fp32, no fma). A token that went nowhere
// (all ids -1) gets +0.
#pragma once
#include <cstdint>

#include "epmoe/format.h"
#include "epmoe/tensor.h"

namespace epmoe::detail {

// Bytes of one combine row (payload, scales) in format f.
inline size_t combine_payload_bytes(ActFormat f, int h) { return payload_bytes(f, h); }
inline size_t combine_scale_bytes(ActFormat f, int h) { return scale_bytes(f, h); }

// Encodes n rows of y [n][H] bf16 into the combine format. f is bf16 or fp8.
void encode_combine_rows(ActFormat f, const QuantParams& p, const bf16_raw* y, int64_t n, int H, uint8_t* payload,
                         uint8_t* scales);

// Adds one encoded row into acc[H] (acc[h] = acc[h] + row[h]). `scratch` holds H floats.
void accumulate_combine_row(ActFormat f, const QuantParams& p, int H, const uint8_t* payload, const uint8_t* scales,
                            float* scratch, float* acc);

// The home rank's sum for its T tokens. slot: [T][R], the slot token t got on rank d (-1: not sent
// there), i.e. the dispatch plan's (dispatch/plan.h has an overload taking the plan).
// recv_payload / recv_scales: [R][C] encoded rows, region d written by rank d at that slot.
// out: [T][H] bf16.
void combine_sum(ActFormat f, const QuantParams& p, int H, int C, int64_t num_tokens, int num_ranks,
                 const int32_t* slot, const uint8_t* recv_payload, const uint8_t* recv_scales, bf16_raw* out);

}  // namespace epmoe::detail
