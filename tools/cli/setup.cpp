// The settings of `epmoe run` / `epmoe validate` and the one check of them (setup.h).
#include "setup.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <cstdio>

#include "bench_util.h"
#include "comm/launch.h"
#include "epmoe/error.h"
#include "epmoe/presets.h"
#include "epmoe/registry.h"
#include "harness/check.h"
#include "harness/machine.h"
#include "harness/synthetic.h"
#include "rank_io.h"

namespace epmoe::cli {

void add_run_flags(Flags& f) {
  f.add("preset", "NAME", "model shape: tiny (default; qwen3-30b-a3b on several GPUs), deepseek-v3, qwen3-235b-a22b, qwen3-30b-a3b, mixtral-8x7b, gpt-oss-120b");
  add_config_flags(f);
  f.add("tokens", "T[,T...]", "tokens per rank, one value per rank or one for all (cpu default: 37,0,64,0 pattern; several GPUs: 2048, last rank 512)");
  f.add("layers", "L", "MoE layers stacked with residuals (default: tiny 4; a model preset 1 on cpu, 3 on GPUs)");
  f.add("seed", "N", "random seed of weights and inputs (default 1)");
  f.add("device", "cpu|cuda", "where to run (default: cuda when the GPU path is built and a GPU is visible)");
  f.add("check-tokens", "N|all", "tokens per rank compared with float64 (default 64; 0 = none)");
  f.add("dump", "PREFIX", "write each rank's final hidden state (raw bf16 [T][H]) to PREFIX.<dispatch>-<weights>.rank<r>.bin");
  add_tuning_flags(f);
}

RunSetup build_setup(const Flags& f) {
  RunSetup s;
  s.gpus = std::max(0, default_gpu_ranks());
  if (f.has("device")) {
    const std::string d = f.get("device");
    if (d == "cpu") s.device = DeviceKind::cpu;
    else if (d == "cuda" || d == "gpu") s.device = DeviceKind::cuda;
    else throw UsageError("--device=" + d + " is not a device; use cpu or cuda");
  } else {
    s.device = s.gpus > 0 ? DeviceKind::cuda : DeviceKind::cpu;
  }
  // On cuda the default is every GPU of the job, and a job of several GPUs defaults to a real model
  // shape with a few layers: the tiny preset would time nothing but launch overheads there.
  const int default_ranks = s.device == DeviceKind::cuda ? std::max(1, s.gpus) : 4;
  const int ranks = f.get_int("ranks", default_ranks);
  const bool multi_gpu = s.device == DeviceKind::cuda && ranks > 1;
  s.preset = f.has("preset") ? f.get("preset") : (multi_gpu ? "qwen3-30b-a3b" : "tiny");
  const ModelPreset& p = preset(s.preset);
  s.cfg = p.config;
  // Every layer of a real shape is generated and checked in float64 on the host: one layer on the
  // CPU, three on GPUs, unless asked.
  const bool real_shape = s.preset != "tiny";
  const int default_layers = !real_shape ? p.num_layers : std::min(s.device == DeviceKind::cpu ? 1 : 3, p.num_layers);
  s.layers = f.get_int("layers", default_layers);
  s.seed = uint64_t(f.get_int("seed", 1));
  if (f.has("dump")) {
    s.dump = f.get("dump");
    // Refused before any work rather than after the run: the prefix's folder must exist.
    const std::filesystem::path dir = std::filesystem::path(s.dump).parent_path();
    std::error_code ec;
    if (s.dump.empty() || (!dir.empty() && !std::filesystem::is_directory(dir, ec)))
      s.flag_issues.push_back({"dump", s.dump, "--dump=" + s.dump + ": the folder " + dir.string() +
                                                   " does not exist; give a prefix in an existing, writable folder"});
  }
  if (f.has("check-tokens") && f.get("check-tokens") == "all") s.check_tokens = INT64_MAX;
  else s.check_tokens = f.get_int("check-tokens", 64);

  MoeConfig& c = s.cfg;
  c.num_ranks = ranks;
  if (s.device == DeviceKind::cpu) {
    c.dispatcher = ranks == 1 ? "local" : "cpu";
    c.runner = "reference";
  } else {
    c.dispatcher = ranks == 1 ? "local" : "nvlink";
    c.runner = "cuda";
  }
  apply_config_flags(f, c);
  if (c.num_ranks < 1)
    s.flag_issues.push_back({"ranks", std::to_string(c.num_ranks), "--ranks=" + std::to_string(c.num_ranks) + " must be at least 1"});
  const int R = std::max(1, c.num_ranks);

  if (f.has("tokens")) {
    const auto list = parse_int_list(f.get("tokens"), "tokens");
    if (list.size() == 1) s.tokens.assign(R, list[0]);
    else if (int(list.size()) == R) s.tokens.assign(list.begin(), list.end());
    else
      throw UsageError("--tokens has " + std::to_string(list.size()) + " values for --ranks=" + std::to_string(R) +
                       "; give one value, or one per rank");
  } else if (s.device == DeviceKind::cpu) {
    // Uneven, with ranks that have no tokens at all: the cases a real batch produces.
    const int64_t pattern[4] = {37, 0, 64, 0};
    for (int r = 0; r < R; ++r) s.tokens.push_back(R == 1 ? 37 : pattern[r % 4]);
  } else if (multi_gpu) {
    // About 2k tokens per rank, the last rank with a quarter of that: ranks see uneven batches.
    s.tokens.assign(R, 2048);
    s.tokens.back() = 512;
  } else {
    s.tokens.assign(R, 256);
  }
  // One issue per distinct bad value: `--tokens -5` on 4 ranks is one mistake, not four.
  std::vector<int64_t> bad;
  for (size_t r = 0; r < s.tokens.size(); ++r) {
    const int64_t t = s.tokens[r];
    if ((t >= 0 && t <= INT_MAX) || std::find(bad.begin(), bad.end(), t) != bad.end()) continue;
    bad.push_back(t);
    const std::string v = std::to_string(t);
    const std::string who = f.has("tokens") && f.get("tokens").find(',') == std::string::npos ? "every rank" : "rank " + std::to_string(r);
    if (t < 0) s.flag_issues.push_back({"tokens", v, "--tokens: " + who + " has " + v + " tokens; give 0 or more"});
    else
      s.flag_issues.push_back({"tokens", v, "--tokens: " + who + " has " + v + " tokens, more than one call can take (" +
                                                std::to_string(INT_MAX) + ")"});
  }
  if (!f.has("capacity")) {
    const int64_t tmax = *std::max_element(s.tokens.begin(), s.tokens.end());
    c.capacity = int(std::clamp<int64_t>(tmax, 1, INT_MAX));
  }
  if (s.layers < 1)
    s.flag_issues.push_back({"layers", std::to_string(s.layers), "--layers=" + std::to_string(s.layers) + " must be at least 1"});
  if (s.check_tokens < 0)
    s.flag_issues.push_back({"check-tokens", std::to_string(s.check_tokens),
                             "--check-tokens=" + std::to_string(s.check_tokens) + " must be 0 (no comparison), more, or all"});
  const auto na = inapplicable_flags(f, c);
  s.flag_issues.insert(s.flag_issues.end(), na.begin(), na.end());

  s.dispatch_given = f.has("dispatch");
  s.weights_given = f.has("weights");
  // nvfp4 dispatch needs a global scale; `run` calibrates it per layer from the data unless given,
  // so any positive placeholder lets the rest of the configuration be validated.
  s.calibrate_nvfp4 = !f.has("nvfp4-global-scale");
  if (s.calibrate_nvfp4) c.nvfp4_global_scale = 1.f;
  return s;
}

std::vector<Row> run_rows(const RunSetup& s) {
  std::vector<Row> rows;
  if (s.dispatch_given) {
    rows.push_back({s.cfg.dispatch_format, s.weights_given ? s.cfg.weight_format : weight_family(s.cfg.dispatch_format)});
    return rows;
  }
  for (ActFormat f : {ActFormat::bf16, ActFormat::fp8, ActFormat::nvfp4})
    rows.push_back({f, s.weights_given ? s.cfg.weight_format : weight_family(f)});
  if (!s.weights_given)
    for (WeightFormat w : {WeightFormat::fp8, WeightFormat::nvfp4}) rows.push_back({ActFormat::bf16, w});
  return rows;
}

MoeConfig row_config(const RunSetup& s, const Row& row) {
  MoeConfig c = s.cfg;
  c.dispatch_format = row.dispatch;
  c.weight_format = row.weights;
  return c;
}

bool SetupCheck::ok() const {
  if (!whole.empty()) return false;
  for (const auto& r : per_row)
    if (!r.empty()) return false;
  return true;
}

namespace {

double weight_bytes_per_element(WeightFormat f) {
  return f == WeightFormat::bf16 ? 2.0 : f == WeightFormat::fp8 ? 1.0 : 0.5625;
}

std::string gib(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", b / double(1ull << 30));
  return buf;
}

// The communicator kind the driver builds for this run.
std::string comm_kind(const RunSetup& s) {
  if (s.cfg.num_ranks == 1) return "local";
  return s.device == DeviceKind::cpu ? "cpu" : "nccl";
}

}  // namespace

SetupCheck check_setup(const RunSetup& s) {
  SetupCheck k;
  k.whole = s.flag_issues;
  const MoeConfig& c = s.cfg;
  const int R = std::max(1, c.num_ranks);

  // Where it runs.
  if (s.device == DeviceKind::cuda && s.gpus == 0)
    k.whole.push_back({"device", "cuda", "--device cuda: this machine shows no CUDA GPU (or this epmoe has no CUDA); use --device cpu"});
  else if (s.device == DeviceKind::cuda && !under_mpirun() && R > s.gpus)
    k.whole.push_back({"ranks", std::to_string(R), "--ranks=" + std::to_string(R) + " needs " + std::to_string(R) +
                                                       " GPUs but this machine shows " + std::to_string(s.gpus) +
                                                       "; use --ranks " + std::to_string(s.gpus) + " or fewer"});
  const Registry& reg = Registry::global();
  const DispatcherInfo* on_device = reg.find_dispatcher(c.dispatcher, s.device);
  if (const DispatcherInfo* d = on_device ? on_device : reg.find_dispatcher(c.dispatcher)) {
    const std::string kind = comm_kind(s);
    if (d->device != s.device) {
      k.whole.push_back({"dispatcher", c.dispatcher,
                         "--dispatcher " + c.dispatcher + " needs --device " + (d->device == DeviceKind::cpu ? "cpu" : "cuda") +
                             (d->device == DeviceKind::cuda && s.gpus == 0 ? ", and this machine shows no CUDA GPU" : "") +
                             "; on --device " + (s.device == DeviceKind::cpu ? "cpu use cpu or local" : "cuda use nvlink, nccl or local")});
    } else if (std::find(d->comm_kinds.begin(), d->comm_kinds.end(), kind) == d->comm_kinds.end()) {
      std::string fix = R == 1 ? "use --ranks 2 or more, or --dispatcher local"
                               : (s.device == DeviceKind::cpu ? "use --dispatcher cpu, or --ranks 1"
                                                              : "use --dispatcher nvlink or nccl, or --ranks 1");
      k.whole.push_back({"dispatcher", c.dispatcher,
                         "--dispatcher " + c.dispatcher + " does not run with --ranks " + std::to_string(R) + " on --device " +
                             (s.device == DeviceKind::cpu ? "cpu" : "cuda") + "; " + fix});
    }
  }

  // Per row: validate() of the row's formats. An issue every row has is an issue of the whole.
  const std::vector<Row> rows = run_rows(s);
  std::vector<std::vector<ConfigIssue>> per(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) per[i] = validate(row_config(s, rows[i]));
  k.per_row.assign(rows.size(), {});
  for (size_t i = 0; i < rows.size(); ++i)
    for (const ConfigIssue& is : per[i]) {
      const bool everywhere = std::all_of(per.begin(), per.end(), [&](const std::vector<ConfigIssue>& o) {
        return std::any_of(o.begin(), o.end(), [&](const ConfigIssue& x) { return x.message == is.message; });
      });
      if (!everywhere) k.per_row[i].push_back(is);
      else if (i == 0) k.whole.push_back(is);
    }
  const int64_t tmax = s.tokens.empty() ? 0 : *std::max_element(s.tokens.begin(), s.tokens.end());
  if (c.capacity >= 1 && tmax > c.capacity && tmax <= INT_MAX)
    k.whole.push_back({"tokens", std::to_string(tmax),
                       "--tokens: a rank has " + std::to_string(tmax) + " tokens, more than --capacity=" +
                           std::to_string(c.capacity) + "; raise --capacity or lower --tokens"});
  if (!k.whole.empty() || c.hidden < 1 || c.intermediate < 1 || c.num_experts < 1 || c.top_k < 1) return k;

  // The plan: what the float64 check covers, memory and time on this machine.
  RunPlan& p = k.plan;
  int64_t checked = 0, total = 0;
  for (int64_t t : s.tokens) {
    p.check_per_rank.push_back(std::min(t, s.check_tokens));
    checked += p.check_per_rank.back();
    total += t;
  }
  const double per_expert = harness::expert_elements(c);
  const int cores = harness::cpu_cores();
  double worst_w = 0;
  for (const Row& r : rows) worst_w = std::max(worst_w, weight_bytes_per_element(r.weights));
  // Host side: the ranks of this process (all of them, but one under mpirun) generate and quantize
  // their experts layer by layer; on the CPU the reference runner also holds fp32 copies of the
  // experts its tokens use. Rates measured on the reference path of a shared 2-core machine:
  // ~0.5 GFLOP/s per core for the fp32 runner and the float64 check, ~75 M weights/s per core
  // generated and quantized.
  const bool cpu = s.device == DeviceKind::cpu;
  const int local_ranks = cpu || !under_mpirun() ? R : 1;
  const double slots = double(local_ranks) * c.experts_per_rank();
  const double used = cpu ? std::min<double>(slots, double(total) * c.top_k) : 0.0;
  p.host_bytes = slots * per_expert * worst_w + used * per_expert * 4.0 + cores * per_expert * 8.0 +
                 double(total) * c.hidden * 24.0 + harness::check_cost(c, checked, cores).bytes;
  p.host_bytes *= 1.15;  // allocator and runner overheads (measured: qwen3-30b-a3b on 4 simulated ranks)
  const double gen_s = slots * per_expert / (75e6 * cores);
  const double fwd_s = cpu ? double(total) * c.top_k * per_expert * 2.0 / (0.5e9 * cores) : 0.0;
  const double chk_s = harness::check_cost(c, checked, cores).flops / (0.5e9 * cores);
  p.seconds = double(rows.size()) * s.layers * (gen_s + fwd_s + chk_s);
  const double avail = harness::available_memory_bytes();
  const std::string shape = s.preset + " (H=" + std::to_string(c.hidden) + " I=" + std::to_string(c.intermediate) +
                            " E=" + std::to_string(c.num_experts) + ")";
  // What fits: the experts scale the weights, so name the largest expert count that fits.
  auto experts_fit = [&](double budget, double per_e, double fixed, double ranks_here) {
    int e = int(std::max(0.0, (budget - fixed) / per_e * double(R) / ranks_here));
    const int step = c.router.kind == RouterKind::sigmoid_grouped_topk && c.router.n_group > 0
                         ? std::lcm(R, c.router.n_group)
                         : R;
    e -= e % step;
    return e >= c.top_k ? "What fits: --experts " + std::to_string(e) + " or fewer"
                        : std::string("Lower --intermediate or --hidden");
  };
  if (p.host_bytes > 0.75 * avail) {
    const double per_e = per_expert * (worst_w + (cpu ? 4.0 : 0.0));
    k.whole.push_back({"model", s.preset,
                       "one layer of " + shape + " on " + std::to_string(local_ranks) + (cpu ? " simulated" : "") +
                           " rank(s) needs about " + gib(p.host_bytes) + " of host memory; this machine has " +
                           gib(avail) + " available. " + experts_fit(0.75 * avail / 1.15, per_e, p.host_bytes / 1.15 - slots * per_e, local_ranks) +
                           (cpu ? ", or run on a GPU (--device cuda)" : "")});
  }
  if (!cpu && s.gpus > 0) {
    // Device side, per GPU: its experts in the weight format (nvfp4 also in the decode engine's
    // prepared order), the activations and the dispatcher's buffers of C rows from every rank.
    const double gpu = gpu_memory_bytes();
    const double per_e = per_expert * worst_w * (worst_w < 1.0 && c.tuning.nvfp4_prepare ? 2.0 : 1.0);
    const double act = double(tmax) * c.hidden * 16.0 + double(R) * c.capacity * c.hidden * 2.0 * (c.top_k + 2);
    const double need = c.experts_per_rank() * per_e + act;
    if (gpu > 0 && need > 0.9 * gpu)
      k.whole.push_back({"model", s.preset,
                         "one layer of " + shape + " needs about " + gib(need) + " on each GPU; GPU 0 has " + gib(gpu) +
                             ". " + experts_fit(0.9 * gpu, per_e, act, 1.0) +
                             ", more --ranks, or fewer --tokens"});
  }
  return k;
}

void print_issues(const char* command, const std::vector<ConfigIssue>& issues) {
  std::fprintf(stderr, "epmoe %s: %zu problem%s:\n", command, issues.size(), issues.size() == 1 ? "" : "s");
  for (const auto& i : issues) std::fprintf(stderr, "  %s: %s\n", i.field.c_str(), i.message.c_str());
}

}  // namespace epmoe::cli
