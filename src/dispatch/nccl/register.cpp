// Registers dispatcher "nccl": host-orchestrated NCCL send/recv on communicators of kind "nccl",
// buffers on CUDA devices, paired with the "cuda" runner.
#include <memory>

#include "core/builtin_backends.h"
#include "dispatch/a2a/host.h"
#include "epmoe/registry.h"

namespace epmoe::detail {

std::unique_ptr<Dispatcher> make_nccl_dispatcher(const MoeConfig& cfg, Communicator& comm);  // nccl_dispatcher.cu

void register_nccl_dispatcher(Registry& reg) {
  DispatcherInfo d;
  d.name = "nccl";
  d.comm_kinds = {"nccl"};
  d.device = DeviceKind::cuda;
  d.formats = {ActFormat::bf16, ActFormat::fp8, ActFormat::nvfp4};
  d.combine_formats = {ActFormat::bf16, ActFormat::fp8};
  d.create = make_nccl_dispatcher;
  d.check = a2a_config_issues;
  reg.add(std::move(d));
  reg.add_pair("nccl", "cuda");
}

}  // namespace epmoe::detail
