// Registers the CPU dispatchers ("local" for one rank, "cpu" for a group of threads).
#include <memory>

#include "core/builtin_backends.h"
#include "epmoe/registry.h"

namespace epmoe::detail {

std::unique_ptr<Dispatcher> make_cpu_dispatcher(const MoeConfig& cfg, Communicator& comm);
std::unique_ptr<Dispatcher> make_local_cpu_dispatcher(const MoeConfig& cfg, Communicator& comm);

void register_cpu_dispatchers(Registry& reg) {
  const std::vector<ActFormat> all = {ActFormat::bf16, ActFormat::fp8, ActFormat::nvfp4};
  const std::vector<ActFormat> combine = {ActFormat::bf16, ActFormat::fp8};
  reg.add(DispatcherInfo{"local", {"local"}, DeviceKind::cpu, all, combine, make_local_cpu_dispatcher, {}});
  reg.add(DispatcherInfo{"cpu", {"cpu"}, DeviceKind::cpu, all, combine, make_cpu_dispatcher, {}});
}

}  // namespace epmoe::detail
