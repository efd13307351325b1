#include "setup.h"

#include <algorithm>

#include "epmoe/error.h"
#include "epmoe/presets.h"

namespace epmoe::cli {

CudaRunHook& cuda_run_hook() {
  static CudaRunHook hook;
  return hook;
}

MultiGpuRunHook& multi_gpu_run_hook() {
  static MultiGpuRunHook hook;
  return hook;
}

DeviceKind default_device() {
  const CudaRunHook& h = cuda_run_hook();
  return (h.run && h.available && h.available()) ? DeviceKind::cuda : DeviceKind::cpu;
}

void add_config_flags(Flags& f) {
  f.add("preset", "NAME", "model shape: tiny (default; qwen3-30b-a3b on several GPUs), deepseek-v3, qwen3-235b-a22b, qwen3-30b-a3b, mixtral-8x7b, gpt-oss-120b");
  f.add("hidden", "H", "hidden size");
  f.add("intermediate", "I", "intermediate size of one expert");
  f.add("experts", "E", "number of experts");
  f.add("topk", "K", "experts per token");
  f.add("ranks", "R", "expert-parallel ranks (cpu: simulated as threads, default 4; cuda: default every visible GPU, or the mpirun world)");
  f.add("capacity", "C", "most tokens one rank may dispatch (default: the largest --tokens value)");
  f.add("tokens", "T[,T...]", "tokens per rank, one value per rank or one for all (cpu default: 37,0,64,0 pattern; several GPUs: 2048, last rank 512)");
  f.add("layers", "L", "MoE layers stacked with residuals (default: the preset's; at most 3 on several GPUs)");
  f.add("dispatch", "FMT", "dispatch format bf16|fp8|nvfp4 (run: default all three)");
  f.add("weights", "FMT", "weight format bf16|fp8|nvfp4 (run: default the dispatch format's family)");
  f.add("combine", "FMT", "combine format bf16|fp8");
  f.add("ue8m0", "", "fp8 scales as powers of two (rounded up)");
  f.add("intermediate-quant", "Q", "none|fp8: re-quantize silu(gate)*up before the second GEMM");
  f.add("router", "KIND", "softmax|sigmoid (softmax_topk, sigmoid_grouped_topk)");
  f.add("n-group", "N", "sigmoid router: expert groups");
  f.add("topk-group", "N", "sigmoid router: groups kept");
  f.add("scaling", "X", "sigmoid router: routed_scaling_factor");
  f.add("renormalize", "", "renormalize the top-k weights to sum 1 (--renormalize=false to disable)");
  f.add("placement", "MAP", "explicit expert map 'e:r.s[,r.s];...' (default contiguous)");
  f.add("slots-per-rank", "N", "expert slots per rank for --placement (default ceil(E/R))");
  f.add("dispatcher", "NAME", "dispatcher backend (cpu default on cpu; local for one rank)");
  f.add("runner", "NAME", "runner backend (reference on cpu)");
  f.add("seed", "N", "random seed of weights and inputs (default 1)");
  f.add("device", "cpu|cuda", "where to run (default: cuda when the GPU path is built and a GPU is visible)");
  f.add("timeout-ms", "MS", "how long a rank waits for a peer");
}

namespace {

ActFormat act_flag(const Flags& f, const std::string& name) {
  const auto v = parse_act_format(f.get(name));
  if (!v) throw UsageError("--" + name + "=" + f.get(name) + " is not a format; use bf16, fp8 or nvfp4");
  return *v;
}

}  // namespace

RunSetup build_setup(const Flags& f) {
  RunSetup s;
  if (f.has("device")) {
    const std::string d = f.get("device");
    if (d == "cpu") s.device = DeviceKind::cpu;
    else if (d == "cuda" || d == "gpu") s.device = DeviceKind::cuda;
    else throw UsageError("--device=" + d + " is not a device; use cpu or cuda");
  } else {
    s.device = default_device();
  }
  // On cuda the default is every GPU of the job (all visible ones, or the mpirun world), and a job
  // of several GPUs defaults to a real model shape with a few layers: the tiny preset would time
  // nothing but launch overheads there.
  int default_ranks = 4;
  if (s.device == DeviceKind::cuda) {
    const MultiGpuRunHook& mh = multi_gpu_run_hook();
    default_ranks = mh.ranks ? std::max(1, mh.ranks()) : 1;
  }
  const int ranks = f.get_int("ranks", default_ranks);
  const bool multi_gpu = s.device == DeviceKind::cuda && ranks > 1;
  s.preset = f.has("preset") ? f.get("preset") : (multi_gpu ? "qwen3-30b-a3b" : "tiny");
  const ModelPreset& p = preset(s.preset);
  s.cfg = p.config;
  s.layers = f.get_int("layers", multi_gpu ? std::min(3, p.num_layers) : p.num_layers);
  s.seed = uint64_t(f.get_int("seed", 1));
  s.check_tokens = f.get_int("check-tokens", s.check_tokens);
  if (s.check_tokens < 0)
    throw UsageError("--check-tokens=" + std::to_string(s.check_tokens) + " must be 0 (no comparison) or more");

  MoeConfig& c = s.cfg;
  c.hidden = f.get_int("hidden", c.hidden);
  c.intermediate = f.get_int("intermediate", c.intermediate);
  c.num_experts = f.get_int("experts", c.num_experts);
  c.top_k = f.get_int("topk", c.top_k);
  c.num_ranks = ranks;
  c.timeout_ms = f.get_int("timeout-ms", c.timeout_ms);
  if (c.num_ranks < 1) throw UsageError("--ranks=" + std::to_string(c.num_ranks) + " must be at least 1");

  if (f.has("tokens")) {
    const auto list = parse_int_list(f.get("tokens"), "tokens");
    if (list.size() == 1) s.tokens.assign(c.num_ranks, list[0]);
    else if (int(list.size()) == c.num_ranks) s.tokens.assign(list.begin(), list.end());
    else
      throw UsageError("--tokens has " + std::to_string(list.size()) + " values for --ranks=" +
                       std::to_string(c.num_ranks) + "; give one value, or one per rank");
  } else if (s.device == DeviceKind::cpu) {
    // Uneven, with ranks that have no tokens at all: the cases a real batch produces.
    const int64_t pattern[4] = {37, 0, 64, 0};
    for (int r = 0; r < c.num_ranks; ++r) s.tokens.push_back(c.num_ranks == 1 ? 37 : pattern[r % 4]);
  } else if (multi_gpu) {
    // About 2k tokens per rank, the last rank with a quarter of that: ranks see uneven batches.
    s.tokens.assign(c.num_ranks, 2048);
    s.tokens.back() = 512;
  } else {
    s.tokens.assign(c.num_ranks, 256);
  }
  const int64_t tmax = *std::max_element(s.tokens.begin(), s.tokens.end());
  c.capacity = f.get_int("capacity", int(std::max<int64_t>(tmax, 1)));

  s.dispatch_given = f.has("dispatch");
  s.weights_given = f.has("weights");
  if (s.dispatch_given) c.dispatch_format = act_flag(f, "dispatch");
  if (s.weights_given) {
    const auto w = parse_weight_format(f.get("weights"));
    if (!w) throw UsageError("--weights=" + f.get("weights") + " is not a weight format; use bf16, fp8 or nvfp4");
    c.weight_format = *w;
  }
  if (f.has("combine")) c.combine_format = act_flag(f, "combine");
  c.fp8_ue8m0 = f.get_bool("ue8m0", c.fp8_ue8m0);
  if (f.has("intermediate-quant")) {
    const std::string q = f.get("intermediate-quant");
    if (q == "none") c.intermediate_quant = IntermediateQuant::none;
    else if (q == "fp8") c.intermediate_quant = IntermediateQuant::fp8;
    else throw UsageError("--intermediate-quant=" + q + " is not known; use none or fp8");
  }
  if (f.has("router")) {
    const std::string r = f.get("router");
    if (r == "softmax" || r == "softmax_topk") c.router.kind = RouterKind::softmax_topk;
    else if (r == "sigmoid" || r == "sigmoid_grouped_topk") c.router.kind = RouterKind::sigmoid_grouped_topk;
    else throw UsageError("--router=" + r + " is not known; use softmax or sigmoid");
  }
  c.router.n_group = f.get_int("n-group", c.router.n_group);
  c.router.topk_group = f.get_int("topk-group", c.router.topk_group);
  c.router.routed_scaling_factor = float(f.get_double("scaling", c.router.routed_scaling_factor));
  c.router.renormalize = f.get_bool("renormalize", c.router.renormalize);
  if (f.has("placement")) {
    const int slots = f.get_int("slots-per-rank", (c.num_experts + c.num_ranks - 1) / c.num_ranks);
    c.placement = ExpertPlacement::parse(f.get("placement"), c.num_experts, c.num_ranks, slots);
  }

  if (s.device == DeviceKind::cpu) {
    c.dispatcher = c.num_ranks == 1 ? "local" : "cpu";
    c.runner = "reference";
  } else {
    c.dispatcher = c.num_ranks == 1 ? "local" : "nvlink";
    c.runner = "cuda";
  }
  if (f.has("dispatcher")) c.dispatcher = f.get("dispatcher");
  if (f.has("runner")) c.runner = f.get("runner");
  // nvfp4 dispatch needs a global scale; `run` calibrates it per layer from the data, so any
  // positive placeholder lets the rest of the configuration be validated.
  if (c.nvfp4_global_scale <= 0.f) c.nvfp4_global_scale = 1.f;
  return s;
}

}  // namespace epmoe::cli
