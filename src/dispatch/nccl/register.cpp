// Registers the multi-GPU dispatchers: "nccl" (host-orchestrated NCCL send/recv) and "nvlink"
// (device-initiated push over NCCL symmetric memory), both on communicators of kind "nccl" with
// buffers on CUDA devices, paired with the "cuda" runner.
#include <memory>

#include "core/builtin_backends.h"
#include "dispatch/nccl/a2a_host.h"
#include "epmoe/registry.h"

namespace epmoe::detail {

void register_nccl_backends(Registry& reg) {
  const std::vector<ActFormat> all = {ActFormat::bf16, ActFormat::fp8, ActFormat::nvfp4};
  const std::vector<ActFormat> combine = {ActFormat::bf16, ActFormat::fp8};
  reg.add(DispatcherInfo{"nccl", {"nccl"}, DeviceKind::cuda, all, combine, make_nccl_dispatcher, {}});
  reg.add(DispatcherInfo{"nvlink", {"nccl"}, DeviceKind::cuda, all, combine, make_nvlink_dispatcher, {}});
  reg.add_pair("nccl", "cuda");
  reg.add_pair("nvlink", "cuda");
}

void gpu_dispatcher_sync(Dispatcher& d, void* stream) {
  nccl_dispatcher_sync(d, stream);
  nvlink_dispatcher_sync(d, stream);
}

}  // namespace epmoe::detail
