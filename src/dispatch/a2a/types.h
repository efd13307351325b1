// Plain types shared by the host and device code of the GPU dispatchers (no device code here, so
// .cpp files may include it).
#pragma once
#include <cstdint>

namespace epmoe::a2a {

constexpr int kMaxRanks = 32;  // destinations per token fit a uint32 mask
constexpr int kMaxTopK = 32;   // one lane per k

// Flattened ExpertPlacement (ExpertPlacement::flatten) for device code.
struct DevPlacement {
  int num_ranks = 0, num_experts = 0, slots_per_rank = 0, contiguous = 1;
  const int32_t* offsets = nullptr;
  const int32_t* ranks = nullptr;
  const int32_t* slots = nullptr;
};

// Where the copies of one source's tokens land on one destination (slot 0 of the region).
struct DestRegion {
  uint8_t* payload;
  uint8_t* scales;
  int32_t* ids;
  float* weights;
};

}  // namespace epmoe::a2a
