// Phase trace of the "nvlink" kernels, a diagnostic for `epmoe bench a2a --phases`: when a
// dispatcher has a stamp buffer, CTA 0 of each later dispatch/combine writes %globaltimer (ns) at
// the points below into stamps[0, kNvlTrace). Off (null) by default; results never depend on it.
#pragma once
#include <cstdint>

namespace epmoe {
class Dispatcher;
namespace detail {

enum NvlTrace : int {
  kTrDispatchStart,   // after the epoch is read
  kTrCounted,         // chunk counts published, grid barrier passed
  kTrStatuses,        // every rank's status (count, errors) arrived
  kTrPushed,          // this CTA's units stored to every destination
  kTrArrived,         // every source's data arrived
  kTrDispatchEnd,     // stale ids reset, expert counts, state advanced
  kTrCombineStart,
  kTrCombinePushed,   // warp 0's rows pushed to their home ranks
  kTrCombineEnd,      // this CTA's sums written
  kNvlTrace
};

// Sets (or, with null, clears) the stamp buffer of an "nvlink" dispatcher: kNvlTrace device
// uint64 values. No-op for other dispatchers.
void nvlink_set_trace(Dispatcher& d, uint64_t* stamps);

}  // namespace detail
}  // namespace epmoe
