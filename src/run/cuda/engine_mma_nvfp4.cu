// Grouped GEMM instantiation for nvfp4 weights (one format per file so that they build in parallel).
#include "run/cuda/engine_mma.cuh"

namespace epmoe::cuda {

void launch_grouped_gemm_nvfp4(const GemmArgs& a, int bm, cudaStream_t stream) {
  gemm::launch<WeightFormat::nvfp4>(a, bm, stream);
}

}  // namespace epmoe::cuda
