// Checkpoints in pieces: WriteCheckpoint's bytes pinned, the streamed writer byte-identical to
// it, StreamCheckpoint covering every array once with the right bytes and hash, and
// OpenCheckpoint refusing what ReadCheckpoint refuses.
#include <cstring>
#include <map>
#include <utility>

#include "state/state_fixtures.h"

namespace lockstep {
namespace {
namespace fs = std::filesystem;
using test::ExpectError;
using test::Forge;
using test::Replace;
using test::SampleState;

class CheckpointStreamTest : public test::ScratchDirTest {};

constexpr const char* kFiles[] = {"model.safetensors", "optimizer.safetensors", "meta.json",
                                  "COMPLETE"};

std::span<const float> ArrayOf(const TensorState& t, StateArray a) {
  switch (a) {
    case StateArray::kParam: return t.param;
    case StateArray::kM: return t.m;
    case StateArray::kV: return t.v;
    case StateArray::kGrad: return t.grad;
  }
  return {};
}

std::map<std::string, std::string> Metadata(const std::string& content, uint64_t step) {
  return {{"content", content},
          {"format", "lockstep-checkpoint"},
          {"format_version", std::to_string(kCheckpointFormatVersion)},
          {"step", std::to_string(step)}};
}

// A source that copies from the sample state and records every piece it fills.
struct RecordingSource {
  std::vector<TensorState> tensors;
  std::vector<std::tuple<size_t, StateArray, int64_t, size_t>> pieces;
  PieceSource Get() {
    return [this](size_t i, StateArray a, int64_t begin, std::span<float> piece) {
      pieces.emplace_back(i, a, begin, piece.size());
      const std::span<const float> from = ArrayOf(tensors[i], a);
      std::memcpy(piece.data(), from.data() + begin, piece.size_bytes());
    };
  }
};

// Pieces of each array are contiguous, in order, start at multiples of piece_floats, are at
// most piece_floats long, and cover the array exactly once.
void ExpectPiecesCover(const std::vector<std::tuple<size_t, StateArray, int64_t, size_t>>& pieces,
                       const std::vector<TensorState>& tensors, int64_t piece_floats) {
  std::map<std::pair<size_t, StateArray>, int64_t> covered;
  for (const auto& [i, a, begin, size] : pieces) {
    int64_t& next = covered[{i, a}];
    EXPECT_EQ(begin, next) << tensors[i].name << " array " << static_cast<int>(a);
    EXPECT_EQ(begin % piece_floats, 0);
    EXPECT_GT(size, 0u);
    EXPECT_LE(static_cast<int64_t>(size), piece_floats);
    next = begin + static_cast<int64_t>(size);
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    for (int a = 0; a < kStateArrayCount; ++a) {
      const int64_t want = static_cast<int64_t>(ArrayOf(tensors[i], StateArray(a)).size());
      EXPECT_EQ(covered[std::pair(i, StateArray(a))], want) << tensors[i].name << " array " << a;
    }
  }
}

// The tensor files are exactly what SafetensorsBytes (the in-memory serializer) makes of the
// same tensors: streaming the data does not change a byte.
TEST_F(CheckpointStreamTest, TensorFilesAreSafetensorsBytesOfTheTensors) {
  const SampleState s;
  const fs::path dir = WriteCheckpoint(dir_, s.state, s.Tensors(), Gradients::kFull);
  std::vector<NamedTensor> model, optimizer, grads;
  for (const TensorState& t : s.Tensors()) {
    model.push_back({t.name, t.shape, t.param});
    optimizer.push_back({t.name + ".exp_avg", t.shape, t.m});
    optimizer.push_back({t.name + ".exp_avg_sq", t.shape, t.v});
    grads.push_back({t.name, t.shape, t.grad});
  }
  EXPECT_EQ(ReadFileBytes(dir / "model.safetensors"),
            SafetensorsBytes(model, Metadata("model", s.state.step)));
  EXPECT_EQ(ReadFileBytes(dir / "optimizer.safetensors"),
            SafetensorsBytes(optimizer, Metadata("optimizer", s.state.step)));
  EXPECT_EQ(ReadFileBytes(dir / "grads.safetensors"),
            SafetensorsBytes(grads, Metadata("grads", s.state.step)));
}

TEST_F(CheckpointStreamTest, StreamedWriteIsByteIdenticalToWriteCheckpoint) {
  const SampleState s;
  const StateHash want = ComputeStateHash(s.state, s.Tensors());
  std::vector<TensorShape> shapes;
  std::vector<Digest> grad_digests;
  for (const TensorState& t : s.Tensors()) {
    shapes.push_back({t.name, t.shape});
    grad_digests.push_back(ArrayDigest(t.grad));
  }
  const int previous_threads = Threads();
  for (const Gradients gradients : {Gradients::kDigests, Gradients::kFull}) {
    const std::string mode = gradients == Gradients::kFull ? "full" : "digests";
    const fs::path reference = WriteCheckpoint(dir_ / mode, s.state, s.Tensors(), gradients);
    std::vector<std::string> files(std::begin(kFiles), std::end(kFiles));
    if (gradients == Gradients::kFull) files.push_back("grads.safetensors");
    // Pieces smaller than the tensors (12 and 3 elements), equal to one, and larger than all;
    // on one and on two threads; the gradients' digests made from the source or given.
    for (const int64_t piece_floats : {1, 3, 5, 12, 1000}) {
      for (const int threads : {1, 2}) {
        for (const bool given : {false, true}) {
          SetThreads(threads);
          const fs::path run = dir_ / fmt::format("run_{}_{}_{}_{}", mode, piece_floats, threads,
                                                  given);
          RecordingSource source{s.Tensors(), {}};
          const WrittenCheckpoint written = WriteCheckpointStreamed(
              run, s.state, shapes, piece_floats, source.Get(), gradients,
              given ? std::span<const Digest>(grad_digests) : std::span<const Digest>());
          EXPECT_EQ(written.dir, CheckpointDir(run, s.state.step));
          for (const std::string& name : files) {
            EXPECT_EQ(ReadFileBytes(written.dir / name), ReadFileBytes(reference / name))
                << name << " with pieces of " << piece_floats;
          }
          EXPECT_EQ(fs::exists(written.dir / "grads.safetensors"), gradients == Gradients::kFull);
          EXPECT_EQ(written.hash.hash, want.hash);
          EXPECT_EQ(written.hash.components, want.components);
          // Given digests of gradients that are not written: the gradients are not read.
          std::vector<TensorState> pulled = s.Tensors();
          if (given && gradients == Gradients::kDigests) {
            for (TensorState& t : pulled) t.grad = {};
          }
          ExpectPiecesCover(source.pieces, pulled, piece_floats);
        }
      }
    }
  }
  SetThreads(previous_threads);
  // Given digests that the written gradients do not hash to, or of the wrong count: refused.
  std::vector<Digest> wrong = grad_digests;
  wrong[1][0] ^= 1;
  RecordingSource source{s.Tensors(), {}};
  ExpectError([&] {
    WriteCheckpointStreamed(dir_ / "wrong", s.state, shapes, 3, source.Get(), Gradients::kFull,
                            wrong);
  }, {"final_norm.gain", ToHex(grad_digests[1]), ToHex(wrong[1])});
  EXPECT_EQ(LatestCompleteCheckpoint(dir_ / "wrong"), std::nullopt);
  ExpectError([&] {
    WriteCheckpointStreamed(dir_ / "short", s.state, shapes, 3, source.Get(), Gradients::kDigests,
                            std::span(wrong).first(1));
  }, {"1 gradient digests for 2 tensors"});
}

TEST_F(CheckpointStreamTest, StreamedWriteRefusesBeforeWritingAndKeepsTheProtocol) {
  const SampleState s;
  std::vector<TensorShape> shapes;
  for (const TensorState& t : s.Tensors()) shapes.push_back({t.name, t.shape});
  RecordingSource source{s.Tensors(), {}};

  // Bad shapes or names, a bad piece size, a wrongly sized array: refused before anything is
  // written (not even checkpoints/).
  std::vector<TensorShape> bad = shapes;
  bad[1].shape = {-3};
  ExpectError([&] { WriteCheckpointStreamed(dir_, s.state, bad, 3, source.Get()); },
              {"final_norm.gain", "negative dimension -3"});
  bad = shapes;
  bad[1].name = bad[0].name;
  ExpectError([&] { WriteCheckpointStreamed(dir_, s.state, bad, 3, source.Get()); },
              {"model.safetensors", "duplicate tensor name 'embed.weight'"});
  ExpectError([&] { WriteCheckpointStreamed(dir_, s.state, shapes, 0, source.Get()); },
              {"piece_floats = 0"});
  std::vector<TensorState> short_grad = s.Tensors();
  short_grad[0].grad = short_grad[0].grad.first(11);
  ExpectError([&] { WriteCheckpoint(dir_, s.state, short_grad); },
              {"'embed.weight'", "grad has 11 elements", "[4, 3] has 12"});
  // Every tensor is checked, also after one that comes with its gradient's digest.
  std::vector<TensorState> short_param = s.Tensors();
  short_param[0].grad_digest = ArrayDigest(short_param[0].grad);
  short_param[1].param = short_param[1].param.first(2);
  ExpectError([&] { WriteCheckpoint(dir_, s.state, short_param); },
              {"'final_norm.gain'", "param has 2 elements"});
  EXPECT_TRUE(source.pieces.empty());
  EXPECT_FALSE(fs::exists(dir_ / "checkpoints"));

  // A source that fails part-way leaves nothing behind: its staging directory is removed.
  const PieceSource failing = [](size_t i, StateArray a, int64_t, std::span<float>) {
    if (i == 1 && a == StateArray::kV) Fail("source: v of tensor 1 is gone");
  };
  ExpectError([&] { WriteCheckpointStreamed(dir_, s.state, shapes, 3, failing); }, {"gone"});
  EXPECT_EQ(LatestCompleteCheckpoint(dir_), std::nullopt);
  EXPECT_TRUE(fs::is_empty(dir_ / "checkpoints"));

  const fs::path dir = WriteCheckpointStreamed(dir_, s.state, shapes, 3, source.Get()).dir;
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_ / "checkpoints"), fs::directory_iterator()),
            1);
  EXPECT_EQ(WriteCheckpointStreamed(dir_, s.state, shapes, 5, source.Get()).dir, dir);  // no-op
  SampleState other;
  other.state.data_cursor++;
  ExpectError([&] { WriteCheckpointStreamed(dir_, other.state, shapes, 3, source.Get()); },
              {dir.string(), "already exists", "refusing"});
  EXPECT_EQ(ReadCheckpoint(dir).state.data_cursor, s.state.data_cursor);
}

class CheckpointStreamModes : public CheckpointStreamTest,
                              public testing::WithParamInterface<Gradients> {};
INSTANTIATE_TEST_SUITE_P(Gradients, CheckpointStreamModes,
                         testing::Values(Gradients::kDigests, Gradients::kFull),
                         [](const auto& info) {
                           return info.param == Gradients::kFull ? "Full" : "Digests";
                         });

// Without full gradients no gradient piece is handed over (c.tensors' gradients are empty).
TEST_P(CheckpointStreamModes, StreamCheckpointCoversEveryArrayOnceFrontToBack) {
  const SampleState s;
  const fs::path dir = WriteCheckpoint(dir_, s.state, s.Tensors(), GetParam());
  const Checkpoint c = ReadCheckpoint(dir);
  EXPECT_EQ(c.grads.has_value(), GetParam() == Gradients::kFull);
  const StateHash want = VerifyCheckpointHash(c);
  EXPECT_EQ(want.hash, ComputeStateHash(s.state, s.Tensors()).hash);
  const CheckpointIndex index = OpenCheckpoint(dir);
  EXPECT_EQ(index.gradients, GetParam());
  EXPECT_EQ(index.dir, dir);
  EXPECT_EQ(index.state_hash, c.state_hash);
  EXPECT_EQ(index.state.descriptor, s.state.descriptor);
  EXPECT_EQ(index.state.spike.recent_skips, s.state.spike.recent_skips);
  ASSERT_EQ(index.tensors.size(), c.tensors.size());
  for (size_t i = 0; i < c.tensors.size(); ++i) {
    EXPECT_EQ(index.tensors[i].name, c.tensors[i].name);
    EXPECT_EQ(index.tensors[i].shape, c.tensors[i].shape);
  }

  const std::map<fs::path, int> file_order = {
      {dir / "model.safetensors", 0}, {dir / "optimizer.safetensors", 1},
      {dir / "grads.safetensors", 2}};
  for (const int64_t piece_floats : {int64_t{1}, int64_t{3}, int64_t{5}, int64_t{1000}, kHashChunkFloats}) {
    std::vector<std::tuple<size_t, StateArray, int64_t, size_t>> pieces;
    std::map<std::pair<size_t, StateArray>, std::vector<float>> got;
    std::pair<int, uint64_t> last_position{-1, 0};  // (file, byte offset): strictly increasing
    const StateHash hash = StreamCheckpoint(
        index, piece_floats,
        [&](size_t i, StateArray a, int64_t begin, std::span<const float> p,
            std::span<const Digest> chunks) {
          // Whole-chunk pieces come with their chunks' digests, others with none.
          if (piece_floats % kHashChunkFloats == 0) {
            const std::vector<Digest> want = ChunkDigests(p);
            EXPECT_TRUE(std::ranges::equal(chunks, want)) << "piece " << begin << " of " << i;
          } else {
            EXPECT_TRUE(chunks.empty());
          }
          pieces.emplace_back(i, a, begin, p.size());
          got[{i, a}].insert(got[{i, a}].end(), p.begin(), p.end());
          const CheckpointIndex::Location where = index.Where(i, a);
          const std::pair<int, uint64_t> position{file_order.at(where.file),
                                                  where.offset + 4 * static_cast<uint64_t>(begin)};
          EXPECT_LT(last_position, position) << "pieces out of file order";
          last_position = position;
        });
    ExpectPiecesCover(pieces, c.tensors, piece_floats);
    for (size_t i = 0; i < c.tensors.size(); ++i) {
      for (int a = 0; a < kStateArrayCount; ++a) {
        const std::span<const float> want_values = ArrayOf(c.tensors[i], StateArray(a));
        const std::vector<float>& values = got[{i, StateArray(a)}];
        ASSERT_EQ(values.size(), want_values.size());
        if (values.empty()) continue;  // a gradient kept as its digest (memcmp needs pointers)
        EXPECT_EQ(0, std::memcmp(values.data(), want_values.data(), want_values.size_bytes()))
            << c.tensors[i].name << " array " << a;
      }
    }
    EXPECT_EQ(hash.hash, want.hash);
    EXPECT_EQ(hash.components, want.components);
    EXPECT_EQ(VerifyStreamedHash(index, hash).hash, want.hash);
  }
  // No sink: only the hash.
  EXPECT_EQ(StreamCheckpoint(index, 4, nullptr).hash, want.hash);
  ExpectError([&] { StreamCheckpoint(index, 0, nullptr); }, {dir.string(), "piece_floats = 0"});
}

TEST_F(CheckpointStreamTest, StreamCheckpointNamesACorruptFile) {
  const SampleState s;
  const fs::path dir = WriteCheckpoint(dir_, s.state, s.Tensors());
  const StateHash good = ComputeStateHash(s.state, s.Tensors());
  const struct {
    size_t tensor;
    StateArray array;
    const char* file;
    const char* component;
  } cases[] = {{1, StateArray::kParam, "model.safetensors", "param:final_norm.gain"},
               {0, StateArray::kV, "optimizer.safetensors", "v:embed.weight"}};
  for (const auto& c : cases) {
    const fs::path path = dir / c.file;
    const std::vector<uint8_t> bytes = ReadFileBytes(path);
    const CheckpointIndex index = OpenCheckpoint(dir);
    std::vector<uint8_t> flipped = bytes;
    flipped[index.Where(c.tensor, c.array).offset + 1] ^= 0x04;  // a data byte, not the header
    WriteFileSynced(path, flipped);
    // The size and header are intact: only the digest, known at the file's end, can tell.
    const CheckpointIndex damaged = OpenCheckpoint(dir);
    ExpectError([&] { StreamCheckpoint(damaged, 3, nullptr); },
                {path.string(), ToHex(TensorFileDigest(flipped, path)),
                 ToHex(TensorFileDigest(bytes, path)), "corrupt"});
    const StateHash forced = StreamCheckpoint(damaged, 3, nullptr, FileDigests::kIgnore);
    EXPECT_EQ(DifferingComponents(forced, good), std::vector<std::string>{c.component});
    ExpectError([&] { VerifyStreamedHash(damaged, forced); },
                {dir.string(), ToHex(forced.hash), ToHex(good.hash)});
    WriteFileSynced(path, bytes);
  }
}

TEST_F(CheckpointStreamTest, OpenCheckpointRefusesWhatReadCheckpointRefuses) {
  const SampleState s;
  const fs::path dir = WriteCheckpoint(dir_, s.state, s.Tensors(), Gradients::kFull);
  const std::vector<uint8_t> model = ReadFileBytes(dir / "model.safetensors");
  const std::string meta = ReadFileText(dir / "meta.json");
  const std::string complete = ReadFileText(dir / "COMPLETE");
  const auto restore = [&] {
    WriteFileSynced(dir / "model.safetensors", model);
    WriteFileSynced(dir / "meta.json", meta);
    WriteFileSynced(dir / "COMPLETE", complete);
    EXPECT_NO_THROW(OpenCheckpoint(dir));
  };

  // A truncated tensor file: its size differs from COMPLETE's.
  WriteFileSynced(dir / "model.safetensors", std::span(model).first(model.size() - 3));
  ExpectError([&] { OpenCheckpoint(dir); },
              {(dir / "model.safetensors").string(), std::to_string(model.size() - 3) + " bytes",
               "lists " + std::to_string(model.size())});
  restore();

  // meta.json: a flipped byte (digest), then forged ones that its parser refuses.
  WriteFileSynced(dir / "meta.json", Replace(meta, "\"rng_seed\": 1234", "\"rng_seed\": 1235"));
  ExpectError([&] { OpenCheckpoint(dir); }, {(dir / "meta.json").string(), "corrupt"});
  Forge(dir, "meta.json", Replace(meta, "\"rng_seed\": 1234", "\"rng_seed\": -1234"));
  ExpectError([&] { OpenCheckpoint(dir); },
              {(dir / "meta.json").string(), "\"rng_seed\"", "unsigned integer", "-1234"});
  Forge(dir, "meta.json", Replace(meta, "\"step\": 7", "\"step\": 8"));
  ExpectError([&] { OpenCheckpoint(dir); }, {"\"step\" is 8", "named for step 7"});
  restore();

  // A header that fails validation, and tensor files that do not agree.
  std::string bad_header(model.begin(), model.end());
  bad_header = Replace(bad_header, "\"F32\"", "\"F16\"");
  Forge(dir, "model.safetensors", bad_header);
  ExpectError([&] { OpenCheckpoint(dir); },
              {(dir / "model.safetensors").string(), "dtype \"F16\"", "F32 only"});
  restore();
  const SafetensorsFile grads = ReadSafetensors(dir / "grads.safetensors");
  std::vector<NamedTensor> renamed = grads.tensors();
  renamed[1].name = "other";
  const std::vector<uint8_t> renamed_bytes = SafetensorsBytes(renamed, grads.metadata());
  Forge(dir, "grads.safetensors", std::string(renamed_bytes.begin(), renamed_bytes.end()));
  ExpectError([&] { OpenCheckpoint(dir); },
              {(dir / "grads.safetensors").string(), "no tensor named 'final_norm.gain'"});
  // A tensor file from another step: its __metadata__ gives it away.
  std::vector<NamedTensor> same = grads.tensors();
  const std::vector<uint8_t> other_step = SafetensorsBytes(same, Metadata("grads", 8));
  Forge(dir, "grads.safetensors", std::string(other_step.begin(), other_step.end()));
  ExpectError([&] { OpenCheckpoint(dir); },
              {(dir / "grads.safetensors").string(), "__metadata__", "grads of step 7"});
  const std::vector<uint8_t> original_grads = SafetensorsBytes(same, grads.metadata());
  Forge(dir, "grads.safetensors", std::string(original_grads.begin(), original_grads.end()));
  restore();

  fs::remove(dir / "COMPLETE");
  ExpectError([&] { OpenCheckpoint(dir); }, {dir.string(), "no COMPLETE"});
}

TEST_F(CheckpointStreamTest, WherePointsAtEachArraysFirstElement) {
  const SampleState s;
  const fs::path dir = WriteCheckpoint(dir_, s.state, s.Tensors(), Gradients::kFull);
  const CheckpointIndex index = OpenCheckpoint(dir);
  const std::vector<TensorState> tensors = s.Tensors();
  ASSERT_EQ(index.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    for (int a = 0; a < kStateArrayCount; ++a) {
      const CheckpointIndex::Location where = index.Where(i, StateArray(a));
      const std::vector<uint8_t> bytes = ReadFileBytes(where.file);
      const std::span<const float> want = ArrayOf(tensors[i], StateArray(a));
      ASSERT_LE(where.offset + want.size_bytes(), bytes.size());
      EXPECT_EQ(0, std::memcmp(bytes.data() + where.offset, want.data(), want.size_bytes()))
          << tensors[i].name << " array " << a << " in " << where.file;
    }
  }
  EXPECT_EQ(index.Where(0, StateArray::kM).file, dir / "optimizer.safetensors");
  EXPECT_EQ(index.Where(1, StateArray::kGrad).file, dir / "grads.safetensors");
  ExpectError([&] { index.Where(2, StateArray::kParam); }, {dir.string(), "tensor 2", "holds 2"});
  // Without full gradients there is no gradient to point at.
  const fs::path digests = WriteCheckpoint(dir_ / "digests", s.state, s.Tensors());
  const CheckpointIndex digest_index = OpenCheckpoint(digests);
  EXPECT_EQ(digest_index.Where(1, StateArray::kV).file, digests / "optimizer.safetensors");
  ExpectError([&] { digest_index.Where(1, StateArray::kGrad); },
              {digests.string(), "final_norm.gain", "digest"});
  EXPECT_EQ(digest_index.grad_digests,
            (std::vector<Digest>{ArrayDigest(tensors[0].grad), ArrayDigest(tensors[1].grad)}));
}

}  // namespace
}  // namespace lockstep
