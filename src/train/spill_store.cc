// SpillStore: the four arrays of every tensor in files of fixed chunks (kSpillChunkFloats), each
// chunk's digest (ArrayDigest: its hash chunks side by side in vector lanes) kept in RAM and
// checked whenever the chunk is read back, so a spill file
// changed under a run is reported, never trained on. A chunk lives in one of three places: nowhere
// (all zeros: the moments and gradients at init cost no disk), in the checkpoint file it was
// loaded from (read in place: loading a checkpoint copies nothing), or in its slot of this store's
// file for its array (after it was first written).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <tuple>

#include "train/state_store.h"

namespace lockstep::train {
namespace {
namespace fs = std::filesystem;

static_assert(kSpillPieceFloats % kSpillChunkFloats == 0, "pieces are whole chunks");
// The streamed global norm continues a tensor's sum piece by piece from block boundaries.
static_assert(kSpillChunkFloats % rk::kNormBlock == 0, "chunks are whole norm blocks");

constexpr int64_t kChunkBytes = kSpillChunkFloats * int64_t{sizeof(float)};
static_assert(kSpillChunkFloats % kHashChunkFloats == 0, "a chunk is whole hash chunks");

// The digest of the k-th chunk (`floats` elements) of a piece, from the digests of the piece's
// hash chunks (ChunkDigests), without hashing it again.
Digest ChunkDigestOf(std::span<const Digest> hash_chunks, int64_t k, int64_t floats) {
  constexpr int64_t kPerChunk = kSpillChunkFloats / kHashChunkFloats;
  return ArrayDigestFromChunks(static_cast<uint64_t>(floats),
                               hash_chunks.subspan(static_cast<size_t>(k * kPerChunk),
                                                   static_cast<size_t>(ChunkCount(floats))));
}
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Reads ranges of files opened with O_DIRECT on threads of its own: the disk works while the
// caller computes, and the bytes go from the disk into the caller's buffer, with no page cache
// and no copy. Read through the page cache, the kernel's copy of file pages into the process
// cost a spilled replay more CPU than hashing the same bytes (docs/performance.md, "Checkpoints
// and spilled state"; bench/replay_open1b.sh measures the replay). Threads blocked in pread
// cost no CPU and need no library (io_uring would do the same with liburing and a ring to
// manage).
class DirectReader {
 public:
  // The reads of one range: done when `left` is zero; `error` is the first failure's message.
  struct Request {
    int left = 0;
    std::string error;
  };

  ~DirectReader() {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    queued_.notify_all();
    for (std::thread& thread : threads_) thread.join();
  }

  // Queues the reads of `to.size()` bytes at `offset` of `file` into `to`, all multiples of
  // kDirectIoAlignment, in transfers of kTransferBytes. The first `need` bytes must be in the
  // file (the rest is padding to whole blocks, which may lie past its end).
  void Read(Request& request, std::shared_ptr<const File> file, uint64_t offset,
            std::span<uint8_t> to, size_t need) {
    {
      const std::lock_guard lock(mutex_);
      // Started before anything is queued: a thread that cannot start fails the read here.
      while (threads_.size() < kThreads) threads_.emplace_back([this] { Work(); });
      for (size_t at = 0; at < to.size(); at += kTransferBytes) {
        const size_t bytes = std::min(kTransferBytes, to.size() - at);
        jobs_.push_back({&request, file, offset + at, to.subspan(at, bytes),
                         need > at ? std::min(need - at, bytes) : 0});
        ++request.left;
      }
    }
    queued_.notify_all();
  }

  // Waits until the request's reads are done.
  void Wait(Request& request) {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return request.left == 0; });
  }

  // Drops the request's queued reads and waits for those under way.
  void Cancel(Request& request) {
    std::unique_lock lock(mutex_);
    const auto mine = [&](const Job& job) { return job.request == &request; };
    request.left -= static_cast<int>(std::erase_if(jobs_, mine));
    done_.wait(lock, [&] { return request.left == 0; });
  }

 private:
  // Two threads, each with one transfer of 8 MiB under way: two sequential streams of direct
  // reads reach a disk's read bandwidth where one stream of smaller reads, or four streams,
  // fall short (`dd` with iflag=direct; docs/performance.md, "Checkpoints and spilled state").
  static constexpr size_t kThreads = 2;
  static constexpr size_t kTransferBytes = size_t{8} << 20;

  struct Job {
    Request* request;
    std::shared_ptr<const File> file;
    uint64_t offset;
    std::span<uint8_t> to;
    size_t need;
  };

  void Work() {
    for (;;) {
      std::unique_lock lock(mutex_);
      queued_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      const Job job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      std::string error;
      try {
        const size_t got = job.file->ReadUpTo(job.offset, job.to);
        if (got < job.need) {
          error = fmt::format(
              "{}: ends at byte {}, but {} bytes from byte {} were expected (truncated while "
              "read?)",
              job.file->path().string(), job.offset + got, job.need, job.offset);
        }
      } catch (const std::exception& e) {
        error = e.what();
      }
      lock.lock();
      if (!error.empty() && job.request->error.empty()) job.request->error = std::move(error);
      --job.request->left;
      lock.unlock();
      done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable queued_, done_;
  std::deque<Job> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;  // started by the first Read
};

class SpillStore final : public StateStore {
 public:
  SpillStore(std::vector<ParamSpec> specs, const fs::path& dir) : StateStore(std::move(specs)) {
    std::error_code error;
    created_dir_ = fs::create_directories(dir, error);
    if (error) Fail("{}: cannot create the spill directory: {}", dir.string(), error.message());
    int64_t floats = 0;  // slots: tensor after tensor, each chunk at a multiple of the chunk size
    for (const ParamSpec& spec : specs_) {
      slot_chunk_.push_back(floats / kSpillChunkFloats);
      floats += Chunks(spec.numel()) * kSpillChunkFloats;
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
      // Gradients bypass the page cache where the filesystem allows (see Release): the
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
    Zero();
  }

  ~SpillStore() override {
    CancelReadsAhead([](const AheadKey&) { return true; });
    files_.clear();  // closes them
    if (created_dir_) {
      std::error_code ignored;
      fs::remove(dir_, ignored);  // only if empty
    }
  }

  Location location() const override { return Location::kDisk; }
  int64_t PieceFloats() const override { return kSpillPieceFloats; }

  Piece Acquire(StateArray array, size_t tensor, int64_t begin, int64_t count, bool load) override {
    const int64_t numel = specs_.at(tensor).numel();
    if (!WholeChunks(tensor, begin, count)) {
      Fail("SpillStore: piece [{}, {}) of tensor '{}' ({} elements) is not whole chunks of {}",
           begin, begin + count, specs_[tensor].name, numel, kSpillChunkFloats);
    }
    const AheadKey key{array, tensor, begin, count};
    std::unique_ptr<Ahead> ahead;
    if (const auto it = ahead_.find(key); load && it != ahead_.end()) {
      ahead = std::move(it->second);
      ahead_.erase(it);
    }
    // Any other read ahead of these elements is of no use now (or stale, once they are stored).
    CancelReadsAhead([&](const AheadKey& other) { return Overlaps(other, key); });
    const auto start = Clock::now();
    if (ahead) reader_.Wait(ahead->request);
    Buffer buffer =
        ahead ? std::move(ahead->buffer) : TakeBuffer(DirectBytes(count * sizeof(float)));
    const size_t lead = ahead ? ahead->lead : 0;
    const Piece piece{
        array, tensor, begin,
        {reinterpret_cast<float*>(buffer.data.get() + lead), static_cast<size_t>(count)}};
    if (load) {
      try {
        if (ahead && !ahead->request.error.empty()) {
          Fail("reading chunks {} to {} of {} of '{}': {}", begin / kSpillChunkFloats,
               Chunks(begin + count) - 1, kStateArrayNames[static_cast<size_t>(array)],
               specs_[tensor].name, ahead->request.error);
        }
        ForChunks(piece, [&](int64_t c, std::span<float> data) {
          return ahead ? CheckChunk(piece, c, data) : ReadChunk(piece, c, data);
        });
      } catch (...) {
        KeepBuffer(std::move(buffer));
        throw;
      }
      traffic_.read_seconds += Seconds(start);
      const int64_t first = begin / kSpillChunkFloats;
      for (int64_t c = first; c < first + Chunks(count); ++c) {
        if (ChunkOf(piece, c).file >= 0) {  // a chunk of zeros is not read
          traffic_.read_bytes += static_cast<uint64_t>(ChunkFloats(tensor, c)) * sizeof(float);
        }
      }
    }
    buffers_.emplace(piece.data.data(), std::move(buffer));
    return piece;
  }

  void Prefetch(StateArray array, size_t tensor, int64_t begin, int64_t count) override {
    if (ReadAhead(array, tensor, begin, count)) return;
    const int64_t first = begin / kSpillChunkFloats;
    const int64_t last = std::min(Chunks(begin + count), Chunks(specs_.at(tensor).numel()));
    // Runs of chunks that lie one after another in one file, each asked for at once.
    int file = -1;
    uint64_t from = 0, to = 0;
    const auto ask = [&] {
      if (file >= 0 && to > from) {
        // Only a hint: an error here (none is expected for a readable file) leaves the read to
        // Acquire, which reports it.
        (void)::posix_fadvise(files_[static_cast<size_t>(file)].file.fd(),
                              static_cast<off_t>(from), static_cast<off_t>(to - from),
                              POSIX_FADV_WILLNEED);
      }
    };
    const auto& chunks = chunks_[static_cast<size_t>(array)][tensor];
    for (int64_t c = first; c < last; ++c) {
      const Chunk& chunk = chunks[static_cast<size_t>(c)];
      if (chunk.file < 0) continue;  // zeros: nothing to read
      const uint64_t bytes = static_cast<uint64_t>(ChunkFloats(tensor, c)) * sizeof(float);
      if (chunk.file != file || chunk.offset != to) {
        ask();
        file = chunk.file;
        from = chunk.offset;
      }
      to = chunk.offset + bytes;
    }
    ask();
  }

  void Release(const Piece& piece, bool store, std::span<const Digest> hash_chunks) override {
    const auto it = buffers_.find(piece.data.data());
    if (it == buffers_.end()) {
      LOCKSTEP_INTERNAL("SpillStore: a piece released twice or never acquired");
    }
    if (store) {
      CancelReadsAhead([&](const AheadKey& other) {
        return Overlaps(other, {piece.array, piece.tensor, piece.begin,
                                static_cast<int64_t>(piece.data.size())});
      });
      const auto start = Clock::now();
      // The chunks are digested in parallel and written in one call: the piece's slots follow
      // one another in its file, and writers of one file on several threads would only spin on
      // its lock.
      const int64_t first = piece.begin / kSpillChunkFloats;
      std::vector<Digest> digests(static_cast<size_t>(Chunks(piece.data.size())));
      const auto count = static_cast<int64_t>(piece.data.size());
      if (!hash_chunks.empty() && hash_chunks.size() != static_cast<size_t>(ChunkCount(count))) {
        Fail("SpillStore: {} hash chunk digests for a piece of {} elements", hash_chunks.size(),
             count);
      }
      ForChunks(piece, [&](int64_t c, std::span<float> data) {
        const int64_t k = c - first;
        digests[static_cast<size_t>(k)] =
            hash_chunks.empty()
                ? ArrayDigest(data)
                : ChunkDigestOf(hash_chunks, k, static_cast<int64_t>(data.size()));
        return std::optional<std::string>();
      });
      try {
        Attached& to = files_[static_cast<size_t>(piece.array)];
        auto* bytes = reinterpret_cast<uint8_t*>(piece.data.data());
        if (to.direct) {  // whole blocks: the buffer's padding is zeroed and written too
          uint8_t* const block = it->second.data.get();
          if (bytes != block) {  // read ahead from a checkpoint at an offset within a block
            std::memmove(block, bytes, piece.data.size_bytes());
            bytes = block;
          }
          const size_t padded = DirectBytes(piece.data.size_bytes());
          std::fill(bytes + piece.data.size_bytes(), bytes + padded, uint8_t{0});
          to.direct->WriteAt(SlotOffset(piece, first), {bytes, padded});
        } else {
          to.file.WriteAt(SlotOffset(piece, first), {bytes, piece.data.size_bytes()});
        }
      } catch (const Error& e) {
        Fail("writing chunks {} to {} of {} of '{}': {}", first,
             first + static_cast<int64_t>(digests.size()) - 1,
             kStateArrayNames[static_cast<size_t>(piece.array)], specs_[piece.tensor].name, e.what());
      }
      for (size_t k = 0; k < digests.size(); ++k) {
        const int64_t c = first + static_cast<int64_t>(k);
        ChunkOf(piece, c) = {static_cast<int>(piece.array), SlotOffset(piece, c), digests[k]};
      }
      traffic_.write_seconds += Seconds(start);
      traffic_.written_bytes += piece.data.size_bytes();
    }
    KeepBuffer(std::move(it->second));
    buffers_.erase(it);
  }

  uint64_t SpillBytes() const override {
    uint64_t bytes = 0;
    for (const Attached& f : files_) {
      if (f.owned) bytes += f.file.AllocatedBytes();
    }
    return bytes;
  }

  Traffic traffic() const override { return traffic_; }

  void Zero() override {
    CancelReadsAhead([](const AheadKey&) { return true; });
    chunks_.assign(kStateArrayCount, {});
    for (auto& tensors : chunks_) {
      for (const ParamSpec& spec : specs_) {
        tensors.emplace_back(static_cast<size_t>(Chunks(spec.numel())));
      }
    }
    // Checkpoint files attached by an earlier Load or Attach are no longer referenced.
    files_.erase(files_.begin() + kStateArrayCount, files_.end());
    attached_.reset();
    pending_.clear();
  }

  StateHash Load(const CheckpointIndex& checkpoint, FileDigests digests,
                 const std::function<void(uint64_t)>& loaded) override {
    Zero();
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
          for (int64_t k = 0; k < Chunks(n); ++k) {
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

  bool Attach(const CheckpointIndex& checkpoint) override {
    Zero();
    const std::map<fs::path, int> file_of = AttachFiles(checkpoint);
    pending_.assign(kStateArrayCount, {});
    for (int a = 0; a < kStateArrayCount; ++a) {
      if (!Loaded(checkpoint, a)) continue;
      for (size_t i = 0; i < specs_.size(); ++i) {
        const CheckpointIndex::Location where = checkpoint.Where(i, static_cast<StateArray>(a));
        std::vector<Chunk>& chunks = chunks_[static_cast<size_t>(a)][i];
        std::vector<InPlace>& pending = pending_[static_cast<size_t>(a)].emplace_back(chunks.size());
        for (size_t c = 0; c < chunks.size(); ++c) {
          pending[c] = {file_of.at(where.file), where.offset + c * kChunkBytes, {}};
          chunks[c] = {pending[c].file, pending[c].offset, {}, /*digested=*/false};
        }
      }
    }
    attached_.emplace(checkpoint);
    return true;
  }

  StateHash FinishAttach(FileDigests digests) override {
    if (!attached_) LOCKSTEP_INTERNAL("SpillStore: FinishAttach without a checkpoint attached");
    // The chunks no step read, from the checkpoint.
    struct Unread {
      size_t array, tensor;
      int64_t chunk;
    };
    std::vector<Unread> unread;
    for (size_t a = 0; a < pending_.size(); ++a) {
      for (size_t i = 0; i < pending_[a].size(); ++i) {
        for (size_t c = 0; c < pending_[a][i].size(); ++c) {
          if (pending_[a][i][c].hash_chunks.empty()) unread.push_back({a, i, static_cast<int64_t>(c)});
        }
      }
    }
    const auto start = Clock::now();
    std::vector<std::optional<std::string>> errors(unread.size());
    ParallelFor(static_cast<int64_t>(unread.size()), [&](int64_t k) {
      const Unread& u = unread[static_cast<size_t>(k)];
      InPlace& in_place = pending_[u.array][u.tensor][static_cast<size_t>(u.chunk)];
      const auto floats = static_cast<size_t>(ChunkFloats(u.tensor, u.chunk));
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
    for (const Unread& u : unread) {
      traffic_.read_bytes += static_cast<uint64_t>(ChunkFloats(u.tensor, u.chunk)) * sizeof(float);
    }
    traffic_.read_seconds += Seconds(start);
    std::vector<TensorDigest> tensors;
    for (size_t i = 0; i < specs_.size(); ++i) {
      TensorDigest& t = tensors.emplace_back(TensorDigest{specs_[i].name, specs_[i].shape});
      for (size_t a = 0; a < pending_.size(); ++a) {
        if (pending_[a].empty()) continue;  // not in the checkpoint
        std::vector<Digest> chunks;
        for (const InPlace& c : pending_[a][i]) {
          chunks.insert(chunks.end(), c.hash_chunks.begin(), c.hash_chunks.end());
        }
        t.*kDigestArrays[a] = ArrayDigestFromChunks(static_cast<uint64_t>(specs_[i].numel()), chunks);
      }
    }
    const CheckpointIndex checkpoint = std::move(*attached_);
    attached_.reset();
    pending_.clear();
    return CheckpointHashOfDigests(checkpoint, std::move(tensors), digests);
  }

 private:
  struct Chunk {
    int file = -1;  // index into files_; -1: all zeros
    uint64_t offset = 0;
    Digest digest{};
    bool digested = true;  // false: attached in place and not read yet (digest unknown)
  };
  // A chunk of an attached checkpoint where it lies, and its hash chunks' digests once read.
  struct InPlace {
    int file = -1;
    uint64_t offset = 0;
    std::vector<Digest> hash_chunks;
  };
  struct Attached {
    File file;
    bool owned;  // this store's (unlinked) spill file, not a checkpoint's
    // The same file opened with O_DIRECT (the gradients' spill file and a checkpoint's files,
    // where the filesystem offers it), shared with the reads under way. The gradients' pieces
    // are written through it, in whole blocks (kDirectIoAlignment; a piece's last, partial,
    // block is padded with zeros in its slot), and pieces are read ahead through it (ReadAhead).
    // Linux keeps direct and cached I/O of a file coherent.
    std::shared_ptr<File> direct;
  };
  // A piece: array, tensor, first element, elements.
  using AheadKey = std::tuple<StateArray, size_t, int64_t, int64_t>;
  static bool Overlaps(const AheadKey& a, const AheadKey& b) {
    const auto& [array_a, tensor_a, begin_a, count_a] = a;
    const auto& [array_b, tensor_b, begin_b, count_b] = b;
    return array_a == array_b && tensor_a == tensor_b && begin_a < begin_b + count_b &&
           begin_b < begin_a + count_a;
  }
  // A piece being read ahead into a buffer of its own (ReadAhead), for Acquire to take over (an
  // Ahead, below). The piece starts `lead` bytes into the buffer, as its first byte does in its
  // file's block.

  // The arrays a checkpoint holds: gradients kept as digests stay zeros here (the next step
  // overwrites them).
  static bool Loaded(const CheckpointIndex& checkpoint, int a) {
    return a != static_cast<int>(StateArray::kGrad) || checkpoint.gradients == Gradients::kFull;
  }

  // Opens the checkpoint's tensor files after this store's own; returns each one's index.
  std::map<fs::path, int> AttachFiles(const CheckpointIndex& checkpoint) {
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

  static int64_t Chunks(int64_t numel) { return (numel + kSpillChunkFloats - 1) / kSpillChunkFloats; }
  // Whether [begin, begin + count) of the tensor is a piece: whole chunks, but for a tensor's
  // last, shorter one.
  bool WholeChunks(size_t tensor, int64_t begin, int64_t count) const {
    const int64_t numel = specs_[tensor].numel();
    return begin >= 0 && begin % kSpillChunkFloats == 0 && count >= 0 && begin + count <= numel &&
           (count % kSpillChunkFloats == 0 || begin + count == numel);
  }
  // The elements of chunk c of a tensor: kSpillChunkFloats but for its last.
  int64_t ChunkFloats(size_t tensor, int64_t c) const {
    return std::min(kSpillChunkFloats, specs_[tensor].numel() - c * kSpillChunkFloats);
  }

  Chunk& ChunkOf(const Piece& piece, int64_t c) {
    return chunks_[static_cast<size_t>(piece.array)][piece.tensor][static_cast<size_t>(c)];
  }

  std::string Describe(size_t array, size_t tensor, int64_t c) const {
    return fmt::format("chunk {} of {} of '{}'", c, kStateArrayNames[array], specs_[tensor].name);
  }
  std::string Describe(const Piece& piece, int64_t c) const {
    return Describe(static_cast<size_t>(piece.array), piece.tensor, c);
  }

  // Runs io(chunk index, chunk data) for every chunk of the piece, in parallel (chunks are
  // independent); io returns an error message or nothing. Fails with the first error.
  template <typename Io>
  void ForChunks(const Piece& piece, Io io) {
    const int64_t first = piece.begin / kSpillChunkFloats;
    const auto n = static_cast<int64_t>(piece.data.size());
    const int64_t count = (n + kSpillChunkFloats - 1) / kSpillChunkFloats;
    std::vector<std::optional<std::string>> errors(static_cast<size_t>(count));
    ParallelFor(count, [&](int64_t k) {
      const int64_t begin = k * kSpillChunkFloats;
      errors[static_cast<size_t>(k)] =
          io(first + k, piece.data.subspan(static_cast<size_t>(begin),
                                           static_cast<size_t>(std::min(kSpillChunkFloats, n - begin))));
    });
    for (const auto& error : errors) {
      if (error) Fail("{}", *error);
    }
  }

  std::optional<std::string> ReadChunk(const Piece& piece, int64_t c, std::span<float> data) {
    Chunk& chunk = ChunkOf(piece, c);
    if (chunk.file < 0) {
      std::ranges::fill(data, 0.0f);
      return std::nullopt;
    }
    const Attached& file = files_[static_cast<size_t>(chunk.file)];
    try {  // in a ParallelFor body: errors are returned, not thrown
      file.file.ReadAt(chunk.offset,
                       {reinterpret_cast<uint8_t*>(data.data()), data.size_bytes()});
    } catch (const Error& e) {
      return fmt::format("reading {}: {}", Describe(piece, c), e.what());
    }
    return CheckChunk(piece, c, data);
  }

  // Checks chunk c of the piece, just read into `data`, against its digest (or, attached in
  // place and read for the first time, records it).
  std::optional<std::string> CheckChunk(const Piece& piece, int64_t c,
                                        std::span<const float> data) {
    Chunk& chunk = ChunkOf(piece, c);
    const Attached& file = files_[static_cast<size_t>(chunk.file)];
    std::vector<Digest> hash_chunks = ChunkDigests(data);
    const Digest digest = ArrayDigestFromChunks(data.size(), hash_chunks);
    if (!chunk.digested) {  // attached in place, read for the first time: its digest is this
      chunk.digest = digest;
      chunk.digested = true;
      pending_[static_cast<size_t>(piece.array)][piece.tensor][static_cast<size_t>(c)].hash_chunks =
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

  // Where chunk c of the piece's tensor lives in its array's spill file.
  uint64_t SlotOffset(const Piece& piece, int64_t c) const {
    return static_cast<uint64_t>(slot_chunk_[piece.tensor] + c) * static_cast<uint64_t>(kChunkBytes);
  }

  fs::path dir_;
  bool created_dir_ = false;
  std::vector<Attached> files_;       // the four spill files (by StateArray), then attachments
  std::vector<int64_t> slot_chunk_;   // first chunk slot of each tensor in a spill file
  std::vector<std::vector<std::vector<Chunk>>> chunks_;  // [array][tensor][chunk]
  // Bytes rounded up to whole blocks of direct I/O.
  static size_t DirectBytes(size_t bytes) {
    return (bytes + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment;
  }
  // Piece buffers are aligned to, and padded to, whole blocks of direct I/O: a piece's padded
  // write, or read, stays inside its buffer.
  struct AlignedDelete {
    void operator()(uint8_t* p) const {
      ::operator delete[](p, std::align_val_t{kDirectIoAlignment});
    }
  };
  struct Buffer {
    std::unique_ptr<uint8_t[], AlignedDelete> data;
    size_t bytes = 0;  // a multiple of kDirectIoAlignment
  };
  struct Ahead {
    Buffer buffer;
    size_t lead = 0;
    DirectReader::Request request;
  };
  static_assert((kSpillChunkFloats * sizeof(float)) % kDirectIoAlignment == 0,
                "chunk slots start on blocks of direct I/O");
  // A buffer of `bytes` (whole blocks): a spare one of that size, else a new one. Reusing them
  // spares the kernel a page fault and a zeroed page per 4 KiB of every piece, which cost as much
  // CPU as hashing it. Spares are freed, largest first, as far as needed for the spares and the
  // buffers in use (acquired pieces and pieces read ahead) together never to hold more than
  // those in use once did (the memory plan counts those).
  Buffer TakeBuffer(size_t bytes) {
    in_use_ += bytes;
    peak_in_use_ = std::max(peak_in_use_, in_use_);
    if (const auto fit = spare_.find(bytes); fit != spare_.end()) {
      Buffer buffer = std::move(fit->second);
      spare_.erase(fit);
      return buffer;
    }
    while (!spare_.empty() && held_ + bytes > peak_in_use_) {
      held_ -= spare_.rbegin()->first;
      spare_.erase(std::prev(spare_.end()));
    }
    held_ += bytes;
    return {std::unique_ptr<uint8_t[], AlignedDelete>(static_cast<uint8_t*>(
                ::operator new[](bytes, std::align_val_t{kDirectIoAlignment}))),
            bytes};
  }
  void KeepBuffer(Buffer buffer) {
    in_use_ -= buffer.bytes;
    const size_t bytes = buffer.bytes;
    spare_.emplace(bytes, std::move(buffer));
  }

  // Starts reading [begin, begin + count) of (array, tensor) into a buffer of its own, where
  // its chunks lie one after another in a file opened with O_DIRECT; returns whether it did (or
  // had). Elsewhere (chunks of zeros, chunks spread over slots or files, a filesystem without
  // O_DIRECT, a checkpoint whose tensor data is not float-aligned) Prefetch asks the kernel.
  bool ReadAhead(StateArray array, size_t tensor, int64_t begin, int64_t count) {
    const AheadKey key{array, tensor, begin, count};
    if (ahead_.contains(key)) return true;
    if (tensor >= specs_.size() || count == 0 || !WholeChunks(tensor, begin, count)) {
      return false;  // Acquire reports such a piece
    }
    const std::vector<Chunk>& chunks = chunks_[static_cast<size_t>(array)][tensor];
    const int64_t first = begin / kSpillChunkFloats;
    const Chunk& head = chunks[static_cast<size_t>(first)];
    if (head.file < 0 || !files_[static_cast<size_t>(head.file)].direct ||
        head.offset % alignof(float) != 0) {
      return false;
    }
    for (int64_t c = first + 1; c < Chunks(begin + count); ++c) {
      const Chunk& chunk = chunks[static_cast<size_t>(c)];
      if (chunk.file != head.file ||
          chunk.offset != head.offset + static_cast<uint64_t>((c - first) * kChunkBytes)) {
        return false;
      }
    }
    auto ahead = std::make_unique<Ahead>();
    ahead->lead = head.offset % kDirectIoAlignment;
    const size_t need = ahead->lead + static_cast<size_t>(count) * sizeof(float);
    ahead->buffer = TakeBuffer(DirectBytes(need));
    reader_.Read(ahead->request, files_[static_cast<size_t>(head.file)].direct,
                 head.offset - ahead->lead, {ahead->buffer.data.get(), ahead->buffer.bytes}, need);
    ahead_.emplace(key, std::move(ahead));
    return true;
  }

  // Cancels the reads ahead of the pieces `which` picks, and frees their buffers.
  template <typename Which>
  void CancelReadsAhead(Which which) {
    for (auto it = ahead_.begin(); it != ahead_.end();) {
      if (!which(it->first)) {
        ++it;
        continue;
      }
      reader_.Cancel(it->second->request);
      KeepBuffer(std::move(it->second->buffer));
      it = ahead_.erase(it);
    }
  }

  std::map<const float*, Buffer> buffers_;  // acquired pieces, by their first element
  // Bytes in buffers in use, their most ever, and held in buffers (in use and spare).
  size_t in_use_ = 0, peak_in_use_ = 0, held_ = 0;
  std::multimap<size_t, Buffer> spare_;  // released pieces' buffers, by size
  std::map<AheadKey, std::unique_ptr<Ahead>> ahead_;  // pieces being read ahead
  DirectReader reader_;
  Traffic traffic_;
  // An attached checkpoint (Attach) until FinishAttach: its index, and where each chunk of each
  // array it holds lies, [array][tensor][chunk] (empty for an array it does not hold).
  std::optional<CheckpointIndex> attached_;
  std::vector<std::vector<std::vector<InPlace>>> pending_;
};

}  // namespace

std::unique_ptr<StateStore> MakeSpillStore(std::vector<ParamSpec> specs, const fs::path& dir) {
  return std::make_unique<SpillStore>(std::move(specs), dir);
}

// The largest sum, over the passes of a spilled step, of the tensors open at once and those read
// ahead: a layer's parameters plus its largest gradient, or output.weight with its gradient and
// final_norm.weight, or tok_embeddings.weight (forward) or its gradient (backward), each with the
// next layer's parameters read ahead; or the update pass's pieces being hashed (up to one full
// piece per array) and those read ahead (as many).
uint64_t SpillStoreOpenBytes(const ModelConfig& model) {
  const auto bytes_of = [](const ParamSpec& spec) {
    return static_cast<uint64_t>(spec.numel()) * sizeof(float);
  };
  std::map<std::string, uint64_t> layer_params, layer_largest;
  uint64_t head = 0, largest = 0;
  for (const ParamSpec& spec : ParameterSpecs(model)) {
    const uint64_t bytes = bytes_of(spec);
    largest = std::max(largest, bytes);
    if (spec.name.starts_with("layers.")) {
      const std::string layer = spec.name.substr(0, spec.name.find('.', 7));
      layer_params[layer] += bytes;
      layer_largest[layer] = std::max(layer_largest[layer], bytes);
    } else if (spec.name == "output.weight" || spec.name == "final_norm.weight") {
      head += bytes;
    }
  }
  const uint64_t piece = static_cast<uint64_t>(kSpillPieceFloats) * sizeof(float);
  const uint64_t array = StateBytes(model) / kStateArrayCount;
  uint64_t next_layer = 0;
  for (const auto& [layer, bytes] : layer_params) next_layer = std::max(next_layer, bytes);
  uint64_t open = std::max(head + largest + next_layer,
                           2 * kStateArrayCount * std::min(piece, array));
  for (const auto& [layer, bytes] : layer_params) {
    open = std::max(open, bytes + layer_largest[layer] + next_layer);
  }
  return open;
}

}  // namespace lockstep::train
