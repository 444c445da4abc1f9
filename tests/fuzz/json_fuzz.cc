#include "core/json.h"
#include "fuzz/fuzz_target.h"

LOCKSTEP_FUZZ_TARGET((void)lockstep::ParseJsonStrict(text, "fuzz"))
