// Programmatic dependent launch (Hopper, CUDA 12.3+; tuning.pdl): a kernel launched with
// launch_kernel(..., pdl = true) may be scheduled before the kernel ahead of it in the stream has
// finished, so its launch and the previous kernel's tail overlap. Why it is safe: every kernel
// launched that way calls dev::pdl_wait() before its first global-memory access, and that wait
// returns only when every grid it depends on has completed and its writes are visible. Launched
// without the attribute (or on an older GPU) both device calls are no-ops, so one kernel body
// serves both launches.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "core/cuda/check.h"

namespace epmoe::cuda {

namespace dev {

// Waits until the grids this one depends on have completed and their memory is visible.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel (launched with pdl) be scheduled once every block of this grid has called
// it; that kernel still waits for this grid's completion in its own pdl_wait.
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// Both, first thing in a kernel that launch_kernel may launch with pdl.
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_trigger();
}

}  // namespace dev

// kernel<<<grid, block, smem, st>>>(args...), with programmatic stream serialization when `pdl`.
// Launch errors are checked here.
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, bool pdl,
                   Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  EPMOE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace epmoe::cuda
