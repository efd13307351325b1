// Registers the single-GPU backends: runner "cuda" and dispatcher "local" on a CUDA device, and the
// pair they form. Everything runs on the communicator's device.
#include <memory>

#include "core/builtin_backends.h"
#include "dispatch/cuda/local.h"
#include "epmoe/registry.h"
#include "run/cuda/policy.h"
#include "run/cuda/runner.h"

namespace epmoe::detail {

void register_cuda_backends(Registry& reg) {
  RunnerInfo runner;
  runner.name = "cuda";
  runner.device = DeviceKind::cuda;
  runner.accepts = {ActFormat::bf16, ActFormat::fp8, ActFormat::nvfp4};
  runner.weights = {WeightFormat::bf16, WeightFormat::fp8, WeightFormat::nvfp4};
  runner.create = [](const MoeConfig& cfg, int device_index) -> std::unique_ptr<Runner> {
    return std::make_unique<cuda::CudaRunner>(cfg, device_index);
  };
  runner.check = cuda::policy::check_config;
  reg.add(std::move(runner));

  DispatcherInfo local;
  local.name = "local";
  local.comm_kinds = {"local"};
  local.device = DeviceKind::cuda;
  local.formats = {ActFormat::bf16, ActFormat::fp8, ActFormat::nvfp4};
  local.combine_formats = {ActFormat::bf16, ActFormat::fp8};
  local.create = [](const MoeConfig& cfg, Communicator& comm) -> std::unique_ptr<Dispatcher> {
    return std::make_unique<cuda::LocalCudaDispatcher>(cfg, comm.device_index());
  };
  reg.add(std::move(local));

  reg.add_pair("local", "cuda");
}

}  // namespace epmoe::detail
