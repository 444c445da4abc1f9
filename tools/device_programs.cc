// device-programs: prints the device's program table (src/device/programs.cc), one program a
// line, tab-separated: its name, its sources (src/device/kernels/, space-separated, in order) and
// its compiler options (the contract's BuildOptions, then its -D defines). scripts/ptx-build.sh
// compiles each line to PTX; a build step, not a user command.
#include <fmt/format.h>

#include "device/runtime.h"

int main() {
  using namespace lockstep::device;
  for (const ProgramSpec& p : ProgramTable()) {
    fmt::print("{}\t{}\t{} {}\n", p.name, fmt::join(p.sources, " "), BuildOptions(), p.defines);
  }
}
