// `epmoe bench runner`: the routed runner "cuda" on one GPU for each preset (`--preset all`: every
// model preset, each with its experts / 2 on the GPU, i.e. EP 2), weight format and M (rows routed
// to this rank; tokens spread evenly over the local experts, top-k folded in: one expert per slot);
// a format the shape cannot take (fp8 needs 128-multiples) is skipped and said. Two baselines are
// measured in the same run: the HBM copy rate (cudaMemcpy D2D, bytes
// read + written) and a cuBLAS per-expert loop of bf16 GEMMs doing the same two GEMMs.
// Weights (>= 2.8 GB at DeepSeek-V3 shapes) are far larger than the 60 MB L2, so every timed run
// streams them from HBM; activations are re-read per run, which matters only at large M where the
// GEMMs are compute bound.
#include "commands.h"

#if defined(EPMOE_WITH_CUDA)
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "args.h"
#include "bench_rows.h"
#include "bench_timer.h"
#include "bench_util.h"
#include "setup.h"
#include "core/cuda/check.h"
#include "epmoe/config.h"
#include "epmoe/error.h"
#include "epmoe/presets.h"
#include "epmoe/quant.h"
#include "harness/cuda/clock_probe.h"
#include "harness/cuda/synthetic.h"
#include "run/cuda/engine_cutlass.h"
#include "run/cuda/policy.h"
#include "run/cuda/runner.h"

namespace epmoe::cli {
namespace {

using cuda::DeviceBuffer;

// Median ms of `reps` calls after `warm` untimed ones, each call waited for (the default stream).
double median_ms(const std::function<void()>& fn, int warm, int reps) {
  return median_us(nullptr, TimeSpec{warm, reps, false, true}, fn) / 1e3;
}

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw BackendError(std::string("cuBLAS ") + what + " failed with status " + std::to_string(int(s)));
}

// The harness's synthetic model (harness/cuda/synthetic.h) for cfg's local experts, built on the
// device (the runner's prepare step writes its copies of them).
struct DeviceWeights {
  harness::cuda::DeviceRankWeights gen;
  ExpertWeights w;
};

void make_weights(DeviceWeights& dw, const MoeConfig& cfg, uint64_t seed) {
  harness::cuda::rank_weights(cfg, seed, 0, 0, dw.gen, nullptr);
  dw.w = dw.gen.w;
}

struct Opts {
  std::vector<const ModelPreset*> presets;
  int local_experts = 0;  // 0: the preset's experts / 2 (EP 2)
  std::vector<long long> Ms;
  std::vector<WeightFormat> fmts;
  int reps = 7;
  bool cublas = true;
  cuda::CudaRunner::Engine engine = cuda::CudaRunner::Engine::automatic;
  std::string engine_name = "auto";
  IntermediateQuant iq = IntermediateQuant::automatic;
  // nvfp4 weights in their natural layout and/or prepared for the decode engine.
  bool nvfp4_natural = false, nvfp4_prepared = true;
  BenchRouting routing = BenchRouting::uniform;  // how rows spread over the local experts (bench_rows.h)
  bool graph = false;  // time CUDA graph replays of one captured call instead of eager calls
  int settle_ms = 0;   // idle this long before each point's timed calls (--settle-ms)
  std::vector<cuda::policy::RowBucket> row_buckets;  // CudaRunner::set_row_buckets (empty: the policy's)
  MoeConfig flags_cfg;                // the shared configuration and tuning flags, applied
  const Flags* flags_given = nullptr;
};

// Local experts of a preset's point: --local-experts, or half the model's (EP 2).
int local_experts_of(const Opts& o, const MoeConfig& model) {
  return o.local_experts > 0 ? o.local_experts : std::max(1, model.num_experts / 2);
}

// The header's iq: the value each weight format runs with, e.g. "auto (bf16 none, fp8 fp8, nvfp4
// none)", so that a table of fp8 rows says whether GEMM2 took the fp8 path.
std::string iq_header(const Opts& o, const MoeConfig& shape) {
  std::string s = intermediate_quant_name(o.iq);
  if (o.iq != IntermediateQuant::automatic) return s;
  s += " (";
  for (size_t i = 0; i < o.fmts.size(); ++i) {
    MoeConfig c = shape;
    c.weight_format = o.fmts[i];
    c.intermediate_quant = o.iq;
    s += std::string(i ? ", " : "") + format_name(o.fmts[i]) + " " +
         intermediate_quant_name(c.effective_intermediate_quant());
  }
  return s + ")";
}

// One preset: the runner for every weight format and M, the cuBLAS loop, the table.
void bench_preset(const Opts& o, const ModelPreset& given, double hbm_gbs, const char* gpu) {
  ModelPreset pre = given;
  apply_config_flags(*o.flags_given, pre.config);  // --hidden, --intermediate, --ue8m0, tuning
  const int H = pre.config.hidden, I = pre.config.intermediate;
  const int E = local_experts_of(o, pre.config);
  const std::vector<long long>& Ms = o.Ms;
  const int reps = o.reps;
  const long long maxM = *std::max_element(Ms.begin(), Ms.end());
  const std::string settle = o.settle_ms > 0 ? ", idle " + std::to_string(o.settle_ms) + " ms before each point" : "";
  const std::string dispatch = o.flags_given->has("dispatch")
                                   ? std::string(", dispatch ") + format_name(pre.config.dispatch_format)
                                   : std::string();
  std::printf("\n# epmoe bench runner: %s, %s H=%d I=%d, %d local experts, median of %d%s, engine %s, iq %s, "
              "cutlass swap %s%s%s%s\n",
              gpu, pre.name.c_str(), H, I, E, reps, o.graph ? " graph replays" : "", o.engine_name.c_str(),
              iq_header(o, pre.config).c_str(), cutlass_swap_name(pre.config.tuning.cutlass_swap), settle.c_str(),
              dispatch.c_str(), pre.config.tuning.fp8_mixed ? "" : ", fp8 weights widened (--fp8-mixed 0)");
  std::fflush(stdout);

  // Inputs: C = maxM slots, K = 1, weight 1; slot j -> expert j % E, or with --skew the first half
  // of each M's slots on the first tenth of the experts. One payload buffer serves every format:
  // random bf16 bits, read as bf16 rows or as e4m3 codes with scales of 1/64.
  DeviceBuffer payload(size_t(maxM) * H * 2), scales(size_t(maxM) * (H / 16) * 4 + 16), ids(size_t(maxM) * 4),
      wts(size_t(maxM) * 4), counts(4), y(size_t(maxM) * H * 2);
  const BenchRows brows(o.routing, pre.config, E, maxM);  // the expert of each of the first M slots
  std::vector<int32_t> hid(maxM);
  {
    for (long long j = 0; j < maxM; ++j) hid[j] = brows.expert(j, maxM);
    EPMOE_CUDA_CHECK(cudaMemcpy(ids.get(), hid.data(), hid.size() * 4, cudaMemcpyHostToDevice));
    const std::vector<float> ones(maxM, 1.f), sc(scales.size() / 4, 1.f / 64);
    EPMOE_CUDA_CHECK(cudaMemcpy(wts.get(), ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
    EPMOE_CUDA_CHECK(cudaMemcpy(scales.get(), sc.data(), sc.size() * 4, cudaMemcpyHostToDevice));
    harness::cuda::uniform_bf16(payload.get<bf16_raw>(), size_t(maxM) * H, 2.f, 99, nullptr);
  }

  struct Row {
    long long M;
    WeightFormat f;
    double ms;
    std::string engines;  // the runner's GEMM engines, e.g. cutlass-fp8/cutlass-fp8
    double sm_mhz;        // the SM clock measured right after the timed calls (clock_probe.h)
  };
  std::vector<Row> rows;
  std::vector<std::string> skipped;
  std::vector<double> cublas_ms(Ms.size(), 0.0);
  struct Pass {
    WeightFormat f;
    bool prepared;
  };
  std::vector<Pass> passes;
  for (WeightFormat f : o.fmts) {
    if (f != WeightFormat::nvfp4) passes.push_back({f, false});
    else {
      if (o.nvfp4_natural) passes.push_back({f, false});
      if (o.nvfp4_prepared) passes.push_back({f, true});
    }
  }
  // Graph capture needs a stream other than the legacy default one.
  cudaStream_t graph_stream = nullptr;
  if (o.graph) EPMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&graph_stream, cudaStreamNonBlocking));
  for (const Pass& pass : passes) {
    const WeightFormat f = pass.f;
    MoeConfig cfg = pre.config;
    cfg.num_experts = E;
    cfg.top_k = 1;
    cfg.num_ranks = 1;
    cfg.capacity = int(maxM);
    cfg.weight_format = f;
    // fp8 tokens for fp8/nvfp4 weights (the fp8 recipe; a partial last 128-block where H % 128 != 0),
    // bf16 where the hidden size is not a multiple of 16; --dispatch FORMAT for every format.
    cfg.dispatch_format = o.flags_given->has("dispatch")                 ? pre.config.dispatch_format
                          : f == WeightFormat::bf16 || H % 16 != 0 ? ActFormat::bf16
                                                                    : ActFormat::fp8;
    cfg.intermediate_quant = o.iq;
    // A format the shape cannot take is skipped and said.
    try {
      validate_or_throw(cfg);
    } catch (const UsageError& e) {
      skipped.push_back(std::string(format_name(f)) + ": " + e.what());
      std::fprintf(stderr, "  %s %s: skipped (%s)\n", pre.name.c_str(), format_name(f), e.what());
      continue;
    }
    DeviceWeights dw;
    make_weights(dw, cfg, 1234);
    // The prepare step MoeLayer runs: nvfp4 the decode engine's copy (not in the natural pass) and,
    // with tuning.nvfp4_mixed, the paired copy; fp8 W13's scales in the one-GEMM SwiGLU's order
    // and the mixed-input GEMM's row scales.
    if (f == WeightFormat::nvfp4 && !pass.prepared) cfg.tuning.nvfp4_prepare = false;
    EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
    cuda::CudaRunner runner(cfg, 0);
    runner.prepare(dw.w, nullptr);
    runner.set_engine(o.engine);
    runner.set_row_buckets(o.row_buckets);
    for (long long M : Ms) {
      cfg.capacity = int(M);
      const int32_t m32 = int32_t(M);
      EPMOE_CUDA_CHECK(cudaMemcpy(counts.get(), &m32, 4, cudaMemcpyHostToDevice));
      if (o.routing == BenchRouting::skew) {  // the hot half depends on M
        for (long long j = 0; j < M; ++j) hid[j] = brows.expert(j, M);
        EPMOE_CUDA_CHECK(cudaMemcpy(ids.get(), hid.data(), size_t(M) * 4, cudaMemcpyHostToDevice));
      }
      DispatchOutput in;
      in.num_ranks = 1;
      in.capacity = int(M);
      in.hidden = H;
      in.top_k = 1;
      in.num_local_experts = E;
      in.format = cfg.dispatch_format;
      in.quant = QuantParams{false, 448.f * 6.f / 8.f};
      in.device = DeviceKind::cuda;
      in.payload = payload.get<uint8_t>();
      in.scales = scales.get<uint8_t>();
      in.local_ids = ids.get<int32_t>();
      in.weights = wts.get<float>();
      in.counts = counts.get<int32_t>();
      const int r = M >= 32768 ? std::max(3, reps / 2) : reps;
      // --graph: one call captured on graph_stream and replayed, the GPU's time without the host's
      // launch work (what a server replaying graphs sees); else eager calls on the default stream.
      const auto call = [&] { runner.run(in, dw.w, y.get<bf16_raw>(), graph_stream); };
      // The power cap acts on an average: an idle GPU comes back to its boost clock.
      if (o.settle_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.settle_ms));
      const double ms = median_us(graph_stream, TimeSpec{2, r, o.graph, true}, call) / 1e3;
      rows.push_back({M, f, ms, runner.last_engines(), harness::cuda::sm_clock_mhz(graph_stream)});
      // The host's side of an eager call: the time run() takes to return (launches enqueued, not
      // done), median of 5 on an idle stream.
      std::vector<double> host;
      for (int i = 0; i < 5; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        call();
        host.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
      }
      const int bm = runner.last_block_m();
      std::fprintf(stderr, "  %s %s M=%lld: %.3f ms (bm %s, %s; host %.1f us per eager call)\n", pre.name.c_str(),
                   format_name(f), M, ms, bm == cuda::policy::kByRows ? "by rows" : std::to_string(bm).c_str(),
                   runner.last_engines(), median(host));
    }
  }
  if (graph_stream) EPMOE_CUDA_CHECK(cudaStreamDestroy(graph_stream));

  // Baseline: cuBLAS bf16, one GEMM pair per expert (same FLOPs, no SwiGLU, no permute).
  if (o.cublas) {
    MoeConfig cfg = pre.config;
    cfg.num_experts = E;
    cfg.num_ranks = 1;
    cfg.placement.reset();
    cfg.weight_format = WeightFormat::bf16;
    DeviceWeights dw;
    make_weights(dw, cfg, 1234);
    DeviceBuffer a(size_t(maxM) * H * 2), h(size_t(maxM) * 2 * I * 2), out(size_t(maxM) * H * 2);
    harness::cuda::uniform_bf16(a.get<bf16_raw>(), size_t(maxM) * H, 1.f, 5, nullptr);
    harness::cuda::uniform_bf16(h.get<bf16_raw>(), size_t(maxM) * 2 * I, 1.f, 6, nullptr);
    cublasHandle_t handle;
    check_cublas(cublasCreate(&handle), "create");
    const float one = 1.f, zero = 0.f;
    for (size_t mi = 0; mi < Ms.size(); ++mi) {
      const long long M = Ms[mi];
      auto run = [&] {
        long long row = 0;
        for (int e = 0; e < E; ++e) {
          const int me = int(M / E + (e < M % E ? 1 : 0));
          if (me == 0) continue;
          const auto* w13 = static_cast<const bf16_raw*>(dw.w.w13.data) + size_t(e) * 2 * I * H;
          const auto* w2 = static_cast<const bf16_raw*>(dw.w.w2.data) + size_t(e) * H * I;
          // C^T [2I][me] = W13 [2I][H] . A^T (column-major view of row-major data).
          check_cublas(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, 2 * I, me, H, &one, w13, CUDA_R_16BF, H,
                                    a.get<bf16_raw>() + row * H, CUDA_R_16BF, H, &zero,
                                    h.get<bf16_raw>() + row * 2 * I, CUDA_R_16BF, 2 * I, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT),
                       "gemm1");
          check_cublas(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, H, me, I, &one, w2, CUDA_R_16BF, I,
                                    h.get<bf16_raw>() + row * 2 * I, CUDA_R_16BF, 2 * I, &zero,
                                    out.get<bf16_raw>() + row * H, CUDA_R_16BF, H, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT),
                       "gemm2");
          row += me;
        }
      };
      cublas_ms[mi] = median_ms(run, 1, M >= 32768 ? 3 : std::max(3, reps / 2));
    }
    cublasDestroy(handle);
  }

  // Table.
  auto wbytes = [&](WeightFormat f) {
    const double el = 3.0 * H * I;
    return f == WeightFormat::bf16 ? el * 2 : f == WeightFormat::fp8 ? el + el / (128 * 128) * 4 : el / 2 + el / 16;
  };
  // The floor of a row: max(weight bytes read (only the experts that receive rows) / (0.9 x the HBM
  // copy rate of this run), FLOPs / P), P 700 TFLOP/s for bf16 tensor-core work (bf16 and nvfp4
  // weights), 1100 for fp8.
  auto floor_ms = [&](WeightFormat f, long long M) {
    const double bytes = double(brows.touched(M)) * wbytes(f), flops = 2.0 * double(M) * 3.0 * H * I;
    const double peak = f == WeightFormat::fp8 ? 1100e12 : 700e12;
    return std::max(bytes / (0.9 * hbm_gbs * 1e9), flops / peak) * 1e3;
  };
  std::printf("\n| M | format | engine | time ms | floor ms | floor / time | TFLOP/s | weight GB/s | weight GB/s / HBM copy | "
              "cuBLAS bf16 loop ms | speedup vs cuBLAS | vs bf16 time | vs fp8 time | SM MHz after |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (size_t mi = 0; mi < Ms.size(); ++mi) {
    const long long M = Ms[mi];
    double t_bf16 = 0, t_fp8 = 0;
    for (const Row& r : rows) {
      if (r.M == M && r.f == WeightFormat::bf16) t_bf16 = r.ms;
      if (r.M == M && r.f == WeightFormat::fp8) t_fp8 = r.ms;
    }
    for (const Row& r : rows) {
      if (r.M != M) continue;
      const double flops = 2.0 * double(M) * 3.0 * H * I;
      const double touched = double(brows.touched(M));
      const double gbs = touched * wbytes(r.f) / (r.ms * 1e6);
      char vs_bf16[32] = "-", vs_fp8[32] = "-", cub[32] = "-", spd[32] = "-";
      if (r.f != WeightFormat::bf16 && t_bf16 > 0) std::snprintf(vs_bf16, sizeof vs_bf16, "%.2fx", r.ms / t_bf16);
      if (r.f == WeightFormat::nvfp4 && t_fp8 > 0) std::snprintf(vs_fp8, sizeof vs_fp8, "%.2fx", r.ms / t_fp8);
      if (cublas_ms[mi] > 0) {
        std::snprintf(cub, sizeof cub, "%.3f", cublas_ms[mi]);
        std::snprintf(spd, sizeof spd, "%.2fx", cublas_ms[mi] / r.ms);
      }
      const double fl = floor_ms(r.f, M);
      std::printf("| %lld | %s | %s | %.3f | %.3f | %.2f | %.0f | %.0f | %.2f | %s | %s | %s | %s | %.0f |\n", M,
                  format_name(r.f), r.engines.c_str(), r.ms, fl, fl / r.ms, flops / (r.ms * 1e9), gbs, gbs / hbm_gbs, cub,
                  spd, vs_bf16, vs_fp8, r.sm_mhz);
    }
  }
  for (const std::string& sk : skipped) std::printf("\nskipped %s\n", sk.c_str());
  std::printf("\nHBM copy %.0f GB/s. TFLOP/s counts 2*M*3*H*I; weight GB/s counts the weights (and scales) of the "
              "experts that received rows, once; floor = max(those bytes / (0.9 x HBM copy), FLOPs / P), P = 700 "
              "TFLOP/s (bf16, nvfp4 weights) or 1100 (fp8); routing %s. SM MHz after: the SM clock measured right after "
              "the point's timed calls; under sustained load the power cap lowers it and the point's time rises.\n",
              hbm_gbs, brows.describe());
  std::fflush(stdout);
}

// --dry-run: for every preset and M, how the routing spreads the rows over the local experts and
// how many rows of MMA each path's tiles do for them, as a multiple of M (1.00: no padding): the
// decode engines' 32-row m-tiles, and the CUTLASS split by rows per expert (policy::row_buckets, or
// --row-buckets) on bf16 and on fp8 weights. A swap-AB tile t does ceil(rows / t) * t rows; the
// unswapped 128-row m-tiles come in pairs (2x1 clusters). Which engine a point runs on is the
// runner's choice (RUNNER.md); this shows what each would compute, without a GPU. The last column
// counts the split's launches per GEMM (one per tile over its ranges) that have rows, of all it
// makes: every tile is launched (the host never sees the counts), and a launch without rows still
// costs a table fill and a GEMM launch that returns at once (~2.3 + ~2.5 us, session 33). The
// mixed-input GEMMs (fp8w, nvfp4w: weights decoded in the main loop) run one token-tile width
// for all experts (policy::fp8w_tile_n), at 256 with head, tail and mid launches
// (cutlass_engine::Grouped::Part); their columns are the MMA rows / M and the token tiles per
// expert with rows: each token tile decodes the expert's weights once, which bounds a narrow
// tile's cost from below (a 64-wide tile ~0.61 of a 256-wide one, session 40).
void print_plan(const Opts& o) {
  const long long maxM = *std::max_element(o.Ms.begin(), o.Ms.end());
  for (const ModelPreset* given : o.presets) {
    ModelPreset pre = *given;
    apply_config_flags(*o.flags_given, pre.config);
    const int H = pre.config.hidden, I = pre.config.intermediate;
    const int E = local_experts_of(o, pre.config);
    const BenchRows brows(o.routing, pre.config, E, maxM);
    std::printf("\n# epmoe bench runner, dry run (no GPU): %s H=%d I=%d, %d local experts, routing %s, cutlass swap %s%s\n",
                pre.name.c_str(), H, I, E, brows.describe(), cutlass_swap_name(pre.config.tuning.cutlass_swap),
                o.row_buckets.empty() ? "" : ", --row-buckets");
    std::printf("| M | mean rows per expert | experts with rows | rows per expert | MMA rows / M: 32-row m-tiles | "
                "CUTLASS split, bf16 | CUTLASS split, fp8 | launches with rows, bf16 / fp8 | mixed-input GEMM | "
                "its token tiles per expert |\n"
                "|---|---|---|---|---|---|---|---|---|---|\n");
    for (const long long M : o.Ms) {
      const std::vector<int> counts = brows.counts(M);
      const double mean = double(M) / E;
      auto padded = [&](int rows, int tile) { return (rows + tile - 1) / tile * tile; };
      long long decode = 0;
      for (const int c : counts) decode += padded(c, 32);
      // MMA rows / M of the split on bf16 or fp8 weights, and its launches per GEMM: with rows, all.
      struct Split {
        double mma;
        int busy, launches;
      };
      auto split = [&](bool fp8) {
        const std::vector<cuda::policy::RowBucket> buckets =
            o.row_buckets.empty() ? cuda::policy::row_buckets(pre.config.tuning.cutlass_swap, mean, fp8,
                                                               cuda::policy::split_weight_bytes(E, H, I, fp8), E)
                                  : o.row_buckets;
        long long mma = 0;
        std::vector<bool> busy(buckets.size(), false);
        for (const int c : counts)
          for (size_t i = 0; i < buckets.size(); ++i) {
            const cuda::policy::RowBucket& b = buckets[i];
            if (c > 0 && c >= b.lo && c <= b.hi) {
              mma += b.tile_n > 0 ? padded(c, b.tile_n) : padded(padded(c, 128) / 128, 2) * 128;
              busy[i] = true;
              break;
            }
          }
        // The runner's launches (one per tile over its ranges) and those any of whose ranges has rows.
        const std::vector<std::vector<int>> launches =
            cuda::policy::bucket_launches(buckets, mean, cuda::cutlass_engine::RowRanges::kMax);
        int busy_launches = 0;
        for (const std::vector<int>& l : launches)
          busy_launches += std::any_of(l.begin(), l.end(), [&](int i) { return bool(busy[size_t(i)]); });
        return Split{double(mma) / double(M), busy_launches, int(launches.size())};
      };
      const Split sb = split(false), s8 = split(true);
      // The mixed-input GEMMs: MMA rows and token tiles (weight decodes) over the experts with rows.
      using Grouped = cuda::cutlass_engine::Grouped;
      const int mixed_tile = cuda::policy::fp8w_tile_n(mean);
      const bool mid = cuda::policy::mixed_mid(H, I);
      long long mixed_mma = 0, mixed_tiles = 0;
      for (const int c : counts) {
        if (c <= 0) continue;
        if (mixed_tile < Grouped::kPartRows) {
          const int tiles = (c + mixed_tile - 1) / mixed_tile;
          mixed_mma += int64_t(tiles) * mixed_tile;
          mixed_tiles += tiles;
          continue;
        }
        // Each launch's rows by the fill's own rule: the head's in 256-wide tiles, a tail's or
        // mid's remainder in one tile of its width.
        const int head = Grouped::part_rows(c, Grouped::Part::head, mid).rows;
        const int heads = (head + Grouped::kPartRows - 1) / Grouped::kPartRows;
        const bool tail = Grouped::part_rows(c, Grouped::Part::tail, mid).rows > 0;
        const bool middle = Grouped::part_rows(c, Grouped::Part::mid, mid).rows > 0;
        mixed_mma += int64_t(heads) * Grouped::kPartRows + (tail ? Grouped::kPartTail : 0) +
                     (middle ? Grouped::kPartMid : 0);
        mixed_tiles += heads + tail + middle;
      }
      const int touched = brows.touched(M);
      const auto [lo, hi] = std::minmax_element(counts.begin(), counts.end());
      std::printf("| %lld | %.1f | %d | %d..%d | %.2f | %.2f | %.2f | %d of %d / %d of %d | %.2f | %.2f |\n", M, mean,
                  touched, *lo, *hi, double(decode) / double(M), sb.mma, s8.mma, sb.busy, sb.launches, s8.busy,
                  s8.launches, double(mixed_mma) / double(M), touched ? double(mixed_tiles) / touched : 0.0);
    }
  }
  std::fflush(stdout);
}

int bench_runner(const std::vector<std::string>& args) {
  Flags flags("bench runner");
  flags.add("preset", "LIST", "model shapes: a name, a comma list, or all (default deepseek-v3)");
  flags.add("local-experts", "N", "experts on this GPU (default: the preset's experts / 2, i.e. EP 2; 128 for deepseek-v3)");
  flags.add("m", "LIST", "rows routed per rank (default 128,512,2048,4096,8192,16384,32768,131072)");
  flags.add("formats", "LIST", "weight formats (default bf16,fp8,nvfp4)");
  flags.add("quick", "", "M = 128,2048,32768 and fewer repetitions");
  flags.add("reps", "N", "timed repetitions per point (median reported; default 7, quick 3)");
  flags.add("no-cublas", "", "skip the cuBLAS baseline");
  flags.add("routing", "NAME", "how rows spread over the experts: uniform (default), skew (half of the rows on a tenth "
                               "of the experts) or router (the preset's router on random logits)");
  flags.add("skew", "", "short for --routing skew");
  flags.add("row-buckets", "SPEC", "CUTLASS split table instead of the policy's, lo-hi:tile,...,lo-:tile (tile 0 unswapped, 64, 96 (fp8), 128, 192), e.g. 0-64:64,65-128:128,129-:0");
  flags.add("dry-run", "", "print each point's rows per expert and the rows of MMA the decode m-tiles and the CUTLASS "
                          "split do for them (x M), then exit; touches no GPU");
  flags.add("graph", "", "time CUDA graph replays of one captured runner call (no host launch work) instead of eager calls");
  flags.add("settle-ms", "MS",
            "idle this many ms before each point's timed calls, so that a sweep's later points do not start under "
            "the power cap that earlier dense GEMMs drove the GPU to (see the SM MHz column; default 0)");
  // The configuration fields a runner-only bench leaves free, and every tuning option (--engine:
  // auto, mma or cutlass, CUTLASS where the format allows; --intermediate-quant fp8: fp8 weights
  // then run GEMM2 on fp8 too).
  // --dispatch: the rows' format for every weight format (default: fp8 for fp8 and nvfp4 weights,
  // bf16 for bf16 weights).
  add_config_flags_only(flags, {"hidden", "intermediate", "ue8m0", "intermediate-quant", "dispatch"});
  add_tuning_flags(flags);
  flags.add("nvfp4-layout", "NAME", "nvfp4 weights: prepared (default: the decode engine's copy), natural, or both");
  if (wants_help(args)) {
    std::printf("usage: epmoe bench runner [flags]\n%s", flags.help().c_str());
    return 0;
  }
  try {
    flags.parse(args);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  // Every flag is checked before the GPU is touched, so a typo fails fast on any machine.
  Opts o;
  o.presets = parse_presets(flags.has("preset") ? flags.get("preset") : "deepseek-v3");
  o.local_experts = flags.get_int("local-experts", 0);
  if (flags.has("local-experts") && o.local_experts <= 0)
    throw UsageError("--local-experts: " + std::to_string(o.local_experts) + " must be positive");
  const bool quick = flags.get_bool("quick", false);
  if (flags.get_bool("skew", false)) o.routing = BenchRouting::skew;
  if (flags.has("routing")) {
    const std::string r = flags.get("routing");
    if (r == "uniform") o.routing = BenchRouting::uniform;
    else if (r == "skew") o.routing = BenchRouting::skew;
    else if (r == "router") o.routing = BenchRouting::router;
    else throw UsageError("--routing=" + r + " is not a routing; use uniform, skew or router");
  }
  o.graph = flags.get_bool("graph", false);
  o.settle_ms = flags.get_int("settle-ms", 0);
  if (o.settle_ms < 0 || o.settle_ms > 60000)
    throw UsageError("--settle-ms: " + std::to_string(o.settle_ms) +
                     " must be 0..60000 (milliseconds of idle before each point)");
  if (flags.has("row-buckets")) o.row_buckets = cuda::policy::parse_row_buckets(flags.get("row-buckets"));
  o.reps = flags.get_int("reps", quick ? 3 : 7);
  if (o.reps <= 0) throw UsageError("--reps: " + std::to_string(o.reps) + " must be positive");
  o.Ms = quick ? std::vector<long long>{128, 2048, 32768}
               : std::vector<long long>{128, 512, 2048, 4096, 8192, 16384, 32768, 131072};
  if (flags.has("m")) o.Ms = parse_int_list(flags.get("m"), "--m");
  o.fmts = {WeightFormat::bf16, WeightFormat::fp8, WeightFormat::nvfp4};
  if (flags.has("formats")) {
    o.fmts.clear();
    for (const std::string& tok : split_list(flags.get("formats"), "formats")) {
      const auto f = parse_weight_format(tok);
      if (!f) throw UsageError("--formats: unknown weight format '" + tok + "'; use bf16, fp8, nvfp4");
      o.fmts.push_back(*f);
    }
  }
  o.cublas = !flags.get_bool("no-cublas", false);
  // Shared flags land on a scratch configuration; each preset's configuration takes them below.
  apply_config_flags(flags, o.flags_cfg);
  o.flags_given = &flags;
  o.engine_name = engine_name(o.flags_cfg.tuning.engine);
  o.engine = o.flags_cfg.tuning.engine;
  o.iq = o.flags_cfg.intermediate_quant;
  for (const ConfigIssue& is : validate(o.flags_cfg.tuning)) throw UsageError(is.message);
  const std::string layout = flags.has("nvfp4-layout") ? flags.get("nvfp4-layout") : "prepared";
  if (layout != "prepared" && layout != "natural" && layout != "both")
    throw UsageError("--nvfp4-layout: '" + layout + "' is not a layout; use prepared, natural or both");
  o.nvfp4_natural = layout != "prepared";
  o.nvfp4_prepared = layout != "natural";

  if (flags.get_bool("dry-run", false)) {
    print_plan(o);
    return 0;
  }
  std::string why;
  if (cuda::device_count(&why) == 0) {
    std::fprintf(stderr, "bench runner: no CUDA device (%s)\n", why.c_str());
    return 1;
  }
  cudaDeviceProp prop{};
  EPMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  // HBM ceiling: D2D copy of 2 GiB, once for every preset of the run.
  double hbm_gbs = 0;
  {
    const size_t copy_bytes = size_t(2) << 30;
    DeviceBuffer c0(copy_bytes), c1(copy_bytes);
    EPMOE_CUDA_CHECK(cudaMemset(c0.get(), 1, copy_bytes));
    const double copy_ms = median_ms(
        [&] { EPMOE_CUDA_CHECK(cudaMemcpyAsync(c1.get(), c0.get(), copy_bytes, cudaMemcpyDeviceToDevice)); }, 2, 5);
    hbm_gbs = 2.0 * copy_bytes / (copy_ms * 1e6);
  }
  std::printf("# HBM copy (D2D, read+write): %.0f GB/s\n", hbm_gbs);
  for (size_t i = 0; i < o.presets.size(); ++i) {
    std::fprintf(stderr, "[bench runner] preset %zu/%zu: %s\n", i + 1, o.presets.size(), o.presets[i]->name.c_str());
    bench_preset(o, *o.presets[i], hbm_gbs, prop.name);
  }
  return 0;
}

const BenchRegistrar reg{{"runner", "routed runner cuda per weight format and M, vs HBM copy and a cuBLAS loop",
                          bench_runner}};

}  // namespace
}  // namespace epmoe::cli
#endif  // EPMOE_WITH_CUDA
