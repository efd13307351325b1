// Layer configuration and its validation. All configuration checks live in validate(); every issue
// it reports names the field, the value and the fix.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "epmoe/format.h"
#include "epmoe/options.h"
#include "epmoe/placement.h"

namespace epmoe {

enum class RouterKind : uint8_t {
  softmax_topk,          // softmax over E in fp32, top-K (ties: lower id), optional renormalize
  sigmoid_grouped_topk,  // DeepSeek-V3: sigmoid, +bias for choice, n_group/topk_group, scaling
};

struct RouterConfig {
  RouterKind kind = RouterKind::softmax_topk;
  bool renormalize = true;
  int n_group = 1;                    // sigmoid_grouped_topk: groups of E/n_group experts
  int topk_group = 1;                 // sigmoid_grouped_topk: groups kept
  float routed_scaling_factor = 1.f;  // sigmoid_grouped_topk: multiplies the final weights
};

// Whether the runner re-quantizes silu(gate)*up before the second GEMM (fp8: e4m3 with block-128
// scales along I, the last block partial when I % 128 != 0). GPU runners then feed GEMM2 to fp8
// tensor cores; the reference runner reproduces the same rounding, so the two can be compared
// tightly. `automatic` (spelled "auto") follows the weights: fp8 for fp8 weights when I % 16 == 0,
// which is how DeepSeek-V3/R1 fp8 checkpoints are served, else none. MoeConfig::effective_intermediate_quant() resolves it; only that is consumed.
enum class IntermediateQuant : uint8_t { none, fp8, automatic };

const char* intermediate_quant_name(IntermediateQuant q);  // "none", "fp8", "auto"
bool parse_intermediate_quant(const std::string& s, IntermediateQuant& out);  // the names above

struct MoeConfig {
  // Model shape.
  int hidden = 0;        // H
  int intermediate = 0;  // I, per expert
  int num_experts = 0;   // E
  int top_k = 0;         // K
  RouterConfig router;

  // Parallelism.
  int num_ranks = 1;  // R
  int capacity = 0;   // C: most tokens one rank may dispatch per call
  std::optional<ExpertPlacement> placement;  // empty: contiguous (E % R == 0)

  // Formats.
  ActFormat dispatch_format = ActFormat::bf16;
  bool fp8_ue8m0 = false;
  float nvfp4_global_scale = 0.f;  // activation gs for nvfp4 dispatch; > 0 required
  WeightFormat weight_format = WeightFormat::bf16;
  ActFormat combine_format = ActFormat::bf16;  // bf16 or fp8
  IntermediateQuant intermediate_quant = IntermediateQuant::automatic;  // read it through effective_*

  // Backends (see registry.h for the valid pairs).
  std::string dispatcher = "cpu";
  std::string runner = "reference";

  int timeout_ms = 10000;  // how long to wait for a peer before naming it in a TimeoutError

  // How the backends run (engines, SMs, pipelines): options.h. Defaults from the environment.
  Tuning tuning = default_tuning();

  // Derived.
  int experts_per_rank() const;  // slots per rank (placement-aware)
  QuantParams quant_params() const { return QuantParams{fp8_ue8m0, nvfp4_global_scale}; }
  ExpertPlacement resolved_placement() const;  // the explicit map or the contiguous one
  // intermediate_quant with automatic resolved (never automatic): fp8 when weight_format is fp8 and
  // intermediate % 16 == 0, else none; an explicit none or fp8 as given.
  IntermediateQuant effective_intermediate_quant() const;
};

struct ConfigIssue {
  std::string field;    // e.g. "hidden"
  std::string value;    // e.g. "7000"
  std::string message;  // e.g. "hidden=7000 is not a multiple of 16, which dispatch format fp8 requires"
};

// Every problem with `cfg`, in field order, then its tuning, the EPMOE_* environment and the
// chosen backends' own limits (the registry's per-backend checks). Empty when valid.
std::vector<ConfigIssue> validate(const MoeConfig& cfg);
// Throws UsageError listing every issue.
void validate_or_throw(const MoeConfig& cfg);
// A hash of everything ranks must agree on; compared across ranks at setup.
uint64_t config_fingerprint(const MoeConfig& cfg);
// Human-readable multi-line dump (what `epmoe validate` prints).
std::string describe(const MoeConfig& cfg);

}  // namespace epmoe
