// Registration hooks of the backends built into this library. Registry::global() calls each once.
// A backend lives in its stage folder and registers itself here; the registry knows no backend.
// Dispatchers are keyed by (name, device): "local" exists for the CPU and for CUDA, and the
// runner's device decides which one a layer gets.
#pragma once

namespace epmoe {
class Registry;
namespace detail {

void register_cpu_dispatchers(Registry&);   // src/dispatch/: "local" (cpu), "cpu"
void register_reference_runner(Registry&);  // src/run/: "reference"
#if defined(EPMOE_WITH_CUDA)
void register_cuda_backends(Registry&);          // src/run/cuda/: "cuda" runner
void register_cuda_local_dispatcher(Registry&);  // src/dispatch/cuda/: "local" (cuda) dispatcher
#endif
#if defined(EPMOE_WITH_NCCL)
void register_nccl_dispatcher(Registry&);        // src/dispatch/nccl/: "nccl"
void register_nvlink_dispatcher(Registry&);      // src/dispatch/nvlink/: "nvlink"
#endif

}  // namespace detail
}  // namespace epmoe
