// Helpers shared by the GPU drivers of the `epmoe` tool (run on several GPUs, bench layer): list
// parsing, medians and a host thread pool for the float64 references. Starting the ranks of a
// multi-GPU job and the result exchange are in src/comm/launch.h.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "epmoe/format.h"
#include "epmoe/presets.h"

namespace epmoe::cli {

// Median (upper middle for even sizes); 0 for an empty list.
double median(std::vector<double> v);

// "a,b,c" -> {"a", "b", "c"}; throws UsageError naming --flag for an empty item.
std::vector<std::string> split_list(const std::string& text, const std::string& flag);
// Presets named by --preset: one name, a comma list, or "all" (every model preset; "tiny" is the
// test shape and only runs when named). Throws UsageError for an unknown name.
std::vector<const ModelPreset*> parse_presets(const std::string& list);
// "bf16,fp8" -> formats; throws UsageError naming --flag and the unknown item.
std::vector<ActFormat> parse_act_formats(const std::string& text, const std::string& flag);

// The weight format of the same family as a dispatch format (bf16 -> bf16, fp8 -> fp8, ...).
WeightFormat weight_family(ActFormat f);

// Runs fn(i) for i in [0, n) on up to `threads` host threads (the calling one included); the
// first exception is rethrown after every worker has stopped.
void parallel_for(int64_t n, int threads, const std::function<void(int64_t)>& fn);

}  // namespace epmoe::cli
