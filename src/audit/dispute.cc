// Finding where two parties part: the first divergent step of two chains (bisecting where a
// party committed only some steps) and the first divergent op of two traces (docs/disputes.md).
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <set>

#include "lockstep/dispute.h"
#include "lockstep/state.h"

namespace lockstep::dispute {
namespace fs = std::filesystem;
using Json = nlohmann::json;

std::map<uint64_t, Digest> ReadChain(const fs::path& path) {
  std::map<uint64_t, Digest> chain;
  if (fs::is_directory(path) && fs::exists(path / "trajectory.json") &&
      !fs::exists(RunLayout{path}.hashes())) {
    // A kit: the hashes its units commit to (the init's step 0 and each interval's end).
    for (const kit::Unit& unit : kit::ReadTrajectory(path).units) {
      chain[unit.until_step] = unit.expected_hash;
    }
    return chain;
  }
  const fs::path file = fs::is_directory(path) ? RunLayout{path}.hashes() : path;
  if (!fs::exists(file)) {
    Fail("{}: neither a state_hashes.jsonl, a run directory holding one, nor a kit", path.string());
  }
  for (const StateHashLine& line : ReadStateHashLines(file)) chain[line.step] = line.hash;
  return chain;
}

std::string StepsVerdict::Json() const {
  nlohmann::json j = {{"diverged", diverged}, {"queries", queries}};
  if (diverged) {
    j["first_divergent_step"] = first_divergent;
    j["first_differing_committed_step"] = first_differing;
    j["last_agreed_step"] = agreed ? nlohmann::json(last_agreed) : nlohmann::json(nullptr);
    j["located"] = located;
  }
  return j.dump(2);
}

StepsVerdict DisputeSteps(const std::map<uint64_t, Digest>& a, const std::map<uint64_t, Digest>& b,
                          const AskHash& ask) {
  // Chains that share no step say nothing about each other: "no divergence" would be a vacuous
  // verdict.
  if (a.empty() || b.empty()) {
    Fail("dispute steps: chain {} holds no step: there is nothing to compare", a.empty() ? "A" : "B");
  }
  StepsVerdict v;
  for (const auto& [step, hash] : a) {
    const auto other = b.find(step);
    if (other == b.end()) continue;
    if (other->second == hash) {
      v.agreed = true;
      v.last_agreed = step;
      continue;
    }
    v.diverged = true;
    v.first_differing = step;
    break;
  }
  if (!v.agreed && !v.diverged) {
    Fail("dispute steps: the chains have no step in common (A holds steps {} to {}, B {} to {}): "
         "there is nothing to compare",
         a.begin()->first, a.rbegin()->first, b.begin()->first, b.rbegin()->first);
  }
  if (!v.diverged) return v;
  // The first divergent step lies in (last_agreed, first_differing]: bisect, asking a party for
  // a hash it did not commit.
  auto hash_at = [&](int party, uint64_t step) -> std::optional<Digest> {
    const auto& chain = party == 0 ? a : b;
    if (const auto it = chain.find(step); it != chain.end()) return it->second;
    if (!ask) return std::nullopt;
    ++v.queries;
    return ask(party, step);
  };
  v.first_divergent = v.first_differing;
  v.located = true;
  if (!v.agreed) {
    // No common step agrees: the chains part at step 0 or between it and the first common step.
    if (v.first_differing == 0) return v;
    const auto ha = hash_at(0, 0), hb = hash_at(1, 0);
    if (!ha || !hb || *ha != *hb) {
      v.located = ha && hb;
      if (v.located) v.first_divergent = 0;
      return v;
    }
    v.agreed = true;
    v.last_agreed = 0;
  }
  uint64_t lo = v.last_agreed, hi = v.first_differing;
  while (hi > lo + 1) {
    const uint64_t mid = lo + (hi - lo) / 2;
    const auto ha = hash_at(0, mid), hb = hash_at(1, mid);
    if (!ha || !hb) {
      v.located = false;
      break;
    }
    (*ha == *hb ? lo : hi) = mid;
  }
  v.last_agreed = lo;
  v.first_divergent = hi;
  return v;
}

std::string OpsVerdict::Json() const {
  static constexpr const char* kKinds[] = {"identical", "outputs", "inputs",
                                           "different_computations", "headers"};
  nlohmann::json j = {{"verdict", kKinds[static_cast<int>(kind)]}};
  if (kind != Kind::kIdentical) {
    j["index"] = index;
    j["record"] = what;
    nlohmann::json diffs = nlohmann::json::array();
    for (const auto& [role, da, db] : differing) diffs.push_back({{"role", role}, {"a", da}, {"b", db}});
    j["differing"] = diffs;
  }
  return j.dump(2);
}

namespace {

std::string Describe(const TraceRecord& r) {
  return fmt::format("op {} '{}' of step {}, layer {}, microbatch {}", r.index, r.op, r.step,
                     r.layer, r.microbatch);
}

// The tensors of two records that differ, by role (a missing role shows as "-").
std::vector<std::tuple<std::string, std::string, std::string>> Differing(
    const std::vector<OpTensorDigest>& a, const std::vector<OpTensorDigest>& b) {
  std::vector<std::tuple<std::string, std::string, std::string>> out;
  std::set<std::string> roles;
  for (const auto* list : {&a, &b}) {
    for (const OpTensorDigest& t : *list) roles.insert(t.role);
  }
  auto find = [](const std::vector<OpTensorDigest>& list, const std::string& role) {
    for (const OpTensorDigest& t : list) {
      if (t.role == role)
        return fmt::format("{}[{}] {}", DtypeName(t.dtype), t.elements, ToHex(t.blake2b));
    }
    return std::string("-");
  };
  for (const std::string& role : roles) {
    const std::string da = find(a, role), db = find(b, role);
    if (da != db) out.emplace_back(role, da, db);
  }
  return out;
}

}  // namespace

OpsVerdict DisputeOps(const Trace& a, const Trace& b) {
  if (a.header.step != b.header.step) {
    Fail("{} traces step {}, {} step {}: compare traces of the same step", a.dir.string(),
         a.header.step, b.dir.string(), b.header.step);
  }
  OpsVerdict v;
  const size_t n = std::min(a.records.size(), b.records.size());
  for (size_t k = 0; k < n; ++k) {
    const TraceRecord& ra = a.records[k];
    const TraceRecord& rb = b.records[k];
    v.index = static_cast<int64_t>(k);
    v.what = Describe(ra);
    if (ra.op != rb.op || ra.layer != rb.layer || ra.microbatch != rb.microbatch ||
        ra.args != rb.args) {
      v.kind = OpsVerdict::Kind::kDifferentComputations;
      v.differing = {{"record", Describe(ra), Describe(rb)}};
      return v;
    }
    v.differing = Differing(ra.inputs, rb.inputs);
    if (!v.differing.empty()) {
      v.kind = OpsVerdict::Kind::kInputs;
      return v;
    }
    v.differing = Differing(ra.outputs, rb.outputs);
    if (!v.differing.empty()) {
      v.kind = OpsVerdict::Kind::kOutputs;
      return v;
    }
  }
  if (a.records.size() != b.records.size()) {
    v.kind = OpsVerdict::Kind::kDifferentComputations;
    v.index = static_cast<int64_t>(n);
    v.what = "the end of the shorter trace";
    v.differing = {{"records", std::to_string(a.records.size()), std::to_string(b.records.size())}};
    return v;
  }
  // Every record agrees: so must what the traces commit to around them, the state each started
  // from and the state each says the step left.
  v = OpsVerdict{};
  const TraceHeader &ha = a.header, &hb = b.header;
  if (ha.checkpoint_step != hb.checkpoint_step) {
    v.differing.emplace_back("checkpoint_step", std::to_string(ha.checkpoint_step),
                             std::to_string(hb.checkpoint_step));
  }
  for (const auto& [name, da, db] :
       {std::tuple{"checkpoint_hash", ha.checkpoint_hash, hb.checkpoint_hash},
        std::tuple{"state_hash", ha.state_hash, hb.state_hash}}) {
    if (da != db) v.differing.emplace_back(name, ToHex(da), ToHex(db));
  }
  if (!v.differing.empty()) {
    v.kind = OpsVerdict::Kind::kHeaders;
    v.index = static_cast<int64_t>(n);
    v.what = "trace.json: every record agrees, the traces' headers do not";
  }
  return v;
}

}  // namespace lockstep::dispute
