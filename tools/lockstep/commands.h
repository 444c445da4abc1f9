// The subcommands of the lockstep binary, one .cc file each.
#pragma once

namespace lockstep::cli {

struct SelftestOptions {
  bool verbose = false;
};
int RunSelftest(const SelftestOptions& options);

}  // namespace lockstep::cli
