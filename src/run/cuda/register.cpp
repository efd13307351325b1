// Registers runner "cuda" (its pairs are declared by the dispatchers: src/dispatch/cuda, nccl,
// nvlink). Everything runs on the communicator's device.
#include <memory>

#include "core/builtin_backends.h"
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
}

}  // namespace epmoe::detail
