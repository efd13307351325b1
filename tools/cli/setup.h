// The flags of every MoeConfig and Tuning field (one parser, used by `epmoe run`, `epmoe validate`
// and every bench), and the settings of a run with the ONE check of them that `run` and
// `validate` share: whatever validate accepts, run runs.
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "args.h"
#include "epmoe/config.h"
#include "epmoe/tensor.h"

namespace epmoe::cli {

// ---- configuration flags ------------------------------------------------------------------------
// Declares a flag for every MoeConfig field (shape, formats, router, placement, group, backends)
// except those named in `except` (a bench that sweeps a field declares its own flag for it).
void add_config_flags(Flags& flags, const std::set<std::string>& except = {});
// Declares only the configuration flags named in `only` (a bench with a fixed layer shape).
void add_config_flags_only(Flags& flags, const std::set<std::string>& only);
// Declares a flag for every Tuning field (--engine, --wgmma-defer, --fused-swiglu,
// --widen-scratch-mb, --nvfp4-prepare, --comm-sms, --push-warps, --combine-mode, --ce-rows).
void add_tuning_flags(Flags& flags);
// Applies the configuration and tuning flags that were given to `cfg` (the others leave it as it
// is); throws UsageError for a value that does not parse. Range checks are validate()'s.
void apply_config_flags(const Flags& flags, MoeConfig& cfg);
void apply_tuning_flags(const Flags& flags, Tuning& t);
// Flags given that do not apply to `cfg` (router group flags with a softmax router,
// --slots-per-rank without --placement), as issues.
std::vector<ConfigIssue> inapplicable_flags(const Flags& flags, const MoeConfig& cfg);

// ---- the settings of one run --------------------------------------------------------------------
struct RunSetup {
  std::string preset;
  MoeConfig cfg;
  int layers = 1;
  std::vector<int64_t> tokens;  // per rank
  uint64_t seed = 1;
  DeviceKind device = DeviceKind::cpu;
  bool dispatch_given = false, weights_given = false;  // else `run` sweeps the formats
  bool calibrate_nvfp4 = true;  // nvfp4 global scale from each layer's input (no --nvfp4-global-scale)
  int64_t check_tokens = 64;  // tokens per rank compared with float64 (0: none)
  int gpus = 0;               // GPUs this process sees (0 without CUDA)
  std::string dump;           // --dump PREFIX: each rank's final hidden state, raw bf16, per row
  std::vector<ConfigIssue> flag_issues;  // flags that do not apply, values out of range
};

// Declares add_config_flags + add_tuning_flags + the run flags (--preset, --tokens, --layers,
// --seed, --device, --check-tokens, --dump).
void add_run_flags(Flags& flags);
// Preset + defaults for the device + overrides from the flags. Throws UsageError only for values
// that do not parse; everything else is check_setup's.
RunSetup build_setup(const Flags& flags);

// One table row of `epmoe run`: the formats it runs in.
struct Row {
  ActFormat dispatch;
  WeightFormat weights;
};
std::vector<Row> run_rows(const RunSetup& s);
MoeConfig row_config(const RunSetup& s, const Row& row);

// What a run will do and cost, estimated before it starts.
struct RunPlan {
  std::vector<int64_t> check_per_rank;  // tokens of each rank compared with float64
  double host_bytes = 0;                // peak host memory of one layer (all ranks of this process)
  double seconds = 0;                   // estimated wall time of all rows (cpu only; 0 = unknown)
};

// The one check of a run's settings: `whole` are problems of the configuration as a whole (said
// once, before any table), `per_row[i]` those of row i only.
struct SetupCheck {
  std::vector<ConfigIssue> whole;
  std::vector<std::vector<ConfigIssue>> per_row;
  RunPlan plan;
  bool ok() const;
};
SetupCheck check_setup(const RunSetup& s);
// Prints issues as "  field: message" lines to stderr, after a header naming the command.
void print_issues(const char* command, const std::vector<ConfigIssue>& issues);

}  // namespace epmoe::cli
