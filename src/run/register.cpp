// Registers the CPU reference runner and the pairs it forms with the CPU dispatchers.
#include <memory>

#include "core/builtin_backends.h"
#include "epmoe/registry.h"
#include "run/reference.h"

namespace epmoe::detail {

void register_reference_runner(Registry& reg) {
  RunnerInfo info;
  info.name = "reference";
  info.device = DeviceKind::cpu;
  info.accepts = {ActFormat::bf16, ActFormat::fp8, ActFormat::nvfp4};
  info.weights = {WeightFormat::bf16, WeightFormat::fp8, WeightFormat::nvfp4};
  info.create = [](const MoeConfig& cfg, int) -> std::unique_ptr<Runner> {
    return std::make_unique<ReferenceRunner>(cfg);
  };
  reg.add(std::move(info));
  reg.add_pair("local", "reference");
  reg.add_pair("cpu", "reference");
}

}  // namespace epmoe::detail
