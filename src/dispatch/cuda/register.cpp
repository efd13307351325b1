// Registers dispatcher "local" on a CUDA device (one rank, no communication) and its pair with
// the "cuda" runner. Everything runs on the communicator's device.
#include <memory>
#include <string>

#include "core/builtin_backends.h"
#include "dispatch/cuda/local.h"
#include "epmoe/registry.h"

namespace epmoe::detail {

void register_cuda_local_dispatcher(Registry& reg) {
  DispatcherInfo local;
  local.name = "local";
  local.comm_kinds = {"local"};
  local.device = DeviceKind::cuda;
  local.formats = {ActFormat::bf16, ActFormat::fp8, ActFormat::nvfp4};
  local.combine_formats = {ActFormat::bf16, ActFormat::fp8};
  local.create = [](const MoeConfig& cfg, Communicator& comm) -> std::unique_ptr<Dispatcher> {
    return std::make_unique<cuda::LocalCudaDispatcher>(cfg, comm.device_index());
  };
  local.check = cuda::local_dispatcher_issues;
  reg.add(std::move(local));
  reg.add_pair("local", "cuda");
}

}  // namespace epmoe::detail
