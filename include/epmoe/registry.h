// The registry pairs dispatchers with runners. A pair is legal when the runner accepts the
// dispatcher's output format and the layer's weight format on the same device kind; an illegal
// request fails with the list of legal pairs. Fused implementations (a dispatch kernel that writes
// straight into a runner's layout) register their own step function for their pair.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "epmoe/comm.h"
#include "epmoe/config.h"
#include "epmoe/dispatch.h"
#include "epmoe/runner.h"

namespace epmoe {

struct DispatcherInfo {
  std::string name;
  std::vector<std::string> comm_kinds;  // communicator kinds it runs on ("local", "cpu", "nccl")
  DeviceKind device = DeviceKind::cpu;  // where its buffers live
  std::vector<ActFormat> formats;       // dispatch formats it carries
  std::vector<ActFormat> combine_formats;
  std::function<std::unique_ptr<Dispatcher>(const MoeConfig&, Communicator&)> create;
  // This backend's own limits (shapes, tuning ranges), called by validate() when cfg names it, so
  // that constructors find no configuration errors. May be empty.
  std::function<void(const MoeConfig&, std::vector<ConfigIssue>&)> check;
};

struct RunnerInfo {
  std::string name;
  DeviceKind device = DeviceKind::cpu;
  std::vector<ActFormat> accepts;       // dispatch formats it reads
  std::vector<WeightFormat> weights;    // weight formats it runs
  std::function<std::unique_ptr<Runner>(const MoeConfig&, int device_index)> create;
  // As DispatcherInfo::check.
  std::function<void(const MoeConfig&, std::vector<ConfigIssue>&)> check;
};

// Everything one forward step needs besides its input.
struct StepContext {
  Dispatcher& dispatcher;
  Runner& runner;
  const ExpertWeights& weights;
  bf16_raw* y;  // runner output workspace [R][C][H] on the pair's device
};
// dispatch -> run -> combine for one rank; out [T, H] bf16.
using StepFn = std::function<void(StepContext&, const DispatchInput&, bf16_raw* out)>;

// The plain composition: dispatch, run, combine.
void default_step(StepContext& ctx, const DispatchInput& in, bf16_raw* out);

class Registry {
 public:
  // The process-wide registry with every built-in backend of this build registered.
  static Registry& global();

  void add(DispatcherInfo info);
  void add(RunnerInfo info);
  // Declares (dispatcher, runner) legal; `step` empty = default_step.
  void add_pair(const std::string& dispatcher, const std::string& runner, StepFn step = {});

  struct Pair {
    const DispatcherInfo* dispatcher = nullptr;
    const RunnerInfo* runner = nullptr;
    StepFn step;
  };
  // Issues with cfg.dispatcher / cfg.runner / formats (called by validate()).
  std::vector<ConfigIssue> check(const MoeConfig& cfg) const;
  // The pair for cfg; throws UsageError with every issue and the legal pairs.
  Pair resolve(const MoeConfig& cfg) const;
  // "dispatcher+runner (dispatch formats; weight formats)" for every legal pair.
  std::vector<std::string> describe_pairs() const;

  // The first dispatcher of that name (a name may have a CPU and a CUDA implementation).
  const DispatcherInfo* find_dispatcher(const std::string& name) const;
  // The implementation of `name` whose buffers live on `device`, or null.
  const DispatcherInfo* find_dispatcher(const std::string& name, DeviceKind device) const;
  const RunnerInfo* find_runner(const std::string& name) const;

 private:
  std::vector<DispatcherInfo> dispatchers_;
  std::vector<RunnerInfo> runners_;
  struct PairEntry {
    std::string dispatcher, runner;
    StepFn step;
  };
  std::vector<PairEntry> pairs_;
};

}  // namespace epmoe
