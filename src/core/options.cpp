// Tuning options (options.h): names, parsers, checks and the dump. The environment defaults are
// read in env.cpp.
#include "epmoe/options.h"

#include <sstream>

#include "core/env.h"
#include "epmoe/config.h"

namespace epmoe {

const char* engine_name(RunnerEngine e) {
  switch (e) {
    case RunnerEngine::mma: return "mma";
    case RunnerEngine::cutlass: return "cutlass";
    default: return "auto";
  }
}

const char* combine_mode_name(CombineMode m) { return m == CombineMode::ce ? "ce" : "sm"; }

const char* fault_check_name(FaultCheck f) {
  switch (f) {
    case FaultCheck::off: return "off";
    case FaultCheck::raise: return "raise";
    default: return "count";
  }
}

bool parse_fault_check(const std::string& s, FaultCheck& out) {
  if (s == "off") out = FaultCheck::off;
  else if (s == "count") out = FaultCheck::count;
  else if (s == "raise") out = FaultCheck::raise;
  else return false;
  return true;
}

const char* cutlass_swap_name(CutlassSwap s) {
  switch (s) {
    case CutlassSwap::off: return "0";
    case CutlassSwap::on: return "1";
    case CutlassSwap::n64: return "64";
    case CutlassSwap::n128: return "128";
    case CutlassSwap::n192: return "192";
    case CutlassSwap::byrows: return "byrows";
    default: return "auto";
  }
}

bool parse_cutlass_swap(const std::string& s, CutlassSwap& out) {
  if (s == "auto") out = CutlassSwap::automatic;
  else if (s == "0" || s == "off") out = CutlassSwap::off;
  else if (s == "1" || s == "on") out = CutlassSwap::on;
  else if (s == "64") out = CutlassSwap::n64;
  else if (s == "128") out = CutlassSwap::n128;
  else if (s == "192") out = CutlassSwap::n192;
  else if (s == "byrows") out = CutlassSwap::byrows;
  else return false;
  return true;
}

bool parse_engine(const std::string& s, RunnerEngine& out) {
  if (s == "auto") out = RunnerEngine::automatic;
  else if (s == "mma") out = RunnerEngine::mma;
  else if (s == "cutlass") out = RunnerEngine::cutlass;
  else return false;
  return true;
}

bool parse_combine_mode(const std::string& s, CombineMode& out) {
  if (s == "sm") out = CombineMode::sm;
  else if (s == "ce") out = CombineMode::ce;
  else return false;
  return true;
}

std::vector<ConfigIssue> validate(const Tuning& t) {
  std::vector<ConfigIssue> is;
  auto range = [&](const char* field, long long v, long long lo, long long hi, const char* fix) {
    if (v < lo || v > hi)
      is.push_back({std::string("tuning.") + field, std::to_string(v),
                    std::string("tuning.") + field + "=" + std::to_string(v) + " is outside [" + std::to_string(lo) +
                        ", " + std::to_string(hi) + "]; " + fix});
  };
  range("widen_scratch_mb", t.widen_scratch_mb, 1, Tuning::kMaxWidenScratchMb, "the default is 1024 (MiB)");
  range("decode_max_rows", t.decode_max_rows, 0, Tuning::kMaxDecodeMaxRows,
        "0 (the default) keeps the measured crossover (--decode-max-rows)");
  range("nvfp4_wide_max_rows", t.nvfp4_wide_max_rows, 0, Tuning::kMaxNvfp4WideMaxRows,
        "0 (the default) keeps the measured bound (--nvfp4-wide-max-rows)");
  range("comm_sms", t.comm_sms, 0, Tuning::kMaxCommSms,
        "0 (the default) takes half the device's SMs (--comm-sms)");
  range("push_warps", t.push_warps, Tuning::kMinPushWarps, Tuning::kMaxPushWarps, "the default is 6 (--push-warps)");
  range("ce_rows", t.ce_rows, 1, Tuning::kMaxCeRows, "the default is 512 (--ce-rows)");
  auto named = [&](const char* field, int v, int count, const char* names) {
    if (v < 0 || v >= count)
      is.push_back({std::string("tuning.") + field, std::to_string(v),
                    std::string("tuning.") + field + " holds no valid value; use one of " + names});
  };
  if (t.nvfp4_wide_rows != 0 && t.nvfp4_wide_rows != 128 && t.nvfp4_wide_rows != 160)
    is.push_back({"tuning.nvfp4_wide_rows", std::to_string(t.nvfp4_wide_rows),
                  "tuning.nvfp4_wide_rows=" + std::to_string(t.nvfp4_wide_rows) +
                      " is not a token-tile height of the wide nvfp4 engine; use 0 (the default: by rows), 128 or 160 "
                      "(--nvfp4-wide-rows)"});
  named("engine", int(t.engine), 3, "auto, mma, cutlass");
  named("combine", int(t.combine), 2, "sm, ce");
  named("fault_check", int(t.fault_check), 3, "off, count, raise");
  named("cutlass_swap", int(t.cutlass_swap), 7, "auto, 0, 1, 64, 128, 192, byrows");
  return is;
}

std::string describe(const Tuning& t) {
  const Tuning& d = default_tuning();
  std::ostringstream os;
  auto row = [&](const char* name, const std::string& v, const std::string& dv, bool agree, const char* var) {
    const bool from_env = env::get(var).has_value();
    const char* src = v != dv ? "set" : (from_env ? "env" : "default");
    const size_t len = std::string(name).size();
    os << "  " << name << std::string(name[0] ? (len < 18 ? 18 - len : 1) : 0, ' ') << v
       << std::string(v.size() < 10 ? 10 - v.size() : 1, ' ') << (agree ? "[agree] " : "[local] ") << src
       << (from_env && v == dv ? std::string(" ") + var : std::string()) << "\n";
  };
  auto b = [](bool x) { return std::string(x ? "1" : "0"); };
  auto i = [](int x) { return std::to_string(x); };
  row("engine", engine_name(t.engine), engine_name(d.engine), false, "EPMOE_RUNNER_ENGINE");
  row("wgmma_defer", b(t.wgmma_defer), b(d.wgmma_defer), false, "EPMOE_WGMMA_DEFER");
  row("pdl", b(t.pdl), b(d.pdl), false, "EPMOE_PDL");
  row("nvfp4_wide_rows", i(t.nvfp4_wide_rows), i(d.nvfp4_wide_rows), false, "EPMOE_NVFP4_WIDE_ROWS");
  row("fused_swiglu", b(t.fused_swiglu), b(d.fused_swiglu), false, "EPMOE_CUTLASS_SWIGLU");
  row("concurrent_buckets", b(t.concurrent_buckets), b(d.concurrent_buckets), false, "EPMOE_CUTLASS_CONCURRENT");
  row("widen_scratch_mb", i(t.widen_scratch_mb), i(d.widen_scratch_mb), false, "EPMOE_WIDEN_SCRATCH_MB");
  row("nvfp4_prepare", b(t.nvfp4_prepare), b(d.nvfp4_prepare), false, "EPMOE_NVFP4_PREPARE");
  row("fp8_mixed", b(t.fp8_mixed), b(d.fp8_mixed), false, "EPMOE_FP8_MIXED");
  row("nvfp4_mixed", b(t.nvfp4_mixed), b(d.nvfp4_mixed), false, "EPMOE_NVFP4_MIXED");
  row("decode_max_rows", i(t.decode_max_rows), i(d.decode_max_rows), false, "EPMOE_DECODE_MAX_ROWS");
  row("nvfp4_wide_max_rows", i(t.nvfp4_wide_max_rows), i(d.nvfp4_wide_max_rows), false, "EPMOE_NVFP4_WIDE_MAX_ROWS");
  row("cutlass_swap", cutlass_swap_name(t.cutlass_swap), cutlass_swap_name(d.cutlass_swap), false,
      "EPMOE_CUTLASS_SWAP");
  row("comm_sms", i(t.comm_sms), i(d.comm_sms), false, "EPMOE_COMM_SMS");
  row("push_warps", i(t.push_warps), i(d.push_warps), false, "EPMOE_NVL_PUSH_WARPS");
  row("combine", combine_mode_name(t.combine), combine_mode_name(d.combine), true, "EPMOE_NVL_COMBINE");
  row("ce_rows", i(t.ce_rows), i(d.ce_rows), true, "EPMOE_NVL_CE_ROWS");
  row("fault_check", fault_check_name(t.fault_check), fault_check_name(d.fault_check), false, "EPMOE_FAULT_CHECK");
  return os.str();
}

}  // namespace epmoe
