// The data faults one forward's inputs can hold (DESIGN.md §7): what is counted, in which counter,
// and the one message of each. Shared by the host scan (faults.cpp, the CPU backend) and the device
// scan (cuda/faults.cu), so both count the same things.
#pragma once
#include <cstdint>
#include <string>

#include "epmoe/numeric.h"

namespace epmoe::detail {

// What the scans call a fault: a NaN or +-inf (all exponent bits set), on the bits.
EPMOE_HD bool bf16_nonfinite(uint32_t bf16_bits) { return (bf16_bits & 0x7f80u) == 0x7f80u; }
EPMOE_HD bool f32_nonfinite(uint32_t f32_bits) { return (f32_bits & 0x7f800000u) == 0x7f800000u; }

enum FaultKind : int {
  kNonfiniteHidden = 0,   // tokens with a NaN or +-inf hidden value
  kNonfiniteLogits = 1,   // tokens with a NaN or +-inf router logit
  kNonfiniteWeights = 2,  // tokens with a NaN or +-inf routing weight (given, or the router's)
  kBadIds = 3,            // topk_ids entries outside [-1, E)
  kFaultKinds = 4,
};

// One forward's inputs, as the layer checked them (contiguous, row-major). A null pointer is not
// scanned.
struct FaultScan {
  int64_t tokens = 0;
  int hidden = 0;
  const uint16_t* x = nullptr;      // bf16 bits [T][H]
  const void* logits = nullptr;     // [T][E], f32 or bf16
  bool logits_bf16 = false;
  int num_experts = 0;
  const int32_t* ids = nullptr;     // [T][K]
  const float* weights = nullptr;   // [T][K]
  int top_k = 0;
};

// Adds the faults of `s` (host memory) to counts[kFaultKinds].
void scan_faults_host(const FaultScan& s, int64_t* counts);

// "3 tokens with NaN/inf in hidden, 1 topk_ids entry outside [-1, 256)" for the faults in
// delta[kFaultKinds]; "" when there are none.
std::string fault_message(const int64_t* delta, int num_experts);

}  // namespace epmoe::detail
