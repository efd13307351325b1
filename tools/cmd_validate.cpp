// `epmoe validate <flags>`: the resolved configuration, or every problem with it (exit code 2).
#include <cstdio>

#include "commands.h"
#include "epmoe/config.h"
#include "epmoe/registry.h"
#include "setup.h"

namespace epmoe::cli {
namespace {

int validate_main(const std::vector<std::string>& args) {
  Flags flags("validate");
  add_config_flags(flags);
  if (wants_help(args)) {
    std::printf("usage: epmoe validate [flags]\n\nResolves a preset and flags into a layer configuration and checks it.\n"
                "Prints the configuration, or every problem found (exit code 2).\n\nflags:\n%s",
                flags.help().c_str());
    return 0;
  }
  flags.parse(args);
  const RunSetup s = build_setup(flags);
  const auto issues = validate(s.cfg);
  if (!issues.empty()) {
    std::fprintf(stderr, "epmoe validate: %zu problem%s:\n", issues.size(), issues.size() == 1 ? "" : "s");
    for (const auto& i : issues) std::fprintf(stderr, "  %s: %s\n", i.field.c_str(), i.message.c_str());
    return 2;
  }
  std::printf("%s", describe(s.cfg).c_str());
  std::printf("layers:     %d\ntokens:    ", s.layers);
  for (size_t r = 0; r < s.tokens.size(); ++r) std::printf("%s%lld", r ? "," : " ", static_cast<long long>(s.tokens[r]));
  std::printf("\nlegal pairs in this build:\n");
  for (const auto& p : Registry::global().describe_pairs()) std::printf("  %s\n", p.c_str());
  return 0;
}

const CommandRegistrar reg{{"validate", "check a configuration (preset + flags) and print it", validate_main}};

}  // namespace
}  // namespace epmoe::cli
