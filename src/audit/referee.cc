// The referee (docs/disputes.md): one op of a disputed step recomputed from the inputs both
// parties agree on, with the reference kernels at one thread; its time and memory are one op's.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "lockstep/dispute.h"
#include "lockstep/kernels.h"
#include "lockstep/state.h"

namespace lockstep::dispute {
namespace fs = std::filesystem;

namespace {

// An op's tensors by role, in their dtypes (rk::OpValues), and their digests.
using OpData = rk::OpValues;

// Whether `data` has tensor t.role in t's dtype.
bool HasTensor(const OpData& data, const OpTensorDigest& t) {
  const auto it = data.tensors.find(t.role);
  return it != data.tensors.end() && it->second.dtype() == t.dtype;
}

Digest DigestOf(const OpData& data, const OpTensorDigest& t) {
  if (!HasTensor(data, t)) Fail("the op has no {} tensor '{}'", DtypeName(t.dtype), t.role);
  return Blake2b().Update(data.tensors.find(t.role)->second.view().bytes()).Final();
}

// The tensors of one side ("input" or "output") of a party's dump of op `record` (trace
// --dump-op). Every tensor of the dump, of either side, must be one of the record's, in the
// record's dtype: a dump holds nothing the party did not commit to.
OpData ReadDump(const fs::path& path, std::string_view side, const TraceRecord& record) {
  const SafetensorsFile file = ReadSafetensors(path, SafetensorsDtypes::kAny);
  for (const auto& [key, value] : file.metadata()) {
    if (key.starts_with("dtype.")) {
      Fail(
          "{}: __metadata__ has '{}': a dump of an earlier lockstep, which stored every tensor "
          "as F32 words; make the dump again with this build's trace --dump-op",
          path.string(), key);
    }
  }
  const auto index = file.metadata().find("index");
  if (index == file.metadata().end() || index->second != std::to_string(record.index)) {
    Fail("{}: the dump of op {}, not of --op {}", path.string(),
         index == file.metadata().end() ? "?" : index->second, record.index);
  }
  OpData data;
  for (const NamedTensor& t : file.tensors()) {
    const bool input = t.name.starts_with("input.");
    if (!input && !t.name.starts_with("output.")) {
      Fail("{}: tensor '{}' is neither an input.* nor an output.* of the op", path.string(),
           t.name);
    }
    const std::vector<OpTensorDigest>& listed = input ? record.inputs : record.outputs;
    const std::string role = t.name.substr(t.name.find('.') + 1);
    const auto it = std::ranges::find(listed, role, &OpTensorDigest::role);
    if (it == listed.end()) {
      std::string roles;
      for (const OpTensorDigest& l : listed) roles += (roles.empty() ? "" : ", ") + l.role;
      Fail(
          "{}: tensor '{}' is not one of record {}'s {} ({}): a dump holds only the record's "
          "tensors",
          path.string(), t.name, record.index, input ? "inputs" : "outputs", roles);
    }
    if (t.data.dtype() != it->dtype) {
      Fail("{}: tensor '{}' is {} (the record's is {})", path.string(), t.name,
           InfoOf(t.data.dtype()).safetensors, DtypeName(it->dtype));
    }
    if (!t.name.starts_with(std::string(side) + ".")) continue;
    data.tensors[role] = HostTensor::Copy(t.data);
  }
  return data;
}

// The op of record r on `in`, with the kernels of the op table: every output of the record
// (`other`: the other party's record of the same op).
OpData Recompute(const TraceRecord& r, const TraceRecord& other, OpData in) {
  const rk::OpSpec* spec = rk::FindOp(r.op);
  if (spec == nullptr) Fail("referee: op '{}' (record {}) is not an op lockstep records", r.op, r.index);
  for (const auto& [name, value] : r.args) in.args[name] = value;
  // No output larger than the largest either party committed to (neither could match it).
  in.allocation_limit = 0;
  for (const TraceRecord* record : {&r, &other}) {
    for (const OpTensorDigest& t : record->outputs) {
      in.allocation_limit = std::max(in.allocation_limit, t.elements);
    }
  }
  OpData out;
  try {
    spec->run(in, out);
  } catch (const Error& e) {
    Fail("record {} ({}): its arguments and revealed inputs cannot be recomputed: {}", r.index,
         r.op, e.what());
  }
  return out;
}

// Whether `data` holds exactly the tensors of `expected`, each with its digest (an extra tensor
// is not what the record committed to, and as an input it could change what the op computes).
bool SameDigests(const OpData& data, const std::vector<OpTensorDigest>& expected) {
  if (data.tensors.size() != expected.size()) return false;
  for (const OpTensorDigest& t : expected) {
    if (!HasTensor(data, t) || DigestOf(data, t) != t.blake2b) return false;
  }
  return true;
}

}  // namespace

int RefereeVerdict::ExitCode() const {
  if (winner == "a") return 0;
  if (winner == "b") return 1;
  return winner == "neither" ? 3 : 4;
}

RefereeVerdict Referee(const RefereeOptions& o) {
  const Trace a = ReadTrace(o.trace_a), b = ReadTrace(o.trace_b);
  if (o.op < 0 || o.op >= static_cast<int64_t>(std::min(a.records.size(), b.records.size()))) {
    Fail("--op {}: the traces have {} and {} records", o.op, a.records.size(), b.records.size());
  }
  const TraceRecord& ra = a.records[static_cast<size_t>(o.op)];
  const TraceRecord& rb = b.records[static_cast<size_t>(o.op)];
  if (a.header.step != b.header.step || ra.op != rb.op || ra.layer != rb.layer ||
      ra.microbatch != rb.microbatch || ra.args != rb.args) {
    Fail("record {} is not the same op in both traces: {} vs {}", o.op, ra.line, rb.line);
  }
  if (ra.inputs.size() != rb.inputs.size() ||
      !std::equal(ra.inputs.begin(), ra.inputs.end(), rb.inputs.begin(),
                  [](const OpTensorDigest& x, const OpTensorDigest& y) {
                    return x.role == y.role && x.dtype == y.dtype && x.elements == y.elements &&
                           x.blake2b == y.blake2b;
                  })) {
    Fail("record {} ({}): the parties' inputs differ, so it is not the op to referee (dispute ops "
         "names the first record whose inputs agree and outputs differ)",
         o.op, ra.op);
  }
  // The agreed inputs, from whichever party revealed them faithfully.
  std::optional<OpData> inputs;
  for (const auto& [dump, record] : {std::pair{o.dump_a, &ra}, std::pair{o.dump_b, &rb}}) {
    OpData revealed = ReadDump(dump, "input", *record);
    if (SameDigests(revealed, ra.inputs)) {
      inputs = std::move(revealed);
      break;
    }
  }
  if (!inputs) {
    Fail("neither {} nor {} holds inputs that hash to the agreed digests of record {}",
         o.dump_a.string(), o.dump_b.string(), o.op);
  }
  const rk::Isa saved_isa = rk::ActiveIsa();
  const int saved_threads = Threads();
  rk::SetIsa(rk::ReferenceIsa());
  SetThreads(1);
  const OpData recomputed = Recompute(ra, rb, std::move(*inputs));
  rk::SetIsa(saved_isa);
  SetThreads(saved_threads);

  nlohmann::json j = {{"op", ra.op},
                      {"index", o.op},
                      {"step", ra.step},
                      {"layer", ra.layer},
                      {"microbatch", ra.microbatch}};
  nlohmann::json recomputed_digests = nlohmann::json::object();
  for (const OpTensorDigest& t : ra.outputs)
    recomputed_digests[t.role] = ToHex(DigestOf(recomputed, t));
  j["recomputed"] = recomputed_digests;
  // A party is right when its committed outputs equal the recomputation; a party whose dump
  // does not match its own record has not revealed what it committed to.
  auto judge = [&](const TraceRecord& r, const fs::path& dump, const char* name) {
    const bool revealed = SameDigests(ReadDump(dump, "output", r), r.outputs);
    const bool right = SameDigests(recomputed, r.outputs);
    j[name] = {{"revealed_matches_record", revealed}, {"outputs_match_recomputation", right}};
    return right && revealed;
  };
  const bool a_right = judge(ra, o.dump_a, "a");
  const bool b_right = judge(rb, o.dump_b, "b");
  RefereeVerdict v;
  v.winner = a_right && b_right ? "both" : a_right ? "a" : b_right ? "b" : "neither";
  j["verdict"] = v.winner;
  v.json = j.dump(2);
  return v;
}

}  // namespace lockstep::dispute
