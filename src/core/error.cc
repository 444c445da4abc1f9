// Error is header-only; this unit anchors the core library's error vocabulary.
#include "lockstep/core.h"
