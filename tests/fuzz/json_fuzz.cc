#include "fuzz/fuzz_target.h"
#include "lockstep/json.h"

LOCKSTEP_FUZZ_TARGET((void)lockstep::ParseJsonStrict(text, "fuzz"))
