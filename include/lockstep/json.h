// The one JSON reader for everything lockstep reads from disk or the network (docs/architecture.md,
// "Lessons that became tests": hostile JSON), and the checked fields every format's reader is made
// of: each failure names the file (`what`), the field and the value. nlohmann::json parses without
// a depth bound and serialises recursively, and its iterator input stops at nothing a C string
// would not: so the text is checked first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "lockstep/core.h"

namespace lockstep {

// Deeper nesting is refused before parsing (no lockstep format nests beyond 4).
inline constexpr int kMaxJsonDepth = 64;
// Larger JSON texts are refused (the largest lockstep writes, a safetensors header of a big
// model, is a few MiB).
inline constexpr size_t kMaxJsonBytes = size_t{64} << 20;

// Parses `text` strictly: no NUL byte, at most kMaxJsonBytes, nesting at most kMaxJsonDepth,
// no duplicate object keys (parsers disagree on which duplicate wins, and an audited file must
// mean one thing to every reader), nothing after the value but whitespace. Every failure is an
// Error naming `what` and the problem.
nlohmann::json ParseJsonStrict(std::string_view text, std::string_view what);

// A value as an error message shows it: its JSON text, cut to at most 80 characters.
std::string ShownJson(const nlohmann::json& value);

// Fails unless `value` is an object whose keys are exactly `keys`.
void RequireKeys(const nlohmann::json& value, std::initializer_list<std::string_view> keys,
                 std::string_view what);
// Typed fields of an object already checked by RequireKeys.
uint64_t U64Field(const nlohmann::json& object, const char* key, std::string_view what);
std::string StringField(const nlohmann::json& object, const char* key, std::string_view what);
Digest DigestField(const nlohmann::json& object, const char* key, std::string_view what);
// Fails unless the object's "format" is `format` and its "format_version" is `version` (the
// only version this build reads).
void RequireFormat(const nlohmann::json& object, std::string_view format, uint64_t version,
                   std::string_view what);
// A JSON value as an unsigned 64-bit integer; `what` names it (e.g. "file: field").
uint64_t AsU64(const nlohmann::json& value, std::string_view what);

// ---- the receipt envelope (docs/formats/receipt.md) ------------------------------------------
// A receipt file is {"receipt": R} or, signed, {"receipt": R, "signature": {"ed25519": KEY,
// "signature": SIG}}: Ed25519 over "lockstep/receipt/v1" \0 BLAKE2b-256(R's canonical text).
// One envelope for every kind of receipt (generation, audit).
// Every kind's receipt object has "format": kReceiptFormat and a "format_version":
// kReceiptFormatVersion for generation receipts, kAuditReceiptFormatVersion (lockstep/kit.h)
// for audit receipts.
inline constexpr char kReceiptFormat[] = "lockstep-receipt";
inline constexpr uint64_t kReceiptFormatVersion = 1;
// The file's text (indented JSON and a newline), signed with `key` when it is not null.
std::string SealReceipt(const nlohmann::json& receipt, const Ed25519Seed* key);
struct OpenedReceipt {
  nlohmann::json receipt;                  // an object; its fields are the kind's to check
  std::optional<Ed25519PublicKey> signer;  // set when signed (the signature verified)
};
// Parses the file's text strictly; a signature present must verify under its key; with `trusted`,
// the receipt must be signed by that key. Fails (Error naming `what`) otherwise.
OpenedReceipt OpenReceipt(std::string_view text, std::string_view what,
                          const Ed25519PublicKey* trusted);

}  // namespace lockstep
