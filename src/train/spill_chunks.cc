// SpillChunks: the spill files, the chunk table, and the chunks' reads, checks and writes.
#include "train/spill_chunks.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "train/direct_reader.h"

namespace lockstep::train {
namespace {
namespace fs = std::filesystem;

constexpr int64_t kChunkBytes = kSpillChunkFloats * int64_t{sizeof(float)};
static_assert(kSpillChunkFloats % kHashChunkFloats == 0, "a chunk is whole hash chunks");
static_assert(kChunkBytes % kDirectIoAlignment == 0, "chunk slots start on blocks of direct I/O");

// The digest of the k-th chunk (`floats` elements) of a piece, from the digests of the piece's
// hash chunks (ChunkDigests), without hashing it again.
Digest ChunkDigestOf(std::span<const Digest> hash_chunks, int64_t k, int64_t floats) {
  constexpr int64_t kPerChunk = kSpillChunkFloats / kHashChunkFloats;
  return ArrayDigestFromChunks(static_cast<uint64_t>(floats),
                               hash_chunks.subspan(static_cast<size_t>(k * kPerChunk),
                                                   static_cast<size_t>(ChunkCount(floats))));
}

// The arrays a checkpoint holds: gradients kept as digests stay zeros here (the next step
// overwrites them).
bool Loaded(const CheckpointIndex& checkpoint, int a) {
  return a != static_cast<int>(StateArray::kGrad) || checkpoint.gradients == Gradients::kFull;
}

}  // namespace

SpillChunks::SpillChunks(const std::vector<ParamSpec>& specs, const fs::path& dir) : specs_(specs) {
  std::error_code error;
  created_dir_ = fs::create_directories(dir, error);
  if (error) Fail("{}: cannot create the spill directory: {}", dir.string(), error.message());
  int64_t floats = 0;  // slots: tensor after tensor, each chunk at a multiple of the chunk size
  for (const ParamSpec& spec : specs_) {
    slot_chunk_.push_back(floats / kSpillChunkFloats);
    floats += Count(spec.numel()) * kSpillChunkFloats;
  }
  for (int a = 0; a < kStateArrayCount; ++a) {
    const fs::path path = dir / fmt::format("{}.spill", kStateArrayNames[a]);
    // Exclusive: a spill file of another run (or a crashed one) is never silently reused.
    std::optional<File> file;
    try {
      file.emplace(File::CreateExclusive(path, 0600));
    } catch (const Error& e) {
      Fail("{} (remove it, or give another --spill-dir)", e.what());
    }
    // Gradients bypass the page cache where the filesystem allows (see Write): the
    // backward writes them while it streams the parameters from disk, and as dirty pages
    // they would make the kernel flush in bursts that stall those reads. The price is that
    // the update pass reads them back from the disk, not from the page cache. The new
    // parameters and moments go through the page cache: the next step reads them back, and
    // written directly they made a spilled training step slower. (docs/performance.md,
    // "Checkpoints and spilled state"; bench/replay_open1b.sh measures both sides.)
    std::shared_ptr<File> direct;
    if (a == static_cast<int>(StateArray::kGrad)) {
      if (std::optional<File> opened = File::OpenDirect(path)) {
        direct = std::make_shared<File>(std::move(*opened));
      }
    }
    // Unlinked at once: the space is the open descriptor's, so it is freed however the process
    // ends (a killed replay of a large model must not leave gigabytes behind).
    files_.push_back({std::move(*file), true, std::move(direct)});
    if (::unlink(path.c_str()) != 0) {
      Fail("{}: cannot unlink the new spill file: {}", path.string(), std::strerror(errno));
    }
  }
  dir_ = dir;
  Clear();
}

SpillChunks::~SpillChunks() {
  files_.clear();  // closes them
  if (created_dir_) {
    std::error_code ignored;
    fs::remove(dir_, ignored);  // only if empty
  }
}

bool SpillChunks::WholeChunks(size_t tensor, int64_t begin, int64_t count) const {
  const int64_t numel = specs_[tensor].numel();
  return begin >= 0 && begin % kSpillChunkFloats == 0 && count >= 0 && begin + count <= numel &&
         (count % kSpillChunkFloats == 0 || begin + count == numel);
}

uint64_t SpillChunks::StoredBytes(const Piece& piece) const {
  uint64_t bytes = 0;
  const int64_t first = piece.begin / kSpillChunkFloats;
  for (int64_t c = first; c < first + Count(static_cast<int64_t>(piece.data.size())); ++c) {
    if (ChunkOf(piece, c).file >= 0) {
      bytes += static_cast<uint64_t>(Floats(piece.tensor, c)) * sizeof(float);
    }
  }
  return bytes;
}

uint64_t SpillChunks::SpillBytes() const {
  uint64_t bytes = 0;
  for (const SpillFile& f : files_) {
    if (f.owned) bytes += f.file.AllocatedBytes();
  }
  return bytes;
}

void SpillChunks::Clear() {
  chunks_.assign(kStateArrayCount, {});
  for (auto& tensors : chunks_) {
    for (const ParamSpec& spec : specs_) {
      tensors.emplace_back(static_cast<size_t>(Count(spec.numel())));
    }
  }
  // Checkpoint files attached by an earlier Load or Attach are no longer referenced.
  files_.erase(files_.begin() + kStateArrayCount, files_.end());
  in_place_.clear();
}

std::map<fs::path, int> SpillChunks::AttachFiles(const CheckpointIndex& checkpoint) {
  std::map<fs::path, int> file_of;
  for (size_t i = 0; i < specs_.size(); ++i) {
    for (int a = 0; a < kStateArrayCount; ++a) {
      if (!Loaded(checkpoint, a)) continue;
      const fs::path& path = checkpoint.Where(i, static_cast<StateArray>(a)).file;
      if (file_of.contains(path)) continue;
      file_of[path] = static_cast<int>(files_.size());
      File file = File::OpenForReading(path);
      std::shared_ptr<File> direct;
      if (std::optional<File> reopened = file.ReopenDirectForReading()) {
        direct = std::make_shared<File>(std::move(*reopened));
      }
      files_.push_back({std::move(file), false, std::move(direct)});
    }
  }
  return file_of;
}

StateHash SpillChunks::Load(const CheckpointIndex& checkpoint, FileDigests digests,
                            const std::function<void(uint64_t)>& loaded) {
  const std::map<fs::path, int> file_of = AttachFiles(checkpoint);
  // StreamCheckpoint reads pieces of whole chunks and hands over their hash chunks' digests:
  // a chunk's digest (ArrayDigest) is made from those, and the chunk is left where it is.
  return StreamCheckpoint(
      checkpoint, kSpillPieceFloats,
      [&](size_t i, StateArray a, int64_t begin, std::span<const float> piece,
          std::span<const Digest> hash_chunks) {
        const CheckpointIndex::Location where = checkpoint.Where(i, a);
        const int file = file_of.at(where.file);
        const auto n = static_cast<int64_t>(piece.size());
        for (int64_t k = 0; k < Count(n); ++k) {
          const int64_t first = begin + k * kSpillChunkFloats;
          const int64_t floats = std::min(kSpillChunkFloats, n - k * kSpillChunkFloats);
          chunks_[static_cast<size_t>(a)][i][static_cast<size_t>(first / kSpillChunkFloats)] = {
              file, where.offset + static_cast<uint64_t>(first) * sizeof(float),
              ChunkDigestOf(hash_chunks, k, floats)};
        }
        loaded(piece.size_bytes());
      },
      digests);
}

void SpillChunks::Attach(const CheckpointIndex& checkpoint) {
  const std::map<fs::path, int> file_of = AttachFiles(checkpoint);
  in_place_.assign(kStateArrayCount, {});
  for (int a = 0; a < kStateArrayCount; ++a) {
    if (!Loaded(checkpoint, a)) continue;
    for (size_t i = 0; i < specs_.size(); ++i) {
      const CheckpointIndex::Location where = checkpoint.Where(i, static_cast<StateArray>(a));
      std::vector<Chunk>& chunks = chunks_[static_cast<size_t>(a)][i];
      std::vector<InPlace>& in_place =
          in_place_[static_cast<size_t>(a)].emplace_back(chunks.size());
      for (size_t c = 0; c < chunks.size(); ++c) {
        in_place[c] = {file_of.at(where.file), where.offset + c * kChunkBytes, {}};
        chunks[c] = {in_place[c].file, in_place[c].offset, {}, /*digested=*/false};
      }
    }
  }
}

uint64_t SpillChunks::ReadUnread() {
  struct Unread {
    size_t array, tensor;
    int64_t chunk;
  };
  std::vector<Unread> unread;
  for (size_t a = 0; a < in_place_.size(); ++a) {
    for (size_t i = 0; i < in_place_[a].size(); ++i) {
      for (size_t c = 0; c < in_place_[a][i].size(); ++c) {
        if (in_place_[a][i][c].hash_chunks.empty()) {
          unread.push_back({a, i, static_cast<int64_t>(c)});
        }
      }
    }
  }
  std::vector<std::optional<std::string>> errors(unread.size());
  ParallelFor(static_cast<int64_t>(unread.size()), [&](int64_t k) {
    const Unread& u = unread[static_cast<size_t>(k)];
    InPlace& in_place = in_place_[u.array][u.tensor][static_cast<size_t>(u.chunk)];
    const auto floats = static_cast<size_t>(Floats(u.tensor, u.chunk));
    const auto data = std::make_unique_for_overwrite<float[]>(floats);
    try {  // in a ParallelFor body: errors are kept, not thrown
      files_[static_cast<size_t>(in_place.file)].file.ReadAt(
          in_place.offset, {reinterpret_cast<uint8_t*>(data.get()), floats * sizeof(float)});
    } catch (const Error& e) {
      errors[static_cast<size_t>(k)] =
          fmt::format("reading {}: {}", Describe(u.array, u.tensor, u.chunk), e.what());
      return;
    }
    in_place.hash_chunks = ChunkDigests({data.get(), floats});
    // A chunk still where it was attached is digested now (read back, it is checked).
    Chunk& chunk = chunks_[u.array][u.tensor][static_cast<size_t>(u.chunk)];
    if (!chunk.digested) {
      chunk.digest = ArrayDigestFromChunks(floats, in_place.hash_chunks);
      chunk.digested = true;
    }
  });
  for (const auto& error : errors) {
    if (error) Fail("{}", *error);
  }
  uint64_t bytes = 0;
  for (const Unread& u : unread) {
    bytes += static_cast<uint64_t>(Floats(u.tensor, u.chunk)) * sizeof(float);
  }
  return bytes;
}

std::vector<TensorDigest> SpillChunks::AttachedDigests() {
  std::vector<TensorDigest> tensors;
  for (size_t i = 0; i < specs_.size(); ++i) {
    TensorDigest& t = tensors.emplace_back(TensorDigest{specs_[i].name, specs_[i].shape});
    for (size_t a = 0; a < in_place_.size(); ++a) {
      if (in_place_[a].empty()) continue;  // not in the checkpoint
      std::vector<Digest> chunks;
      for (const InPlace& c : in_place_[a][i]) {
        chunks.insert(chunks.end(), c.hash_chunks.begin(), c.hash_chunks.end());
      }
      t.*kDigestArrays[a] = ArrayDigestFromChunks(static_cast<uint64_t>(specs_[i].numel()), chunks);
    }
  }
  in_place_.clear();
  return tensors;
}

template <typename Io>
void SpillChunks::ForChunks(const Piece& piece, Io io) {
  const int64_t first = piece.begin / kSpillChunkFloats;
  const auto n = static_cast<int64_t>(piece.data.size());
  const int64_t count = (n + kSpillChunkFloats - 1) / kSpillChunkFloats;
  std::vector<std::optional<std::string>> errors(static_cast<size_t>(count));
  ParallelFor(count, [&](int64_t k) {
    const int64_t begin = k * kSpillChunkFloats;
    errors[static_cast<size_t>(k)] = io(
        first + k, piece.data.subspan(static_cast<size_t>(begin),
                                      static_cast<size_t>(std::min(kSpillChunkFloats, n - begin))));
  });
  for (const auto& error : errors) {
    if (error) Fail("{}", *error);
  }
}

void SpillChunks::Read(const Piece& piece) {
  ForChunks(piece, [&](int64_t c, std::span<float> data) { return ReadChunk(piece, c, data); });
}

void SpillChunks::Check(const Piece& piece) {
  ForChunks(piece, [&](int64_t c, std::span<float> data) { return CheckChunk(piece, c, data); });
}

void SpillChunks::Write(const Piece& piece, std::span<uint8_t> buffer,
                        std::span<const Digest> hash_chunks) {
  // The chunks are digested in parallel and written in one call: the piece's slots follow
  // one another in its file, and writers of one file on several threads would only spin on
  // its lock.
  const int64_t first = piece.begin / kSpillChunkFloats;
  std::vector<Digest> digests(static_cast<size_t>(Count(piece.data.size())));
  const auto count = static_cast<int64_t>(piece.data.size());
  if (!hash_chunks.empty() && hash_chunks.size() != static_cast<size_t>(ChunkCount(count))) {
    Fail("SpillStore: {} hash chunk digests for a piece of {} elements", hash_chunks.size(), count);
  }
  ForChunks(piece, [&](int64_t c, std::span<float> data) {
    const int64_t k = c - first;
    digests[static_cast<size_t>(k)] =
        hash_chunks.empty() ? ArrayDigest(data)
                            : ChunkDigestOf(hash_chunks, k, static_cast<int64_t>(data.size()));
    return std::optional<std::string>();
  });
  try {
    SpillFile& to = files_[static_cast<size_t>(piece.array)];
    auto* bytes = reinterpret_cast<uint8_t*>(piece.data.data());
    if (to.direct) {  // whole blocks: the buffer's padding is zeroed and written too
      uint8_t* const block = buffer.data();
      if (bytes != block) {  // read ahead from a checkpoint at an offset within a block
        std::memmove(block, bytes, piece.data.size_bytes());
        bytes = block;
      }
      const size_t padded = DirectBytes(piece.data.size_bytes());
      std::fill(bytes + piece.data.size_bytes(), bytes + padded, uint8_t{0});
      to.direct->WriteAt(SlotOffset(piece.tensor, first), {bytes, padded});
    } else {
      to.file.WriteAt(SlotOffset(piece.tensor, first), {bytes, piece.data.size_bytes()});
    }
  } catch (const Error& e) {
    Fail("writing chunks {} to {} of {} of '{}': {}", first,
         first + static_cast<int64_t>(digests.size()) - 1,
         kStateArrayNames[static_cast<size_t>(piece.array)], specs_[piece.tensor].name, e.what());
  }
  for (size_t k = 0; k < digests.size(); ++k) {
    const int64_t c = first + static_cast<int64_t>(k);
    ChunkOf(piece, c) = {static_cast<int>(piece.array), SlotOffset(piece.tensor, c), digests[k]};
  }
}

std::optional<SpillChunks::Run> SpillChunks::DirectRun(StateArray array, size_t tensor,
                                                       int64_t begin, int64_t count) const {
  const std::vector<Chunk>& chunks = chunks_[static_cast<size_t>(array)][tensor];
  const int64_t first = begin / kSpillChunkFloats;
  const Chunk& head = chunks[static_cast<size_t>(first)];
  if (head.file < 0 || !files_[static_cast<size_t>(head.file)].direct ||
      head.offset % alignof(float) != 0) {
    return std::nullopt;
  }
  for (int64_t c = first + 1; c < Count(begin + count); ++c) {
    const Chunk& chunk = chunks[static_cast<size_t>(c)];
    if (chunk.file != head.file ||
        chunk.offset != head.offset + static_cast<uint64_t>((c - first) * kChunkBytes)) {
      return std::nullopt;
    }
  }
  return Run{files_[static_cast<size_t>(head.file)].direct, head.offset};
}

void SpillChunks::Advise(StateArray array, size_t tensor, int64_t begin, int64_t count) const {
  const int64_t first = begin / kSpillChunkFloats;
  const int64_t last = std::min(Count(begin + count), Count(specs_.at(tensor).numel()));
  // Runs of chunks that lie one after another in one file, each asked for at once.
  int file = -1;
  uint64_t from = 0, to = 0;
  const auto ask = [&] {
    if (file >= 0 && to > from) {
      // Only a hint: an error here (none is expected for a readable file) leaves the read to
      // Read, which reports it.
      (void)::posix_fadvise(files_[static_cast<size_t>(file)].file.fd(), static_cast<off_t>(from),
                            static_cast<off_t>(to - from), POSIX_FADV_WILLNEED);
    }
  };
  const auto& chunks = chunks_[static_cast<size_t>(array)][tensor];
  for (int64_t c = first; c < last; ++c) {
    const Chunk& chunk = chunks[static_cast<size_t>(c)];
    if (chunk.file < 0) continue;  // zeros: nothing to read
    const uint64_t bytes = static_cast<uint64_t>(Floats(tensor, c)) * sizeof(float);
    if (chunk.file != file || chunk.offset != to) {
      ask();
      file = chunk.file;
      from = chunk.offset;
    }
    to = chunk.offset + bytes;
  }
  ask();
}

int64_t SpillChunks::Floats(size_t tensor, int64_t c) const {
  return std::min(kSpillChunkFloats, specs_[tensor].numel() - c * kSpillChunkFloats);
}

uint64_t SpillChunks::SlotOffset(size_t tensor, int64_t c) const {
  return static_cast<uint64_t>(slot_chunk_[tensor] + c) * static_cast<uint64_t>(kChunkBytes);
}

std::string SpillChunks::Describe(size_t array, size_t tensor, int64_t c) const {
  return fmt::format("chunk {} of {} of '{}'", c, kStateArrayNames[array], specs_[tensor].name);
}

std::optional<std::string> SpillChunks::ReadChunk(const Piece& piece, int64_t c,
                                                  std::span<float> data) {
  Chunk& chunk = ChunkOf(piece, c);
  if (chunk.file < 0) {
    std::ranges::fill(data, 0.0f);
    return std::nullopt;
  }
  const SpillFile& file = files_[static_cast<size_t>(chunk.file)];
  try {  // in a ParallelFor body: errors are returned, not thrown
    file.file.ReadAt(chunk.offset, {reinterpret_cast<uint8_t*>(data.data()), data.size_bytes()});
  } catch (const Error& e) {
    return fmt::format("reading {}: {}", Describe(piece, c), e.what());
  }
  return CheckChunk(piece, c, data);
}

std::optional<std::string> SpillChunks::CheckChunk(const Piece& piece, int64_t c,
                                                   std::span<const float> data) {
  Chunk& chunk = ChunkOf(piece, c);
  const SpillFile& file = files_[static_cast<size_t>(chunk.file)];
  std::vector<Digest> hash_chunks = ChunkDigests(data);
  const Digest digest = ArrayDigestFromChunks(data.size(), hash_chunks);
  if (!chunk.digested) {  // attached in place, read for the first time: its digest is this
    chunk.digest = digest;
    chunk.digested = true;
    in_place_[static_cast<size_t>(piece.array)][piece.tensor][static_cast<size_t>(c)].hash_chunks =
        std::move(hash_chunks);
    return std::nullopt;
  }
  if (digest != chunk.digest) {
    return fmt::format(
        "{}: {} at byte {} reads back with digest {} but was {} with {}: the file was changed "
        "under lockstep",
        file.file.path().string(), Describe(piece, c), chunk.offset, ToHex(digest),
        file.owned ? "written" : "loaded", ToHex(chunk.digest));
  }
  return std::nullopt;
}

}  // namespace lockstep::train
