// The command table of the `epmoe` tool. Each command lives in its own file and registers itself
// with a static CommandRegistrar, so adding one touches no shared file. `epmoe bench` is a
// command whose subcommands register the same way (tools/bench/bench_*.cpp, with a BenchRegistrar).
#pragma once
#include <string>
#include <vector>

namespace epmoe::cli {

// Returns the process exit code: 0 ok, 1 failure, 2 usage error.
using CommandFn = int (*)(const std::vector<std::string>& args);

struct Command {
  std::string name;
  std::string summary;  // one line for `epmoe help`
  CommandFn run;
};

// Top-level commands (run, validate, bench, ...), in registration order.
std::vector<Command>& commands();
// Subcommands of `epmoe bench`; empty when no benchmark is built in.
std::vector<Command>& bench_commands();

struct CommandRegistrar {
  explicit CommandRegistrar(Command c) { commands().push_back(std::move(c)); }
};
struct BenchRegistrar {
  explicit BenchRegistrar(Command c) { bench_commands().push_back(std::move(c)); }
};

// True when args contains -h, --help or help as its first element.
bool wants_help(const std::vector<std::string>& args);

}  // namespace epmoe::cli
