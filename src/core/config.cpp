// Configuration: derived values, validation (every issue, in field order), the cross-rank
// fingerprint and the human-readable dump.
#include "epmoe/config.h"

#include <algorithm>
#include <cmath>
#include <climits>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "epmoe/error.h"
#include "epmoe/registry.h"

namespace epmoe {

int MoeConfig::experts_per_rank() const {
  if (placement) return placement->slots_per_rank();
  if (num_ranks < 1) return 0;
  return num_experts / num_ranks;
}

ExpertPlacement MoeConfig::resolved_placement() const {
  if (placement) return *placement;
  return ExpertPlacement::contiguous(num_experts, num_ranks);
}

IntermediateQuant MoeConfig::effective_intermediate_quant() const {
  if (intermediate_quant != IntermediateQuant::automatic) return intermediate_quant;
  return weight_format == WeightFormat::fp8 && intermediate >= 1 && intermediate % 16 == 0 ? IntermediateQuant::fp8
                                                                                             : IntermediateQuant::none;
}

const char* intermediate_quant_name(IntermediateQuant q) {
  switch (q) {
    case IntermediateQuant::none: return "none";
    case IntermediateQuant::fp8: return "fp8";
    case IntermediateQuant::automatic: return "auto";
  }
  return "?";
}

bool parse_intermediate_quant(const std::string& s, IntermediateQuant& out) {
  for (IntermediateQuant q : {IntermediateQuant::none, IntermediateQuant::fp8, IntermediateQuant::automatic}) {
    if (s == intermediate_quant_name(q)) {
      out = q;
      return true;
    }
  }
  return false;
}

namespace {

const char* router_name(RouterKind k) {
  return k == RouterKind::sigmoid_grouped_topk ? "sigmoid_grouped_topk" : "softmax_topk";
}

std::string fmt_float(float v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

class Issues {
 public:
  void add(std::string field, std::string value, std::string message) {
    list_.push_back(ConfigIssue{std::move(field), std::move(value), std::move(message)});
  }
  void add(const std::string& field, int value, const std::string& message) {
    add(field, std::to_string(value), field + "=" + std::to_string(value) + " " + message);
  }
  std::vector<ConfigIssue> take() { return std::move(list_); }

 private:
  std::vector<ConfigIssue> list_;
};

void check_hidden(const MoeConfig& c, Issues& is) {
  if (c.hidden < 1) {
    is.add("hidden", c.hidden, "must be >= 1; set the model's hidden size");
    return;
  }
  auto need = [&](int mult, const std::string& who, const std::string& fix) {
    if (c.hidden % mult != 0) {
      is.add("hidden", c.hidden,
             "is not a multiple of " + std::to_string(mult) + ", which " + who + " requires; " + fix);
    }
  };
  const int dm = hidden_multiple(c.dispatch_format);
  if (dm > 1) {
    need(dm, std::string("dispatch format ") + format_name(c.dispatch_format),
         "use dispatch format bf16 or a hidden size that is a multiple of " + std::to_string(dm));
  }
  // fp8 weights take any H: their 128x128 scale tiles at the edges are partial (FORMATS.md).
  if (c.weight_format == WeightFormat::nvfp4) {
    need(16, "weight format nvfp4 (blocks of 16 along H in W13)",
         "use weight format bf16 or a hidden size that is a multiple of 16");
  }
  if (c.combine_format == ActFormat::fp8) {
    need(16, "combine format fp8 (blocks of 128, the last one partial, moved in 16-byte pieces)",
         "use combine format bf16 or a hidden size that is a multiple of 16");
  }
}

void check_intermediate(const MoeConfig& c, Issues& is) {
  if (c.intermediate < 1) {
    is.add("intermediate", c.intermediate, "must be >= 1; set the per-expert intermediate size");
    return;
  }
  auto need = [&](int mult, const std::string& who, const std::string& fix) {
    if (c.intermediate % mult != 0) {
      is.add("intermediate", c.intermediate,
             "is not a multiple of " + std::to_string(mult) + ", which " + who + " requires; " + fix);
    }
  };
  // fp8 weights take any I: partial edge tiles, and W13's gate and up tiled apart (FORMATS.md).
  if (c.weight_format == WeightFormat::nvfp4) {
    need(16, "weight format nvfp4 (blocks of 16 along I in W2)",
         "use weight format bf16 or an intermediate size that is a multiple of 16");
  }
  if (c.intermediate_quant == IntermediateQuant::fp8) {
    need(16, "intermediate_quant fp8 (block-128 scales along I, the last block partial)",
         "use intermediate_quant none or an intermediate size that is a multiple of 16");
  }
}

void check_router(const MoeConfig& c, Issues& is) {
  const RouterConfig& r = c.router;
  if (r.kind != RouterKind::sigmoid_grouped_topk) return;
  const int E = c.num_experts;
  if (r.n_group < 1) {
    is.add("router.n_group", r.n_group, "must be >= 1 for sigmoid_grouped_topk; use 1 for a single group");
  } else if (E >= 1 && E % r.n_group != 0) {
    is.add("router.n_group", r.n_group,
           "does not divide num_experts=" + std::to_string(E) +
               "; sigmoid_grouped_topk needs equal groups, pick a divisor of " + std::to_string(E));
  } else if (E >= 1 && E / r.n_group < 2) {
    is.add("router.n_group", r.n_group,
           "leaves " + std::to_string(E / r.n_group) +
               " expert per group; the group score sums the top-2 scores, so each group needs >= 2 experts; "
               "use n_group <= " + std::to_string(E / 2));
  }
  if (r.n_group >= 1 && (r.topk_group < 1 || r.topk_group > r.n_group)) {
    is.add("router.topk_group", r.topk_group,
           "is outside [1, n_group=" + std::to_string(r.n_group) + "]; keep between 1 and n_group groups");
  } else if (r.n_group >= 1 && E >= 1 && E % r.n_group == 0 && c.top_k >= 1 &&
             int64_t(c.top_k) > int64_t(r.topk_group) * (E / r.n_group)) {
    is.add("router.topk_group", r.topk_group,
           "keeps only " + std::to_string(int64_t(r.topk_group) * (E / r.n_group)) + " experts (topk_group * E/n_group), "
               "fewer than top_k=" + std::to_string(c.top_k) + "; raise topk_group or lower top_k");
  }
  if (!std::isfinite(r.routed_scaling_factor) || r.routed_scaling_factor <= 0.f) {
    const std::string v = fmt_float(r.routed_scaling_factor);
    is.add("router.routed_scaling_factor", v,
           "router.routed_scaling_factor=" + v + " must be finite and > 0; use 1 for no scaling");
  }
}

void check_placement(const MoeConfig& c, Issues& is) {
  if (!c.placement) {
    if (c.num_ranks >= 1 && c.num_experts >= 1 && c.num_experts % c.num_ranks != 0) {
      is.add("placement", "contiguous",
             "num_experts=" + std::to_string(c.num_experts) + " is not divisible by num_ranks=" +
                 std::to_string(c.num_ranks) +
                 ", which the default contiguous placement requires; use a num_ranks that divides " +
                 std::to_string(c.num_experts) + " or give an explicit placement (--placement)");
    }
    return;
  }
  const ExpertPlacement& p = *c.placement;
  if (p.num_experts() != c.num_experts) {
    is.add("placement", "explicit",
           "placement lists " + std::to_string(p.num_experts()) + " experts but num_experts=" +
               std::to_string(c.num_experts) + "; give one entry per expert");
  }
  if (p.num_ranks() != c.num_ranks) {
    is.add("placement", "explicit",
           "placement is for " + std::to_string(p.num_ranks()) + " ranks but num_ranks=" +
               std::to_string(c.num_ranks) + "; build the placement for num_ranks ranks");
  }
  for (const std::string& pr : p.problems()) is.add("placement", "explicit", "placement: " + pr);
}

}  // namespace

std::vector<ConfigIssue> validate(const MoeConfig& c) {
  Issues is;
  check_hidden(c, is);
  check_intermediate(c, is);
  if (c.num_experts < 1) is.add("num_experts", c.num_experts, "must be >= 1");
  if (c.top_k < 1) {
    is.add("top_k", c.top_k, "must be >= 1; each token needs at least one expert");
  } else if (c.top_k > 16) {
    is.add("top_k", c.top_k, "exceeds 16, the largest top_k epmoe supports; use top_k <= 16");
  } else if (c.num_experts >= 1 && c.top_k > c.num_experts) {
    is.add("top_k", c.top_k,
           "exceeds num_experts=" + std::to_string(c.num_experts) + "; use top_k <= " + std::to_string(c.num_experts));
  }
  check_router(c, is);
  if (c.num_ranks < 1) is.add("num_ranks", c.num_ranks, "must be >= 1; use 1 for a single device");
  if (c.capacity < 1) {
    is.add("capacity", c.capacity,
           "must be >= 1; set it to the most tokens one rank dispatches per call (e.g. the max batch tokens)");
  } else if (c.num_ranks >= 1 && int64_t(c.capacity) * c.num_ranks > int64_t(INT32_MAX)) {
    // Receive slots [R][C] are indexed with 32-bit integers on the device.
    is.add("capacity", c.capacity,
           "times num_ranks=" + std::to_string(c.num_ranks) + " exceeds 2^31-1 receive slots; lower capacity to <= " +
               std::to_string(int64_t(INT32_MAX) / c.num_ranks));
  }
  check_placement(c, is);
  if (c.dispatch_format == ActFormat::nvfp4 &&
      (!std::isfinite(c.nvfp4_global_scale) || c.nvfp4_global_scale <= 0.f)) {
    const std::string v = fmt_float(c.nvfp4_global_scale);
    is.add("nvfp4_global_scale", v,
           "nvfp4_global_scale=" + v +
               " must be finite and > 0 for dispatch format nvfp4; calibrate it as 448*6/amax of the activations "
               "(nvfp4_global_scale_bf16() computes it from data)");
  }
  if (c.combine_format != ActFormat::bf16 && c.combine_format != ActFormat::fp8) {
    is.add("combine_format", format_name(c.combine_format),
           std::string("combine_format=") + format_name(c.combine_format) + " is not supported; use bf16 or fp8");
  }
  if (c.timeout_ms < 1) is.add("timeout_ms", c.timeout_ms, "must be >= 1; the default is 10000");

  std::vector<ConfigIssue> out = is.take();
  for (ConfigIssue& i : validate(c.tuning)) out.push_back(std::move(i));
  for (const ConfigIssue& i : environment_issues()) out.push_back(i);
  // The registry owns backend legality (names, pairs, formats per backend). A registry that trips
  // over a malformed config must not hide the issues found above.
  try {
    for (ConfigIssue& i : Registry::global().check(c)) out.push_back(std::move(i));
  } catch (const Error& e) {
    out.push_back(ConfigIssue{"dispatcher", c.dispatcher, std::string("backend check failed: ") + e.what()});
  }
  return out;
}

void validate_or_throw(const MoeConfig& cfg) {
  const std::vector<ConfigIssue> issues = validate(cfg);
  if (issues.empty()) return;
  std::string msg = "invalid MoE configuration (" + std::to_string(issues.size()) +
                    (issues.size() == 1 ? " issue):" : " issues):");
  for (const ConfigIssue& i : issues) msg += "\n  - " + i.message;
  throw UsageError(msg);
}

namespace {

// FNV-1a over an explicit little-endian serialization, so the value does not depend on struct
// layout, padding or the host's byte order.
class Hasher {
 public:
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) byte(static_cast<uint8_t>(v >> (8 * i)));
  }
  void i32(int32_t v) { u64(static_cast<uint64_t>(static_cast<uint32_t>(v))); }
  void f32(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u64(u);
  }
  void str(const std::string& s) {
    u64(s.size());
    for (char ch : s) byte(static_cast<uint8_t>(ch));
  }
  uint64_t value() const { return h_; }

 private:
  void byte(uint8_t b) {
    h_ ^= b;
    h_ *= 0x100000001b3ull;
  }
  uint64_t h_ = 0xcbf29ce484222325ull;
};

}  // namespace

uint64_t config_fingerprint(const MoeConfig& c) {
  // Only what changes the bytes exchanged or their meaning. timeout_ms and the [local] tuning
  // fields may differ between ranks.
  Hasher h;
  h.str("epmoe-config-v1");
  h.i32(c.hidden);
  h.i32(c.intermediate);
  h.i32(c.num_experts);
  h.i32(c.top_k);
  h.i32(static_cast<int>(c.router.kind));
  h.i32(c.router.renormalize ? 1 : 0);
  h.i32(c.router.n_group);
  h.i32(c.router.topk_group);
  h.f32(c.router.routed_scaling_factor);
  h.i32(c.num_ranks);
  h.i32(c.capacity);
  // Hash the resolved placement so that an explicit map equal to the contiguous one agrees with a
  // rank that left placement empty.
  bool resolved = false;
  ExpertPlacement p;
  try {
    p = c.resolved_placement();
    resolved = true;
  } catch (const Error&) {
  }
  h.i32(resolved ? 1 : 0);
  if (resolved) {
    h.i32(p.num_ranks());
    h.i32(p.slots_per_rank());
    const ExpertPlacement::Flat f = p.flatten();
    h.u64(f.offsets.size());
    for (int32_t v : f.offsets) h.i32(v);
    for (size_t i = 0; i < f.ranks.size(); ++i) {
      h.i32(f.ranks[i]);
      h.i32(f.slots[i]);
    }
  }
  h.i32(static_cast<int>(c.dispatch_format));
  h.i32(c.fp8_ue8m0 ? 1 : 0);
  h.f32(c.nvfp4_global_scale);
  h.i32(static_cast<int>(c.weight_format));
  h.i32(static_cast<int>(c.combine_format));
  // The resolved value: "auto" and the fp8 it means for fp8 weights are the same bytes on the wire.
  h.i32(static_cast<int>(c.effective_intermediate_quant()));
  h.str(c.dispatcher);
  h.str(c.runner);
  // Tuning fields marked [agree] (options.h): both sides of a combine must agree on who writes
  // which flags. Only the effective value counts (the copy engine moves bf16 rows only).
  const bool ce = c.tuning.combine == CombineMode::ce && c.combine_format == ActFormat::bf16;
  h.i32(ce ? c.tuning.ce_rows : 0);
  return h.value();
}

std::string describe(const MoeConfig& c) {
  std::ostringstream os;
  os << "model:      H=" << c.hidden << " I=" << c.intermediate << " E=" << c.num_experts << " K=" << c.top_k << "\n";
  os << "router:     " << router_name(c.router.kind) << (c.router.renormalize ? " renormalize" : " no-renormalize");
  if (c.router.kind == RouterKind::sigmoid_grouped_topk) {
    os << " n_group=" << c.router.n_group << " topk_group=" << c.router.topk_group
       << " routed_scaling_factor=" << c.router.routed_scaling_factor;
  }
  os << "\n";
  os << "parallel:   R=" << c.num_ranks << " C=" << c.capacity << " experts/rank=" << c.experts_per_rank() << "\n";
  os << "placement:  ";
  if (!c.placement) {
    os << "contiguous\n";
  } else {
    const ExpertPlacement& p = *c.placement;
    int redundant = 0;
    for (int e = 0; e < p.num_experts(); ++e) redundant += std::max<int>(0, int(p.copies(e).size()) - 1);
    os << "explicit (" << p.num_experts() << " experts, " << p.num_ranks() << " ranks x " << p.slots_per_rank()
       << " slots, " << redundant << " redundant copies)\n";
  }
  os << "dispatch:   " << format_name(c.dispatch_format);
  if (c.dispatch_format == ActFormat::fp8) os << (c.fp8_ue8m0 ? " (ue8m0 scales)" : " (fp32 scales)");
  if (c.dispatch_format == ActFormat::nvfp4) os << " (global scale " << c.nvfp4_global_scale << ")";
  if (c.hidden >= 1) {
    os << ", " << payload_bytes(c.dispatch_format, c.hidden) + scale_bytes(c.dispatch_format, c.hidden)
       << " bytes/token";
  }
  os << "\n";
  os << "weights:    " << format_name(c.weight_format) << "\n";
  os << "combine:    " << format_name(c.combine_format) << "\n";
  os << "interm. q:  " << intermediate_quant_name(c.effective_intermediate_quant());
  if (c.intermediate_quant == IntermediateQuant::automatic) os << " (auto: fp8 for fp8 weights with I % 16 == 0)";
  os << "\n";
  os << "backends:   dispatcher=" << c.dispatcher << " runner=" << c.runner << "\n";
  os << "timeout:    " << c.timeout_ms << " ms\n";
  os << "tuning:\n" << describe(c.tuning);
  char fp[32];
  std::snprintf(fp, sizeof fp, "%016llx", static_cast<unsigned long long>(config_fingerprint(c)));
  os << "fingerprint: " << fp << "\n";
  return os.str();
}

}  // namespace epmoe
