// Per-op traces of a step (docs/disputes.md): the recorder (an OpObserver on a replaying
// Trainer), the records.jsonl / trace.json format with its Merkle root, and its strict reader.
#include <fmt/format.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "lockstep/audit.h"
#include "lockstep/data.h"
#include "lockstep/dispute.h"
#include "lockstep/json.h"
#include "lockstep/train.h"

namespace lockstep::dispute {
namespace fs = std::filesystem;
using Json = nlohmann::json;

// ---- records ---------------------------------------------------------------------------------

double TraceRecord::Arg(std::string_view name) const {
  for (const auto& [key, value] : args) {
    if (key == name) return value;
  }
  Fail("trace record {} ({}): no argument '{}'", index, op, name);
}

namespace {

constexpr std::string_view kTraceFormat = "lockstep-trace";
constexpr uint64_t kTraceVersion = 2;  // 2: the norm recorded as block_squares (docs/disputes.md)

// An argument as JSON: integral values as integers, the others as the double they are.
Json ArgJson(double v) {
  if (std::isfinite(v) && v == std::trunc(v) && std::fabs(v) < 9007199254740992.0) {
    return Json(static_cast<int64_t>(v));
  }
  return Json(v);
}

Json TensorJson(std::string_view role, TensorView t) {
  return Json{{"role", role},
              {"dtype", DtypeName(t.dtype())},
              {"elements", t.elements()},
              {"blake2b", ToHex(Blake2b().Update(t.bytes()).Final())}};
}

// A dumped tensor, "input.<role>" or "output.<role>", in its own dtype.
struct DumpTensor {
  std::string name;
  HostTensor tensor;
};

class TraceRecorder final : public OpObserver {
 public:
  TraceRecorder(const fs::path& records, std::set<int64_t> dump_ops)
      : path_(records), dump_ops_(std::move(dump_ops)), file_(File::CreateExclusive(records)) {
  }

  void Context(uint64_t step, int64_t microbatch) override {
    step_ = step;
    microbatch_ = microbatch;
  }

  void Begin(std::string_view op, int64_t layer, std::span<const OpArg> args,
             std::span<const OpTensor> inputs) override {
    record_ = Json::object();
    record_["index"] = index_;
    record_["step"] = step_;
    record_["microbatch"] = microbatch_;
    record_["op"] = op;
    record_["layer"] = layer;
    Json a = Json::object();
    for (const OpArg& arg : args) a[std::string(arg.name)] = ArgJson(arg.value);
    record_["args"] = a;
    Json in = Json::array();
    for (const OpTensor& t : inputs) in.push_back(TensorJson(t.role, t.view));
    record_["inputs"] = in;
    if (dump_ops_.contains(index_)) {
      Dump& dump = dumps_[index_];
      dump.op = op;
      for (const OpTensor& t : inputs) {
        dump.tensors.push_back({"input." + std::string(t.role), HostTensor::Copy(t.view)});
      }
    }
  }

  void End(std::span<const OpOutput> outputs) override {
    Json out = Json::array();
    for (const OpOutput& t : outputs) out.push_back(TensorJson(t.role, t.view));
    record_["outputs"] = out;
    if (dump_ops_.contains(index_)) {
      Dump& dump = dumps_[index_];
      for (const OpOutput& t : outputs) {
        dump.tensors.push_back({"output." + std::string(t.role), HostTensor::Copy(t.view)});
      }
    }
    const std::string line = record_.dump();
    leaves_.push_back(LeafHash(line));
    pending_ += line;
    pending_ += '\n';
    if (pending_.size() >= kWriteBytes) {
      file_.Write(pending_);
      pending_.clear();
    }
    ++index_;
  }

  // Flushes and fsyncs records.jsonl; returns the leaves.
  const std::vector<Digest>& Finish() {
    file_.Write(pending_);
    pending_.clear();
    file_.Sync();
    file_.Close();
    return leaves_;
  }

  struct Dump {
    std::string op;
    std::vector<DumpTensor> tensors;
  };
  const std::map<int64_t, Dump>& dumps() const { return dumps_; }

 private:
  fs::path path_;
  std::set<int64_t> dump_ops_;
  static constexpr size_t kWriteBytes = size_t{1} << 20;  // records are written in ~1 MiB runs
  File file_;
  std::string pending_;
  uint64_t step_ = 0;
  int64_t microbatch_ = 0, index_ = 0;
  Json record_;
  std::vector<Digest> leaves_;
  std::map<int64_t, Dump> dumps_;
};

std::vector<OpTensorDigest> TensorsOf(const Json& list, const std::string& what) {
  if (!list.is_array()) Fail("{}: not an array", what);
  std::vector<OpTensorDigest> out;
  for (const Json& t : list) {
    RequireKeys(t, {"role", "dtype", "elements", "blake2b"}, what);
    OpTensorDigest d;
    d.role = StringField(t, "role", what);
    const std::string dtype = StringField(t, "dtype", what);
    const DtypeInfo* info = FindDtype(dtype);
    if (info == nullptr) Fail("{}: dtype '{}' is not a dtype lockstep knows", what, dtype);
    d.dtype = info->dtype;
    const uint64_t elements = U64Field(t, "elements", what);
    if (elements > (uint64_t{1} << 60)) Fail("{}: elements = {} is too large", what, elements);
    d.elements = static_cast<int64_t>(elements);
    d.blake2b = DigestField(t, "blake2b", what);
    out.push_back(std::move(d));
  }
  return out;
}

TraceRecord ParseRecord(const std::string& line, const std::string& what) {
  const Json j = ParseJsonStrict(line, what);
  // One text per record: the Merkle leaf is the line's bytes, so a record written otherwise (
  // spaces, another key order) would be another commitment to the same content.
  if (j.dump() != line) {
    Fail("{}: not in the canonical form lockstep writes (compact JSON, keys sorted: {})", what,
         ShownJson(j));
  }
  RequireKeys(j, {"index", "step", "microbatch", "op", "layer", "args", "inputs", "outputs"}, what);
  TraceRecord r;
  r.index = static_cast<int64_t>(U64Field(j, "index", what));
  r.step = U64Field(j, "step", what);
  for (const char* key : {"microbatch", "layer"}) {
    if (!j[key].is_number_integer()) Fail("{}: {} is not an integer", what, key);
  }
  r.microbatch = j["microbatch"].get<int64_t>();
  r.layer = j["layer"].get<int64_t>();
  r.op = StringField(j, "op", what);
  if (!j["args"].is_object()) Fail("{}: args is not an object", what);
  for (const auto& [key, value] : j["args"].items()) {
    if (!value.is_number()) Fail("{}: args.{} is not a number", what, key);
    r.args.emplace_back(key, value.get<double>());
  }
  r.inputs = TensorsOf(j["inputs"], what + " inputs");
  r.outputs = TensorsOf(j["outputs"], what + " outputs");
  // The record must be a call the op table describes (docs/disputes.md, "The op catalogue").
  const rk::OpSpec* spec = rk::FindOp(r.op);
  if (spec == nullptr) Fail("{}: op '{}' is not an op lockstep records", what, r.op);
  std::vector<std::string_view> names;
  for (const auto& [name, value] : r.args) names.push_back(name);
  const auto roles = [](const std::vector<OpTensorDigest>& tensors) {
    std::vector<rk::RoleAndDtype> out;
    for (const OpTensorDigest& t : tensors) {
      out.emplace_back(t.role, t.dtype);
    }
    return out;
  };
  if (!rk::CallFits(*spec, names, roles(r.inputs), roles(r.outputs))) {
    Fail("{}: the arguments or tensors of op '{}' are not those the op catalogue gives it "
         "(docs/disputes.md)",
         what, r.op);
  }
  r.line = line;
  return r;
}

void WriteHeader(const fs::path& path, const TraceHeader& h) {
  const Json j = {{"format", kTraceFormat},
                  {"format_version", kTraceVersion},
                  {"step", h.step},
                  {"checkpoint_step", h.checkpoint_step},
                  {"checkpoint_hash", ToHex(h.checkpoint_hash)},
                  {"state_hash", ToHex(h.state_hash)},
                  {"records", h.records},
                  {"merkle_root", ToHex(h.merkle_root)}};
  WriteFileSynced(path, j.dump(2) + "\n");
}

}  // namespace

Trace WriteTrace(const TraceOptions& o) {
  const CheckpointIndex start = OpenCheckpoint(o.checkpoint);
  if (o.step <= start.state.step) {
    Fail("--step {} is at or before the step of --checkpoint {} (step {}): a trace records a step "
         "replayed from an earlier checkpoint",
         o.step, o.checkpoint.string(), start.state.step);
  }
  CheckOutput({"--out", o.out}, OutputKind::kNewDirectory);  // absent or empty
  SetThreads(o.threads);
  const RunConfig config = audit::ConfigOfCheckpoint(start);
  const data::Dataset dataset = data::OpenDataset(o.data_dir);
  if (o.executor != nullptr) train::PlanDeviceMemory(config, {}, 1, 0, *o.executor);
  train::Trainer trainer(config, dataset, train::RunDescriptor(config, dataset));
  trainer.set_progress(o.progress);
  trainer.set_faults(o.faults);
  trainer.set_executor(o.executor);
  trainer.Restore(start);
  const Digest checkpoint_hash = trainer.hash();
  while (trainer.state().step + 1 < o.step) trainer.Step();

  fs::create_directories(o.out);
  TraceRecorder recorder(o.out / "records.jsonl", o.dump_ops);
  trainer.set_observer(&recorder);
  trainer.Step();
  trainer.set_observer(nullptr);
  const std::vector<Digest>& leaves = recorder.Finish();

  Trace trace;
  trace.dir = o.out;
  trace.header = {o.step, start.state.step, checkpoint_hash, trainer.hash(),
                  static_cast<int64_t>(leaves.size()), MerkleRoot(leaves)};
  for (const int64_t k : o.dump_ops) {
    const auto dump = recorder.dumps().find(k);
    if (dump == recorder.dumps().end()) {
      Fail("--dump-op {}: step {} has {} ops (0 .. {})", k, o.step, leaves.size(),
           leaves.size() - 1);
    }
    std::vector<NamedTensor> tensors;
    std::map<std::string, std::string> metadata = {
        {"op", dump->second.op}, {"index", std::to_string(k)}, {"step", std::to_string(o.step)}};
    for (const DumpTensor& t : dump->second.tensors) {
      tensors.push_back({t.name, {t.tensor.elements()}, t.tensor.view()});
    }
    WriteSafetensors(o.out / fmt::format("op_{}.safetensors", k), tensors, metadata);
  }
  WriteHeader(o.out / "trace.json", trace.header);
  return ReadTrace(o.out);
}

Trace ReadTrace(const fs::path& dir) {
  const std::string header_what = (dir / "trace.json").string();
  const Json h = ParseJsonStrict(ReadFileText(dir / "trace.json"), header_what);
  RequireKeys(h,
              {"format", "format_version", "step", "checkpoint_step", "checkpoint_hash",
               "state_hash", "records", "merkle_root"},
              header_what);
  RequireFormat(h, kTraceFormat, kTraceVersion, header_what);
  Trace trace;
  trace.dir = dir;
  trace.header.step = U64Field(h, "step", header_what);
  trace.header.checkpoint_step = U64Field(h, "checkpoint_step", header_what);
  trace.header.checkpoint_hash = DigestField(h, "checkpoint_hash", header_what);
  trace.header.state_hash = DigestField(h, "state_hash", header_what);
  trace.header.records = static_cast<int64_t>(U64Field(h, "records", header_what));
  trace.header.merkle_root = DigestField(h, "merkle_root", header_what);

  const fs::path records = dir / "records.jsonl";
  const std::string text = ReadFileText(records);
  std::vector<Digest> leaves;
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = text.find('\n', at);
    const std::string what = fmt::format("{}: line {}", records.string(), leaves.size() + 1);
    if (end == std::string::npos) Fail("{}: the last line has no newline (cut short?)", what);
    TraceRecord r = ParseRecord(text.substr(at, end - at), what);
    if (r.index != static_cast<int64_t>(leaves.size()) || r.step != trace.header.step) {
      Fail("{}: index {} of step {} (expected index {} of step {})", what, r.index, r.step,
           leaves.size(), trace.header.step);
    }
    leaves.push_back(LeafHash(r.line));
    trace.records.push_back(std::move(r));
    at = end + 1;
  }
  if (leaves.empty())
    Fail("{}: no records (a traced step records every op it runs)", records.string());
  if (static_cast<int64_t>(leaves.size()) != trace.header.records) {
    Fail("{}: {} records, trace.json says {}", records.string(), leaves.size(),
         trace.header.records);
  }
  const Digest root = MerkleRoot(leaves);
  if (root != trace.header.merkle_root) {
    Fail("{}: the records' Merkle root is {}, trace.json commits to {}", records.string(),
         ToHex(root), ToHex(trace.header.merkle_root));
  }
  return trace;
}

}  // namespace lockstep::dispute
