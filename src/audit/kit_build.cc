// `lockstep kit build`: a run directory and its dataset -> a self-contained, verifiable kit.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>

#include "lockstep/build_info.h"
#include "lockstep/json.h"
#include "lockstep/kit.h"
#include "lockstep/train.h"

namespace lockstep::audit {
// The kit formats (the state layer's, state.h).
using kit::DescribeFile;
using kit::KitFile;
using kit::KitManifest;
using kit::kManifestName;
using kit::kSignaturesName;
using kit::kTrajectoryName;
using kit::ManifestJson;
using kit::Trajectory;
using kit::TrajectoryJson;
using kit::Unit;
using kit::UnitKind;
using kit::ValidateKitPath;

namespace {
namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr std::string_view kConfigName = "config.yaml";
constexpr std::string_view kDataDir = "data";

struct PublishedCheckpoint {
  uint64_t step = 0;
  fs::path dir;
  Digest state_hash{};
  std::string descriptor;
  std::vector<std::string> files;  // COMPLETE's listing, then COMPLETE itself
};

// What the kit needs from a checkpoint: meta.json's step, state_hash and descriptor, and the
// files COMPLETE lists -- read by the state layer's one checkpoint reader (OpenCheckpoint checks
// meta.json, COMPLETE and the tensor headers; the tensors are not loaded: for a large model they
// are many GiB, the auditor's replay verifies them, and kit.json pins their bytes).
PublishedCheckpoint ReadPublishedCheckpoint(const fs::path& dir, uint64_t expected_step) {
  const CheckpointIndex index = OpenCheckpoint(dir);
  if (index.state.step != expected_step) {
    Fail("{}: field \"step\" is {} but the directory is step {}", (dir / RunLayout::kMeta).string(),
         index.state.step, expected_step);
  }
  PublishedCheckpoint c{index.state.step, dir, index.state_hash, index.state.descriptor, {}};
  for (const CheckpointIndex::File& f : index.files) {
    if (!f.path.empty()) c.files.push_back(f.path.filename().string());  // grads: with kFull only
  }
  c.files.emplace_back(RunLayout::kMeta);
  c.files.emplace_back(RunLayout::kComplete);
  return c;
}

// metrics.jsonl: step -> step_seconds.
std::map<uint64_t, double> ReadStepSeconds(const fs::path& path) {
  std::map<uint64_t, double> seconds;
  for (const train::MetricsLine& m : train::ReadMetrics(path)) seconds[m.step] = m.step_seconds;
  return seconds;
}

// The run config as YAML, from the descriptor's "name", "model" and "train". Every scalar is
// written as its JSON text, which YAML reads back as the same value (JSON numbers, booleans and
// double-quoted strings are YAML scalars); BuildKit checks that it reproduces the descriptor.
std::string ConfigYaml(const Json& descriptor, std::string_view what) {
  std::string yaml = fmt::format(
      "# The run's config, written by `lockstep kit build` from the run descriptor that its\n"
      "# checkpoints record (numerics contract v{}).\n",
      build::kContractVersion);
  if (!descriptor.contains("name") || !descriptor["name"].is_string()) {
    Fail("{}: the run descriptor has no string \"name\"", what);
  }
  yaml += "name: " + descriptor["name"].dump() + "\n";
  for (const char* section : {"model", "train"}) {
    if (!descriptor.contains(section) || !descriptor[section].is_object()) {
      Fail("{}: the run descriptor has no object \"{}\"", what, section);
    }
    yaml += std::string(section) + ":\n";
    for (const auto& [key, value] : descriptor[section].items()) {
      if (value.is_structured()) {
        Fail("{}: descriptor field {}.{} = {} is not a scalar", what, section, key,
             ShownJson(value));
      }
      yaml += fmt::format("  {}: {}\n", key, value.dump());
    }
  }
  return yaml;
}

// A copy of `from` at the new path `to` (its directories made), fsynced.
void CopyFile(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::create_directories(to.parent_path(), ec);
  if (!ec) fs::copy_file(from, to, fs::copy_options::none, ec);
  if (ec) {
    const std::string why = ec.message();
    Fail("copying {} ({} bytes) to {}: {}", from.string(), fs::file_size(from, ec), to.string(),
         why);
  }
  File::OpenForReading(to).Sync();
}

// Every regular file under `dir`, described, sorted by relative path; kit.json excluded.
std::vector<KitFile> DescribeTree(const fs::path& dir) {
  std::vector<KitFile> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    std::string relative = entry.path().lexically_relative(dir).generic_string();
    if (relative == kManifestName) continue;
    ValidateKitPath(relative, dir.string());
    files.push_back(DescribeFile(entry.path(), std::move(relative)));
  }
  std::sort(files.begin(), files.end(),
            [](const KitFile& a, const KitFile& b) { return a.path < b.path; });
  return files;
}

}  // namespace

Trajectory BuildKit(const KitBuildOptions& options) {
  CheckOutput({"--out", options.out_dir}, OutputKind::kNewDirectory);
  const fs::path hashes_path = RunLayout{options.run_dir}.hashes();
  const std::vector<StateHashLine> lines = ReadStateHashLines(hashes_path);
  if (lines.empty()) Fail("{}: no line for step 0 (the init)", hashes_path.string());
  std::map<uint64_t, Digest> chain;
  for (const StateHashLine& line : lines) chain[line.step] = line.hash;
  // A signed run's signatures go into the kit; they must verify and sign this very chain.
  const fs::path signatures = RunLayout{options.run_dir}.signatures();
  if (fs::exists(signatures)) {
    const SignedChain signed_chain = ReadSignedChain(signatures);
    if (const auto problems = VerifySignedChain(signed_chain, nullptr); !problems.empty()) {
      Fail("{}: {}", signatures.string(), problems.front());
    }
    // Every line must be the one signed for its step (checked first, as it names the step; the
    // checkpoints' chains below pin the lines too, signed or not).
    for (const SignedLine& line : signed_chain.lines) {
      const auto it = chain.find(line.step);
      if (it == chain.end() || it->second != line.hash) {
        Fail("{}: step {} is signed as {}, but {} holds {}", signatures.string(), line.step,
             ToHex(line.hash), hashes_path.string(),
             it == chain.end() ? "no line" : ToHex(it->second));
      }
    }
    if (signed_chain.lines.size() != lines.size()) {
      Fail(
          "{}: signs {} chain lines, but {} has {}: every line of a signed run is signed (step "
          "{} is not; resume the run with --sign-key to sign it)",
          signatures.string(), signed_chain.lines.size(), hashes_path.string(), lines.size(),
          signed_chain.lines.size());
    }
  }
  // Every checkpoint must attest the chain it is published with: its hash, its prev_hash and
  // (a checkpoint of this lockstep) its chain through every line before it.
  CheckChainAncestry(hashes_path, lines, CheckpointAnchors(options.run_dir, UINT64_MAX));

  std::vector<PublishedCheckpoint> checkpoints;
  for (const uint64_t step : CompleteCheckpointSteps(options.run_dir)) {
    const fs::path dir = CheckpointDir(options.run_dir, step);
    PublishedCheckpoint c = ReadPublishedCheckpoint(dir, step);
    const auto line = chain.find(step);
    if (line == chain.end() || line->second != c.state_hash) {
      Fail("{}: meta.json's state_hash {} is not {}'s hash for step {} ({})", dir.string(),
           ToHex(c.state_hash), hashes_path.string(), step,
           line == chain.end() ? "no line" : ToHex(line->second));
    }
    if (!checkpoints.empty() && c.descriptor != checkpoints.front().descriptor) {
      Fail("{}: its run descriptor differs from {}'s: a kit holds one run", dir.string(),
           checkpoints.front().dir.string());
    }
    checkpoints.push_back(std::move(c));
  }
  if (checkpoints.empty()) {
    Fail("{}: no complete checkpoint (checkpoints/step_*/COMPLETE): a kit needs the run "
         "descriptor that checkpoints record, and its interval units start from checkpoints",
         options.run_dir.string());
  }
  if (checkpoints.front().step != 0) {
    Fail(
        "{}: no checkpoint of step 0 (the first is step {}): a kit's units cover the chain from "
        "the init to the last checkpoint, and the first interval starts from step 0's",
        options.run_dir.string(), checkpoints.front().step);
  }
  const std::string& descriptor = checkpoints.front().descriptor;
  const std::string descriptor_what = (checkpoints.front().dir / RunLayout::kMeta).string() +
                                      ": field \"descriptor\"";
  const Json descriptor_json = ParseJsonStrict(descriptor, descriptor_what);
  if (!descriptor_json.is_object()) Fail("{}: not a JSON object", descriptor_what);
  auto recorded = [&](const char* key) {
    return descriptor_json.contains(key) ? descriptor_json[key] : Json();
  };

  // The dataset must be the one the run trained on, and the config we write must give back the
  // exact descriptor: otherwise no unit of the kit could match.
  const data::Dataset dataset = data::OpenDataset(options.data_dir);
  const std::string manifest_hex = ToHex(dataset.manifest_digest());
  if (recorded("data_manifest_blake2b") != Json(manifest_hex)) {
    Fail(
        "--data {}: manifest.json has BLAKE2b {}, but the run trained on data_manifest_blake2b "
        "{} ({})",
        options.data_dir.string(), manifest_hex, ShownJson(recorded("data_manifest_blake2b")),
        descriptor_what);
  }
  if (recorded("contract_version") != Json(build::kContractVersion)) {
    Fail("{}: contract_version {}, this lockstep implements numerics contract v{}", descriptor_what,
         ShownJson(recorded("contract_version")), build::kContractVersion);
  }
  const std::string config_yaml = ConfigYaml(descriptor_json, descriptor_what);
  const RunConfig config = ParseRunConfig(config_yaml, "the kit's config.yaml");
  if (train::RunDescriptor(config, dataset) != descriptor) {
    Fail("{}: the config written from it does not reproduce it: {} != {}", descriptor_what,
         train::RunDescriptor(config, dataset), descriptor);
  }

  const std::map<uint64_t, double> step_seconds = ReadStepSeconds(RunLayout{options.run_dir}.metrics());
  auto interval_seconds = [&](uint64_t start, uint64_t until) {
    double total = 0;
    for (uint64_t s = start + 1; s <= until; ++s) {
      const auto it = step_seconds.find(s);
      if (it == step_seconds.end()) {
        Fail("{}: no line for step {}", RunLayout{options.run_dir}.metrics().string(), s);
      }
      total += it->second;
    }
    if (!std::isfinite(total)) {
      Fail("{}: steps {} to {} take {} seconds in all, not a finite number",
           RunLayout{options.run_dir}.metrics().string(), start + 1, until, total);
    }
    return total;
  };

  Trajectory trajectory;
  trajectory.descriptor = descriptor;
  Unit init;
  init.name = "init";
  init.kind = UnitKind::kInit;
  init.config = kConfigName;
  init.data = kDataDir;
  init.seed = config.train.seed;
  init.expected_hash = chain.at(0);
  trajectory.units.push_back(init);
  auto kit_checkpoint = [](const PublishedCheckpoint& c) {
    return RunLayout{}.checkpoint(c.step).generic_string();  // the kit keeps the run's layout
  };
  for (size_t i = 0; i + 1 < checkpoints.size(); ++i) {
    const PublishedCheckpoint &from = checkpoints[i], &to = checkpoints[i + 1];
    Unit unit;
    unit.name = fmt::format("interval_{}_{}", from.step, to.step);
    unit.kind = UnitKind::kInterval;
    unit.config = kConfigName;
    unit.data = kDataDir;
    unit.start_step = from.step;
    unit.until_step = to.step;
    unit.start_checkpoint = kit_checkpoint(from);
    unit.target_checkpoint = kit_checkpoint(to);
    unit.expected_hash = to.state_hash;
    unit.publisher_wall_seconds = interval_seconds(from.step, to.step);
    trajectory.units.push_back(std::move(unit));
  }

  // What the kit copies, from where to where (relative to the kit).
  std::vector<std::pair<fs::path, fs::path>> copies = {
      {options.data_dir / "manifest.json", fs::path(kDataDir) / "manifest.json"}};
  for (const data::ShardInfo& shard : dataset.shards()) {
    for (const std::string& name : {shard.bin, shard.idx}) {
      copies.emplace_back(options.data_dir / name, fs::path(kDataDir) / name);
    }
  }
  for (const PublishedCheckpoint& c : checkpoints) {
    for (const std::string& name : c.files)
      copies.emplace_back(c.dir / name, fs::path(kit_checkpoint(c)) / name);
  }
  if (fs::exists(signatures)) copies.emplace_back(signatures, kSignaturesName);
  uint64_t bytes = 0;
  for (const auto& [from, to] : copies) bytes += fs::file_size(from);
  RequireFreeSpace(options.out_dir, bytes, "the kit");

  // Built in a staging directory beside it and renamed, so that out_dir is either absent or a
  // whole kit; on any failure the staging directory goes, with only what was copied into it.
  StagedDirectory staged(options.out_dir);
  const fs::path& tmp = staged.path();
  for (const auto& [from, to] : copies) CopyFile(from, tmp / to);
  WriteFileSynced(tmp / kConfigName, config_yaml);
  WriteFileSynced(tmp / kTrajectoryName, TrajectoryJson(trajectory));

  KitManifest manifest;
  manifest.lockstep_version = build::kVersion;
  manifest.git_commit = build::kGitCommit;
  manifest.contract_version = build::kContractVersion;
  manifest.files = DescribeTree(tmp);
  WriteFileSynced(tmp / kManifestName, ManifestJson(manifest));
  staged.Commit();
  return trajectory;
}

}  // namespace lockstep::audit
