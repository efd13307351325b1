// `epmoe run`: the main job. Runs a stack of MoE layers with residual connections on the configured
// ranks (cpu threads, one GPU, or many) and prints, per format, the error against float64 with
// unquantized weights and the time of the forward passes (run_driver.h).
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "epmoe/error.h"
#include "run_driver.h"
#include "run_report.h"
#include "setup.h"

namespace epmoe::cli {
namespace {

int run_main(const std::vector<std::string>& args) {
  Flags flags("run");
  add_run_flags(flags);
  if (wants_help(args)) {
    std::printf(
        "usage: epmoe run [flags]\n\n"
        "Runs a stack of MoE layers (h <- h + MoE(h), bf16) on the configured ranks and prints, per\n"
        "dispatch/weight format, the error of the final hidden state against a float64 computation\n"
        "with unquantized weights (which reuses the quantized path's routing decisions) on the first\n"
        "--check-tokens tokens of every rank, and the time of the forward passes. A row whose outputs\n"
        "are NaN/Inf fails (exit 1). Without a GPU it runs the tiny preset on 4 simulated ranks with\n"
        "37,0,64,0 tokens (--ranks 1: dispatcher local), once per dispatch format, then per weight\n"
        "format; a model preset runs one layer on the CPU when it fits in memory. With one GPU it runs\n"
        "on that GPU (dispatcher local, runner cuda); with several GPUs (or under mpirun -np N, one\n"
        "process per GPU) it runs qwen3-30b-a3b, 3 layers, across all of them (dispatcher nvlink, or\n"
        "--dispatcher nccl; runner cuda) and also reports tokens/s per GPU. The settings are checked\n"
        "first, as `epmoe validate` checks them.\n\nflags:\n%s",
        flags.help().c_str());
    return 0;
  }
  flags.parse(args);
  const RunSetup s = build_setup(flags);
  const SetupCheck k = check_setup(s);
  if (!k.whole.empty()) {
    print_issues("run", k.whole);
    return 2;
  }
  print_run_summary(s, k);
  // A rank that gave up waiting leaves its group unusable, and the other ranks then report that
  // (in the library's terms); the user's knob is --timeout-ms.
  const auto timed_out = [&](const std::string& what) {
    const auto at = what.find("rank ");
    const std::string cause = what.find("did not arrive") != std::string::npos && at != std::string::npos
                                  ? what.substr(at, what.find(')', at) == std::string::npos ? std::string::npos : what.find(')', at) - at)
                                  : what;
    return BackendError("a rank waited longer than --timeout-ms=" + std::to_string(s.cfg.timeout_ms) +
                        " ms for a peer (" + cause + "); raise --timeout-ms, the machine may be busy");
  };
  try {
    return run_driver(s, k);
  } catch (const TimeoutError& e) {
    throw timed_out(e.what());
  } catch (const Error& e) {
    if (std::string(e.what()).find("did not arrive within") == std::string::npos) throw;
    throw timed_out(e.what());
  }
}

const CommandRegistrar reg{{"run", "run a stack of MoE layers and report accuracy and time (the main job)", run_main}};

}  // namespace
}  // namespace epmoe::cli
