// The receipt envelope (docs/formats/receipt.md, "The file" and "The signature"): one file
// layout and one signature for every kind of receipt.
#include <fmt/format.h>

#include <string_view>
#include <vector>

#include "lockstep/json.h"

namespace lockstep {
namespace {

constexpr char kSignedPrefix[] = "lockstep/receipt/v1";

// The signed message: the prefix, a zero byte, and the BLAKE2b-256 of the receipt object's
// canonical text (compact, keys sorted: nlohmann::json's dump()).
std::vector<uint8_t> SignedMessage(const nlohmann::json& receipt) {
  const std::string canonical = receipt.dump();
  const Digest digest =
      Blake2b256({reinterpret_cast<const uint8_t*>(canonical.data()), canonical.size()});
  const std::string_view prefix = kSignedPrefix;
  std::vector<uint8_t> message(prefix.begin(), prefix.end());
  message.push_back(0);
  message.insert(message.end(), digest.begin(), digest.end());
  return message;
}

}  // namespace

std::string SealReceipt(const nlohmann::json& receipt, const Ed25519Seed* key) {
  nlohmann::json file = {{"receipt", receipt}};
  if (key != nullptr) {
    file["signature"] = {{"ed25519", ToHex(PublicKeyOf(*key))},
                         {"signature", ToHex(SignMessage(*key, SignedMessage(receipt)))}};
  }
  return file.dump(2) + "\n";
}

OpenedReceipt OpenReceipt(std::string_view text, std::string_view what,
                          const Ed25519PublicKey* trusted) {
  const nlohmann::json file = ParseJsonStrict(text, what);
  OpenedReceipt opened;
  if (file.is_object() && file.contains("signature")) {
    RequireKeys(file, {"receipt", "signature"}, what);
    const nlohmann::json& sig = file.at("signature");
    const std::string sig_what = fmt::format("{}: signature", what);
    RequireKeys(sig, {"ed25519", "signature"}, sig_what);
    const auto key =
        BytesFromHex<32>(StringField(sig, "ed25519", sig_what), sig_what + ": ed25519");
    const auto signature =
        BytesFromHex<64>(StringField(sig, "signature", sig_what), sig_what + ": signature");
    if (trusted != nullptr && key != *trusted) {
      Fail("{}: signed by key {}, not the trusted key {}", what, ToHex(key), ToHex(*trusted));
    }
    if (!VerifySignature(key, SignedMessage(file.at("receipt")), signature)) {
      Fail(
          "{}: the signature does not verify under its key {}: the receipt was changed after it "
          "was signed, or the signature is forged",
          what, ToHex(key));
    }
    opened.signer = key;
  } else {
    RequireKeys(file, {"receipt"}, what);
    if (trusted != nullptr) Fail("{}: the receipt is not signed (--trusted-key was given)", what);
  }
  opened.receipt = file.at("receipt");
  if (!opened.receipt.is_object()) Fail("{}: receipt is not a JSON object", what);
  return opened;
}

}  // namespace lockstep
