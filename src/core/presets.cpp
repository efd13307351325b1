// Public MoE model shapes. Values come from the models' published config.json files (Hugging Face
// model cards), noted per entry; only the routed-expert part of each model is described here.
#include "epmoe/presets.h"

#include "epmoe/error.h"

namespace epmoe {

namespace {

MoeConfig shape(int hidden, int intermediate, int experts, int top_k, RouterConfig router) {
  MoeConfig c;
  c.hidden = hidden;
  c.intermediate = intermediate;
  c.num_experts = experts;
  c.top_k = top_k;
  c.router = router;
  return c;
}

RouterConfig softmax(bool renormalize) {
  RouterConfig r;
  r.kind = RouterKind::softmax_topk;
  r.renormalize = renormalize;
  return r;
}

std::vector<ModelPreset> build() {
  std::vector<ModelPreset> v;
  // Test shape: small enough that several CPU ranks run several layers in every format quickly,
  // yet H is a multiple of 128 (fp8) and E/R is whole for R in {1, 2, 4, 8, 16}.
  v.push_back({"tiny", shape(256, 128, 16, 4, softmax(true)), 4});

  // deepseek-ai/DeepSeek-V3 config.json: hidden_size 7168, moe_intermediate_size 2048,
  // n_routed_experts 256, num_experts_per_tok 8, scoring_func sigmoid, topk_method noaux_tc,
  // n_group 8, topk_group 4, routed_scaling_factor 2.5, norm_topk_prob true; num_hidden_layers 61
  // of which first_k_dense_replace 3 are dense, so 58 MoE layers. The checkpoint's weights are fp8
  // with 128x128 block scales (weight_format fp8); the preset keeps bf16 so it runs everywhere.
  {
    RouterConfig r;
    r.kind = RouterKind::sigmoid_grouped_topk;
    r.renormalize = true;
    r.n_group = 8;
    r.topk_group = 4;
    r.routed_scaling_factor = 2.5f;
    v.push_back({"deepseek-v3", shape(7168, 2048, 256, 8, r), 58});
  }

  // Qwen/Qwen3-235B-A22B config.json: hidden_size 4096, moe_intermediate_size 1536, num_experts 128,
  // num_experts_per_tok 8, norm_topk_prob true, num_hidden_layers 94 (all MoE).
  v.push_back({"qwen3-235b-a22b", shape(4096, 1536, 128, 8, softmax(true)), 94});

  // Qwen/Qwen3-30B-A3B config.json: hidden_size 2048, moe_intermediate_size 768, num_experts 128,
  // num_experts_per_tok 8, norm_topk_prob true, num_hidden_layers 48 (all MoE).
  v.push_back({"qwen3-30b-a3b", shape(2048, 768, 128, 8, softmax(true)), 48});

  // mistralai/Mixtral-8x7B-v0.1 config.json: hidden_size 4096, intermediate_size 14336,
  // num_local_experts 8, num_experts_per_tok 2, num_hidden_layers 32. Mixtral takes the softmax of
  // the top-2 logits, which equals softmax over all experts followed by renormalization.
  v.push_back({"mixtral-8x7b", shape(4096, 14336, 8, 2, softmax(true)), 32});

  // openai/gpt-oss-120b config.json: hidden_size 2880, intermediate_size 2880, num_local_experts 128,
  // experts_per_token 4, num_hidden_layers 36. Its router takes the softmax of the top-4 logits
  // (= softmax + renormalize). Its experts use a clamped SwiGLU with biases, which epmoe's plain
  // SwiGLU does not reproduce: the preset gives the shape and traffic, not the model's numerics.
  // 2880 is not a multiple of 128: fp8 weights have partial edge tiles (W13's gate and up tiled
  // apart), fp8 activations a partial last 128-block.
  v.push_back({"gpt-oss-120b", shape(2880, 2880, 128, 4, softmax(true)), 36});
  return v;
}

}  // namespace

const std::vector<ModelPreset>& presets() {
  static const std::vector<ModelPreset> all = build();
  return all;
}

const ModelPreset& preset(const std::string& name) {
  for (const ModelPreset& p : presets()) {
    if (p.name == name) return p;
  }
  std::string known;
  for (const ModelPreset& p : presets()) known += (known.empty() ? "" : ", ") + p.name;
  throw UsageError("preset=\"" + name + "\" is unknown; use one of: " + known);
}

}  // namespace epmoe
