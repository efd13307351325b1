// Expert placement: the contiguous default, explicit maps with redundant copies, the CLI syntax and
// the copy-selection rule shared by every backend.
#include "epmoe/placement.h"

#include <cctype>
#include <string_view>

#include "epmoe/error.h"

namespace epmoe {

ExpertPlacement ExpertPlacement::contiguous(int num_experts, int num_ranks) {
  if (num_ranks < 1) {
    throw UsageError("placement: num_ranks=" + std::to_string(num_ranks) + " must be >= 1");
  }
  if (num_experts < 1) {
    throw UsageError("placement: num_experts=" + std::to_string(num_experts) + " must be >= 1");
  }
  if (num_experts % num_ranks != 0) {
    throw UsageError("placement: num_experts=" + std::to_string(num_experts) + " is not divisible by num_ranks=" +
                     std::to_string(num_ranks) +
                     ", which the contiguous placement requires; pick num_ranks dividing num_experts or give an "
                     "explicit placement");
  }
  ExpertPlacement p;
  p.num_ranks_ = num_ranks;
  p.slots_per_rank_ = num_experts / num_ranks;
  p.contiguous_ = true;
  p.copies_.resize(num_experts);
  for (int e = 0; e < num_experts; ++e) p.copies_[e] = {ExpertCopy{e / p.slots_per_rank_, e % p.slots_per_rank_}};
  return p;
}

ExpertPlacement ExpertPlacement::explicit_map(int num_ranks, int slots_per_rank,
                                              std::vector<std::vector<ExpertCopy>> copies) {
  ExpertPlacement p;
  p.num_ranks_ = num_ranks;
  p.slots_per_rank_ = slots_per_rank;
  p.copies_ = std::move(copies);
  // A map that happens to be the contiguous layout is reported as such so that backends may take
  // their contiguous fast path; choose() gives the same answer either way.
  const int E = p.num_experts();
  bool contiguous = num_ranks >= 1 && E > 0 && int64_t(slots_per_rank) * num_ranks == E;
  for (int e = 0; contiguous && e < E; ++e) {
    contiguous = p.copies_[e].size() == 1 && p.copies_[e][0] == ExpertCopy{e / slots_per_rank, e % slots_per_rank};
  }
  p.contiguous_ = contiguous;
  return p;
}

namespace {

// Minimal cursor over the --placement syntax; errors name the position so a long spec can be fixed.
struct Cursor {
  std::string_view s;
  size_t i = 0;
  void skip_ws() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  bool eat(char c) {
    skip_ws();
    if (i < s.size() && s[i] == c) {
      ++i;
      return true;
    }
    return false;
  }
  bool at_end() {
    skip_ws();
    return i >= s.size();
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw UsageError("placement=\"" + std::string(s) + "\": " + what + " at character " + std::to_string(i) +
                     "; the syntax is \"expert:rank.slot[,rank.slot...];expert:...\", e.g. \"0:0.0,1.3;1:0.1\"");
  }
  int number(const char* what) {
    skip_ws();
    if (i >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i]))) fail(std::string("expected ") + what);
    int64_t v = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
      v = v * 10 + (s[i] - '0');
      if (v > 1'000'000'000) fail(std::string(what) + " too large");
      ++i;
    }
    return static_cast<int>(v);
  }
};

}  // namespace

ExpertPlacement ExpertPlacement::parse(const std::string& spec, int num_experts, int num_ranks, int slots_per_rank) {
  if (num_experts < 1) {
    throw UsageError("placement: num_experts=" + std::to_string(num_experts) + " must be >= 1 to parse a placement");
  }
  std::vector<std::vector<ExpertCopy>> copies(num_experts);
  std::vector<bool> seen(num_experts, false);
  Cursor c{spec};
  while (!c.at_end()) {
    const int e = c.number("an expert id");
    if (e >= num_experts) {
      c.fail("expert " + std::to_string(e) + " is outside [0, " + std::to_string(num_experts) + ")");
    }
    if (seen[e]) c.fail("expert " + std::to_string(e) + " is listed twice; list all its copies in one entry");
    seen[e] = true;
    if (!c.eat(':')) c.fail("expected ':' after expert " + std::to_string(e));
    do {
      const int r = c.number("a rank");
      if (!c.eat('.')) c.fail("expected '.' between rank and slot");
      const int s = c.number("a slot");
      copies[e].push_back(ExpertCopy{r, s});
    } while (c.eat(','));
    if (!c.eat(';') && !c.at_end()) c.fail("expected ';' or ',' after a copy");
  }
  // Range and completeness problems are left to problems() so that validate() lists them all.
  return explicit_map(num_ranks, slots_per_rank, std::move(copies));
}

ExpertCopy ExpertPlacement::choose(int expert, int src_rank, int64_t token) const {
  if (expert < 0 || expert >= num_experts() || copies_[expert].empty()) {
    throw UsageError("placement: expert " + std::to_string(expert) + " has no copy (experts are [0, " +
                     std::to_string(num_experts()) + "))");
  }
  const auto& cs = copies_[expert];
  if (cs.size() == 1) return cs[0];
  for (const ExpertCopy& c : cs) {
    if (c.rank == src_rank) return c;
  }
  const int64_t n = static_cast<int64_t>(cs.size());
  // Non-negative modulo: src_rank and token are never negative in valid use, but a wrong caller
  // must not index out of range.
  int64_t k = (int64_t(src_rank) + token) % n;
  if (k < 0) k += n;
  return cs[static_cast<size_t>(k)];
}

std::vector<std::string> ExpertPlacement::problems() const {
  std::vector<std::string> out;
  if (num_ranks_ < 1) out.push_back("num_ranks=" + std::to_string(num_ranks_) + " must be >= 1");
  if (slots_per_rank_ < 1) {
    out.push_back("slots_per_rank=" + std::to_string(slots_per_rank_) + " must be >= 1");
  }
  if (copies_.empty()) out.push_back("the placement lists no experts");
  if (!out.empty()) return out;
  // owner[rank * slots + slot] = expert occupying it, or -1.
  std::vector<int> owner(size_t(num_ranks_) * size_t(slots_per_rank_), -1);
  for (int e = 0; e < num_experts(); ++e) {
    if (copies_[e].empty()) {
      out.push_back("expert " + std::to_string(e) + " has no copy; give it at least one rank.slot");
      continue;
    }
    for (const ExpertCopy& c : copies_[e]) {
      const std::string where = "expert " + std::to_string(e) + " copy on rank " + std::to_string(c.rank) +
                                " slot " + std::to_string(c.slot);
      if (c.rank < 0 || c.rank >= num_ranks_) {
        out.push_back(where + ": rank is outside [0, " + std::to_string(num_ranks_) + ")");
        continue;
      }
      if (c.slot < 0 || c.slot >= slots_per_rank_) {
        out.push_back(where + ": slot is outside [0, " + std::to_string(slots_per_rank_) +
                      "); raise slots per rank or use a smaller slot");
        continue;
      }
      int& o = owner[size_t(c.rank) * slots_per_rank_ + c.slot];
      if (o == e) {
        out.push_back(where + ": the same copy is listed twice");
      } else if (o >= 0) {
        out.push_back(where + ": the slot already holds expert " + std::to_string(o) +
                      "; each slot holds one expert");
      } else {
        o = e;
      }
    }
  }
  return out;
}

ExpertPlacement::Flat ExpertPlacement::flatten() const {
  Flat f;
  f.offsets.reserve(copies_.size() + 1);
  f.offsets.push_back(0);
  for (const auto& cs : copies_) {
    for (const ExpertCopy& c : cs) {
      f.ranks.push_back(c.rank);
      f.slots.push_back(c.slot);
    }
    f.offsets.push_back(static_cast<int32_t>(f.ranks.size()));
  }
  return f;
}

}  // namespace epmoe
