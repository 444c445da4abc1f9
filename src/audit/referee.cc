// The referee (docs/disputes.md): one op of a disputed step recomputed from the inputs both
// parties agree on, with the reference kernels at one thread; its time and memory are one op's.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "lockstep/dispute.h"
#include "lockstep/kernels.h"
#include "lockstep/state.h"

namespace lockstep::dispute {
namespace fs = std::filesystem;

namespace {

// An op's tensors by role, in their dtypes.
struct OpData {
  std::map<std::string, std::vector<float>> f32;
  std::map<std::string, std::vector<uint32_t>> u32;
  std::map<std::string, std::vector<double>> f64;

  const std::vector<float>& F(const std::string& role) const { return Get(f32, role); }
  const std::vector<uint32_t>& U(const std::string& role) const { return Get(u32, role); }
  const std::vector<double>& D(const std::string& role) const { return Get(f64, role); }
  bool Has(const std::string& role) const { return f32.contains(role); }

  template <typename T>
  static const std::vector<T>& Get(const std::map<std::string, std::vector<T>>& m,
                                   const std::string& role) {
    const auto it = m.find(role);
    if (it == m.end()) Fail("referee: the op has no tensor '{}' of the needed dtype", role);
    return it->second;
  }

  Digest DigestOf(const TensorDigest& t) const {
    auto bytes = [](const auto& v) {
      return std::span(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(v[0]));
    };
    if (t.dtype == "u32") return Blake2b().Update(bytes(U(t.role))).Final();
    if (t.dtype == "f64") return Blake2b().Update(bytes(D(t.role))).Final();
    return Blake2b().Update(bytes(F(t.role))).Final();
  }
};

// The tensors of one side ("input" or "output") of an op dump (trace --dump-op).
OpData ReadDump(const fs::path& path, std::string_view side, int64_t op) {
  const SafetensorsFile file = ReadSafetensors(path);
  const auto index = file.metadata().find("index");
  if (index == file.metadata().end() || index->second != std::to_string(op)) {
    Fail("{}: the dump of op {}, not of --op {}", path.string(),
         index == file.metadata().end() ? "?" : index->second, op);
  }
  OpData data;
  for (const NamedTensor& t : file.tensors()) {
    const std::string prefix = std::string(side) + ".";
    if (!t.name.starts_with(prefix)) continue;
    const std::string role = t.name.substr(prefix.size());
    const auto dtype = file.metadata().find("dtype." + t.name);
    if (dtype == file.metadata().end()) {
      Fail("{}: tensor '{}' has no dtype.{} in __metadata__", path.string(), t.name, t.name);
    }
    if (dtype->second == "f32") {
      data.f32[role].assign(t.data.begin(), t.data.end());
    } else if (dtype->second == "u32") {
      auto& v = data.u32[role];
      v.resize(t.data.size());
      std::memcpy(v.data(), t.data.data(), t.data.size_bytes());
    } else if (dtype->second == "f64" && t.data.size() % 2 == 0) {
      auto& v = data.f64[role];
      v.resize(t.data.size() / 2);
      std::memcpy(v.data(), t.data.data(), t.data.size_bytes());
    } else {
      Fail("{}: tensor '{}': dtype '{}' with {} words", path.string(), t.name, dtype->second,
           t.data.size());
    }
  }
  return data;
}

int64_t I(const TraceRecord& r, std::string_view name) {
  return static_cast<int64_t>(r.Arg(name));
}
float Fl(const TraceRecord& r, std::string_view name) { return static_cast<float>(r.Arg(name)); }

rk::AttentionShape AttentionOf(const TraceRecord& r) {
  return {I(r, "batch"),    I(r, "seq"),    I(r, "q_heads"), I(r, "kv_heads"),
          I(r, "head_dim"), I(r, "window"), Fl(r, "scale")};
}
rk::CrossEntropyShape CrossEntropyOf(const TraceRecord& r) {
  return {I(r, "rows"), I(r, "d"), I(r, "vocab"), I(r, "vocab_chunk"), Fl(r, "z_loss")};
}

// The op of record r on `in`, with the reference kernels: every output of the record.
OpData Recompute(const TraceRecord& r, const OpData& in) {
  OpData out;
  auto zeros = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n), 0.0f); };
  auto& o = out.f32;
  const std::string& op = r.op;
  if (op == "embedding_fwd") {
    o["out"] = zeros(static_cast<int64_t>(in.U("ids").size()) * I(r, "d"));
    rk::EmbeddingForward(in.F("table"), in.U("ids"), o["out"], I(r, "vocab"), I(r, "d"));
  } else if (op == "embedding_bwd") {
    o["dtable"] = in.F("dtable");
    rk::EmbeddingBackward(in.F("dout"), in.U("ids"), o["dtable"], I(r, "vocab"), I(r, "d"));
  } else if (op == "rmsnorm_fwd") {
    const int64_t rows = I(r, "rows"), cols = I(r, "cols");
    o["y"] = zeros(rows * cols);
    o["rstd"] = zeros(rows);
    const std::span<const float> gain = in.Has("gain") ? std::span<const float>(in.F("gain"))
                                                       : std::span<const float>();
    rk::RmsNormForward(in.F("x"), gain, Fl(r, "eps"), o["y"], o["rstd"], rows, cols);
  } else if (op == "rmsnorm_bwd") {
    const int64_t rows = I(r, "rows"), cols = I(r, "cols");
    o["dx"] = zeros(rows * cols);
    const bool gain = in.Has("gain");
    if (gain) o["dgain"] = zeros(cols);
    rk::RmsNormBackward(in.F("dy"), in.F("x"), gain ? std::span<const float>(in.F("gain")) : std::span<const float>(),
                        in.F("rstd"), o["dx"], gain ? std::span<float>(o["dgain"]) : std::span<float>(), rows, cols);
  } else if (op == "gemm_xwt" || op == "gemm_dyw" || op == "gemm_dytx") {
    const int64_t m = I(r, "m"), n = I(r, "n"), k = I(r, "k");
    const bool acc = I(r, "accumulate") != 0;
    if (op == "gemm_xwt") {
      o["y"] = acc ? in.F("y") : zeros(m * n);
      rk::GemmXWt(in.F("x"), in.F("w"), o["y"], m, n, k, acc);
    } else if (op == "gemm_dyw") {
      o["dx"] = acc ? in.F("dx") : zeros(m * k);
      rk::GemmDyW(in.F("dy"), in.F("w"), o["dx"], m, n, k, acc);
    } else {
      o["dw"] = acc ? in.F("dw") : zeros(n * k);
      rk::GemmDytX(in.F("dy"), in.F("x"), o["dw"], m, n, k, acc);
    }
  } else if (op == "rope_fwd" || op == "rope_bwd") {
    const rk::RopeTable table = rk::MakeRopeTable(I(r, "table_seq"), I(r, "head_dim"), Fl(r, "theta"));
    const bool fwd = op == "rope_fwd";
    const std::vector<float>& x = in.F(fwd ? "x" : "dy");
    std::vector<float>& y = o[fwd ? "y" : "dx"];
    y = zeros(static_cast<int64_t>(x.size()));
    (fwd ? rk::RopeForward : rk::RopeBackward)(x, y, table, I(r, "batch"), I(r, "seq"),
                                               I(r, "heads"), I(r, "head_dim"));
  } else if (op == "attention_fwd") {
    const rk::AttentionShape s = AttentionOf(r);
    o["out"] = zeros(static_cast<int64_t>(in.F("q").size()));
    o["lse"] = zeros(s.batch * s.q_heads * s.seq);
    rk::AttentionForward(s, in.F("q"), in.F("k"), in.F("v"), o["out"], o["lse"]);
  } else if (op == "attention_bwd") {
    o["dq"] = zeros(static_cast<int64_t>(in.F("q").size()));
    o["dk"] = zeros(static_cast<int64_t>(in.F("k").size()));
    o["dv"] = zeros(static_cast<int64_t>(in.F("v").size()));
    rk::AttentionBackward(AttentionOf(r), in.F("q"), in.F("k"), in.F("v"), in.F("out"),
                          in.F("lse"), in.F("dout"), o["dq"], o["dk"], o["dv"]);
  } else if (op == "add_into") {
    o["y"] = in.F("y");
    rk::AddInto(in.F("x"), o["y"]);
  } else if (op == "copy") {
    o["y"] = in.F("x");
  } else if (op == "swiglu_fwd") {
    o["act"] = zeros(I(r, "rows") * I(r, "f"));
    rk::SwigluForward(in.F("gu"), o["act"], I(r, "rows"), I(r, "f"));
  } else if (op == "swiglu_bwd") {
    o["dgu"] = zeros(I(r, "rows") * 2 * I(r, "f"));
    rk::SwigluBackward(in.F("gu"), in.F("dact"), o["dgu"], I(r, "rows"), I(r, "f"));
  } else if (op == "cross_entropy_fwd") {
    const rk::CrossEntropyShape s = CrossEntropyOf(r);
    o["loss"] = zeros(s.rows);
    o["zloss"] = zeros(s.rows);
    o["lse"] = zeros(s.rows);
    rk::CrossEntropyForward(s, in.F("h"), in.F("w"), in.U("targets"), o["loss"], o["zloss"],
                            o["lse"]);
  } else if (op == "cross_entropy_bwd") {
    const rk::CrossEntropyShape s = CrossEntropyOf(r);
    o["dh"] = zeros(s.rows * s.d);
    o["dw"] = in.F("dw");
    rk::CrossEntropyBackward(s, in.F("h"), in.F("w"), in.U("targets"), in.F("lse"),
                             Fl(r, "grad_scale"), o["dh"], o["dw"]);
  } else if (op == "row_sum") {
    o["sum"] = zeros(I(r, "rows"));
    rk::RowSum(in.F("x"), o["sum"], I(r, "rows"), I(r, "cols"));
  } else if (op == "block_squares") {
    out.f64["sums"] = rk::BlockSquares(in.F("x"));
  } else if (op == "canonicalize_nans") {
    o["x"] = in.F("x");
    rk::CanonicalizeNaNs(o["x"]);
  } else if (op == "global_norm") {
    std::vector<int64_t> blocks;
    for (const double count : in.D("blocks")) {
      if (!(count >= 0 && count <= 9007199254740992.0) || count != std::floor(count)) {
        Fail("referee: record {}: block count {} is not a non-negative integer", r.index, count);
      }
      blocks.push_back(static_cast<int64_t>(count));
    }
    o["norm"] = {rk::NormOfBlockSums(in.D("sums"), blocks)};
  } else if (op == "scale") {
    o["x"] = in.F("x");
    rk::Scale(o["x"], Fl(r, "factor"));
  } else if (op == "adamw") {
    o["param"] = in.F("param");
    o["m"] = in.F("m");
    o["v"] = in.F("v");
    const rk::AdamWParams p{Fl(r, "lr"),  Fl(r, "beta1"),        Fl(r, "beta2"),
                            Fl(r, "eps"), Fl(r, "weight_decay"), I(r, "step")};
    rk::AdamWUpdate(p, o["param"], in.F("grad"), o["m"], o["v"]);
  } else {
    Fail("referee: op '{}' (record {}) is not an op lockstep records", op, r.index);
  }
  return out;
}

// Whether `data` holds every tensor of `expected`, each with its digest.
bool SameDigests(const OpData& data, const std::vector<TensorDigest>& expected) {
  for (const TensorDigest& t : expected) {
    const bool present = t.dtype == "u32"   ? data.u32.contains(t.role)
                         : t.dtype == "f64" ? data.f64.contains(t.role)
                                            : data.f32.contains(t.role);
    if (!present || data.DigestOf(t) != t.blake2b) return false;
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
                  [](const TensorDigest& x, const TensorDigest& y) {
                    return x.role == y.role && x.dtype == y.dtype && x.elements == y.elements &&
                           x.blake2b == y.blake2b;
                  })) {
    Fail("record {} ({}): the parties' inputs differ, so it is not the op to referee (dispute ops "
         "names the first record whose inputs agree and outputs differ)",
         o.op, ra.op);
  }
  // The agreed inputs, from whichever party revealed them faithfully.
  std::optional<OpData> inputs;
  for (const fs::path& dump : {o.dump_a, o.dump_b}) {
    OpData revealed = ReadDump(dump, "input", o.op);
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
  const OpData recomputed = Recompute(ra, *inputs);
  rk::SetIsa(saved_isa);
  SetThreads(saved_threads);

  nlohmann::json j = {{"op", ra.op},
                      {"index", o.op},
                      {"step", ra.step},
                      {"layer", ra.layer},
                      {"microbatch", ra.microbatch}};
  nlohmann::json recomputed_digests = nlohmann::json::object();
  for (const TensorDigest& t : ra.outputs) recomputed_digests[t.role] = ToHex(recomputed.DigestOf(t));
  j["recomputed"] = recomputed_digests;
  // A party is right when its committed outputs equal the recomputation; a party whose dump
  // does not match its own record has not revealed what it committed to.
  auto judge = [&](const TraceRecord& r, const fs::path& dump, const char* name) {
    const bool revealed = SameDigests(ReadDump(dump, "output", o.op), r.outputs);
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
