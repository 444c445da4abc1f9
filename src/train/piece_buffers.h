// PieceBuffers: the buffers of a SpillStore's pieces, and the pieces read ahead into them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <new>
#include <tuple>

#include "lockstep/core.h"
#include "lockstep/state.h"
#include "train/direct_reader.h"

namespace lockstep::train {

// A piece of a store: array, tensor, first element, elements.
using PieceKey = std::tuple<StateArray, size_t, int64_t, int64_t>;

// Buffers aligned to, and padded to, whole blocks of direct I/O, so that a piece's padded write,
// or read, stays inside its buffer; and pieces read ahead into buffers of their own through a
// DirectReader, for SpillStore::Acquire to take over.
class PieceBuffers {
 public:
  struct AlignedDelete {
    void operator()(uint8_t* p) const {
      ::operator delete[](p, std::align_val_t{kDirectIoAlignment});
    }
  };
  struct Buffer {
    std::unique_ptr<uint8_t[], AlignedDelete> data;
    size_t bytes = 0;  // a multiple of kDirectIoAlignment
  };
  // A piece being read ahead into a buffer of its own. The piece starts `lead` bytes into the
  // buffer, as its first byte does in its file's block.
  struct Ahead {
    Buffer buffer;
    size_t lead = 0;
    DirectReader::Request request;
  };

  PieceBuffers() = default;
  PieceBuffers(const PieceBuffers&) = delete;
  PieceBuffers& operator=(const PieceBuffers&) = delete;
  ~PieceBuffers() { CancelAll(); }

  // A buffer of `bytes` (whole blocks): a spare one of that size, else a new one. Reusing them
  // spares the kernel a page fault and a zeroed page per 4 KiB of every piece, which cost as much
  // CPU as hashing it. Spares are freed, largest first, as far as needed for the spares and the
  // buffers in use (acquired pieces and pieces read ahead) together never to hold more than
  // those in use once did (the memory plan counts those).
  Buffer Take(size_t bytes);
  // A buffer no longer in use, kept as a spare.
  void Keep(Buffer buffer);

  // Whether the piece is being read ahead.
  bool ReadingAhead(const PieceKey& piece) const { return ahead_.contains(piece); }
  // Starts reading the piece, whose `bytes` lie at `offset` of `file` (opened with O_DIRECT),
  // into a buffer of its own.
  void ReadAhead(const PieceKey& piece, std::shared_ptr<const File> file, uint64_t offset,
                 size_t bytes);
  // The piece's read ahead (nullptr if none), taken over by the caller: Wait for it, then the
  // buffer is the caller's.
  std::unique_ptr<Ahead> TakeAhead(const PieceKey& piece);
  void Wait(Ahead& ahead) { reader_.Wait(ahead.request); }
  // Cancels the reads ahead of the pieces that overlap `piece` (or of every piece), and keeps
  // their buffers as spares.
  void CancelOverlapping(const PieceKey& piece);
  void CancelAll();

 private:
  template <typename Which>
  void Cancel(Which which);

  // Bytes in buffers in use, their most ever, and held in buffers (in use and spare).
  size_t in_use_ = 0, peak_in_use_ = 0, held_ = 0;
  std::multimap<size_t, Buffer> spare_;               // released pieces' buffers, by size
  std::map<PieceKey, std::unique_ptr<Ahead>> ahead_;  // pieces being read ahead
  DirectReader reader_;
};

}  // namespace lockstep::train
