// SpillChunks: where each chunk of a SpillStore's arrays lies, its digest, and the files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "lockstep/core.h"
#include "lockstep/model.h"
#include "lockstep/state.h"
#include "train/state_store.h"

namespace lockstep::train {

// The four arrays of every tensor in chunks of kSpillChunkFloats (a tensor's last may be
// shorter), each chunk's digest (ArrayDigest: its hash chunks side by side in vector lanes) kept
// in RAM and checked whenever the chunk is read back, so a spill file changed under a run is
// reported, never trained on. A chunk lives in one of three places: nowhere (all zeros: the
// moments and gradients at init cost no disk), in the checkpoint file it was loaded from (read
// in place: loading a checkpoint copies nothing), or in its slot of this store's file for its
// array (after it was first written). Pieces (whole chunks; SpillStore) are read and written
// with their chunks in parallel.
class SpillChunks {
 public:
  // Creates `dir` (if needed) and, exclusively, the four spill files in it, which are unlinked
  // at once; every chunk is zeros. `specs` (the store's) outlive this.
  SpillChunks(const std::vector<ParamSpec>& specs, const std::filesystem::path& dir);
  // Closes the files, and removes `dir` if this made it (only if empty).
  ~SpillChunks();
  SpillChunks(const SpillChunks&) = delete;
  SpillChunks& operator=(const SpillChunks&) = delete;

  // The chunks of `numel` elements.
  static int64_t Count(int64_t numel) {
    return (numel + kSpillChunkFloats - 1) / kSpillChunkFloats;
  }
  // Whether [begin, begin + count) of the tensor is a piece: whole chunks, but for a tensor's
  // last, shorter one.
  bool WholeChunks(size_t tensor, int64_t begin, int64_t count) const;
  // The bytes of the piece's chunks that lie in a file (a chunk of zeros is not read).
  uint64_t StoredBytes(const Piece& piece) const;
  // Bytes the store's own spill files occupy on disk now.
  uint64_t SpillBytes() const;

  // Every chunk zeros; the files of a checkpoint loaded or attached before are closed.
  void Clear();
  // After Clear: points every chunk of the checkpoint at where it lies in its files, digested
  // as StreamCheckpoint reads it (every file once); returns StreamCheckpoint's state hash.
  StateHash Load(const CheckpointIndex& checkpoint, FileDigests digests,
                 const std::function<void(uint64_t bytes)>& loaded);
  // After Clear: points every chunk of the checkpoint at where it lies, undigested: each is
  // digested when it is first read, and ReadUnread reads the others.
  void Attach(const CheckpointIndex& checkpoint);
  // After Attach: reads, where they lie in the checkpoint (even if overwritten since), the
  // chunks no Read or Check has read, digesting those still in place; returns the bytes read.
  uint64_t ReadUnread();
  // After ReadUnread: the attached checkpoint's tensors, with the digest of each array it holds
  // (made from its chunks' hash chunks, as read). Forgets the attached chunks.
  std::vector<TensorDigest> AttachedDigests();

  // Reads the piece's chunks into it (zeros for a chunk that lies nowhere) and checks each
  // against its digest.
  void Read(const Piece& piece);
  // Checks the piece's chunks, already read into it, against their digests.
  void Check(const Piece& piece);
  // Digests the piece's chunks (from `hash_chunks`, its ChunkDigests, when given) and writes
  // them to their slots in the spill file of the piece's array. `buffer` holds the piece:
  // whole blocks of direct I/O, aligned, as a file opened with O_DIRECT takes them.
  void Write(const Piece& piece, std::span<uint8_t> buffer, std::span<const Digest> hash_chunks);

  // A file opened with O_DIRECT, and an offset in it.
  struct Run {
    std::shared_ptr<const File> file;
    uint64_t offset = 0;
  };
  // Where the chunks of a piece (WholeChunks, not empty) lie one after another from a
  // float-aligned offset of a file opened with O_DIRECT; nothing otherwise.
  std::optional<Run> DirectRun(StateArray array, size_t tensor, int64_t begin, int64_t count) const;
  // Asks the kernel to read [begin, begin + count) of (array, tensor) into the page cache, each
  // run of chunks that lie one after another in a file at once.
  void Advise(StateArray array, size_t tensor, int64_t begin, int64_t count) const;

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
  struct SpillFile {
    File file;
    bool owned;  // this store's (unlinked) spill file, not a checkpoint's
    // The same file opened with O_DIRECT (the gradients' spill file and a checkpoint's files,
    // where the filesystem offers it), shared with the reads under way. The gradients' pieces
    // are written through it, in whole blocks (kDirectIoAlignment; a piece's last, partial,
    // block is padded with zeros in its slot), and pieces are read ahead through it
    // (DirectRun). Linux keeps direct and cached I/O of a file coherent.
    std::shared_ptr<File> direct;
  };

  // Opens the checkpoint's tensor files after this store's own; returns each one's index.
  std::map<std::filesystem::path, int> AttachFiles(const CheckpointIndex& checkpoint);
  // The elements of chunk c of a tensor: kSpillChunkFloats but for its last.
  int64_t Floats(size_t tensor, int64_t c) const;
  Chunk& ChunkOf(const Piece& piece, int64_t c) {
    return chunks_[static_cast<size_t>(piece.array)][piece.tensor][static_cast<size_t>(c)];
  }
  const Chunk& ChunkOf(const Piece& piece, int64_t c) const {
    return chunks_[static_cast<size_t>(piece.array)][piece.tensor][static_cast<size_t>(c)];
  }
  // Where chunk c of the tensor lives in its array's spill file.
  uint64_t SlotOffset(size_t tensor, int64_t c) const;
  std::string Describe(size_t array, size_t tensor, int64_t c) const;
  std::string Describe(const Piece& piece, int64_t c) const {
    return Describe(static_cast<size_t>(piece.array), piece.tensor, c);
  }

  // Runs io(chunk index, chunk data) for every chunk of the piece, in parallel (chunks are
  // independent); io returns an error message or nothing. Fails with the first error.
  template <typename Io>
  void ForChunks(const Piece& piece, Io io);
  std::optional<std::string> ReadChunk(const Piece& piece, int64_t c, std::span<float> data);
  // Checks chunk c of the piece, just read into `data`, against its digest (or, attached in
  // place and read for the first time, records it).
  std::optional<std::string> CheckChunk(const Piece& piece, int64_t c, std::span<const float> data);

  const std::vector<ParamSpec>& specs_;
  std::filesystem::path dir_;
  bool created_dir_ = false;
  std::vector<SpillFile> files_;     // the four spill files (by StateArray), then attachments
  std::vector<int64_t> slot_chunk_;  // first chunk slot of each tensor in a spill file
  std::vector<std::vector<std::vector<Chunk>>> chunks_;  // [array][tensor][chunk]
  // An attached checkpoint's chunks where they lie, [array][tensor][chunk] (empty for an
  // array it does not hold), until AttachedDigests.
  std::vector<std::vector<std::vector<InPlace>>> in_place_;
};

}  // namespace lockstep::train
