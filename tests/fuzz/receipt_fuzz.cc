#include "fuzz/fuzz_target.h"
#include "lockstep/json.h"

// The receipt envelope of every kind (docs/formats/receipt.md): strict JSON, the signature's
// form, Ed25519 verification of whatever key and signature the input holds.
LOCKSTEP_FUZZ_TARGET((void)lockstep::OpenReceipt(text, "fuzz", nullptr))
