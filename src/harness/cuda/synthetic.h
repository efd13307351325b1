// The synthetic model of harness/synthetic.h generated on the device: the same counter hash gives
// the same fp32 masters, quantized on the device into the storage format with the operation order
// of quantize_matrix, so the bytes equal rank_weights()'s on the host (tests/harness/cuda). This is
// how the benches build weights at real shapes (128 experts x 7168 x 2048 take seconds on the host
// per rank and layer, milliseconds here).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/cuda/check.h"
#include "epmoe/config.h"
#include "epmoe/runner.h"

namespace epmoe::harness::cuda {

// Rank `rank`'s experts of `layer` (cfg's placement and weight format) on the current device:
// `w` views the buffers (device = cuda); slots no expert occupies hold quantized zeros.
struct DeviceRankWeights {
  epmoe::cuda::DeviceBuffer d13, s13, g13, d2, s2, g2;
  ExpertWeights w;
};
// Runs on `stream` and waits for it before returning.
void rank_weights(const MoeConfig& cfg, uint64_t seed, int layer, int rank, DeviceRankWeights& out,
                  cudaStream_t stream);

// uniform_bf16(n, amplitude, seed) of harness/synthetic.h written to device memory p.
void uniform_bf16(bf16_raw* p, size_t n, float amplitude, uint64_t seed, cudaStream_t stream);

}  // namespace epmoe::harness::cuda
