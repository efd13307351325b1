// `epmoe bench <subcommand>`: a front for the benchmark drivers, which register themselves from
// tools/bench/bench_*.cpp through BenchRegistrar (see commands.h).
#include <algorithm>
#include <cstdio>
#include <exception>

#include "commands.h"
#include "epmoe/error.h"

namespace epmoe::cli {
namespace {

void list_subcommands(std::FILE* to) {
  std::fprintf(to, "usage: epmoe bench <subcommand> [flags]\n\n");
  if (bench_commands().empty()) {
    std::fprintf(to, "no bench subcommand is built into this binary (they register from tools/bench/bench_*.cpp)\n");
    return;
  }
  auto table = bench_commands();
  std::sort(table.begin(), table.end(), [](const Command& a, const Command& b) { return a.name < b.name; });
  std::fprintf(to, "subcommands:\n");
  for (const auto& c : table) std::fprintf(to, "  %-10s %s\n", c.name.c_str(), c.summary.c_str());
  std::fprintf(to, "\n'epmoe bench <subcommand> --help' describes its flags.\n");
}

int bench_main(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    list_subcommands(stdout);
    return 0;
  }
  for (const auto& c : bench_commands()) {
    if (c.name != args[0]) continue;
    // Errors name the subcommand; UsageError is the caller's to fix (exit 2), the rest exit 1.
    try {
      return c.run(std::vector<std::string>(args.begin() + 1, args.end()));
    } catch (const UsageError& e) {
      std::fprintf(stderr, "epmoe bench %s: %s\n", c.name.c_str(), e.what());
      return 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "epmoe bench %s: error: %s\n", c.name.c_str(), e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "epmoe bench: unknown subcommand '%s'\n\n", args[0].c_str());
  list_subcommands(stderr);
  return 2;
}

const CommandRegistrar reg{{"bench", "benchmarks (epmoe bench: list of subcommands)", bench_main}};

}  // namespace
}  // namespace epmoe::cli
