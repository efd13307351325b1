#include "harness/machine.h"

#include <unistd.h>

#include <fstream>
#include <string>

#include "core/parallel.h"

namespace epmoe::harness {

double available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024.0;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? double(pages) * double(page) : 8.0 * (1ull << 30);
}

int cpu_cores() { return detail::cpu_threads(); }

}  // namespace epmoe::harness
