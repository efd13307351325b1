// What `epmoe run` and `epmoe validate` print about a run before it starts: the shape, the
// ranks and backends, the tokens, and the plan (float64 check, memory, time estimate).
#pragma once
#include "setup.h"

namespace epmoe::cli {

void print_run_summary(const RunSetup& s, const SetupCheck& k);

}  // namespace epmoe::cli
