// Internal errors (include/lockstep/core.h): where the broken invariant is, relative to the
// source tree, so that the message reads the same on every build machine.
#include "lockstep/core.h"

namespace lockstep {

void FailInternal(std::string_view file, int line, const std::string& what) {
  for (const std::string_view root : {"/src/", "/tools/", "/include/"}) {
    if (const size_t at = file.rfind(root); at != std::string_view::npos) {
      file.remove_prefix(at + 1);
      break;
    }
  }
  throw InternalError(fmt::format(
      "internal error at {}:{}: {} (a bug in lockstep, not in its input: please report it)", file,
      line, what));
}

}  // namespace lockstep
