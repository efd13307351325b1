// Phase trace of the "nvlink" kernels, a diagnostic for `epmoe bench a2a --phases`: when a
// dispatcher has a stamp buffer, CTA 0 of each later dispatch/combine writes %globaltimer (ns) at
// the points below into stamps[0, kNvlTrace), and every CTA folds its start and end into the span
// slots. The buffer must start as all ones. Off (null) by default; results never depend on it.
#pragma once
#include <cstdint>

namespace epmoe {
class Dispatcher;
namespace detail {

enum NvlTrace : int {
  kTrDispatchStart,   // after the epoch is read
  kTrChunkCounted,    // this CTA's chunk counted (before the grid barrier)
  kTrCounted,         // chunk counts published, grid barrier passed
  kTrStatusSent,      // our status released to every peer
  kTrSlotsDone,       // slots of the chunk and the first units' loads issued (the status wait starts)
  kTrStatuses,        // every rank's status (count, errors) arrived
  kTrPushed,          // this CTA's units stored to every destination
  kTrArrived,         // every source's data arrived
  kTrDispatchEnd,     // stale ids reset, expert counts, state advanced
  kTrCombineStart,
  kTrCombinePushed,   // warp 0's rows pushed to their home ranks
  kTrCombineEnd,      // this CTA's sums written
  // Kernel spans over all CTAs (what a profiler reports as the kernel's duration): the earliest
  // CTA start (atomicMin) and the complement of the latest CTA end (atomicMin of ~t), so that the
  // host initialises every slot to all ones.
  kTrDispatchFirst,
  kTrDispatchLastInv,
  kTrCombineFirst,
  kTrCombineLastInv,
  // Spread of the CTAs: the latest start (complement) and the earliest end of each kernel.
  kTrDispatchLastStartInv,
  kTrDispatchFirstEnd,
  kTrCombineLastStartInv,
  kTrCombineFirstEnd,
  kNvlTrace
};

// Sets (or, with null, clears) the stamp buffer of an "nvlink" dispatcher: kNvlTrace device
// uint64 values. No-op for other dispatchers.
void nvlink_set_trace(Dispatcher& d, uint64_t* stamps);

}  // namespace detail
}  // namespace epmoe
