// What this machine offers the CPU work of the harness: memory and cores, read once.
#pragma once
#include <cstdint>

namespace epmoe::harness {

// Memory available to new allocations now (MemAvailable of /proc/meminfo; else physical memory).
double available_memory_bytes();
// CPU threads the library's pool uses (cpu_threads(): EPMOE_CPU_THREADS or the cores).
int cpu_cores();

}  // namespace epmoe::harness
