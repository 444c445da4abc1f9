// Signed commitments (docs/formats/signatures.md): signing key files and signatures.jsonl, its
// strict reader, signature and root checks, and equivocation between two signed histories.
#include "lockstep/state.h"
#include "state/internal.h"

namespace lockstep {
namespace fs = std::filesystem;
using state_internal::Json;

namespace {

constexpr std::string_view kKeyFormat = "lockstep-signing-key";
constexpr std::string_view kPublicKeyFormat = "lockstep-public-key";
constexpr uint64_t kKeyVersion = 1;
constexpr uint64_t kMaxKeyFileBytes = 4096;  // a key file lockstep writes is about 150 bytes

std::vector<uint8_t> Message(std::string_view tag, uint64_t n, const Digest& digest) {
  std::vector<uint8_t> m(tag.begin(), tag.end());
  m.push_back(0);
  for (int i = 0; i < 8; ++i) m.push_back(static_cast<uint8_t>(n >> (8 * i)));
  m.insert(m.end(), digest.begin(), digest.end());
  return m;
}

template <size_t N>
std::array<uint8_t, N> HexField(const Json& object, const char* key, std::string_view what) {
  if (!object[key].is_string()) Fail("{}: {} is not a string", what, key);
  return BytesFromHex<N>(object[key].get<std::string>(), fmt::format("{}: {}", what, key));
}

}  // namespace

void WriteSigningKey(const fs::path& key_path, const Ed25519Seed& seed) {
  fs::path pub_path = key_path;
  pub_path += ".pub";
  CheckOutput({"--out", key_path}, OutputKind::kNewFile);
  CheckOutput({"KEY.pub", pub_path}, OutputKind::kNewFile);
  const std::string secret =
      Json{{"format", kKeyFormat}, {"format_version", kKeyVersion}, {"ed25519_seed", ToHex(seed)}}
          .dump(2) +
      "\n";
  // Both written whole under staging names before either takes its name, the secret made 0600
  // in one step (never readable by others, even briefly): a full disk leaves neither file, and
  // an existing file, or one that appears meanwhile, is never replaced.
  StagedFile key(key_path, OutputKind::kNewFile, 0600);
  key.file().Write(secret);
  StagedFile pub(pub_path, OutputKind::kNewFile);
  pub.file().Write(PublicKeyJson(PublicKeyOf(seed)));
  key.Commit();
  try {
    pub.Commit();
  } catch (const Error&) {
    std::error_code ignored;
    fs::remove(key_path, ignored);  // the key this call just made, useless without its .pub
    throw;
  }
}

std::string PublicKeyJson(const Ed25519PublicKey& key) {
  return Json{{"format", kPublicKeyFormat}, {"format_version", kKeyVersion}, {"ed25519", ToHex(key)}}
             .dump(2) +
         "\n";
}

Ed25519Seed ReadSigningKey(const fs::path& key_path) {
  const std::string what = key_path.string();
  const Json j = ParseJsonStrict(ReadFileText(key_path, kMaxKeyFileBytes, "a key file"), what);
  RequireKeys(j, {"format", "format_version", "ed25519_seed"}, what);
  RequireFormat(j, kKeyFormat, kKeyVersion, what);
  return HexField<32>(j, "ed25519_seed", what);
}

Ed25519PublicKey ReadPublicKey(const fs::path& pub_path) {
  const std::string what = pub_path.string();
  const Json j = ParseJsonStrict(ReadFileText(pub_path, kMaxKeyFileBytes, "a key file"), what);
  RequireKeys(j, {"format", "format_version", "ed25519"}, what);
  RequireFormat(j, kPublicKeyFormat, kKeyVersion, what);
  return HexField<32>(j, "ed25519", what);
}

std::vector<uint8_t> ChainLineMessage(uint64_t step, const Digest& hash) {
  return Message("lockstep/chain-line/v1", step, hash);
}

std::vector<uint8_t> ChainRootMessage(uint64_t steps, const Digest& root) {
  return Message("lockstep/chain-root/v1", steps, root);
}

Digest ChainRoot(std::span<const SignedLine> lines) {
  std::vector<Digest> leaves;
  for (const SignedLine& line : lines) {
    std::array<char, 8 + sizeof(Digest)> bytes;  // u64(step) || hash
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(line.step >> (8 * i));
    std::memcpy(bytes.data() + 8, line.hash.data(), line.hash.size());
    leaves.push_back(LeafHash({bytes.data(), bytes.size()}));
  }
  return MerkleRoot(leaves);
}

void StartSignedChain(const fs::path& path, const Ed25519PublicKey& key) {
  WriteFileSynced(path, Json{{"kind", "key"}, {"ed25519", ToHex(key)}}.dump() + "\n");
}

void AppendSignedLine(const fs::path& path, const SignedLine& line) {
  AppendFileSynced(path, Json{{"kind", "line"},
                              {"step", line.step},
                              {"hash", ToHex(line.hash)},
                              {"signature", ToHex(line.signature)}}
                                 .dump() +
                             "\n");
}

void AppendSignedRoot(const fs::path& path, const SignedRoot& root) {
  AppendFileSynced(path, Json{{"kind", "root"},
                              {"steps", root.steps},
                              {"root", ToHex(root.root)},
                              {"signature", ToHex(root.signature)}}
                                 .dump() +
                             "\n");
}

SignedChain ReadSignedChain(const fs::path& path, TornLine torn) {
  std::string text = ReadFileText(path);
  if (torn == TornLine::kDrop && !text.empty() && text.back() != '\n') {
    const size_t last = text.rfind('\n');
    if (last == std::string::npos) Fail("{}: its key line is torn (no newline)", path.string());
    text.resize(last + 1);
  }
  SignedChain chain;
  size_t begin = 0;
  for (size_t number = 1; begin < text.size(); ++number) {
    const std::string what = fmt::format("{}: line {}", path.string(), number);
    const size_t end = text.find('\n', begin);
    if (end == std::string::npos) Fail("{}: no final newline (a torn append?)", what);
    const Json j = ParseJsonStrict(std::string_view(text).substr(begin, end - begin), what);
    begin = end + 1;
    const std::string kind = j.is_object() && j.contains("kind") && j["kind"].is_string()
                                 ? j["kind"].get<std::string>()
                                 : "";
    if (number == 1) {
      if (kind != "key") Fail("{}: the first line must be the key (\"kind\": \"key\")", what);
      RequireKeys(j, {"kind", "ed25519"}, what);
      chain.key = HexField<32>(j, "ed25519", what);
    } else if (kind == "line") {
      RequireKeys(j, {"kind", "step", "hash", "signature"}, what);
      const SignedLine line{U64Field(j, "step", what), DigestField(j, "hash", what),
                            HexField<64>(j, "signature", what)};
      if (line.step != chain.lines.size()) {
        Fail("{}: step {} where step {} comes next (signed lines are consecutive from 0)", what,
             line.step, chain.lines.size());
      }
      chain.lines.push_back(line);
    } else if (kind == "root") {
      RequireKeys(j, {"kind", "steps", "root", "signature"}, what);
      const SignedRoot root{U64Field(j, "steps", what), DigestField(j, "root", what),
                            HexField<64>(j, "signature", what)};
      if (root.steps == 0 || root.steps > chain.lines.size()) {
        Fail("{}: a root over {} steps, but {} lines are signed before it", what, root.steps,
             chain.lines.size());
      }
      chain.roots.push_back(root);
    } else {
      Fail("{}: kind '{}' (expected key, line or root)", what, kind);
    }
  }
  if (text.empty()) Fail("{}: empty (no key line)", path.string());
  return chain;
}

std::vector<std::string> VerifySignedChain(const SignedChain& chain,
                                           const Ed25519PublicKey* trusted) {
  std::vector<std::string> problems;
  if (trusted != nullptr && chain.key != *trusted) {
    problems.push_back(fmt::format("signed with key {}, not the trusted key {}", ToHex(chain.key),
                                   ToHex(*trusted)));
  }
  for (const SignedLine& line : chain.lines) {
    if (!VerifySignature(chain.key, ChainLineMessage(line.step, line.hash), line.signature)) {
      problems.push_back(fmt::format("step {}: the signature of hash {} does not verify",
                                     line.step, ToHex(line.hash)));
    }
  }
  for (const SignedRoot& root : chain.roots) {
    if (!VerifySignature(chain.key, ChainRootMessage(root.steps, root.root), root.signature)) {
      problems.push_back(fmt::format("root over steps 0..{}: the signature does not verify",
                                     root.steps - 1));
    }
    const Digest lines_root = ChainRoot(std::span(chain.lines).first(root.steps));
    if (lines_root != root.root) {
      problems.push_back(fmt::format("root over steps 0..{}: signed {}, the signed lines give {}",
                                     root.steps - 1, ToHex(root.root), ToHex(lines_root)));
    }
  }
  return problems;
}

std::optional<std::string> FindEquivocation(const SignedChain& a, const SignedChain& b) {
  const size_t common = std::min(a.lines.size(), b.lines.size());
  for (size_t s = 0; s < common; ++s) {
    if (a.lines[s].hash != b.lines[s].hash) {
      return fmt::format("equivocation at step {}: the key signed both {} and {}", s,
                         ToHex(a.lines[s].hash), ToHex(b.lines[s].hash));
    }
  }
  // A root one history signed that the other's lines do not reproduce (the other history may
  // hold fewer lines than the root covers).
  for (const auto& [signer, other] : {std::pair{&a, &b}, std::pair{&b, &a}}) {
    for (const SignedRoot& root : signer->roots) {
      if (root.steps > other->lines.size()) continue;
      if (ChainRoot(std::span(other->lines).first(root.steps)) != root.root) {
        return fmt::format("equivocation: a signed root over steps 0..{} does not match the other "
                           "history's lines",
                           root.steps - 1);
      }
    }
  }
  return std::nullopt;
}

std::vector<Ed25519PublicKey> ParseTrustedKeys(std::string_view text, const std::string& source) {
  std::vector<Ed25519PublicKey> keys;
  const std::vector<std::string> lines = Lines(text);
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string line = lines[i];
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.empty() || line.starts_with('#')) continue;
    keys.push_back(BytesFromHex<32>(
        line, fmt::format("{}: line {} (a key is 64 lowercase hex digits: the \"ed25519\" value "
                          "of a KEY.pub)",
                          source, i + 1)));
  }
  if (keys.empty()) Fail("{}: no key (one 64-hex Ed25519 public key per line)", source);
  return keys;
}

}  // namespace lockstep
