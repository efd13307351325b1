// The flags of every MoeConfig and Tuning field (setup.h): one declaration, one parser.
#include <climits>

#include "epmoe/error.h"
#include "epmoe/options.h"
#include "setup.h"

namespace epmoe::cli {

namespace {

ActFormat act_flag(const Flags& f, const std::string& name) {
  const auto v = parse_act_format(f.get(name));
  if (!v) throw UsageError("--" + name + "=" + f.get(name) + " is not a format; use bf16, fp8 or nvfp4");
  return *v;
}

struct FlagSpec {
  const char *name, *value, *help;
};

// MoeConfig fields, in the order of config.h.
const FlagSpec kConfigFlags[] = {
    {"hidden", "H", "hidden size"},
    {"intermediate", "I", "intermediate size of one expert"},
    {"experts", "E", "number of experts"},
    {"topk", "K", "experts per token"},
    {"router", "KIND", "softmax|sigmoid (softmax_topk, sigmoid_grouped_topk)"},
    {"n-group", "N", "sigmoid router: expert groups"},
    {"topk-group", "N", "sigmoid router: groups kept"},
    {"scaling", "X", "sigmoid router: routed_scaling_factor"},
    {"renormalize", "", "renormalize the top-k weights to sum 1 (--renormalize=false to disable)"},
    {"ranks", "R", "expert-parallel ranks (cpu: simulated as threads, default 4; cuda: default every visible GPU, or the mpirun world)"},
    {"capacity", "C", "most tokens one rank may dispatch (default: the largest --tokens value)"},
    {"placement", "MAP", "explicit expert map 'e:r.s[,r.s];...' (default contiguous)"},
    {"slots-per-rank", "N", "expert slots per rank for --placement (default ceil(E/R))"},
    {"dispatch", "FMT", "dispatch format bf16|fp8|nvfp4 (run: default all three)"},
    {"ue8m0", "", "fp8 scales as powers of two (rounded up)"},
    {"nvfp4-global-scale", "X", "nvfp4 dispatch: activation global scale (run: default calibrated per layer from the data)"},
    {"weights", "FMT", "weight format bf16|fp8|nvfp4 (run: default the dispatch format's family)"},
    {"combine", "FMT", "combine format bf16|fp8"},
    {"intermediate-quant", "Q", "auto|none|fp8: re-quantize silu(gate)*up to fp8 before the second GEMM (auto, the default: fp8 for fp8 weights with I % 16 == 0, else none)"},
    {"iq", "Q", "short for --intermediate-quant"},
    {"dispatcher", "NAME", "dispatcher backend (cpu: cpu, or local for one rank; cuda: nvlink|nccl, or local for one GPU)"},
    {"runner", "NAME", "runner backend (reference on cpu, cuda on GPUs)"},
    {"timeout-ms", "MS", "how long a rank waits for a peer before giving up"},
};

const FlagSpec kTuningFlags[] = {
    {"engine", "auto|mma|cutlass", "runner cuda: GEMM engines it may use (env EPMOE_RUNNER_ENGINE)"},
    {"wgmma-defer", "0|1", "runner cuda: decode wgmma waits for a stage one iteration later (env EPMOE_WGMMA_DEFER)"},
    {"pdl", "0|1", "runner cuda: programmatic dependent launch of the row passes and the GEMMs (env EPMOE_PDL)"},
    {"nvfp4-wide-rows", "0|128|160", "runner cuda: token-tile height of the wide nvfp4 engine, 0 = per expert (env EPMOE_NVFP4_WIDE_ROWS)"},
    {"fused-swiglu", "0|1", "runner cuda: CUTLASS GEMM1 with SwiGLU in its epilogue (env EPMOE_CUTLASS_SWIGLU)"},
    {"concurrent-buckets", "0|1", "runner cuda: CUTLASS launches per row range overlap on side streams (env EPMOE_CUTLASS_CONCURRENT)"},
    {"widen-scratch-mb", "N", "runner cuda: MiB for widening fp8/nvfp4 weights for CUTLASS bf16 (env EPMOE_WIDEN_SCRATCH_MB)"},
    {"nvfp4-prepare", "0|1", "runner cuda: copy nvfp4 weights into the decode engine's order (env EPMOE_NVFP4_PREPARE)"},
    {"fp8-mixed", "0|1", "runner cuda: fp8 weights x bf16 decoded in the CUTLASS GEMM, 0 widens them (env EPMOE_FP8_MIXED)"},
    {"nvfp4-mixed", "0|1", "runner cuda: prepare nvfp4 weights 1 byte each for the CUTLASS GEMM, 0 widens them (env EPMOE_NVFP4_MIXED)"},
    {"decode-max-rows", "N", "runner cuda: expected rows per expert up to which the decode engines run, above CUTLASS (prepared nvfp4: the wide engine up to 640); 0 = measured crossover (env EPMOE_DECODE_MAX_ROWS)"},
    {"nvfp4-wide-max-rows", "N", "runner cuda: expected rows per expert up to which prepared nvfp4 runs the wide engine, above CUTLASS (on the paired copy, or widened); 0 = measured bound: with paired copies 128, 96 for small experts, none on under 16 local experts, else 640 or 512 (env EPMOE_NVFP4_WIDE_MAX_ROWS)"},
    {"cutlass-swap", "auto|0|1|64|128|192|byrows", "runner cuda: CUTLASS GEMMs swap-AB (weights in the 128-row tile; 64/128/192: token-tile width; byrows: per expert by its rows; auto: byrows except small experts) (env EPMOE_CUTLASS_SWAP)"},
    {"comm-sms", "N", "dispatcher nvlink: SMs of the dispatch and combine kernels (env EPMOE_COMM_SMS)"},
    {"push-warps", "N", "dispatcher nvlink: combine warps per CTA that push rows, 4..12 (env EPMOE_NVL_PUSH_WARPS)"},
    {"combine-mode", "sm|ce", "dispatcher nvlink: who moves combine rows, SMs or the copy engine (env EPMOE_NVL_COMBINE)"},
    {"ce-rows", "N", "dispatcher nvlink, combine-mode ce: rows per copy (env EPMOE_NVL_CE_ROWS)"},
    {"fault-check", "off|count|raise", "layer: count NaN/inf inputs and bad device ids, or raise on them (env EPMOE_FAULT_CHECK)"},
};

// An int flag that may not wrap: the value is range-checked here, in the flag's own terms.
int int_flag(const Flags& f, const std::string& name, int fallback) {
  if (!f.has(name)) return fallback;
  const std::string& v = f.get(name);
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0') throw UsageError("--" + name + "=" + v + " is not an integer");
  if (x < INT_MIN || x > INT_MAX)
    throw UsageError("--" + name + "=" + v + " is out of range; the most it can be is " + std::to_string(INT_MAX));
  return int(x);
}

bool switch01(const Flags& f, const std::string& name, bool fallback) { return f.get_bool(name, fallback); }

}  // namespace

// --iq goes with --intermediate-quant: declared, or left out, together.
static bool same_flag(const std::set<std::string>& names, const std::string& name) {
  return names.count(name) || (name == "iq" && names.count("intermediate-quant"));
}

void add_config_flags(Flags& f, const std::set<std::string>& except) {
  for (const FlagSpec& s : kConfigFlags)
    if (!same_flag(except, s.name)) f.add(s.name, s.value, s.help);
}

void add_config_flags_only(Flags& f, const std::set<std::string>& only) {
  for (const FlagSpec& s : kConfigFlags)
    if (same_flag(only, s.name)) f.add(s.name, s.value, s.help);
}

void add_tuning_flags(Flags& f) {
  for (const FlagSpec& s : kTuningFlags) f.add(s.name, s.value, s.help);
}

void apply_tuning_flags(const Flags& f, Tuning& t) {
  if (f.has("engine") && !parse_engine(f.get("engine"), t.engine))
    throw UsageError("--engine=" + f.get("engine") + " is not an engine; use auto, mma or cutlass");
  t.wgmma_defer = switch01(f, "wgmma-defer", t.wgmma_defer);
  t.pdl = switch01(f, "pdl", t.pdl);
  t.nvfp4_wide_rows = int_flag(f, "nvfp4-wide-rows", t.nvfp4_wide_rows);
  t.fused_swiglu = switch01(f, "fused-swiglu", t.fused_swiglu);
  t.concurrent_buckets = switch01(f, "concurrent-buckets", t.concurrent_buckets);
  t.widen_scratch_mb = int_flag(f, "widen-scratch-mb", t.widen_scratch_mb);
  t.nvfp4_prepare = switch01(f, "nvfp4-prepare", t.nvfp4_prepare);
  t.fp8_mixed = switch01(f, "fp8-mixed", t.fp8_mixed);
  t.nvfp4_mixed = switch01(f, "nvfp4-mixed", t.nvfp4_mixed);
  if (f.has("cutlass-swap") && !parse_cutlass_swap(f.get("cutlass-swap"), t.cutlass_swap))
    throw UsageError("--cutlass-swap=" + f.get("cutlass-swap") + " is not a swap-AB choice; use auto, 0, 1, 64, 128, 192 or byrows");
  t.comm_sms = int_flag(f, "comm-sms", t.comm_sms);
  t.push_warps = int_flag(f, "push-warps", t.push_warps);
  if (f.has("combine-mode") && !parse_combine_mode(f.get("combine-mode"), t.combine))
    throw UsageError("--combine-mode=" + f.get("combine-mode") + " is not a combine mode; use sm or ce");
  t.decode_max_rows = int_flag(f, "decode-max-rows", t.decode_max_rows);
  t.nvfp4_wide_max_rows = int_flag(f, "nvfp4-wide-max-rows", t.nvfp4_wide_max_rows);
  t.ce_rows = int_flag(f, "ce-rows", t.ce_rows);
  if (f.has("fault-check") && !parse_fault_check(f.get("fault-check"), t.fault_check))
    throw UsageError("--fault-check=" + f.get("fault-check") + " is not a fault-check mode; use off, count or raise");
}

void apply_config_flags(const Flags& f, MoeConfig& c) {
  c.hidden = int_flag(f, "hidden", c.hidden);
  c.intermediate = int_flag(f, "intermediate", c.intermediate);
  c.num_experts = int_flag(f, "experts", c.num_experts);
  c.top_k = int_flag(f, "topk", c.top_k);
  if (f.has("router")) {
    const std::string r = f.get("router");
    if (r == "softmax" || r == "softmax_topk") c.router.kind = RouterKind::softmax_topk;
    else if (r == "sigmoid" || r == "sigmoid_grouped_topk") c.router.kind = RouterKind::sigmoid_grouped_topk;
    else throw UsageError("--router=" + r + " is not known; use softmax or sigmoid");
  }
  c.router.n_group = int_flag(f, "n-group", c.router.n_group);
  c.router.topk_group = int_flag(f, "topk-group", c.router.topk_group);
  c.router.routed_scaling_factor = float(f.get_double("scaling", c.router.routed_scaling_factor));
  c.router.renormalize = f.get_bool("renormalize", c.router.renormalize);
  c.num_ranks = int_flag(f, "ranks", c.num_ranks);
  c.capacity = int_flag(f, "capacity", c.capacity);
  if (f.has("dispatch")) c.dispatch_format = act_flag(f, "dispatch");
  c.fp8_ue8m0 = f.get_bool("ue8m0", c.fp8_ue8m0);
  c.nvfp4_global_scale = float(f.get_double("nvfp4-global-scale", c.nvfp4_global_scale));
  if (f.has("weights")) {
    const auto w = parse_weight_format(f.get("weights"));
    if (!w) throw UsageError("--weights=" + f.get("weights") + " is not a weight format; use bf16, fp8 or nvfp4");
    c.weight_format = *w;
  }
  if (f.has("combine")) c.combine_format = act_flag(f, "combine");
  if (f.has("intermediate-quant") && f.has("iq"))
    throw UsageError("--iq is short for --intermediate-quant; give one of them");
  for (const char* name : {"intermediate-quant", "iq"}) {
    if (!f.has(name)) continue;
    const std::string q = f.get(name);
    if (!parse_intermediate_quant(q, c.intermediate_quant))
      throw UsageError(std::string("--") + name + "=" + q + " is not known; use auto, none or fp8");
  }
  if (f.has("dispatcher")) c.dispatcher = f.get("dispatcher");
  if (f.has("runner")) c.runner = f.get("runner");
  c.timeout_ms = int_flag(f, "timeout-ms", c.timeout_ms);
  apply_tuning_flags(f, c.tuning);
  // Last: the map is read against the final expert and rank counts.
  if (f.has("placement")) {
    if (c.num_experts < 1 || c.num_ranks < 1)
      throw UsageError("--placement needs --experts and --ranks of at least 1");
    const int slots = int_flag(f, "slots-per-rank", (c.num_experts + c.num_ranks - 1) / c.num_ranks);
    c.placement = ExpertPlacement::parse(f.get("placement"), c.num_experts, c.num_ranks, slots);
  }
}

std::vector<ConfigIssue> inapplicable_flags(const Flags& f, const MoeConfig& c) {
  std::vector<ConfigIssue> is;
  if (c.router.kind != RouterKind::sigmoid_grouped_topk)
    for (const char* name : {"n-group", "topk-group", "scaling"})
      if (f.has(name))
        is.push_back({name, f.get(name),
                      std::string("--") + name + " applies to the sigmoid router only, and this router is softmax; "
                      "add --router sigmoid or leave --" + name + " out"});
  if (f.has("slots-per-rank") && !f.has("placement"))
    is.push_back({"slots-per-rank", f.get("slots-per-rank"),
                  "--slots-per-rank applies to an explicit --placement only; add --placement or leave it out"});
  return is;
}

}  // namespace epmoe::cli
