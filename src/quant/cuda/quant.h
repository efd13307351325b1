// CUDA activation quantization (DESIGN.md §2), bitwise equal to quant.h's CPU quantize_rows /
// dequantize_rows. All pointers are device pointers; the calls are asynchronous on `stream` and
// never synchronize the host (CUDA-graph capturable).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "epmoe/format.h"
#include "epmoe/tensor.h"

namespace epmoe::cuda {

// in: [T, H] bf16. payload: [T][payload_bytes(f, H)], scales: [T][scale_bytes(f, H)].
void quantize_rows(ActFormat f, const QuantParams& p, const bf16_raw* in, int64_t T, int H,
                   uint8_t* payload, uint8_t* scales, cudaStream_t stream);
// out: [T, H] fp32.
void dequantize_rows(ActFormat f, const QuantParams& p, const uint8_t* payload, const uint8_t* scales,
                     int64_t T, int H, float* out, cudaStream_t stream);

// Gathering form used by the dispatcher: output row j (j < rows) takes input row row_map[j];
// rows j >= *n_valid (device scalar; null = all) or with row_map[j] < 0 are not written.
void quantize_rows_gather(ActFormat f, const QuantParams& p, const bf16_raw* in, const int32_t* row_map,
                          const int32_t* n_valid, int64_t rows, int H, uint8_t* payload, uint8_t* scales,
                          cudaStream_t stream);

// Throws UsageError when H does not suit format f (multiple of 16 for fp8 and nvfp4) or when
// nvfp4 has no positive global scale.
void check_quant_args(ActFormat f, const QuantParams& p, int H, const char* who);

}  // namespace epmoe::cuda
