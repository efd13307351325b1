// Tuning options: how a backend runs, never what it computes (every value gives the same bytes,
// except where a field says so). Each field is marked
//   [agree] ranks must hold the same value: it is part of config_fingerprint, so ranks built
//           differently fail at setup instead of hanging;
//   [local] each rank may choose its own.
// Defaults come from the environment (EPMOE_* variables, read by one reader, src/core/env.cpp),
// else from the built-in value below. A malformed variable is reported by validate() as an issue
// naming the variable; the field then keeps its built-in default. Code that sets a field directly
// wins over the environment. validate() checks every field.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace epmoe {

struct ConfigIssue;

// Which GEMM engines runner "cuda" may use.
enum class RunnerEngine : uint8_t {
  automatic,  // decode engines for few rows per expert, CUTLASS above the measured crossover
  mma,        // never CUTLASS (decode wgmma / mma.sync engines)
  cutlass,    // CUTLASS grouped GEMMs whatever M (needs a build with CUTLASS)
};

// Whether runner "cuda"'s CUTLASS grouped GEMMs run swap-AB (out^T = W * A^T: the weights' output
// dimension in the 128-row tile, the expert's rows in a 64-wide one; docs/RUNNER.md).
enum class CutlassSwap : uint8_t {
  automatic,  // each expert on the tile that fits its rows (swap-AB 64, 128, 192 or unswapped: one
              // launch per tile over its ranges of rows, as byrows); small experts (policy::kSplitMinWeightBytes)
              // one launch, swap-AB 128 up to policy::kSwapMaxRows expected rows, unswapped above
  off,        // never
  on,         // always (where the engine is CUTLASS), one token-tile width (64 or 128) by expected rows
  n64,        // always, 64-wide token tiles
  n128,       // always, 128-wide token tiles
  n192,       // always, 192-wide token tiles
  byrows,     // each expert on the tile that fits its rows, whatever the experts' size
};

// Who moves the combine rows of dispatcher "nvlink".
enum class CombineMode : uint8_t {
  sm,  // push warps of the combine kernel
  ce,  // the copy engine (bf16 combine only; fp8 rows are encoded by the push warps on the way)
};

// What MoeLayer does about data faults only the device sees: NaN/inf in hidden, router logits or
// routing weights, topk ids outside [-1, E) in a device tensor (DESIGN.md §7). Their outcome is the
// same in every mode; the mode only decides whether they are counted and whether forward raises.
enum class FaultCheck : uint8_t {
  off,    // not counted (no scan of the inputs)
  count,  // counted on the device (one read of the inputs per forward, no host synchronization);
          //   MoeLayer::fault_counts() reads them
  raise,  // counted, and forward waits for its stream and raises UsageError naming the faults
};

struct Tuning {
  // --- runner "cuda" -------------------------------------------------------------------------
  RunnerEngine engine = RunnerEngine::automatic;  // [local] EPMOE_RUNNER_ENGINE=auto|mma|cutlass
  bool wgmma_defer = true;      // [local] EPMOE_WGMMA_DEFER=0|1: the decode wgmma pipeline waits
                                //   for a stage's MMAs one iteration later (same bits, faster)
  bool pdl = true;              // [local] EPMOE_PDL=0|1: the row passes and the GEMMs (decode wgmma,
                                //   CUTLASS) are launched with programmatic dependent launch, each kernel's
                                //   launch overlapping the previous one's end (same bits)
  int nvfp4_wide_rows = 0;      // [local] EPMOE_NVFP4_WIDE_ROWS=0|128|160: token-tile height of the
                                //   wide nvfp4 engine; 0: per expert, the one giving fewer tiles
                                //   (an expert of 129-160 rows decodes its weights once; same bits)
  bool fused_swiglu = false;    // [local] EPMOE_CUTLASS_SWIGLU=0|1: CUTLASS GEMM1 as gate half +
                                //   up half with SwiGLU in its epilogue (same bits)
  bool concurrent_buckets = true;  // [local] EPMOE_CUTLASS_CONCURRENT=0|1: the CUTLASS GEMMs' launches
                                //   per range of rows per expert (cutlass_swap auto/byrows) on side
                                //   streams, overlapping (same bits)
  int widen_scratch_mb = 1024;  // [local] EPMOE_WIDEN_SCRATCH_MB=1..16777216: bound of the buffer
                                //   fp8/nvfp4 weights are widened into for the CUTLASS bf16 GEMM
  bool nvfp4_prepare = true;    // [local] EPMOE_NVFP4_PREPARE=0|1: copy nvfp4 weights once into
                                //   the decode engine's load order (the weight bytes again)
  bool fp8_mixed = true;        // [local] EPMOE_FP8_MIXED=0|1: CUTLASS GEMMs of fp8 weights with a
                                //   bf16 operand decode the weights in the main loop; 0: widen them
                                //   to bf16 first (same bits)
  bool nvfp4_mixed = true;      // [local] EPMOE_NVFP4_MIXED=0|1: the prepare step also writes nvfp4
                                //   weights as one byte per weight (both codes of a pair and their
                                //   block scale), which CUTLASS GEMMs decode in the main loop; 0: no
                                //   such copy, large-M nvfp4 GEMMs widen to bf16 first (same bits)
  int decode_max_rows = 0;      // [local] EPMOE_DECODE_MAX_ROWS=0..65536: expected rows per expert
                                //   up to which engine auto keeps the 32-row decode engines (above:
                                //   CUTLASS, or for prepared nvfp4 the wide engine up to 640 rows);
                                //   0 = the measured per-format crossover (policy.h)
  int nvfp4_wide_max_rows = 0;  // [local] EPMOE_NVFP4_WIDE_MAX_ROWS=0..65536: expected rows per expert
                                //   up to which engine auto runs prepared nvfp4 on the wide engine
                                //   (above: CUTLASS, on the paired copy or widened); 0 = the
                                //   measured bound (policy.h: with paired copies 128, 96 for experts
                                //   under 16 M weights, none on under 16 local experts; else 640,
                                //   512 for experts under 16 M weights)
  CutlassSwap cutlass_swap = CutlassSwap::automatic;  // [local] EPMOE_CUTLASS_SWAP=auto|0|1|64|128|192|byrows:
                                //   CUTLASS GEMMs swap-AB (64/128/192: that token-tile width; auto:
                                //   per expert by its rows where that pays, byrows: always; same results within the bf16 rounding
                                //   bound)

  // --- device-initiated dispatchers ("nvlink") -----------------------------------------------
  int comm_sms = 0;             // [local] EPMOE_COMM_SMS=0..1024: SMs (CTAs) of the dispatch and
                                //   combine kernels, at most the device's SM count; 0 = half the
                                //   device's SMs (66 on an H200), leaving the rest to work the caller
                                //   runs on other streams at the same time
  int push_warps = 6;           // [local] EPMOE_NVL_PUSH_WARPS=4..12: combine warps per CTA that
                                //   push rows (the others sum); ignored in combine mode ce
  CombineMode combine = CombineMode::sm;  // [agree] EPMOE_NVL_COMBINE=sm|ce
  int ce_rows = 512;            // [agree] EPMOE_NVL_CE_ROWS=1..1048576: rows per copy-engine copy

  // --- MoeLayer ------------------------------------------------------------------------------
  FaultCheck fault_check = FaultCheck::count;  // [local] EPMOE_FAULT_CHECK=off|count|raise

  // Built-in limits (validate() and the CLI use them).
  static constexpr int kMinPushWarps = 4, kMaxPushWarps = 12;
  static constexpr int kMaxCommSms = 1024;
  static constexpr int kMaxCeRows = 1 << 20;
  static constexpr int kMaxWidenScratchMb = 1 << 24;
  static constexpr int kMaxDecodeMaxRows = 1 << 16;
  static constexpr int kMaxNvfp4WideMaxRows = 1 << 16;
};

// The defaults: built-in values overridden by the EPMOE_* variables that are set and well formed.
// Read once per process (the environment is not re-read).
const Tuning& default_tuning();
// Issues with the EPMOE_* variables (field = the variable's name), empty when all are well formed.
const std::vector<ConfigIssue>& environment_issues();

// Every problem with the fields of `t` (field names "tuning.<name>").
std::vector<ConfigIssue> validate(const Tuning& t);

const char* engine_name(RunnerEngine e);        // "auto", "mma", "cutlass"
const char* combine_mode_name(CombineMode m);   // "sm", "ce"
const char* fault_check_name(FaultCheck f);     // "off", "count", "raise"
// Parsers shared by the environment reader and the CLI: false when `s` is not a valid name.
bool parse_engine(const std::string& s, RunnerEngine& out);
bool parse_combine_mode(const std::string& s, CombineMode& out);
bool parse_fault_check(const std::string& s, FaultCheck& out);
const char* cutlass_swap_name(CutlassSwap s);   // "auto", "0", "1", "64", "128"
bool parse_cutlass_swap(const std::string& s, CutlassSwap& out);  // auto, 0 or off, 1 or on, 64, 128, 192

// One line per field: "name = value   [agree|local]  source" where source is "env EPMOE_X" or
// "default" (what `epmoe validate` prints).
std::string describe(const Tuning& t);

}  // namespace epmoe
