// The dispatch input check of every dispatcher, CPU and GPU: which problems exist (check_codes.h,
// also the device kernels' error codes), how each is found on the host, and the one message of
// each, naming the rank, the value and the fix. A dispatcher that finds a problem on the device
// decodes the record it exchanged (decode_input_record) and raises the same text as the CPU ones.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dispatch/check_codes.h"

namespace epmoe::detail {

// One rank's input problem, or code kOk.
struct InputProblem {
  int32_t code = input::kOk;
  int64_t num_tokens = 0;  // T as the caller passed it
  int64_t token = 0;       // kBadId: first bad entry (token, k) and its id
  int32_t k = 0;
  int32_t value = 0;       // kBadId: the id; kNullInput: the NullField

  bool ok() const { return code == input::kOk; }
};

// What can be seen without reading the ids: T < 0, T > C, a null pointer with T > 0. Dispatchers
// whose ids live on the device call this and find bad ids in their kernels.
InputProblem check_input_shape(int64_t num_tokens, int capacity, const void* hidden, const void* ids,
                               const void* weights);
// check_input_shape, then the ids (host memory, [T][K]) against [-1, E): the first bad entry.
InputProblem check_input(int64_t num_tokens, int capacity, int num_experts, int top_k, const void* hidden,
                         const int32_t* ids, const float* weights);

// A problem from its exchanged record (input::kRecordInts values).
InputProblem decode_input_record(const int32_t* rec);

// The message of `p` on `rank`: "rank 2: T=17 tokens exceeds capacity C=16; raise ..." ("" when
// ok). capacity and num_experts are the configuration's (every rank has the same).
std::string input_message(const InputProblem& p, int rank, int capacity, int num_experts);

// Collects the per-rank messages (empty ones skipped) into the text of the UsageError every
// dispatcher raises when any rank's input is bad: "dispatch: rank 0: ...; rank 2: ... (nothing was
// sent)". Empty when every message is empty.
std::string rejected_dispatch(const std::vector<std::string>& rank_messages);

// Combine called in the wrong state or with missing buffers (local to the calling rank).
std::string combine_without_dispatch();
std::string combine_null_y(int64_t received);     // y null while tokens were dispatched to this rank
std::string combine_null_out(int64_t num_tokens);  // out null while this rank dispatched T > 0

}  // namespace epmoe::detail
