// The one reader of the process environment (env.h) and the environment's tuning defaults
// (options.h).
#include "core/env.h"

#include <cctype>
#include <cstdlib>
#include <mutex>

#include "epmoe/config.h"
#include "epmoe/error.h"
#include "epmoe/options.h"

namespace epmoe::env {

std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);  // the only getenv call of the library
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

namespace {

[[noreturn]] void malformed(const char* name, const std::string& v, const std::string& expected, const char* what,
                            const std::string& example) {
  throw UsageError("environment variable " + std::string(name) + "='" + v + "' is not " + expected + " (" + what +
                   "); unset it or give e.g. " + example);
}

// Whole decimal number without sign, blanks or suffix; nullopt when it is not one or too long.
std::optional<long long> whole(const std::string& v) {
  if (v.empty() || v.size() > 12 || v.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoll(v);
}

}  // namespace

std::optional<long long> integer(const char* name, long long lo, long long hi, const char* what) {
  const auto v = get(name);
  if (!v) return std::nullopt;
  const auto x = whole(*v);
  if (!x || *x < lo || *x > hi)
    malformed(name, *v, "a whole number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", what,
              std::to_string(lo));
  return x;
}

std::optional<bool> flag(const char* name, const char* what) {
  const auto v = get(name);
  if (!v) return std::nullopt;
  if (*v != "0" && *v != "1") malformed(name, *v, "0 or 1", what, "1");
  return *v == "1";
}

std::optional<MpiLaunch> mpi_launch() {
  const auto rank = get("OMPI_COMM_WORLD_RANK"), size = get("OMPI_COMM_WORLD_SIZE");
  if (!rank || !size) return std::nullopt;
  auto num = [](const char* name, const std::optional<std::string>& v, int dflt) {
    if (!v) return dflt;
    const auto x = whole(*v);
    if (!x || *x > (1 << 24))
      throw UsageError("environment variable " + std::string(name) + "='" + *v +
                       "' is not a rank or size; it is set by mpirun, start the ranks with mpirun -np <R>");
    return int(*x);
  };
  MpiLaunch m;
  m.rank = num("OMPI_COMM_WORLD_RANK", rank, 0);
  m.size = num("OMPI_COMM_WORLD_SIZE", size, 1);
  m.local_rank = num("OMPI_COMM_WORLD_LOCAL_RANK", get("OMPI_COMM_WORLD_LOCAL_RANK"), m.rank);
  m.local_size = num("OMPI_COMM_WORLD_LOCAL_SIZE", get("OMPI_COMM_WORLD_LOCAL_SIZE"), m.size);
  if (m.size < 1 || m.rank >= m.size)
    throw UsageError("mpirun's OMPI_COMM_WORLD_RANK=" + std::to_string(m.rank) + " is not below OMPI_COMM_WORLD_SIZE=" +
                     std::to_string(m.size));
  return m;
}

std::string bootstrap_dir() { return get("EPMOE_BOOTSTRAP_DIR").value_or("/tmp"); }

std::string job_id() {
  for (const char* name : {"EPMOE_JOB_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid"}) {
    if (auto v = get(name)) {
      for (char& ch : *v)
        if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_') ch = '_';
      return *v;
    }
  }
  return "";
}

bool nccl_allow_version_mismatch() { return get("EPMOE_NCCL_ALLOW_VERSION_MISMATCH").has_value(); }

int cpu_threads() {
  return int(integer("EPMOE_CPU_THREADS", 1, 4096, "threads of the CPU reference; 1 = serial").value_or(0));
}

}  // namespace epmoe::env

namespace epmoe {

namespace {

struct EnvTuning {
  Tuning tuning;
  std::vector<ConfigIssue> issues;
};

// Each variable on its own: a malformed one becomes an issue and leaves its field at the built-in
// default, so one typo does not hide the others.
EnvTuning read_env_tuning() {
  EnvTuning r;
  Tuning& t = r.tuning;
  auto take = [&](const char* name, auto&& read) {
    try {
      read();
    } catch (const UsageError& e) {
      r.issues.push_back({name, env::get(name).value_or(""), e.what()});
    }
  };
  take("EPMOE_RUNNER_ENGINE", [&] {
    if (auto v = env::get("EPMOE_RUNNER_ENGINE"); v && !parse_engine(*v, t.engine))
      throw UsageError("environment variable EPMOE_RUNNER_ENGINE='" + *v +
                       "' is not an engine (runner cuda's GEMM engines); unset it or give auto, mma or cutlass");
  });
  take("EPMOE_WGMMA_DEFER", [&] {
    if (auto v = env::flag("EPMOE_WGMMA_DEFER", "1: the decode wgmma engine waits for a stage's MMAs one iteration later"))
      t.wgmma_defer = *v;
  });
  take("EPMOE_PDL", [&] {
    if (auto v = env::flag("EPMOE_PDL", "1: runner cuda launches its row passes and GEMMs with programmatic dependent launch"))
      t.pdl = *v;
  });
  take("EPMOE_NVFP4_WIDE_ROWS", [&] {
    if (auto v = env::integer("EPMOE_NVFP4_WIDE_ROWS", 0, 160, "token-tile height of runner cuda's wide nvfp4 engine (0: by rows, 128 or 160)"))
      t.nvfp4_wide_rows = int(*v);
  });
  take("EPMOE_CUTLASS_SWIGLU", [&] {
    if (auto v = env::flag("EPMOE_CUTLASS_SWIGLU", "1: SwiGLU in the epilogue of CUTLASS GEMM1's up half"))
      t.fused_swiglu = *v;
  });
  take("EPMOE_CUTLASS_CONCURRENT", [&] {
    if (auto v = env::flag("EPMOE_CUTLASS_CONCURRENT", "1: runner cuda's CUTLASS launches per row range overlap on side streams"))
      t.concurrent_buckets = *v;
  });
  take("EPMOE_WIDEN_SCRATCH_MB", [&] {
    if (auto v = env::integer("EPMOE_WIDEN_SCRATCH_MB", 1, Tuning::kMaxWidenScratchMb,
                              "MiB of scratch for weights widened to bf16"))
      t.widen_scratch_mb = int(*v);
  });
  take("EPMOE_NVFP4_PREPARE", [&] {
    if (auto v = env::flag("EPMOE_NVFP4_PREPARE", "1: copy nvfp4 weights into the decode engine's load order"))
      t.nvfp4_prepare = *v;
  });
  take("EPMOE_FP8_MIXED", [&] {
    if (auto v = env::flag("EPMOE_FP8_MIXED", "1: fp8 weights with a bf16 operand decoded inside runner cuda's CUTLASS GEMM"))
      t.fp8_mixed = *v;
  });
  take("EPMOE_NVFP4_MIXED", [&] {
    if (auto v = env::flag("EPMOE_NVFP4_MIXED", "1: nvfp4 weights paired (1 byte each) for runner cuda's mixed-input CUTLASS GEMM"))
      t.nvfp4_mixed = *v;
  });
  take("EPMOE_DECODE_MAX_ROWS", [&] {
    if (auto v = env::integer("EPMOE_DECODE_MAX_ROWS", 0, Tuning::kMaxDecodeMaxRows,
                              "expected rows per expert up to which runner cuda keeps its decode engines"))
      t.decode_max_rows = int(*v);
  });
  take("EPMOE_NVFP4_WIDE_MAX_ROWS", [&] {
    if (auto v = env::integer("EPMOE_NVFP4_WIDE_MAX_ROWS", 0, Tuning::kMaxNvfp4WideMaxRows,
                              "expected rows per expert up to which runner cuda runs prepared nvfp4 on its wide engine"))
      t.nvfp4_wide_max_rows = int(*v);
  });
  take("EPMOE_CUTLASS_SWAP", [&] {
    if (auto v = env::get("EPMOE_CUTLASS_SWAP"); v && !parse_cutlass_swap(*v, t.cutlass_swap))
      throw UsageError("environment variable EPMOE_CUTLASS_SWAP='" + *v +
                       "' is not a swap-AB choice (runner cuda's CUTLASS GEMMs); unset it or give auto, 0, 1, 64, 128, 192 or byrows");
  });
  take("EPMOE_COMM_SMS", [&] {
    if (auto v = env::integer("EPMOE_COMM_SMS", 0, Tuning::kMaxCommSms, "SMs of the nvlink dispatch/combine kernels"))
      t.comm_sms = int(*v);
  });
  take("EPMOE_NVL_PUSH_WARPS", [&] {
    if (auto v = env::integer("EPMOE_NVL_PUSH_WARPS", Tuning::kMinPushWarps, Tuning::kMaxPushWarps,
                              "combine warps per CTA that push rows; the others sum"))
      t.push_warps = int(*v);
  });
  take("EPMOE_NVL_COMBINE", [&] {
    if (auto v = env::get("EPMOE_NVL_COMBINE"); v && !parse_combine_mode(*v, t.combine))
      throw UsageError("environment variable EPMOE_NVL_COMBINE='" + *v +
                       "' is not a combine mode (who moves the nvlink combine rows); unset it or give sm or ce");
  });
  take("EPMOE_NVL_CE_ROWS", [&] {
    if (auto v = env::integer("EPMOE_NVL_CE_ROWS", 1, Tuning::kMaxCeRows, "rows per copy-engine copy of the combine"))
      t.ce_rows = int(*v);
  });
  take("EPMOE_FAULT_CHECK", [&] {
    if (auto v = env::get("EPMOE_FAULT_CHECK"); v && !parse_fault_check(*v, t.fault_check))
      throw UsageError("environment variable EPMOE_FAULT_CHECK='" + *v +
                       "' is not a fault-check mode (what MoeLayer does about NaN/inf inputs and bad device ids); "
                       "unset it or give off, count or raise");
  });
  return r;
}

const EnvTuning& env_tuning() {
  static const EnvTuning r = read_env_tuning();
  return r;
}

}  // namespace

const Tuning& default_tuning() { return env_tuning().tuning; }
const std::vector<ConfigIssue>& environment_issues() { return env_tuning().issues; }

}  // namespace epmoe
