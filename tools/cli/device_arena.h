// Device copies owned by one scope of the `epmoe` tool's GPU drivers (CUDA builds only): everything
// put here is freed when the arena goes.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "core/cuda/check.h"

namespace epmoe::cli {

class DeviceArena {
 public:
  void* alloc(size_t bytes) {
    bufs_.emplace_back(std::max<size_t>(bytes, 1));
    return bufs_.back().get();
  }
  void* put(const void* host, size_t bytes) {
    void* p = alloc(bytes);
    if (bytes) {
      EPMOE_CUDA_CHECK(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
      // A pageable upload may return before its DMA lands; callers use p on non-blocking streams.
      EPMOE_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    }
    return p;
  }

 private:
  std::vector<cuda::DeviceBuffer> bufs_;
};

}  // namespace epmoe::cli
