// Which rank holds which expert. Contiguous by default; an explicit map allows several copies of a
// hot expert (redundant experts) on different ranks.
//
// Rule for redundant copies: a token of source rank s uses the copy on s itself if there is one,
// otherwise copy number (s + t) mod n, where t is the token's index on s and n the number of
// copies. The rule is deterministic (every backend and the oracle agree) and spreads the load of
// one source's tokens over all copies.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace epmoe {

struct ExpertCopy {
  int rank = 0;
  int slot = 0;  // local expert index on that rank
  bool operator==(const ExpertCopy&) const = default;
};

class ExpertPlacement {
 public:
  ExpertPlacement() = default;
  // Expert e on rank e / (E/R), slot e % (E/R). Requires E % R == 0 (validated by validate()).
  static ExpertPlacement contiguous(int num_experts, int num_ranks);
  // copies[e] lists the (rank, slot) copies of logical expert e.
  static ExpertPlacement explicit_map(int num_ranks, int slots_per_rank,
                                      std::vector<std::vector<ExpertCopy>> copies);
  // Parses "e:r.s[,r.s...];e:..." (the CLI's --placement flag).
  static ExpertPlacement parse(const std::string& spec, int num_experts, int num_ranks, int slots_per_rank);

  int num_experts() const { return static_cast<int>(copies_.size()); }
  int num_ranks() const { return num_ranks_; }
  int slots_per_rank() const { return slots_per_rank_; }
  bool is_contiguous() const { return contiguous_; }
  std::span<const ExpertCopy> copies(int expert) const { return copies_[expert]; }

  // The copy that token `token` of rank `src_rank` uses for `expert` (rule above).
  ExpertCopy choose(int expert, int src_rank, int64_t token) const;

  // Problems found: ranks or slots out of range, an expert without copies, two experts in one
  // slot. Empty when valid. Messages name the expert, the rank and the slot.
  std::vector<std::string> problems() const;

  // Flattened form for device code: offsets[e]..offsets[e+1] index into ranks/slots.
  struct Flat {
    std::vector<int32_t> offsets, ranks, slots;
  };
  Flat flatten() const;

 private:
  int num_ranks_ = 1;
  int slots_per_rank_ = 0;
  bool contiguous_ = true;
  std::vector<std::vector<ExpertCopy>> copies_;
};

}  // namespace epmoe
