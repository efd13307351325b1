// Registers dispatcher "nvlink": device-initiated push over NCCL symmetric memory on communicators
// of kind "nccl", buffers on CUDA devices, paired with the "cuda" runner.
#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "core/builtin_backends.h"
#include "dispatch/a2a/host.h"
#include "epmoe/registry.h"

namespace epmoe::detail {

std::unique_ptr<Dispatcher> make_nvlink_dispatcher(const MoeConfig& cfg, Communicator& comm);  // nvlink_dispatcher.cu

namespace {

// The GPU all-to-all limits, and comm_sms against the current device: the dispatch and combine
// kernels spin on flags, so all their CTAs must be resident at once (one per SM). Without a GPU
// there is nothing to compare with; the dispatcher's constructor runs this again on its device.
void nvlink_config_issues(const MoeConfig& cfg, std::vector<ConfigIssue>& issues) {
  a2a_config_issues(cfg, issues);
  int n = 0, dev = 0, sms = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1 || cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    cudaGetLastError();  // no device: not an error of the configuration
    return;
  }
  if (cfg.tuning.comm_sms > sms)
    issues.push_back({"tuning.comm_sms", std::to_string(cfg.tuning.comm_sms),
                      "tuning.comm_sms=" + std::to_string(cfg.tuning.comm_sms) + " exceeds the " +
                          std::to_string(sms) + " SMs of device " + std::to_string(dev) +
                          " (dispatcher nvlink); the spinning CTAs must all be resident, use --comm-sms <= " +
                          std::to_string(sms)});
}

}  // namespace

void register_nvlink_dispatcher(Registry& reg) {
  DispatcherInfo d;
  d.name = "nvlink";
  d.comm_kinds = {"nccl"};
  d.device = DeviceKind::cuda;
  d.formats = {ActFormat::bf16, ActFormat::fp8, ActFormat::nvfp4};
  d.combine_formats = {ActFormat::bf16, ActFormat::fp8};
  d.create = make_nvlink_dispatcher;
  d.check = nvlink_config_issues;
  reg.add(std::move(d));
  reg.add_pair("nvlink", "cuda");
}

}  // namespace epmoe::detail
