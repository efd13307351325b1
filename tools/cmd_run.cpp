// `epmoe run`: the main job. Runs a stack of MoE layers with residual connections on simulated
// ranks (cpu) and prints, per format, the error against float64 with unquantized weights.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"
#include "commands.h"
#include "epmoe/error.h"
#include "layer/model.h"
#include "setup.h"

namespace epmoe::cli {
namespace {

struct Row {
  ActFormat dispatch;
  WeightFormat weights;
};

void print_header() {
  std::printf("%-9s %-8s %-8s %7s %12s %12s %12s %10s\n", "dispatch", "weights", "combine", "tokens", "max_abs_err",
              "max_rel_err", "1-cosine", "time_ms");
  std::fflush(stdout);  // before the progress lines on stderr
}

int run_rows(const RunSetup& s, const std::vector<Row>& rows) {
  int64_t total = 0;
  for (int64_t t : s.tokens) total += t;
  print_header();
  int failures = 0;
  for (const Row& row : rows) {
    MoeConfig c = s.cfg;
    c.dispatch_format = row.dispatch;
    c.weight_format = row.weights;
    const std::string tag = std::string("dispatch=") + format_name(row.dispatch) + " weights=" + format_name(row.weights);
    try {
      const auto t0 = std::chrono::steady_clock::now();
      std::fprintf(stderr, "[epmoe run] %s: building %d layer%s\n", tag.c_str(), s.layers, s.layers == 1 ? "" : "s");
      const Model model(c, s.layers, s.seed);
      const StackResult r = run_stack_cpu(model, s.tokens, s.seed * 7919 + 17, [&](int l) {
        const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::fprintf(stderr, "[epmoe run] %s: layer %d/%d done (%.1f s)\n", tag.c_str(), l + 1, s.layers, el);
      });
      std::printf("%-9s %-8s %-8s %7lld %12.3e %12.3e %12.3e %10.2f\n", format_name(row.dispatch),
                  format_name(row.weights), format_name(c.combine_format), static_cast<long long>(total),
                  r.error.max_abs, r.error.max_rel, r.error.one_minus_cos, r.forward_seconds * 1e3);
      if (r.error.nonfinite) std::printf("  (%lld non-finite values left out)\n", static_cast<long long>(r.error.nonfinite));
    } catch (const UsageError& e) {
      std::printf("%-9s %-8s  skipped: %s\n", format_name(row.dispatch), format_name(row.weights), e.what());
      ++failures;
    }
    std::fflush(stdout);
  }
  return failures == int(rows.size()) ? 2 : 0;
}

int run_main(const std::vector<std::string>& args) {
  Flags flags("run");
  add_config_flags(flags);
  flags.add("check-tokens", "N", "several GPUs: tokens per rank compared with float64 (default 64; 0 = none)");
  if (wants_help(args)) {
    std::printf(
        "usage: epmoe run [flags]\n\n"
        "Runs a stack of MoE layers (h <- h + MoE(h), bf16) on the configured ranks and prints, per\n"
        "dispatch/weight format, the error of the final hidden state against a float64 computation\n"
        "with unquantized weights (which reuses the quantized path's routing decisions), and the time\n"
        "of the forward passes. Without a GPU it runs the tiny preset on 4 simulated ranks with\n"
        "37,0,64,0 tokens, once per dispatch format, then once per weight format. With one GPU it runs\n"
        "on that GPU (dispatcher local, runner cuda); with several GPUs (or under mpirun -np N, one\n"
        "process per GPU) it runs qwen3-30b-a3b, 3 layers, across all of them (dispatcher nvlink, or\n"
        "--dispatcher nccl; runner cuda) and also reports tokens/s per GPU.\n\nflags:\n%s",
        flags.help().c_str());
    return 0;
  }
  flags.parse(args);
  const RunSetup s = build_setup(flags);
  if (s.device == DeviceKind::cuda) {
    const MultiGpuRunHook& mh = multi_gpu_run_hook();
    if (s.cfg.num_ranks > 1 || (mh.under_mpi && mh.under_mpi())) {
      if (!mh.run)
        throw UsageError("--ranks=" + std::to_string(s.cfg.num_ranks) +
                         ": the multi-GPU driver of `epmoe run` is not built into this binary (it needs NCCL); use "
                         "--ranks 1 or --device cpu");
      return mh.run(s);
    }
    if (!cuda_run_hook().run)
      throw UsageError("--device cuda: the GPU driver of `epmoe run` is not built into this binary; use --device cpu");
    return cuda_run_hook().run(s);
  }

  std::printf("epmoe run: preset %s, H=%d I=%d E=%d K=%d, %d layer%s, %d rank%s (dispatcher %s, runner %s), tokens",
              s.preset.c_str(), s.cfg.hidden, s.cfg.intermediate, s.cfg.num_experts, s.cfg.top_k, s.layers,
              s.layers == 1 ? "" : "s", s.cfg.num_ranks, s.cfg.num_ranks == 1 ? "" : "s", s.cfg.dispatcher.c_str(),
              s.cfg.runner.c_str());
  for (size_t r = 0; r < s.tokens.size(); ++r) std::printf("%s%lld", r ? "," : " ", static_cast<long long>(s.tokens[r]));
  std::printf(" (C=%d), seed %llu\n\n", s.cfg.capacity, static_cast<unsigned long long>(s.seed));

  const ActFormat all_act[] = {ActFormat::bf16, ActFormat::fp8, ActFormat::nvfp4};
  const WeightFormat all_w[] = {WeightFormat::bf16, WeightFormat::fp8, WeightFormat::nvfp4};
  std::vector<Row> rows;
  if (s.dispatch_given && s.weights_given) {
    rows.push_back({s.cfg.dispatch_format, s.cfg.weight_format});
    return run_rows(s, rows);
  }
  if (s.dispatch_given) {
    rows.push_back({s.cfg.dispatch_format, weight_family(s.cfg.dispatch_format)});
    return run_rows(s, rows);
  }
  std::printf("by dispatch format (weights %s):\n", s.weights_given ? "as given" : "of the same family");
  for (ActFormat f : all_act) rows.push_back({f, s.weights_given ? s.cfg.weight_format : weight_family(f)});
  int rc = run_rows(s, rows);
  if (!s.weights_given) {
    std::printf("\nby weight format (dispatch bf16):\n");
    rows.clear();
    for (WeightFormat w : all_w) rows.push_back({ActFormat::bf16, w});
    rc = std::max(rc, run_rows(s, rows));
  }
  return rc;
}

const CommandRegistrar reg{{"run", "run a stack of MoE layers and report accuracy and time (the main job)", run_main}};

}  // namespace
}  // namespace epmoe::cli
