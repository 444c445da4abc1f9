// The routes of a microbatch group to the state (routes.h).
#include "train/routes.h"

#include <algorithm>
#include <array>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "train/comm.h"

namespace lockstep::train {
namespace {

// The store itself: the group's microbatches accumulate in place.
class StoreRoute : public GroupRoute {
 public:
  explicit StoreRoute(TensorAccess& store) : store_(store) {}
  std::span<const float> OpenParam(size_t i) override { return store_.OpenParam(i); }
  void CloseParam(size_t i) override { store_.CloseParam(i); }
  std::span<float> OpenGrad(size_t i, bool accumulate) override {
    return store_.OpenGrad(i, accumulate);
  }
  void CloseGrad(size_t i) override { store_.CloseGrad(i); }
  void WillOpenParam(size_t i) override { store_.WillOpenParam(i); }
  void Finish(std::vector<std::vector<double>>&) override {}

 private:
  TensorAccess& store_;
};

// The store itself, which also sums the squares of each gradient's norm blocks
// (rk::BlockSquares) whenever the Model closes it: the last close leaves the step's gradient,
// so the global norm need not read the gradients back (a spilled store would read every
// gradient from disk again). squares[i] is empty until tensor i's gradient is closed.
class SquaringRoute final : public StoreRoute {
 public:
  SquaringRoute(TensorAccess& store, size_t tensors)
      : StoreRoute(store), open_(tensors), squares_(tensors) {}
  std::span<float> OpenGrad(size_t i, bool accumulate) override {
    return open_.at(i) = StoreRoute::OpenGrad(i, accumulate);
  }
  void CloseGrad(size_t i) override {
    squares_.at(i) = rk::BlockSquares(open_[i]);
    StoreRoute::CloseGrad(i);
  }
  void Finish(std::vector<std::vector<double>>& squares) override { squares = std::move(squares_); }

 private:
  std::vector<std::span<float>> open_;
  std::vector<std::vector<double>> squares_;
};

// The Model's tensors during a microbatch group other than a single process's first: the
// parameters from the store, the gradients into the group buffer (overwritten by the group's
// first microbatch, accumulated by the rest).
class GroupBufferRoute final : public GroupRoute {
 public:
  GroupBufferRoute(TensorAccess& params, ParamStore& grads) : params_(params), grads_(grads) {}
  std::span<const float> OpenParam(size_t i) override { return params_.OpenParam(i); }
  void CloseParam(size_t i) override { params_.CloseParam(i); }
  std::span<float> OpenGrad(size_t i, bool) override { return grads_.Tensor(i); }
  void CloseGrad(size_t) override {}
  void WillOpenParam(size_t i) override { params_.WillOpenParam(i); }
  void Finish(std::vector<std::vector<double>>&) override {}

 private:
  TensorAccess& params_;
  ParamStore& grads_;
};

// Full sharding (docs/distributed.md, "Full sharding"): each parameter gathered whole from its
// owners when the Model says it will open it (WillOpenParam: the next layer's while this one
// computes) and dropped when it closes it, in the forward and again in the backward; each
// gradient, final when the Model closes it (a group is one microbatch), sent to the owners of
// its elements at once, and added there, on the exchange's thread, into G in group order (round
// 0's first group copied, every later one added), as FoldRound adds a round's group buffers.
// A parameter the Model closes and asks for again at once (the head, from the forward into the
// backward) is kept, not gathered again. The parameters gathered in the forward are checked
// against their owners' chunk digests of the last step (when this process has them: not in the
// first step after a restore). Finish waits for every transfer; the gradients are in G after it.
class ShardedRoute final : public GroupRoute {
 public:
  ShardedRoute(StateStore& store, const Exchange& exchange, OpExecutor* executor, int64_t round,
               uint64_t step, const std::vector<std::vector<Digest>>& param_chunks, bool corrupt)
      : store_(store),
        exchange_(exchange),
        executor_(executor),
        param_chunks_(param_chunks),
        corrupt_(corrupt),
        step_(step),
        first_group_(round == 0) {
    LOCKSTEP_CHECK(store.location() == StateStore::Location::kRam, "a fully sharded store in RAM");
    // This rank's G, written on the exchange's thread: views into RAM, made current on the host
    // here (an OpExecutor is called from this thread only).
    for (size_t i = 0; i < exchange.specs().size(); ++i) {
      const ElementRange held = exchange.Held(i);
      grads_.push_back(store.Acquire(StateArray::kGrad, i, held.begin, held.size(), round > 0));
      if (executor_ != nullptr) {
        if (round > 0) executor_->ToHost(grads_.back().data);
        executor_->HostWrites(grads_.back().data);
      }
    }
  }
  ShardedRoute(const ShardedRoute&) = delete;
  ShardedRoute& operator=(const ShardedRoute&) = delete;
  ~ShardedRoute() override {
    // Unwinding: the exchange's thread may still use the buffers below.
    try {
      WaitForAll();
    } catch (...) {  // the error that unwinds is the one to report
    }
  }

  void WillOpenParam(size_t i) override {
    if (closed_ && closed_->first != i) closed_.reset();
    if (params_.contains(i)) return;
    OpenParamState& p = params_[i];
    const ElementRange held = exchange_.Held(i);
    p.mine = store_.Acquire(StateArray::kParam, i, held.begin, held.size(), /*load=*/true);
    if (closed_) {  // closed by the call before: still whole here
      p.whole = std::move(closed_->second);
      closed_.reset();
      return;
    }
    if (executor_ != nullptr) executor_->ToHost(p.mine.data);
    p.whole.resize(static_cast<size_t>(exchange_.specs()[i].numel()));
    last_ = p.ticket = exchange_.StartGatherParameter(i, p.mine.data, p.whole);
  }
  std::span<const float> OpenParam(size_t i) override {
    WillOpenParam(i);
    OpenParamState& p = params_.at(i);
    exchange_.comm().Wait(p.ticket);
    if (checked_.insert(i).second && !param_chunks_.empty()) Check(i, p.whole);
    return p.whole;
  }
  void CloseParam(size_t i) override {
    const auto it = params_.find(i);
    LOCKSTEP_CHECK(it != params_.end(), "parameter {} closed, not open", i);
    store_.Release(it->second.mine, /*store=*/false);
    closed_.emplace(i, std::move(it->second.whole));
    params_.erase(it);
  }
  std::span<float> OpenGrad(size_t i, bool accumulate) override {
    LOCKSTEP_CHECK(!accumulate, "a fully sharded group accumulates no microbatches");
    closed_.reset();
    grad_.swap(spare_);  // a buffer a finished send left, if any
    grad_.resize(static_cast<size_t>(exchange_.specs()[i].numel()));
    return grad_;
  }
  void CloseGrad(size_t i) override {
    closed_.reset();
    // At most kSendsInFlight gradients on their way at once (and one open): the memory bound.
    while (!sends_.empty() && exchange_.comm().Done(sends_.front().ticket)) Retire();
    if (sends_.size() == kSendsInFlight) {
      exchange_.comm().Wait(sends_.front().ticket);
      Retire();
    }
    sends_.push_back({std::move(grad_), 0});
    grad_ = {};
    Send& send = sends_.back();
    send.ticket = exchange_.StartGatherTensorToOwners(
        i, send.tensor,
        [this](size_t t, int64_t begin, int64_t count, std::span<const float> parts) {
          Fold(t, begin, count, parts);
        });
    last_ = send.ticket;
  }

  // Every transfer done: the group's gradients are in G, and G's pieces released. Then every
  // rank stops if any rank received a copy that differs from its owner's digest.
  void Finish(std::vector<std::vector<double>>&) override {
    WaitForAll();
    for (const Piece& g : grads_) store_.Release(g, /*store=*/true);
    grads_.clear();
    exchange_.StopOnDivergedCopies(
        diverged_, [&](size_t i) -> const std::vector<Digest>& { return param_chunks_[i]; }, step_);
  }

 private:
  static constexpr size_t kSendsInFlight = 2;

  struct OpenParamState {
    Piece mine;                // this rank's range of it, in the store
    std::vector<float> whole;  // gathered
    Comm::Ticket ticket = 0;
  };
  struct Send {
    std::vector<float> tensor;
    Comm::Ticket ticket = 0;
  };

  void WaitForAll() {
    exchange_.comm().Wait(last_);
    sends_.clear();
    spare_ = {};
    closed_.reset();
  }
  // The oldest send is done: its buffer is kept for the next gradient (no fresh pages to fault
  // in), the larger of the two if one is kept already.
  void Retire() {
    std::vector<float>& done = sends_.front().tensor;
    if (done.capacity() > spare_.capacity()) spare_.swap(done);
    sends_.pop_front();
  }

  // On the exchange's thread: every rank's part of [begin, begin + count) of tensor t's
  // gradient, in rank order, added into this rank's G in that order.
  void Fold(size_t t, int64_t begin, int64_t count, std::span<const float> parts) {
    const Piece& g = grads_[t];
    const std::span<float> total =
        g.data.subspan(static_cast<size_t>(begin - g.begin), static_cast<size_t>(count));
    for (int r = 0; r < exchange_.ranks(); ++r) {
      const auto part = parts.subspan(static_cast<size_t>(r * count), static_cast<size_t>(count));
      if (first_group_ && r == 0) {
        std::ranges::copy(part, total.begin());
      } else {
        rk::AddInto(part, total);
      }
    }
  }

  void Check(size_t i, std::span<float> whole) {
    for (int r = 0; r < exchange_.ranks(); ++r) {
      const ElementRange range = exchange_.Held(i, r);
      if (r == exchange_.rank() || range.size() == 0) continue;
      Exchange::CheckCopy(
          whole.subspan(static_cast<size_t>(range.begin), static_cast<size_t>(range.size())), i, r,
          range.begin, param_chunks_[i], corrupt_, diverged_);
    }
  }

  StateStore& store_;
  const Exchange& exchange_;
  OpExecutor* executor_;
  const std::vector<std::vector<Digest>>& param_chunks_;
  bool corrupt_;
  const uint64_t step_;
  const bool first_group_;
  std::vector<Piece> grads_;                 // this rank's range of G, per tensor
  std::map<size_t, OpenParamState> params_;  // gathered or on their way, by tensor
  // The parameter the last call closed, whole, while no other call has come.
  std::optional<std::pair<size_t, std::vector<float>>> closed_;
  std::vector<float> grad_;   // the one gradient open
  std::vector<float> spare_;  // a finished send's buffer
  std::deque<Send> sends_;    // gradients on their way to their owners
  Comm::Ticket last_ = 0;     // the last transfer started
  std::set<size_t> checked_;  // tensors checked (in the forward)
  // This rank's first received chunk that differs from its owner's digest, as {tensor, owner,
  // first element}, or all -1.
  std::array<int64_t, 3> diverged_{-1, -1, -1};
};

}  // namespace

std::unique_ptr<GroupRoute> MakeGroupRoute(const RouteParts& parts, int64_t round, int64_t rounds,
                                           uint64_t step, bool corrupt_copy) {
  const bool one_process = parts.exchange.ranks() == 1;
  if (one_process && round == 0) {
    if (rounds == 1 && parts.store.location() == StateStore::Location::kDisk) {
      return std::make_unique<SquaringRoute>(parts.store, parts.store.specs().size());
    }
    return std::make_unique<StoreRoute>(parts.store);
  }
  if (parts.sharded) {
    return std::make_unique<ShardedRoute>(parts.store, parts.exchange, parts.executor, round, step,
                                          parts.param_chunks, corrupt_copy);
  }
  LOCKSTEP_CHECK(parts.group != nullptr, "a group buffer for round {} of {}", round, rounds);
  return std::make_unique<GroupBufferRoute>(parts.store, *parts.group);
}

}  // namespace lockstep::train
