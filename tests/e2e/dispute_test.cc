// Disputes end to end (docs/disputes.md): a party with a one-ulp fault in one op is found at the
// right step and op, and the referee names the honest party whichever side it is on; faults in
// the forward, the backward, the update and the data are each localised to their record; a
// sparse chain is bisected in log2(k) questions.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/run_lockstep.h"
#include "lockstep/core.h"
#include "lockstep/dispute.h"
#include "lockstep/state.h"

namespace lockstep {
namespace {
namespace fs = std::filesystem;
using Json = nlohmann::json;
using test::Lockstep;
using test::Result;

class Dispute : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("lockstep_dispute_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    Result r = Lockstep("data synth --out " + Path("data") + " --seed 7 --tokens 200000");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // The honest party A: tiny, 16 steps, checkpoints at 0, 10 and 16.
    r = Lockstep("train --config tiny --data " + Path("data") + " --out " + Path("A") +
                 " --steps 16 --no-progress");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = Lockstep(TraceArgs("A", "TA", 7));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::string Path(const std::string& name) { return (dir_ / name).string(); }
  static std::string TraceArgs(const std::string& run, const std::string& out, int64_t step,
                               int64_t dump = -1) {
    return "trace --checkpoint " + Path(run) + "/checkpoints/step_000000000 --data " +
           Path("data") + " --step " + std::to_string(step) + " --out " + Path(out) +
           " --no-progress" + (dump >= 0 ? " --dump-op " + std::to_string(dump) : "");
  }
  // The index of the first record of honest trace TA matching op, layer and microbatch.
  static int64_t IndexOf(const std::string& op, int64_t layer, int64_t microbatch) {
    std::ifstream in(dir_ / "TA/records.jsonl");
    for (std::string line; std::getline(in, line);) {
      const Json r = Json::parse(line);
      if (r["op"] == op && r["layer"] == layer && r["microbatch"] == microbatch) return r["index"];
    }
    ADD_FAILURE() << "no record " << op << " layer " << layer << " microbatch " << microbatch;
    return -1;
  }

  static fs::path dir_;
};
fs::path Dispute::dir_;

TEST_F(Dispute, AOneUlpFaultIsFoundAtItsStepAndOpAndTheHonestPartyWinsOnEitherSide) {
  const int64_t k = IndexOf("attention_fwd", 1, 0);
  const std::string fault = " --test-fault-op 7:" + std::to_string(k);
  Result r = Lockstep("train --config tiny --data " + Path("data") + " --out " + Path("B") +
                      " --steps 8 --no-progress" + fault);
  ASSERT_EQ(r.exit_code, 0) << r.output;

  r = Lockstep("dispute steps " + Path("A") + " " + Path("B"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const Json steps = Json::parse(r.output);
  EXPECT_EQ(steps["first_divergent_step"], 7) << r.output;
  EXPECT_EQ(steps["last_agreed_step"], 6) << r.output;

  r = Lockstep(TraceArgs("A", "TA1", 7, k));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Lockstep(TraceArgs("B", "TB1", 7, k) + fault);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Lockstep("dispute ops " + Path("TA1") + " " + Path("TB1"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const Json ops = Json::parse(r.output);
  EXPECT_EQ(ops["verdict"], "outputs");
  EXPECT_EQ(ops["index"], k);
  EXPECT_EQ(ops["record"], "op " + std::to_string(k) + " 'attention_fwd' of step 7, layer 1, "
                           "microbatch 0");

  const std::string dump_a = Path("TA1/op_" + std::to_string(k) + ".safetensors");
  const std::string dump_b = Path("TB1/op_" + std::to_string(k) + ".safetensors");
  r = Lockstep("referee --trace-a " + Path("TA1") + " --trace-b " + Path("TB1") + " --op " +
               std::to_string(k) + " --dump-a " + dump_a + " --dump-b " + dump_b);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Json::parse(r.output)["verdict"], "a") << r.output;
  // The roles swapped: the faulty party is now A, and B (honest) wins.
  r = Lockstep("referee --trace-a " + Path("TB1") + " --trace-b " + Path("TA1") + " --op " +
               std::to_string(k) + " --dump-a " + dump_b + " --dump-b " + dump_a);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(Json::parse(r.output)["verdict"], "b") << r.output;
  // Dumps of another op are refused; inputs other than the agreed ones convince nobody.
  r = Lockstep("referee --trace-a " + Path("TA1") + " --trace-b " + Path("TB1") + " --op " +
               std::to_string(k - 1) + " --dump-a " + dump_a + " --dump-b " + dump_b);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("the dump of op " + std::to_string(k) + ", not of --op"),
            std::string::npos) << r.output;
  r = Lockstep("referee --trace-a " + Path("TA1") + " --trace-b " + Path("TB1") + " --op " +
               std::to_string(k) + " --dump-a " + dump_b + " --dump-b " + dump_b);
  EXPECT_EQ(r.exit_code, 3) << "B's outputs revealed as A's: " << r.output;

  // A dump holds only the record's tensors: one more output, or one more input in either dump,
  // is refused naming the dump and the tensor, as is a tensor of neither side.
  const auto with_extra = [&](const std::string& from, const std::string& name,
                              const std::string& to) {
    const SafetensorsFile file = ReadSafetensors(from, SafetensorsDtypes::kAny);
    std::vector<NamedTensor> tensors = file.tensors();
    const std::vector<float> extra = {1.0f, 2.0f};
    tensors.push_back({name, {2}, extra});
    WriteSafetensors(to, tensors, file.metadata());
    return to;
  };
  const std::string referee = "referee --trace-a " + Path("TA1") + " --trace-b " + Path("TB1") +
                              " --op " + std::to_string(k);
  const auto refused = [&](const std::string& a, const std::string& b, const std::string& words) {
    const Result refusal = Lockstep(referee + " --dump-a " + a + " --dump-b " + b);
    EXPECT_EQ(refusal.exit_code, 2) << refusal.output;
    EXPECT_NE(refusal.output.find(words), std::string::npos) << refusal.output;
  };
  const std::string record = "not one of record " + std::to_string(k) + "'s ";
  refused(with_extra(dump_a, "output.extra", Path("A_out.st")), dump_b,
          "A_out.st: tensor 'output.extra' is " + record + "outputs");
  refused(with_extra(dump_a, "input.extra", Path("A_in.st")), dump_b,
          "A_in.st: tensor 'input.extra' is " + record + "inputs");
  refused(dump_a, with_extra(dump_b, "input.extra", Path("B_in.st")),
          "B_in.st: tensor 'input.extra' is " + record + "inputs");
  // A tensor of the record in another dtype than the record's (its bytes as u32, or as f32)
  // is refused too, and so is a dump of an earlier build (every tensor as F32 words, the dtypes
  // in the metadata).
  {
    const SafetensorsFile file = ReadSafetensors(dump_a, SafetensorsDtypes::kAny);
    std::vector<NamedTensor> tensors = file.tensors();
    TensorView& first = tensors.front().data;
    const Dtype other = first.dtype() == Dtype::kU32 ? Dtype::kF32 : Dtype::kU32;
    ASSERT_EQ(InfoOf(first.dtype()).size, 4);
    first = TensorView(other, first.data(), first.elements());
    WriteSafetensors(Path("A_dtype.st"), tensors, file.metadata());
    refused(Path("A_dtype.st"), dump_b,
            "A_dtype.st: tensor '" + tensors.front().name + "' is " +
                std::string(InfoOf(other).safetensors) + " (the record's is ");
    std::map<std::string, std::string> metadata = file.metadata();
    metadata["dtype." + tensors.front().name] = "f32";
    WriteSafetensors(Path("A_old.st"), file.tensors(), metadata);
    refused(Path("A_old.st"), dump_b, "a dump of an earlier lockstep");
  }
  r = Lockstep(referee + " --dump-a " + with_extra(dump_a, "notes", Path("A_notes.st")) +
               " --dump-b " + dump_b);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("tensor 'notes' is neither an input.* nor an output.*"),
            std::string::npos)
      << r.output;
}

TEST_F(Dispute, FaultsInTheForwardTheBackwardTheUpdateAndTheDataAreLocalised) {
  struct Case {
    std::string name, fault, kind, role;
    int64_t index;
  };
  const Case cases[] = {
      {"forward", "", "outputs", "act", IndexOf("swiglu_fwd", 1, 0)},
      {"backward", "", "outputs", "dw", IndexOf("gemm_dytx", 0, 1)},
      {"update", "", "outputs", "param", IndexOf("adamw", -1, -1)},
      // Token 130 is in microbatch 1 (2 sequences of 65 tokens each): its embedding reads it.
      {"data", " --test-fault-token 7:130", "inputs", "ids", IndexOf("embedding_fwd", -1, 1)},
  };
  for (const Case& c : cases) {
    const std::string fault =
        c.fault.empty() ? " --test-fault-op 7:" + std::to_string(c.index) : c.fault;
    const std::string out = "TB_" + c.name;
    Result r = Lockstep(TraceArgs("A", out, 7) + fault);
    ASSERT_EQ(r.exit_code, 0) << c.name << ": " << r.output;
    r = Lockstep("dispute ops " + Path("TA") + " " + Path(out));
    EXPECT_EQ(r.exit_code, 1) << c.name << ": " << r.output;
    const Json v = Json::parse(r.output);
    EXPECT_EQ(v["verdict"], c.kind) << c.name << ": " << r.output;
    EXPECT_EQ(v["index"], c.index) << c.name << ": " << r.output;
    EXPECT_EQ(v["differing"][0]["role"], c.role) << c.name << ": " << r.output;
  }
}

TEST_F(Dispute, ASparseChainIsBisectedInThreeQuestions) {
  const std::string fault = " --test-fault-op 7:" + std::to_string(IndexOf("gemm_dytx", 0, 1));
  Result r = Lockstep("train --config tiny --data " + Path("data") + " --out " + Path("B16") +
                      " --steps 16 --no-progress" + fault);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // B publishes every 8th hash only.
  std::ifstream in(dir_ / "B16/state_hashes.jsonl");
  std::ofstream sparse(dir_ / "B16_every8.jsonl");
  for (std::string line; std::getline(in, line);) {
    if (Json::parse(line)["step"].get<int>() % 8 == 0) sparse << line << "\n";
  }
  sparse.close();
  // Asked for a step it did not publish, B replays its own computation from step 0.
  const std::string ask_b = std::string(LOCKSTEP_BINARY) + " replay --checkpoint " + Path("B16") +
                            "/checkpoints/step_000000000 --until-step {step} --data " +
                            Path("data") + fault;
  r = Lockstep("dispute steps " + Path("A") + " " + Path("B16_every8.jsonl") + " --ask-b '" +
               ask_b + "'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const Json v = Json::parse(r.output);
  EXPECT_EQ(v["first_differing_committed_step"], 8) << r.output;
  EXPECT_EQ(v["first_divergent_step"], 7) << r.output;
  EXPECT_EQ(v["located"], true) << r.output;
  EXPECT_LE(v["queries"].get<int>(), 3) << r.output;
  // Without a way to ask, the answer is the interval the committed hashes allow.
  r = Lockstep("dispute steps " + Path("A") + " " + Path("B16_every8.jsonl"));
  EXPECT_EQ(Json::parse(r.output)["located"], false) << r.output;
}

// An int8 model's own ops (tiny-int8, with the int8 backward): the referee recomputes each, and a
// one-bit fault in an int8 GEMM's output is found at that op and decided for the honest party.
TEST_F(Dispute, TheInt8OpsAreRecomputedAndAFaultInOneIsDecided) {
  Result r = Lockstep("train --config tiny-int8 --data " + Path("data") + " --out " + Path("I") +
                      " --steps 2 --no-progress");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Lockstep(TraceArgs("I", "TI", 2));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::map<std::string, int64_t> first;
  std::ifstream in(dir_ / "TI/records.jsonl");
  for (std::string line; std::getline(in, line);) {
    const Json rec = Json::parse(line);
    const std::string op = rec["op"];
    if (op == "quantize_rows" || op == "gemm_i8_xwt" || op == "hadamard_quantize_rows")
      first.try_emplace(op, rec["index"]);
  }
  ASSERT_EQ(first.size(), 3u) << "quantize_rows, gemm_i8_xwt and hadamard_quantize_rows";
  std::string dumps;
  for (const auto& [op, index] : first) dumps += " --dump-op " + std::to_string(index);
  const int64_t k = first["gemm_i8_xwt"];
  ASSERT_EQ(Lockstep(TraceArgs("I", "TIA", 2) + dumps).exit_code, 0);
  ASSERT_EQ(Lockstep(TraceArgs("I", "TIB", 2) + dumps + " --test-fault-op 2:" + std::to_string(k))
                .exit_code,
            0);
  for (const auto& [op, index] : first) {
    const std::string dump = Path("TIA/op_" + std::to_string(index) + ".safetensors");
    r = Lockstep("referee --trace-a " + Path("TIA") + " --trace-b " + Path("TI") + " --op " +
                 std::to_string(index) + " --dump-a " + dump + " --dump-b " + dump);
    EXPECT_EQ(r.exit_code, 4) << op << ": " << r.output;
  }
  r = Lockstep("dispute ops " + Path("TIA") + " " + Path("TIB"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(Json::parse(r.output)["index"], k) << r.output;
  const std::string op = "/op_" + std::to_string(k) + ".safetensors";
  r = Lockstep("referee --trace-a " + Path("TIB") + " --trace-b " + Path("TIA") + " --op " +
               std::to_string(k) + " --dump-a " + Path("TIB") + op + " --dump-b " + Path("TIA") +
               op);
  EXPECT_EQ(r.exit_code, 1) << "party B (the honest one here) is right: " << r.output;
}

// The referee's recomputation of every kind of op a step has equals what the trainer computed:
// an honest party's record against itself is "both" (exit 4) for each.
TEST_F(Dispute, TheRefereeRecomputesEveryKindOfOpBitForBit) {
  std::map<std::string, int64_t> first;
  std::ifstream in(dir_ / "TA/records.jsonl");
  for (std::string line; std::getline(in, line);) {
    const Json r = Json::parse(line);
    first.try_emplace(r["op"], r["index"]);
  }
  EXPECT_GE(first.size(), 20u);
  std::string dumps;
  for (const auto& [op, index] : first) dumps += " --dump-op " + std::to_string(index);
  Result r = Lockstep(TraceArgs("A", "TALL", 7) + dumps);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const auto& [op, index] : first) {
    const std::string dump = Path("TALL/op_" + std::to_string(index) + ".safetensors");
    r = Lockstep("referee --trace-a " + Path("TALL") + " --trace-b " + Path("TA") + " --op " +
                 std::to_string(index) + " --dump-a " + dump + " --dump-b " + dump);
    EXPECT_EQ(r.exit_code, 4) << op << ": " << r.output;
  }
}

// A revealed record with its inclusion proof verifies against the trace's root; another record
// or another position does not.
TEST_F(Dispute, ARevealedRecordProvesItsPlaceUnderTheRoot) {
  const dispute::Trace trace = dispute::ReadTrace(dir_ / "TA");
  for (int64_t k : {int64_t{0}, int64_t{37}, trace.header.records - 1}) {
    const Result r = Lockstep("dispute reveal " + Path("TA") + " --op " + std::to_string(k));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const Json j = Json::parse(r.output);
    std::vector<Digest> proof;
    for (const auto& hex : j["proof"]) proof.push_back(DigestFromHex(hex.get<std::string>(), "proof"));
    const Digest leaf = LeafHash(j["record"].get<std::string>());
    const auto count = static_cast<size_t>(trace.header.records);
    EXPECT_TRUE(VerifyInclusion(leaf, static_cast<size_t>(k), count, proof,
                                         trace.header.merkle_root));
    EXPECT_FALSE(VerifyInclusion(leaf, static_cast<size_t>(k) ^ 1, count, proof,
                                          trace.header.merkle_root));
    const Digest other = LeafHash(trace.records[(static_cast<size_t>(k) + 1) % count].line);
    EXPECT_FALSE(VerifyInclusion(other, static_cast<size_t>(k), count, proof,
                                          trace.header.merkle_root));
  }
}

// A record that is not a call the op table describes (a role renamed, an op unknown, a role in a
// dtype of the table that is not its own, a dtype outside the table) is refused when the trace
// is read, naming the record.
TEST_F(Dispute, ARecordOutsideTheOpCatalogueIsRefused) {
  for (const auto& [from, to] :
       {std::pair<std::string, std::string>{"\"role\":\"table\"", "\"role\":\"tablet\""},
        {"\"op\":\"embedding_fwd\"", "\"op\":\"embedding_fwd2\""},
        {"\"dtype\":\"f32\"", "\"dtype\":\"bf16\""},
        {"\"dtype\":\"f32\"", "\"dtype\":\"f16\""}}) {
    const fs::path edited = dir_ / "TA_edited";
    fs::remove_all(edited);
    fs::copy(dir_ / "TA", edited);
    std::string records = ReadFileText(edited / "records.jsonl");
    const size_t at = records.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    records.replace(at, from.size(), to);
    WriteFileSynced(edited / "records.jsonl", records);
    const Result r = Lockstep("dispute ops " + Path("TA") + " " + edited.string());
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("records.jsonl: line 1"), std::string::npos) << r.output;
    EXPECT_TRUE(r.output.find("not those the op catalogue gives it") != std::string::npos ||
                r.output.find("is not an op lockstep records") != std::string::npos ||
                r.output.find("dtype 'f16' is not a dtype lockstep knows") != std::string::npos)
        << r.output;
  }
}

// Two traces are identical only when all they commit to agrees: records that agree under headers
// that do not (another state claimed after the step, or another start) are a difference; a trace
// with no records, or a record not in the canonical form its leaf commits to, is refused.
TEST_F(Dispute, TracesAgreeOnlyWhenTheirHeadersAgreeAndTheirRecordsAreCanonical) {
  const auto copy = [&](const std::string& name) {
    fs::remove_all(dir_ / name);
    fs::copy(dir_ / "TA", dir_ / name);
    return dir_ / name;
  };
  const auto edit_header = [&](const fs::path& trace, const std::function<void(Json&)>& edit) {
    Json h = Json::parse(ReadFileText(trace / "trace.json"));
    edit(h);
    WriteFileSynced(trace / "trace.json", h.dump(2) + "\n");
  };
  for (const char* field : {"state_hash", "checkpoint_hash"}) {
    const fs::path other = copy(std::string("TA_") + field);
    edit_header(other, [&](Json& h) { h[field] = std::string(64, 'a'); });
    const Result r = Lockstep("dispute ops " + Path("TA") + " " + other.string());
    EXPECT_EQ(r.exit_code, 1) << r.output;
    const Json v = Json::parse(r.output);
    EXPECT_EQ(v["verdict"], "headers") << r.output;
    ASSERT_EQ(v["differing"].size(), 1u) << r.output;
    EXPECT_EQ(v["differing"][0]["role"], field) << r.output;
    EXPECT_EQ(v["differing"][0]["b"], std::string(64, 'a')) << r.output;
  }
  EXPECT_EQ(Lockstep("dispute ops " + Path("TA") + " " + Path("TA")).exit_code, 0);

  const fs::path empty = copy("TA_empty");
  WriteFileSynced(empty / "records.jsonl", std::string_view());
  edit_header(empty, [](Json& h) { h["records"] = 0; });
  Result r = Lockstep("dispute ops " + empty.string() + " " + empty.string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("records.jsonl: no records"), std::string::npos) << r.output;

  // The first record with a space after its first colon, the root recomputed over it.
  const fs::path spaced = copy("TA_spaced");
  std::vector<std::string> lines = Lines(ReadFileText(spaced / "records.jsonl"));
  lines[0].insert(lines[0].find(':') + 1, " ");
  std::string text;
  std::vector<Digest> leaves;
  for (const std::string& line : lines) {
    text += line + "\n";
    leaves.push_back(LeafHash(line));
  }
  WriteFileSynced(spaced / "records.jsonl", text);
  edit_header(spaced, [&](Json& h) { h["merkle_root"] = ToHex(MerkleRoot(leaves)); });
  r = Lockstep("dispute ops " + Path("TA") + " " + spaced.string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("records.jsonl: line 1: not in the canonical form"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace lockstep
