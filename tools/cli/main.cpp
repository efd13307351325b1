// `epmoe`: entry point. Looks the command up in the table of tools/cli/commands.h.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "commands.h"
#include "epmoe/error.h"

namespace epmoe::cli {

std::vector<Command>& commands() {
  static std::vector<Command> table;
  return table;
}

std::vector<Command>& bench_commands() {
  static std::vector<Command> table;
  return table;
}

bool wants_help(const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "help") return true;
  return std::any_of(args.begin(), args.end(), [](const std::string& a) { return a == "-h" || a == "--help"; });
}

namespace {

void print_usage(std::FILE* to) {
  std::fprintf(to,
               "epmoe - expert-parallel Mixture-of-Experts layers\n\n"
               "usage: epmoe <command> [flags]\n\ncommands:\n");
  auto table = commands();
  std::sort(table.begin(), table.end(), [](const Command& a, const Command& b) { return a.name < b.name; });
  for (const auto& c : table) std::fprintf(to, "  %-10s %s\n", c.name.c_str(), c.summary.c_str());
  std::fprintf(to, "  %-10s %s\n\n'epmoe <command> --help' describes a command's flags.\n", "help",
               "this list (epmoe help <command>: that command's help)");
}

}  // namespace
}  // namespace epmoe::cli

int main(int argc, char** argv) {
  using namespace epmoe::cli;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    print_usage(stderr);
    return 2;
  }
  std::string name = args[0];
  args.erase(args.begin());
  if (name == "--help" || name == "-h" || name == "help") {
    if (args.empty()) {
      print_usage(stdout);
      return 0;
    }
    name = args[0];  // `epmoe help run` == `epmoe run --help`
    args = {"--help"};
  }
  for (const auto& c : commands()) {
    if (c.name != name) continue;
    try {
      return c.run(args);
    } catch (const epmoe::UsageError& e) {
      std::fprintf(stderr, "epmoe %s: %s\n", name.c_str(), e.what());
      return 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "epmoe %s: error: %s\n", name.c_str(), e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "epmoe: unknown command '%s'\n\n", name.c_str());
  print_usage(stderr);
  return 2;
}
