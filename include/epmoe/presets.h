// Public model shapes. Every field can be overridden (the CLI maps each to a flag).
#pragma once
#include <string>
#include <vector>

#include "epmoe/config.h"

namespace epmoe {

struct ModelPreset {
  std::string name;
  MoeConfig config;  // shape, router and formats; num_ranks/capacity are set by the caller
  int num_layers;    // MoE layers stacked by `epmoe run`
};

// tiny, deepseek-v3, qwen3-235b-a22b, qwen3-30b-a3b, mixtral-8x7b, gpt-oss-120b.
const std::vector<ModelPreset>& presets();
// Throws UsageError listing the known names when `name` is unknown.
const ModelPreset& preset(const std::string& name);

}  // namespace epmoe
