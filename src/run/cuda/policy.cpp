// Engine and tile choice of runner "cuda" (policy.h).
#include "run/cuda/policy.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

#include "epmoe/error.h"
#include "run/cuda/engine.h"
#include "run/cuda/engine_cutlass.h"
#include "run/cuda/widen.h"

namespace epmoe::cuda::policy {

double expected_rows(const MoeConfig& cfg, const DispatchOutput& in) {
  const int experts = std::max({cfg.num_experts, in.num_local_experts, 1});
  return double(in.slots()) * in.top_k / experts;
}

int block_m(double expected_rows, int forced, int decode_max_rows) {
  if (forced) return forced;
  const double limit = decode_max_rows > 0 ? double(decode_max_rows) : kDecodeMaxRows;
  return expected_rows <= limit ? kWgmmaBlockM : 128;
}

bool use_cutlass(RunnerEngine engine, WeightFormat wf, double expected_rows, int decode_max_rows) {
  if (engine == RunnerEngine::mma || !cutlass_engine::available()) return false;
  if (engine == RunnerEngine::cutlass || decode_max_rows == kDecodeNever) return true;
  if (decode_max_rows > 0) return expected_rows > double(decode_max_rows);
  const int min_rows = wf == WeightFormat::nvfp4 ? kCutlassMinRowsNvfp4 : kCutlassMinRows;
  return expected_rows >= double(min_rows);
}

int swap_tile_n(CutlassSwap swap, double expected_rows) {
  const int by_rows = expected_rows <= kSwapNarrowMaxRows ? 64 : 128;
  switch (swap) {
    case CutlassSwap::off: return 0;
    case CutlassSwap::on: return by_rows;
    case CutlassSwap::n64: return 64;
    case CutlassSwap::n128: return 128;
    case CutlassSwap::n192: return 192;
    default: return expected_rows <= kSwapMaxRows ? by_rows : 0;
  }
}

int single_tile_n(double expected_rows) { return expected_rows <= kSwapMaxRows ? 128 : 0; }

std::vector<RowBucket> row_buckets(CutlassSwap swap, double expected_rows, bool fp8, double weight_bytes,
                                   int experts) {
  constexpr int kAll = RowBucket{}.hi;
  if (swap == CutlassSwap::automatic &&
      (weight_bytes < kSplitMinWeightBytes || experts < kSplitMinExperts || expected_rows > split_max_rows(fp8)))
    return {RowBucket{0, kAll, single_tile_n(expected_rows)}};
  if (swap == CutlassSwap::automatic && expected_rows <= kSplitNarrowMaxRows) return {{0, 64, 64}, {65, kAll, 128}};
  if (swap == CutlassSwap::automatic || swap == CutlassSwap::byrows) {
    if (fp8)
      return {{0, 64, 64},   {65, 128, 128}, {129, 192, 96}, {193, 256, 0},
              {257, 288, 96}, {289, 384, 128}, {385, kAll, 0}};
    return {{0, 64, 64},    {65, 128, 128}, {129, 192, 192}, {193, 256, 0},
            {257, 384, 192}, {385, 512, 0},  {513, 576, 192}, {577, kAll, 0}};
  }
  RowBucket all;
  all.tile_n = swap_tile_n(swap, expected_rows);
  return {all};
}

std::vector<RowBucket> parse_row_buckets(const std::string& spec) {
  auto fail = [&](const std::string& part, const std::string& why) {
    throw UsageError("row buckets '" + spec + "': '" + part + "' " + why +
                     "; write lo-hi:tile,...,lo-:tile from 0 up, tile 0 (unswapped), 64, 96, 128 or 192");
  };
  std::vector<RowBucket> out;
  size_t at = 0;
  while (at <= spec.size()) {
    const size_t comma = std::min(spec.find(',', at), spec.size());
    const std::string part = spec.substr(at, comma - at);
    at = comma + 1;
    const size_t dash = part.find('-'), colon = part.find(':');
    if (dash == std::string::npos || colon == std::string::npos || colon < dash) fail(part, "is not lo-hi:tile");
    RowBucket b;
    try {
      size_t used = 0;
      b.lo = std::stoi(part.substr(0, dash), &used);
      if (used != dash) fail(part, "has a bad lower bound");
      const std::string hi = part.substr(dash + 1, colon - dash - 1);
      if (!hi.empty()) {
        b.hi = std::stoi(hi, &used);
        if (used != hi.size()) fail(part, "has a bad upper bound");
      }
      const std::string tile = part.substr(colon + 1);
      b.tile_n = std::stoi(tile, &used);
      if (used != tile.size()) fail(part, "has a bad tile");
    } catch (const std::logic_error&) {
      fail(part, "has a number that does not parse");
    }
    if (!out.empty() && out.back().hi == RowBucket{}.hi) fail(part, "follows the open last range");
    if (b.lo != (out.empty() ? 0 : out.back().hi + 1)) fail(part, "does not start where the previous range ends (or at 0)");
    if (b.hi < b.lo) fail(part, "ends before it starts");
    if (b.tile_n != 0 && !cutlass_engine::swap_tile_exists(b.tile_n, true))
      fail(part, "has a tile without an instantiation");
    out.push_back(b);
  }
  if (out.back().hi != RowBucket{}.hi) fail(spec.substr(spec.rfind(',') == std::string::npos ? 0 : spec.rfind(',') + 1),
                                            "is the last range but not open (lo-:tile)");
  return out;
}

std::vector<int> bucket_order(const std::vector<RowBucket>& buckets, double expected_rows) {
  auto distance = [&](const RowBucket& b) {
    if (expected_rows < b.lo) return double(b.lo) - expected_rows;
    if (expected_rows > b.hi) return expected_rows - double(b.hi);
    return 0.0;
  };
  std::vector<int> order(buckets.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return distance(buckets[a]) < distance(buckets[b]); });
  return order;
}

std::vector<std::vector<int>> bucket_launches(const std::vector<RowBucket>& buckets, double expected_rows,
                                              int max_ranges) {
  if (max_ranges < 1)
    throw UsageError("bucket_launches: max_ranges=" + std::to_string(max_ranges) + " must be at least 1");
  std::vector<std::vector<int>> launches;
  for (const int b : bucket_order(buckets, expected_rows)) {
    size_t i = 0;
    while (i < launches.size() && (buckets[launches[i].front()].tile_n != buckets[b].tile_n ||
                                   int(launches[i].size()) >= max_ranges))
      ++i;
    if (i == launches.size()) launches.emplace_back();
    launches[i].push_back(b);
  }
  for (std::vector<int>& l : launches) std::sort(l.begin(), l.end());
  return launches;
}

void check_row_buckets(const std::vector<RowBucket>& buckets, bool fp8) {
  for (const RowBucket& b : buckets)
    if (b.tile_n != 0 && !cutlass_engine::swap_tile_exists(b.tile_n, fp8))
      throw UsageError("row buckets: tile " + std::to_string(b.tile_n) + " (rows " + std::to_string(b.lo) +
                       "..) has no swap-AB instantiation on the " + (fp8 ? "fp8" : "bf16") +
                       " GEMM; use 0, 64, 128 or 192" + (fp8 ? " (or 96)" : ""));
}

DecodeEngines decode_engines(bool wgmma_decode, int bm, WeightFormat wf, ActFormat act, IntermediateQuant iq,
                             int hidden, int intermediate, bool prepared13, bool prepared2) {
  const bool decode = wgmma_decode && bm == kWgmmaBlockM;
  const int H = hidden, I = intermediate;
  DecodeEngines d;
  d.bf16 = decode && wf == WeightFormat::bf16;
  d.fp8_1 = decode && wf == WeightFormat::fp8 && act == ActFormat::fp8;
  d.fp8_2 = decode && wf == WeightFormat::fp8 && iq == IntermediateQuant::fp8;
  d.nvfp4_1 = decode && wf == WeightFormat::nvfp4 && wgmma_nvfp4_supports(H, I, true, prepared13);
  d.nvfp4_2 = decode && wf == WeightFormat::nvfp4 && wgmma_nvfp4_supports(I, H, false, prepared2);
  return d;
}

int decode_max_rows(WeightFormat wf, const DecodeEngines& d32, int tuned, bool prepared, int experts,
                    int64_t expert_weights, bool fp8_mixed) {
  if (tuned > 0) return tuned;
  if (wf == WeightFormat::fp8 && fp8_mixed) {
    const int bf16_operands = int(!d32.fp8_1) + int(!d32.fp8_2);  // decode GEMMs that would run mma.sync
    if (bf16_operands == 2 || (bf16_operands == 1 && expert_weights >= kFp8MixedDecodeMinExpert)) return kDecodeNever;
  }
  if (wf == WeightFormat::nvfp4 && d32.nvfp4_1 && d32.nvfp4_2)
    return prepared ? kDecodeMaxRowsNvfp4Wide : kDecodeMaxRowsNvfp4;
  if (wf == WeightFormat::bf16 && d32.bf16 && experts < kSplitMinExperts) return kDecodeMaxRowsFewBf16;
  return 0;
}

double nvfp4_wide_max_rows(int hidden, int intermediate, int tuned, bool paired, int experts) {
  if (tuned > 0) return double(tuned);
  const bool small = 3 * int64_t(hidden) * intermediate < kNvfp4WideSmallExpert;
  if (paired) return experts < kSplitMinExperts ? 0.0 : small ? kNvfp4WideMaxRowsPairedSmall : kNvfp4WideMaxRowsPaired;
  return small ? kNvfp4WideMaxRowsSmall : kNvfp4WideMaxRows;
}

bool use_nvfp4_wide(RunnerEngine engine, const DecodeEngines& d32, bool prepared, double expected_rows,
                    int decode_max_rows, double max_rows) {
  return engine != RunnerEngine::cutlass && prepared && d32.nvfp4_1 && d32.nvfp4_2 && decode_max_rows > 0 &&
         expected_rows > double(decode_max_rows) && expected_rows <= max_rows;
}

int fp8w_tile_n(double expected_rows) { return expected_rows <= 64 ? 64 : expected_rows <= 128 ? 128 : 256; }

std::string path_name(CutlassPath p, WeightFormat wf, int swap_tile_n) {
  std::string s = p == CutlassPath::fp8      ? "cutlass-fp8"
                  : p == CutlassPath::fp8w   ? "cutlass-fp8w"
                  : p == CutlassPath::nvfp4w ? "cutlass-nvfp4w"
                                             : "cutlass-bf16";
  if (swap_tile_n == kByRows) s += "-byrows";
  else if (swap_tile_n) s += "-swap" + std::to_string(swap_tile_n);
  if (p == CutlassPath::widened) s += wf == WeightFormat::nvfp4 ? "(widened nvfp4)" : "(widened fp8)";
  return s;
}

size_t CutlassPlan::scratch_bytes() const {
  return std::max(gemm1 == CutlassPath::widened ? size_t(chunk1) * expert_bytes1 : 0,
                  gemm2 == CutlassPath::widened ? size_t(chunk2) * expert_bytes2 : 0);
}

CutlassPlan cutlass_plan(const DispatchOutput& in, const ExpertWeights& w, IntermediateQuant iq, bool fused_swiglu,
                         CutlassSwap swap, double expected_rows, size_t widen_scratch_bytes, bool fp8_mixed,
                         bool nvfp4_paired) {
  const int E = in.num_local_experts, H = in.hidden, I = w.intermediate;
  const WeightFormat wf = w.w13.format;
  const bool iq8 = iq == IntermediateQuant::fp8;
  const bool fp8w = wf == WeightFormat::fp8;
  // 16-byte TMA rows of e4m3 (the fp8 formats' own rule, checked again here); a partial last
  // 128-block in H or I is its own scale block on the fp8 GEMMs.
  const bool tma_rows = H % 16 == 0 && I % 16 == 0;
  // fp8 GEMM1: the dispatched e4m3 rows are the A operand as they are (16-byte row copies).
  const bool fp8_1 = fp8w && in.format == ActFormat::fp8 && tma_rows &&
                     reinterpret_cast<uintptr_t>(in.payload) % 16 == 0 && w.w13.scales;
  const bool fp8_2 = fp8w && iq8 && tma_rows && w.w2.scales;
  // fp8 weights with a bf16 operand decoded in the main loop: 16-byte TMA rows of codes (K % 16)
  // and of row scales and bf16 output (N % 8, which tma_rows implies for N = 2I and N = H).
  const bool mixed = fp8w && fp8_mixed && tma_rows && w.w13.scales && w.w2.scales;
  // nvfp4 weights from their paired copies: the same TMA rule (one byte per weight).
  const bool paired = wf == WeightFormat::nvfp4 && nvfp4_paired && tma_rows;
  const CutlassPath other = mixed ? CutlassPath::fp8w : paired ? CutlassPath::nvfp4w : CutlassPath::widened;
  CutlassPlan p;
  p.gemm1 = wf == WeightFormat::bf16 ? CutlassPath::bf16 : fp8_1 ? CutlassPath::fp8 : other;
  p.gemm2 = wf == WeightFormat::bf16 ? CutlassPath::bf16 : fp8_2 ? CutlassPath::fp8 : other;
  p.fp8w_tile_n = fp8w_tile_n(expected_rows);
  p.mixed_mid = mixed_mid(H, I);
  p.split_w13 = p.gemm1 == CutlassPath::fp8 && I % 128 != 0;
  p.swap_tile_n = swap_tile_n(swap, expected_rows);
  p.buckets = row_buckets(swap, expected_rows, fp8w, split_weight_bytes(E, H, I, fp8w), E);
  const bool fusable = fused_swiglu && (p.gemm1 == CutlassPath::bf16 || p.gemm1 == CutlassPath::widened) && !iq8;
  if (fusable && swap == CutlassSwap::automatic && expected_rows > kSwapMaxRows) p.buckets = {RowBucket{}};
  // Without being asked: where GEMM1 is one unswapped bf16 launch anyway, the one-GEMM SwiGLU
  // (glu_fits: I % 128 == 0) gives the unfused bits without the pass and takes no split away.
  const bool one_unswapped = p.direct_tile_n() == 0;  // one bucket, unswapped
  const bool glu = p.gemm1 == CutlassPath::bf16 && !iq8 && cutlass_engine::glu_fits(I) && one_unswapped;
  p.fused_swiglu = (fusable && p.tile_n(p.gemm1) == 0) || glu;
  p.fp8_glu = p.gemm1 == CutlassPath::fp8 && p.gemm2 == CutlassPath::fp8 && cutlass_engine::glu_fp8_fits(I) &&
              one_unswapped;
  p.glu_split = glu_in_split(p, I, iq);
  p.expert_bytes1 = widen::expert_bytes(w.w13);
  p.expert_bytes2 = widen::expert_bytes(w.w2);
  p.chunk1 = std::min(widen::chunk_experts(widen_scratch_bytes, p.expert_bytes1, E), 65535);
  p.chunk2 = std::min(widen::chunk_experts(widen_scratch_bytes, p.expert_bytes2, E), 65535);
  return p;
}

bool glu_in_split(const CutlassPlan& p, int intermediate, IntermediateQuant iq) {
  if (p.gemm1 != CutlassPath::bf16 || iq == IntermediateQuant::fp8 || p.fused_swiglu ||
      !cutlass_engine::glu_fits(intermediate) || p.buckets.size() < 2)
    return false;
  int unswapped = 0;
  for (const RowBucket& b : p.buckets) unswapped += b.tile_n == 0;
  return unswapped >= 1 && unswapped <= cutlass_engine::RowRanges::kMax;
}

void check_config(const MoeConfig& cfg, std::vector<ConfigIssue>& issues) {
  using Dim = std::pair<const char*, int>;
  for (const auto& [field, v] : {Dim{"hidden", cfg.hidden}, Dim{"intermediate", cfg.intermediate}}) {
    if (v >= 1 && v % 64 != 0)
      issues.push_back({field, std::to_string(v),
                        std::string(field) + "=" + std::to_string(v) +
                            " is not a multiple of 64, which runner cuda's GEMM tiles require; use a multiple of 64 "
                            "or runner reference"});
  }
  if (cfg.tuning.engine == RunnerEngine::cutlass && !cutlass_engine::available())
    issues.push_back({"tuning.engine", engine_name(cfg.tuning.engine),
                      "tuning.engine=cutlass, but this build has no CUTLASS (run scripts/setup.sh and re-run cmake), "
                      "or use engine auto/mma"});
}

}  // namespace epmoe::cuda::policy
