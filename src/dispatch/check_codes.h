// The problems a dispatcher can find in one rank's DispatchInput, as plain integer codes: device
// kernels record them and ranks exchange them, so this header holds no host-only code. The one
// message of each problem: dispatch/check.h.
#pragma once
#include <cstdint>

namespace epmoe::detail::input {

enum Code : int32_t {
  kOk = 0,
  kOverCapacity = 1,  // T > C
  kBadId = 2,         // a topk_ids entry outside [-1, E)
  kNullInput = 3,     // hidden, topk_ids or topk_weights null with T > 0
  kNegative = 4,      // T < 0
};

// Which pointer a kNullInput is about (the record's `value`).
enum NullField : int32_t { kNullHidden = 0, kNullIds = 1, kNullWeights = 2 };

// A problem as ranks exchange it: kRecordInts int32 values in this order. token/k/value are the
// first bad entry for kBadId (value = the id), value = the NullField for kNullInput, else 0.
enum RecordField : int { kRecCode = 0, kRecTokens = 1, kRecToken = 2, kRecK = 3, kRecValue = 4, kRecordInts = 5 };

}  // namespace epmoe::detail::input
