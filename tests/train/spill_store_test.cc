// SpillStore: pieces round-trip through the chunk files, untouched chunks read as zeros, a chunk
// changed on disk is reported naming the file, a checkpoint is loaded in place (and never
// written to), pieces are read ahead with O_DIRECT and checked as any read, and every operation
// gives the bits the in-RAM store gives.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "lockstep/core.h"
#include "lockstep/state.h"
#include "train/state_store.h"

namespace lockstep::train {
namespace {
namespace fs = std::filesystem;

constexpr int64_t kChunk = kSpillChunkFloats;

// Two tensors: one of 2 chunks and a bit (pieces cross chunk ends), one smaller than a chunk.
std::vector<ParamSpec> Specs() {
  return {{.name = "big", .shape = {2, kChunk + 3}, .weight_decay = true, .is_matrix = true},
          {.name = "small", .shape = {5}, .weight_decay = false, .is_matrix = false}};
}

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

class SpillStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lockstep_spill_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes `values` as array `a` of tensor i, piece by piece.
  static void Put(StateStore& store, StateArray a, size_t i, const std::vector<float>& values) {
    const auto n = static_cast<int64_t>(values.size());
    for (int64_t begin = 0; begin < n; begin += store.PieceFloats()) {
      const int64_t count = std::min(store.PieceFloats(), n - begin);
      const Piece p = store.Acquire(a, i, begin, count, /*load=*/false);
      std::memcpy(p.data.data(), values.data() + begin, p.data.size_bytes());
      store.Release(p, /*store=*/true);
    }
  }
  // Whether dir_ is on a filesystem that offers O_DIRECT.
  bool HasDirectIo() {
    fs::create_directories(dir_);
    const fs::path probe = dir_ / "probe";
    WriteFileSynced(probe, std::string_view("x"));
    return File::OpenDirect(probe).has_value();
  }
  // A checkpoint of step `step` under dir_/name, with gradients, of random arrays (seeded from
  // `seed`); data[i][a] is array a of tensor i.
  struct RandomCheckpoint {
    std::vector<std::array<std::vector<float>, kStateArrayCount>> data;
    std::vector<TensorState> tensors;
    StepState state;
    fs::path dir;
  };
  RandomCheckpoint WriteRandomCheckpoint(const char* name, uint64_t step, uint32_t seed) {
    const std::vector<ParamSpec> specs = Specs();
    RandomCheckpoint c;
    for (size_t i = 0; i < specs.size(); ++i) {
      auto& d = c.data.emplace_back();
      for (int a = 0; a < kStateArrayCount; ++a) {
        d[a] = Random(specs[i].numel(), seed * static_cast<uint32_t>(i) + a);
      }
      c.tensors.push_back({specs[i].name, specs[i].shape, d[0], d[1], d[2], d[3], {}});
    }
    c.state.step = step;
    c.state.descriptor = "{}";
    c.dir = WriteCheckpoint(dir_ / name, c.state, c.tensors, Gradients::kFull);
    return c;
  }

  static std::vector<float> Get(StateStore& store, StateArray a, size_t i) {
    const int64_t n = store.specs()[i].numel();
    const Piece p = store.Acquire(a, i, 0, n, /*load=*/true);
    std::vector<float> out(p.data.begin(), p.data.end());
    store.Release(p, /*store=*/false);
    return out;
  }

  fs::path dir_;
};

TEST_F(SpillStoreTest, PiecesRoundTripAndUntouchedChunksAreZero) {
  auto spill = MakeSpillStore(Specs(), dir_ / "spill");
  auto ram = MakeMemoryStore(Specs());
  const int64_t n = Specs()[0].numel();
  EXPECT_EQ(Get(*spill, StateArray::kM, 0), std::vector<float>(static_cast<size_t>(n), 0.0f));
  const std::vector<float> values = Random(n, 1);
  for (StateStore* store : {spill.get(), ram.get()}) Put(*store, StateArray::kV, 0, values);
  EXPECT_EQ(Get(*spill, StateArray::kV, 0), values);
  EXPECT_EQ(Get(*spill, StateArray::kV, 0), Get(*ram, StateArray::kV, 0));
  // The whole-tensor access the Model uses: an accumulated gradient comes back as stored.
  std::span<float> g = spill->OpenGrad(1, /*accumulate=*/false);
  std::ranges::fill(g, 2.5f);
  spill->CloseGrad(1);
  EXPECT_EQ(spill->OpenGrad(1, /*accumulate=*/true)[4], 2.5f);
  spill->CloseGrad(1);
  EXPECT_GT(spill->SpillBytes(), 0u);
  spill.reset();
  EXPECT_FALSE(fs::exists(dir_ / "spill")) << "spill files left behind";
}

// Where the filesystem offers O_DIRECT, the gradients' spill file also has a direct descriptor
// (they are written through it, bypassing the page cache) and the other three do not; pieces of
// any length still round-trip (a last block is padded), read back through the page cache.
TEST_F(SpillStoreTest, SpillFilesAreOpenedForDirectWrites) {
  if (!HasDirectIo()) GTEST_SKIP() << dir_ << " has no O_DIRECT";
  auto spill = MakeSpillStore(Specs(), dir_ / "spill");
  for (const char* name : {"param", "m", "v", "grad"}) {
    const std::string target = (dir_ / "spill" / (std::string(name) + ".spill")).string() + " (deleted)";
    int direct = 0;
    for (const auto& fd : fs::directory_iterator("/proc/self/fd")) {
      std::error_code error;
      if (fs::read_symlink(fd.path(), error).string() != target) continue;
      // fdinfo's flags are octal; O_DIRECT is 040000 on x86-64 and 0200000 on aarch64.
      const std::string info = ReadFileText("/proc/self/fdinfo/" + fd.path().filename().string());
      const size_t at = info.find("flags:");
      ASSERT_NE(at, std::string::npos) << info;
      if (std::stoul(info.substr(at + 6), nullptr, 8) & O_DIRECT) ++direct;
    }
    EXPECT_EQ(direct, std::string_view(name) == "grad" ? 1 : 0) << name;
  }
  for (const StateArray a : {StateArray::kParam, StateArray::kM, StateArray::kGrad}) {
    const std::vector<float> values = Random(Specs()[0].numel(), 3 + static_cast<uint32_t>(a));
    Put(*spill, a, 0, values);
    EXPECT_EQ(Get(*spill, a, 0), values);
  }
}

TEST_F(SpillStoreTest, ChunkChangedOnDiskIsNamed) {
  auto spill = MakeSpillStore(Specs(), dir_ / "spill");
  Put(*spill, StateArray::kM, 0, Random(Specs()[0].numel(), 2));
  // The spill file is unlinked once created: reach it through this process's descriptor.
  fs::path m_spill;
  for (const auto& fd : fs::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const std::string target = fs::read_symlink(fd.path(), error).string();
    if (target == (dir_ / "spill" / "m.spill").string() + " (deleted)") m_spill = fd.path();
  }
  ASSERT_FALSE(m_spill.empty()) << "no open, unlinked m.spill";
  EXPECT_FALSE(fs::exists(dir_ / "spill" / "m.spill"));
  {
    std::fstream f(m_spill, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4 * (kChunk + 7));  // inside the second chunk
    f.put('\x5a');
  }
  try {
    Get(*spill, StateArray::kM, 0);
    FAIL() << "a changed chunk was read back without an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("m.spill"), std::string::npos) << message;
    EXPECT_NE(message.find("chunk 1 of m of 'big'"), std::string::npos) << message;
    EXPECT_NE(message.find("changed under lockstep"), std::string::npos) << message;
  }
}

TEST_F(SpillStoreTest, PiecesMustBeWholeChunks) {
  auto spill = MakeSpillStore(Specs(), dir_ / "spill");
  EXPECT_THROW(spill->Acquire(StateArray::kGrad, 0, 3, kChunk, true), Error);
  EXPECT_THROW(spill->Acquire(StateArray::kGrad, 0, 0, kChunk + 1, true), Error);
  EXPECT_THROW(spill->Acquire(StateArray::kGrad, 0, kChunk, 3 * kChunk, true), Error);
}

TEST_F(SpillStoreTest, ExistingSpillFileIsNotReused) {
  fs::create_directories(dir_ / "spill");
  std::ofstream(dir_ / "spill" / "grad.spill") << "someone else's";
  EXPECT_THROW(MakeSpillStore(Specs(), dir_ / "spill"), Error);
}

// A checkpoint loads in place: the data is read where it is (the same bits as a load into RAM,
// the same recomputed hash) and writes go to the spill files, never into the checkpoint.
TEST_F(SpillStoreTest, CheckpointLoadsInPlaceAndIsNeverWritten) {
  const std::vector<ParamSpec> specs = Specs();
  const RandomCheckpoint checkpoint = WriteRandomCheckpoint("run", 3, 10);
  const auto& [data, tensors, state, written] = checkpoint;
  const CheckpointIndex index = OpenCheckpoint(written);
  const std::string complete = ReadFileText(written / "COMPLETE");

  auto spill = MakeSpillStore(specs, dir_ / "spill");
  auto ram = MakeMemoryStore(specs);
  const StateHash spilled = spill->Load(index, FileDigests::kEnforce, [](uint64_t) {});
  EXPECT_EQ(spilled.hash, ram->Load(index, FileDigests::kEnforce, [](uint64_t) {}).hash);
  EXPECT_EQ(spilled.hash, index.state_hash);
  for (size_t i = 0; i < specs.size(); ++i) {
    for (int a = 0; a < kStateArrayCount; ++a) {
      EXPECT_EQ(Get(*spill, static_cast<StateArray>(a), i), data[i][a]) << i << " " << a;
    }
  }
  Put(*spill, StateArray::kParam, 0, Random(specs[0].numel(), 99));
  EXPECT_NO_THROW(VerifyCheckpointHash(ReadCheckpoint(written)));
  EXPECT_EQ(ReadFileText(written / "COMPLETE"), complete);

  // A checkpoint that keeps the gradients' digests: the same hash, from those digests; the
  // gradients are not loaded (the spilled ones read as zeros until a step writes them).
  const fs::path digests = WriteCheckpoint(dir_ / "digests", state, tensors);
  const CheckpointIndex digest_index = OpenCheckpoint(digests);
  auto spill2 = MakeSpillStore(specs, dir_ / "spill2");
  EXPECT_EQ(spill2->Load(digest_index, FileDigests::kEnforce, [](uint64_t) {}).hash,
            index.state_hash);
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(Get(*spill2, StateArray::kV, i), data[i][2]) << i;
    EXPECT_EQ(Get(*spill2, StateArray::kGrad, i), std::vector<float>(data[i][3].size(), 0.0f))
        << i;
  }
}

// Where the filesystem offers O_DIRECT, a prefetched piece of a checkpoint is read ahead into a
// buffer of the store's own, starting where the piece starts in its file's block (not at a
// block: the data of a safetensors file is not block-aligned), and gives the checkpoint's bits.
// A read ahead is checked against the digests as any read, is not used once its elements were
// stored, and a file cut short is named.
TEST_F(SpillStoreTest, PiecesAreReadAheadAndChecked) {
  if (!HasDirectIo()) GTEST_SKIP() << dir_ << " has no O_DIRECT";
  const std::vector<ParamSpec> specs = Specs();
  const RandomCheckpoint checkpoint = WriteRandomCheckpoint("run", 2, 20);
  const auto& [data, tensors, state, written] = checkpoint;
  const CheckpointIndex index = OpenCheckpoint(written);
  auto load = [&](const char* name) {
    auto store = MakeSpillStore(specs, dir_ / name);
    EXPECT_EQ(store->Load(index, FileDigests::kEnforce, [](uint64_t) {}).hash, index.state_hash);
    return store;
  };
  auto spill = load("spill");
  bool unaligned = false;  // some piece was read ahead at an offset within a block
  for (size_t i = 0; i < specs.size(); ++i) {
    for (int a = 0; a < kStateArrayCount; ++a) {
      const auto array = static_cast<StateArray>(a);
      const int64_t n = specs[i].numel();
      // Pieces of one chunk and the rest: each is asked ahead, then taken.
      for (int64_t begin = 0; begin < n; begin += kChunk) {
        const int64_t count = std::min(kChunk, n - begin);
        spill->Prefetch(array, i, begin, count);
        const Piece p = spill->Acquire(array, i, begin, count, /*load=*/true);
        unaligned |= reinterpret_cast<uintptr_t>(p.data.data()) % kDirectIoAlignment != 0;
        EXPECT_TRUE(std::equal(p.data.begin(), p.data.end(), data[i][a].begin() + begin))
            << specs[i].name << " array " << a << " at " << begin;
        spill->Release(p, /*store=*/false);
      }
    }
  }
  EXPECT_TRUE(unaligned) << "no piece was read ahead with O_DIRECT";

  // A gradient read ahead at an offset within a block, stored (written with O_DIRECT from its
  // block's start), reads back as stored.
  spill->Prefetch(StateArray::kGrad, 1, 0, 5);
  Piece g = spill->Acquire(StateArray::kGrad, 1, 0, 5, /*load=*/true);
  g.data[4] = 7.0f;
  spill->Release(g, /*store=*/true);
  std::vector<float> stored = data[1][3];
  stored[4] = 7.0f;
  EXPECT_EQ(Get(*spill, StateArray::kGrad, 1), stored);

  // Elements stored after they were asked ahead: the store's values, not the file's.
  const std::vector<float> fresh = Random(specs[0].numel(), 77);
  spill->Prefetch(StateArray::kM, 0, 0, specs[0].numel());
  Put(*spill, StateArray::kM, 0, fresh);
  EXPECT_EQ(Get(*spill, StateArray::kM, 0), fresh);

  // Reads ahead still under way when the store is zeroed or destroyed are cancelled.
  spill->Prefetch(StateArray::kV, 0, 0, kChunk);
  spill->Zero();
  spill->Prefetch(StateArray::kParam, 0, 0, kChunk);
  spill.reset();

  // A checkpoint byte changed after the load: the read ahead is refused, naming the chunk.
  const fs::path model = written / "model.safetensors";
  auto changed = load("changed");
  const CheckpointIndex::Location where = index.Where(0, StateArray::kParam);
  {
    std::fstream f(model, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(where.offset + 4 * (kChunk + 1)));
    f.put('\x5a');
  }
  // Reads chunk 1 of big's parameters ahead, then takes it: the error must name every part.
  const auto refused = [&](std::initializer_list<std::string_view> parts) {
    changed->Prefetch(StateArray::kParam, 0, kChunk, kChunk);
    try {
      changed->Acquire(StateArray::kParam, 0, kChunk, kChunk, /*load=*/true);
      ADD_FAILURE() << "read ahead without an error";
    } catch (const Error& e) {
      for (std::string_view part : parts) {
        EXPECT_NE(std::string_view(e.what()).find(part), std::string::npos) << e.what();
      }
    }
  };
  refused({"chunk 1 of param of 'big'", "changed under lockstep"});

  // Cut short after the load: the read ahead names the file and where it ends.
  fs::resize_file(model, where.offset + 4 * kChunk);
  refused({"model.safetensors: ends at byte", "chunks 1 to 1 of param of 'big'"});
}

}  // namespace
}  // namespace lockstep::train
