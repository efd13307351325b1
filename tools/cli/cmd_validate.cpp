// `epmoe validate <flags>`: the resolved settings of `epmoe run` with the same flags, or every
// problem with them (exit code 2). It runs the check `run` runs (check_setup), so what it accepts,
// run runs.
#include <cstdio>

#include "commands.h"
#include "epmoe/config.h"
#include "epmoe/registry.h"
#include "run_report.h"
#include "setup.h"

namespace epmoe::cli {
namespace {

int validate_main(const std::vector<std::string>& args) {
  Flags flags("validate");
  add_run_flags(flags);
  if (wants_help(args)) {
    std::printf("usage: epmoe validate [flags]\n\nResolves a preset and flags (those of `epmoe run`) into a layer\n"
                "configuration and checks it as `epmoe run` would. Prints the configuration with the tuning\n"
                "options and where each value came from, and the plan of the run; or every problem found\n"
                "(exit code 2).\n\nflags:\n%s",
                flags.help().c_str());
    return 0;
  }
  flags.parse(args);
  const RunSetup s = build_setup(flags);
  const SetupCheck k = check_setup(s);
  if (!k.ok()) {
    std::vector<ConfigIssue> all = k.whole;
    const auto rows = run_rows(s);
    for (size_t i = 0; i < rows.size(); ++i)
      for (const auto& is : k.per_row[i])
        all.push_back({is.field, is.value,
                       std::string("row dispatch=") + format_name(rows[i].dispatch) + " weights=" +
                           format_name(rows[i].weights) + ": " + is.message});
    print_issues("validate", all);
    return 2;
  }
  std::printf("%s", describe(s.cfg).c_str());
  std::printf("layers:     %d\n", s.layers);
  print_run_summary(s, k);
  std::printf("legal pairs in this build:\n");
  for (const auto& p : Registry::global().describe_pairs()) std::printf("  %s\n", p.c_str());
  return 0;
}

const CommandRegistrar reg{{"validate", "check the settings of a run (preset + flags) and print them", validate_main}};

}  // namespace
}  // namespace epmoe::cli
