// PieceBuffers: spare buffers kept within the peak in use, and reads ahead on a DirectReader.
#include "train/piece_buffers.h"

#include <algorithm>
#include <iterator>
#include <utility>

namespace lockstep::train {
namespace {

// Whether two pieces share an element.
bool Overlaps(const PieceKey& a, const PieceKey& b) {
  const auto& [array_a, tensor_a, begin_a, count_a] = a;
  const auto& [array_b, tensor_b, begin_b, count_b] = b;
  return array_a == array_b && tensor_a == tensor_b && begin_a < begin_b + count_b &&
         begin_b < begin_a + count_a;
}

}  // namespace

PieceBuffers::Buffer PieceBuffers::Take(size_t bytes) {
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
  return {std::unique_ptr<uint8_t[], AlignedDelete>(
              static_cast<uint8_t*>(::operator new[](bytes, std::align_val_t{kDirectIoAlignment}))),
          bytes};
}

void PieceBuffers::Keep(Buffer buffer) {
  in_use_ -= buffer.bytes;
  const size_t bytes = buffer.bytes;
  spare_.emplace(bytes, std::move(buffer));
}

void PieceBuffers::ReadAhead(const PieceKey& piece, std::shared_ptr<const File> file,
                             uint64_t offset, size_t bytes) {
  auto ahead = std::make_unique<Ahead>();
  ahead->lead = offset % kDirectIoAlignment;
  const size_t need = ahead->lead + bytes;
  ahead->buffer = Take(DirectBytes(need));
  reader_.Read(ahead->request, std::move(file), offset - ahead->lead,
               {ahead->buffer.data.get(), ahead->buffer.bytes}, need);
  ahead_.emplace(piece, std::move(ahead));
}

std::unique_ptr<PieceBuffers::Ahead> PieceBuffers::TakeAhead(const PieceKey& piece) {
  const auto it = ahead_.find(piece);
  if (it == ahead_.end()) return nullptr;
  std::unique_ptr<Ahead> ahead = std::move(it->second);
  ahead_.erase(it);
  return ahead;
}

template <typename Which>
void PieceBuffers::Cancel(Which which) {
  for (auto it = ahead_.begin(); it != ahead_.end();) {
    if (!which(it->first)) {
      ++it;
      continue;
    }
    reader_.Cancel(it->second->request);
    Keep(std::move(it->second->buffer));
    it = ahead_.erase(it);
  }
}

void PieceBuffers::CancelOverlapping(const PieceKey& piece) {
  Cancel([&](const PieceKey& other) { return Overlaps(other, piece); });
}

void PieceBuffers::CancelAll() {
  Cancel([](const PieceKey&) { return true; });
}

}  // namespace lockstep::train
