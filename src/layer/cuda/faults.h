// Device scan of a forward's inputs for data faults (layer/faults.h): one kernel on the caller's
// stream, counters in device memory, no host synchronization. Atomics happen only where a fault
// is found, so the normal path costs one read of the inputs.
#pragma once
#include <cuda_runtime.h>

#include "layer/faults.h"

namespace epmoe::cuda {

// Adds the faults of `s` (device memory) to counters[kFaultKinds] (device memory).
void scan_faults(const detail::FaultScan& s, unsigned long long* counters, cudaStream_t stream);

}  // namespace epmoe::cuda
