// The configuration flags shared by `epmoe run` and `epmoe validate` (every preset field), and
// the device choice of `epmoe run`.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "args.h"
#include "epmoe/config.h"
#include "epmoe/tensor.h"

namespace epmoe::cli {

struct RunSetup {
  std::string preset;
  MoeConfig cfg;
  int layers = 1;
  std::vector<int64_t> tokens;  // per rank
  uint64_t seed = 1;
  DeviceKind device = DeviceKind::cpu;
  bool dispatch_given = false, weights_given = false;  // else `run` sweeps the formats
  int check_tokens = 64;  // GPU runs on several ranks: tokens per rank compared with float64
};

// Declares every configuration flag on `flags`.
void add_config_flags(Flags& flags);
// Preset + defaults for the device + overrides from the flags. Does not validate: callers do.
RunSetup build_setup(const Flags& flags);

// ---- GPU extension point ------------------------------------------------------------------------
// `epmoe run` without --device uses default_device(): cuda when a GPU driver is registered and
// reports a visible GPU, else cpu. The GPU engineers register their driver from a file of their
// own (tools/run_cuda.cpp, say) with a static CudaRunRegistrar; with --device cuda, build_setup's
// defaults are one rank, dispatcher "local", runner "cuda".
struct CudaRunHook {
  std::function<bool()> available;               // a GPU is visible and the CUDA backends are built
  std::function<int(const RunSetup&)> run;       // runs the stack and prints the table; exit code
};
CudaRunHook& cuda_run_hook();
struct CudaRunRegistrar {
  explicit CudaRunRegistrar(CudaRunHook h) { cuda_run_hook() = std::move(h); }
};
DeviceKind default_device();

// The multi-GPU driver of `epmoe run` (tools/run_multi_gpu.cpp): cuda with more than one rank, or
// any cuda run under mpirun. `ranks` gives the default rank count on cuda (the mpirun world size,
// else the visible GPUs); `under_mpi` says whether this process is one rank of an mpirun job.
struct MultiGpuRunHook {
  std::function<int()> ranks;
  std::function<bool()> under_mpi;
  std::function<int(const RunSetup&)> run;
};
MultiGpuRunHook& multi_gpu_run_hook();
struct MultiGpuRunRegistrar {
  explicit MultiGpuRunRegistrar(MultiGpuRunHook h) { multi_gpu_run_hook() = std::move(h); }
};

}  // namespace epmoe::cli
