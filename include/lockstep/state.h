// lockstep state: safetensors files, the chained state hash, checkpoints and the state-hash log.
// No compute lives here (the layer never includes kernels.h): verifying a checkpoint or a chain
// needs nothing but these formats. Byte layouts: docs/formats/state-hash.md and
// docs/formats/checkpoint.md.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lockstep/core.h"
#include "lockstep/tensor.h"

namespace lockstep {

// ---- safetensors (Hugging Face format) -------------------------------------------------------
// A tensor of a safetensors file, in any dtype of lockstep/tensor.h (written and read under its
// safetensors name: F32, U32, F64, I8, I32, BF16).
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  TensorView data;
};
// Which dtypes a reader accepts: F32 alone (checkpoints, forward outputs), or every dtype of
// lockstep/tensor.h (trace dumps).
enum class SafetensorsDtypes { kF32, kAny };

// Writes `tensors` (data laid out in the given order) and `metadata` (the "__metadata__" entry,
// omitted when empty) as the file at `path`, replaced whole (a StagedFile). The bytes are a pure
// function of the arguments. Fails on duplicate, empty or reserved names and on a data size that
// does not match the shape.
void WriteSafetensors(const std::filesystem::path& path, std::span<const NamedTensor> tensors,
                      const std::map<std::string, std::string>& metadata);
// The exact bytes WriteSafetensors writes.
std::vector<uint8_t> SafetensorsBytes(std::span<const NamedTensor> tensors,
                                      const std::map<std::string, std::string>& metadata);

// A validated safetensors file held in memory. Move-only: the tensors' spans point into it.
class SafetensorsFile {
 public:
  SafetensorsFile(SafetensorsFile&&) = default;
  SafetensorsFile& operator=(SafetensorsFile&&) = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // In file order (ascending data offsets), which is the order they were written in.
  const std::vector<NamedTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Fails naming the file and the tensor when there is no tensor of that name.
  const NamedTensor& Get(std::string_view name) const;

 private:
  friend SafetensorsFile ParseSafetensors(std::vector<uint8_t>, const std::filesystem::path&,
                                          SafetensorsDtypes);
  SafetensorsFile() = default;

  std::filesystem::path path_;
  std::vector<uint8_t> bytes_;
  std::vector<NamedTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Reads and validates a file: header length within the file, JSON without duplicate keys, each
// dtype one `accept` allows, shape × element size == data size, offsets contiguous and covering
// the data exactly, the header in lockstep's canonical form. Every error names the file and the
// problem (tensor, field, value). Each tensor's data is aligned to its element size.
SafetensorsFile ReadSafetensors(const std::filesystem::path& path,
                                SafetensorsDtypes accept = SafetensorsDtypes::kF32);
// The same on bytes already in memory; `path` only names the source in errors.
SafetensorsFile ParseSafetensors(std::vector<uint8_t> bytes, const std::filesystem::path& path,
                                 SafetensorsDtypes accept = SafetensorsDtypes::kF32);

// ---- the state a training step leaves behind -------------------------------------------------
struct SpikeState {
  uint64_t total_skips = 0;
  std::vector<uint64_t> recent_skips;  // steps (1-based) of skips still inside the window
};

struct StepState {
  uint64_t step = 0;            // completed optimizer steps of the run (0 = init)
  uint64_t optimizer_step = 0;  // AdamW updates applied (skipped steps don't count)
  float lr = 0, grad_norm = 0, clip_factor = 1;  // hashed as their IEEE bits
  bool skipped = false;
  Digest tokens_digest{};  // BLAKE2b of the exact token windows this step consumed (zeros at init)
  uint64_t rng_seed = 0, rng_counter = 0;  // the run's Philox stream position
  uint64_t data_cursor = 0;                // index of the next token window of the canonical stream
  SpikeState spike;
  Digest prev_hash{};      // hash of step - 1 (zeros for the init state)
  std::string descriptor;  // canonical run descriptor JSON, hashed as these exact UTF-8 bytes
  // Not hashed: the chain of every step's state hash from 0 to this step (ChainAfter), which
  // meta.json keeps as chain_blake2b so that a checkpoint pins every line of
  // state_hashes.jsonl before it. Absent in a checkpoint of an earlier lockstep, and in a state
  // continued from one.
  std::optional<Digest> chain;
};
// The chain through step `step` of state hash `hash`: BLAKE2b-256(previous ‖ u64 little-endian
// step ‖ hash), with previous the chain through step - 1 (32 zero bytes before step 0).
Digest ChainAfter(const Digest& previous, uint64_t step, const Digest& hash);

// One parameter with its AdamW moments and its post-clip gradient. param, m and v always have
// the shape's element count (at init m, v and grad are zeros). The gradient is known by its
// elements, by its array digest (`grad_digest`, with `grad` empty: a checkpoint that keeps only
// the gradients' digests), or by both, and then the elements must hash to the digest.
struct TensorState {
  std::string name;
  std::vector<int64_t> shape;
  std::span<const float> param, m, v, grad;
  std::optional<Digest> grad_digest;
};

// The four arrays of a tensor's state, in state-hash order.
enum class StateArray { kParam = 0, kM = 1, kV = 2, kGrad = 3 };
inline constexpr int kStateArrayCount = 4;
// As the state hash's components name them (docs/formats/state-hash.md).
inline constexpr std::array<std::string_view, kStateArrayCount> kStateArrayNames = {
    "param", "m", "v", "grad"};

// A parameter's name and shape, in parameter order: a tensor's state without its data.
struct TensorShape {
  std::string name;
  std::vector<int64_t> shape;
  Dtype dtype = Dtype::kF32;  // its elements' (a parameter's state is f32)
};

// ---- the chained state hash (docs/formats/state-hash.md) -------------------------------------
// An array's digest: BLAKE2b-256 of u64(element count) followed by the BLAKE2b-256 digests of
// its chunks of kHashChunkFloats elements (the last may be shorter), in order. Chunks are
// independent, so any thread, or in a distributed run the rank that holds them, may hash them;
// the digest cannot depend on who did.
inline constexpr int64_t kHashChunkFloats = int64_t{1} << 18;  // 1 MiB
// The digests of the chunks of `piece`, which starts at a chunk boundary of its array and holds
// whole chunks except perhaps the array's last (in parallel on Threads() threads).
std::vector<Digest> ChunkDigests(std::span<const float> piece);
// ChunkDigests of several pieces at once (the four arrays of a tensor): chunks of equal length
// are hashed side by side across the pieces, so arrays of a chunk or two still fill the lanes.
std::vector<std::vector<Digest>> ChunkDigestsOfPieces(std::span<const std::span<const float>> pieces);
Digest ArrayDigestFromChunks(uint64_t elements, std::span<const Digest> chunks);
// Chunks in an array of `elements`.
inline int64_t ChunkCount(int64_t elements) {
  return (elements + kHashChunkFloats - 1) / kHashChunkFloats;
}
Digest ArrayDigest(std::span<const float> values);
// ArrayDigest of `elements` zeros (+0.0f), without them: init moments and gradients.
Digest ZeroArrayDigest(uint64_t elements);
// An array's digest from its elements in pieces of any lengths, in order.
class ArrayHasher {
 public:
  ArrayHasher& Update(std::span<const float> piece);
  Digest Final();
  // The digests of the chunks completed so far (after Final: all of them).
  std::span<const Digest> chunks() const { return chunks_; }

 private:
  uint64_t elements_ = 0;
  Blake2b partial_;            // the chunk being filled,
  int64_t partial_floats_ = 0;  // with this many elements
  std::vector<Digest> chunks_;
};

// The per-tensor part of the hash: the array digest of each of the four arrays.
struct TensorDigest {
  std::string name;
  std::vector<int64_t> shape;
  Digest param{}, m{}, v{}, grad{};
};
// A TensorDigest's array digests in StateArray order: t.*kDigestArrays[a].
inline constexpr std::array<Digest TensorDigest::*, kStateArrayCount> kDigestArrays = {
    &TensorDigest::param, &TensorDigest::m, &TensorDigest::v, &TensorDigest::grad};

struct StateHash {
  Digest hash{};
  // Every digest the hash is made of, in hash order, so a mismatch names its component:
  // "prev_hash", "scalars", "descriptor", "tokens", "layout", then per tensor
  // "param:<name>", "m:<name>", "v:<name>", "grad:<name>".
  std::vector<std::pair<std::string, Digest>> components;
};

// Fails naming the tensor when an array's size does not match its shape, or when the gradient's
// elements do not hash to its grad_digest.
TensorDigest DigestTensor(const TensorState& tensor);
// The hash from per-tensor digests, so a caller can stream tensors one at a time (RAM ~ one
// tensor). Fails on empty or duplicate tensor names.
StateHash StateHashFromDigests(const StepState& state, std::span<const TensorDigest> tensors);
// DigestTensor on every tensor (in parallel on Threads() threads; the result does not depend
// on it), then StateHashFromDigests.
StateHash ComputeStateHash(const StepState& state, std::span<const TensorState> tensors);
// The digest of a named component ("grad:<name>", ...); fails naming it when the hash has none.
const Digest& ComponentDigest(const StateHash& hash, std::string_view component);
// Names of the components that differ between two hashes, or that only one of them has.
std::vector<std::string> DifferingComponents(const StateHash& a, const StateHash& b);

// ---- checkpoints (docs/formats/checkpoint.md) ------------------------------------------------
// The digest COMPLETE lists for a tensor file (docs/formats/checkpoint.md, "COMPLETE"):
// H(tag || u64(data_start) || H(the data_start bytes before the data) || the ArrayDigest of each
// tensor in data order). Each byte is hashed once, and the arrays' digests are those the state
// hash uses. TensorFileDigestOf takes them; TensorFileDigest parses a whole file (which must be a
// valid safetensors file) and computes them.
Digest TensorFileDigestOf(std::span<const uint8_t> head, std::span<const Digest> arrays);
Digest TensorFileDigest(std::span<const uint8_t> file, const std::filesystem::path& path);

// What a checkpoint keeps of the step's post-clip gradients (docs/formats/checkpoint.md): their
// array digests in meta.json, which is all the state hash needs (the checkpoint is then 12 bytes
// per parameter), or the gradients themselves as well (grads.safetensors), which localising a
// disagreement down to gradient elements needs.
enum class Gradients { kDigests, kFull };
// The arrays per tensor a checkpoint holds: param, m, v, and the gradient only with kFull.
inline int CheckpointArrays(Gradients gradients) {
  return gradients == Gradients::kFull ? kStateArrayCount : kStateArrayCount - 1;
}

// The run directory's layout (docs/training.md, "The run directory"): the one place the names of
// a run's files and of a checkpoint's are composed.
struct RunLayout {
  std::filesystem::path dir;
  std::filesystem::path hashes() const { return dir / "state_hashes.jsonl"; }
  std::filesystem::path metrics() const { return dir / "metrics.jsonl"; }
  std::filesystem::path signatures() const { return dir / kSignaturesName; }
  std::filesystem::path checkpoints() const { return dir / "checkpoints"; }
  // checkpoints/step_%09d for `step`.
  std::filesystem::path checkpoint(uint64_t step) const;

  static constexpr char kSignaturesName[] = "signatures.jsonl";
  // A checkpoint directory's files (docs/formats/checkpoint.md).
  static constexpr char kModel[] = "model.safetensors";
  static constexpr char kOptimizer[] = "optimizer.safetensors";
  static constexpr char kGrads[] = "grads.safetensors";
  static constexpr char kMeta[] = "meta.json";
  static constexpr char kComplete[] = "COMPLETE";
};

// `run_dir/checkpoints/step_%09d` for `step` (RunLayout{run_dir}.checkpoint(step)).
std::filesystem::path CheckpointDir(const std::filesystem::path& run_dir, uint64_t step);

// Writes run_dir/checkpoints/step_%09d/ (model and optimizer safetensors, with kFull grads
// safetensors too, meta.json with the gradients' digests and the state hash, COMPLETE last) into
// a temporary sibling, fsyncs every file, renames it into place and fsyncs the parent. The bytes
// are a pure function of the arguments. If the final directory exists already it must hold
// exactly these bytes (a deterministic rewrite is a no-op); otherwise this fails naming the
// directory. Returns the final directory. Fails naming the tensor, before writing anything, when
// an array's size does not match its shape, a gradient does not hash to its grad_digest, or
// kFull is asked of a tensor whose gradient is known by its digest only.
// WriteCheckpointStreamed (below) does the writing.
std::filesystem::path WriteCheckpoint(const std::filesystem::path& run_dir, const StepState& state,
                                      std::span<const TensorState> tensors,
                                      Gradients gradients = Gradients::kDigests);

// A checkpoint read back and checked against its COMPLETE listing. Move-only (spans into files).
struct Checkpoint {
  std::filesystem::path dir;
  StepState state;
  Digest state_hash{};  // as meta.json records it
  SafetensorsFile model, optimizer;
  std::optional<SafetensorsFile> grads;  // a checkpoint with full gradients only
  // In model.safetensors file order, spans into the files; each grad_digest is meta.json's, and
  // `grad` holds the elements when the checkpoint has them.
  std::vector<TensorState> tensors;
};

// What ReadCheckpoint does with a file whose BLAKE2b differs from the one COMPLETE lists.
enum class FileDigests {
  kEnforce,  // fail naming the file: the only choice for anything that trusts the contents
  kIgnore,   // read it anyway (sizes are still checked): forensics, `lockstep replay --force`
};

// Refuses a directory without COMPLETE; checks every listed file's size and digest; parses
// meta.json; checks that the tensor files agree in names and shapes. Does not recompute
// the state hash (VerifyCheckpointHash does). Errors name the file and the field or digest.
// Holds every file in memory: every command reads checkpoints with OpenCheckpoint and
// StreamCheckpoint (below), which make the same checks with one piece in memory; this reader,
// written separately, is what the tests check the streamed one against.
Checkpoint ReadCheckpoint(const std::filesystem::path& dir,
                          FileDigests digests = FileDigests::kEnforce);
// Recomputes the state hash from the checkpoint's contents; fails naming the directory and both
// hashes when it differs from meta.json's state_hash. Returns the recomputed hash.
StateHash VerifyCheckpointHash(const Checkpoint& checkpoint);
// The complete checkpoint (a step_* directory holding COMPLETE) with the highest step, ignoring
// temporary and incomplete directories. Does not validate its contents.
std::optional<std::filesystem::path> LatestCompleteCheckpoint(const std::filesystem::path& run_dir);
// The steps of every complete checkpoint under run_dir/checkpoints, ascending.
std::vector<uint64_t> CompleteCheckpointSteps(const std::filesystem::path& run_dir);

// ---- checkpoints streamed in pieces: RAM ~ one piece, whatever the model's size -------------
// A checkpoint whose small files are read and checked but whose tensor data is not loaded:
// COMPLETE parsed strictly; meta.json checked against COMPLETE (size and digest) and parsed; the
// tensor files' sizes checked against COMPLETE and their headers read and validated as
// ReadSafetensors validates them (__metadata__ included) and matched up as ReadCheckpoint
// matches them. The tensor files' digests need every byte: StreamCheckpoint checks them.
struct CheckpointIndex {
  std::filesystem::path dir;
  StepState state;
  Digest state_hash{};               // as meta.json records it
  std::vector<TensorShape> tensors;  // model.safetensors order (ascending data offsets)
  std::vector<Digest> grad_digests;  // meta.json's, per tensor
  Gradients gradients = Gradients::kDigests;  // kFull: grads.safetensors holds the gradients

  // Where array `a` of tensor `i` starts: the file and the byte offset of its first element
  // from the start of the file. Fails naming the directory when there is no tensor i, or when
  // `a` is the gradient of a checkpoint that keeps only its digest.
  struct Location {
    std::filesystem::path file;
    uint64_t offset = 0;
  };
  Location Where(size_t i, StateArray a) const;

  // model.safetensors, optimizer.safetensors, grads.safetensors as COMPLETE lists them (the
  // last only with full gradients; otherwise its path is empty).
  struct File {
    std::filesystem::path path;
    uint64_t size = 0;
    Digest digest{};          // TensorFileDigest for a tensor file, BLAKE2b-256 for meta.json
    uint64_t data_start = 0;  // 8 + the header's length: the bytes before the tensor data
  };
  std::array<File, 3> files;
  // offsets[i][a]: Where(i, a).offset.
  std::vector<std::array<uint64_t, kStateArrayCount>> offsets;
};
// Fails like ReadCheckpoint (with FileDigests::kEnforce for meta.json) on everything it checks.
CheckpointIndex OpenCheckpoint(const std::filesystem::path& dir);

// The piece length lockstep streams checkpoints in when nothing else decides it (4 MiB).
inline constexpr int64_t kCheckpointPieceFloats = int64_t{1} << 20;

// Receives a piece of array `a` of tensor `i`: elements [begin, begin + piece.size()).
// A piece of array a of tensor i as it is read, with the digests of its hash chunks
// (kHashChunkFloats; ChunkDigests of the piece) when piece_floats is a multiple of
// kHashChunkFloats, else empty: a sink can reuse them instead of hashing the piece again.
using PieceSink = std::function<void(size_t i, StateArray a, int64_t begin,
                                     std::span<const float> piece, std::span<const Digest> chunks)>;
// Fills a piece likewise.
using PieceSource =
    std::function<void(size_t i, StateArray a, int64_t begin, std::span<float> piece)>;

// Reads the tensor files once each, front to back, in pieces: the pieces of an array start at
// multiples of piece_floats within that array (the last may be shorter; an empty array has
// none), so a sink can digest fixed chunks. Every piece goes to `sink` (which may be empty) as it
// is read; its contents are not trusted until StreamCheckpoint returns, because a file's digest
// is only known at its end: on a mismatch with COMPLETE it fails naming the file and both
// digests (unless `digests` is kIgnore), and so it does when a full gradient does not hash to
// meta.json's grad_digests. A checkpoint without full gradients hands over no gradient pieces.
// Returns the state hash recomputed from the data and meta.json's gradient digests (components
// included); it does not compare it with meta.json's state_hash (VerifyStreamedHash does).
StateHash StreamCheckpoint(const CheckpointIndex& index, int64_t piece_floats,
                           const PieceSink& sink, FileDigests digests = FileDigests::kEnforce);
// What StreamCheckpoint checks once it has read every byte, for a reader that read and digested
// the arrays itself (a SpillStore reading a checkpoint in place, as a step first needs each
// chunk): each tensor file's digest, made from its header (read again here) and the arrays'
// digests in `tensors`, against COMPLETE, and full gradients against meta.json's grad_digests,
// as `digests` says. tensors[i] is index.tensors[i]'s (its grad is read only with full
// gradients). Returns the state hash of those digests, as StreamCheckpoint does.
StateHash CheckpointHashOfDigests(const CheckpointIndex& index, std::vector<TensorDigest> tensors,
                                  FileDigests digests = FileDigests::kEnforce);
// Fails naming the directory and both hashes when `recomputed` (StreamCheckpoint's result)
// differs from meta.json's state_hash, as VerifyCheckpointHash does. Returns `recomputed`.
StateHash VerifyStreamedHash(const CheckpointIndex& index, StateHash recomputed);

// Reads elements [begin, begin + out.size()) of array `a` of tensor `i` from the checkpoint's
// file. No digest is checked here: call it on a checkpoint StreamCheckpoint has verified.
void ReadCheckpointPiece(const CheckpointIndex& index, size_t i, StateArray a, int64_t begin,
                         std::span<float> out);

struct WrittenCheckpoint {
  std::filesystem::path dir;
  StateHash hash;  // computed from the bytes written
};
// WriteCheckpoint with every array pulled from `source` piece by piece (pieces start at multiples
// of piece_floats within each array; an empty array has none), RAM ~ one piece. The gradients'
// digests are `grad_digests` when given (one per tensor: then the gradients are pulled only for
// kFull, and must hash to them), else made from the gradients pulled from `source`. The same
// protocol and the same bytes as WriteCheckpoint (temporary directory, fsync, COMPLETE last,
// rename, no-op on an identical rewrite, refusal of a different existing one). The state hash
// is computed from the data as it is written, so meta.json comes after the three tensor files.
// Names, shapes and the descriptor are validated before anything is written; `source` may
// throw, which leaves only the temporary directory behind.
WrittenCheckpoint WriteCheckpointStreamed(const std::filesystem::path& run_dir,
                                          const StepState& state,
                                          std::span<const TensorShape> tensors,
                                          int64_t piece_floats, const PieceSource& source,
                                          Gradients gradients = Gradients::kDigests,
                                          std::span<const Digest> grad_digests = {});

// ---- state_hashes.jsonl: one {"step": N, "hash": "<64 hex>"} object per line -----------------
struct StateHashLine {
  uint64_t step = 0;
  Digest hash{};
  bool operator==(const StateHashLine&) const = default;
};
// Appends one line and fsyncs the file.
void AppendStateHashLine(const std::filesystem::path& path, const StateHashLine& line);
// Replaces the file with `lines` atomically (temp file, fsync, rename): how a resume drops the
// lines past its checkpoint.
void WriteStateHashLines(const std::filesystem::path& path, std::span<const StateHashLine> lines);
// Reads and validates every line (exact keys, 64 lowercase hex, strictly increasing steps);
// errors name the file and the line number. A last line without its newline (an append cut
// short by a crash or a full disk) is an error, or with kDrop dropped with a note on stderr (a
// resume: the line is rewritten when its step is replayed).
enum class TornLine { kRefuse, kDrop };
std::vector<StateHashLine> ReadStateHashLines(const std::filesystem::path& path,
                                              TornLine torn = TornLine::kRefuse);

// Where a checkpoint anchors the chain: its step, state hash and prev_hash, as meta.json holds
// them (OpenCheckpoint checks meta.json's seal).
struct ChainAnchor {
  std::filesystem::path checkpoint;
  uint64_t step = 0;
  Digest hash{}, prev_hash{};
  std::optional<Digest> chain;  // meta.json's chain_blake2b, when it has one
};
// The anchors of run_dir's complete checkpoints at steps up to `last_step`, in step order.
std::vector<ChainAnchor> CheckpointAnchors(const std::filesystem::path& run_dir,
                                           uint64_t last_step);
// Checks `lines` (of `path`) as the ancestry the checkpoints attest: one line per step from 0
// without a gap, and for each anchor the line of its step holding its hash, the line of the
// step before holding its prev_hash (zeros for step 0), and, where the anchor has a chain, the
// lines from step 0 to its step chaining (ChainAfter) to it: so every line up to a checkpoint
// of this lockstep is pinned. Fails naming the file, the steps and the checkpoint.
void CheckChainAncestry(const std::filesystem::path& path, std::span<const StateHashLine> lines,
                        std::span<const ChainAnchor> anchors);

// ---- signed commitments: keys and signatures.jsonl (docs/formats/signatures.md) -------------
// KEY holds an Ed25519 seed ({"format": "lockstep-signing-key", ...}), KEY.pub its public key.
// WriteSigningKey creates both (KEY with mode 0600; an existing file is refused).
void WriteSigningKey(const std::filesystem::path& key_path, const Ed25519Seed& seed);
Ed25519Seed ReadSigningKey(const std::filesystem::path& key_path);
Ed25519PublicKey ReadPublicKey(const std::filesystem::path& pub_path);
std::string PublicKeyJson(const Ed25519PublicKey& key);
// A list of trusted public keys (docs/cli.md, "Input files"): one key per line as 64 lowercase
// hex digits, trailing spaces and CRs ignored, empty lines and lines from '#' skipped; at least
// one key. `source` names the list in errors, with the line.
inline constexpr uint64_t kMaxTrustedKeysBytes = uint64_t{1} << 20;  // 15,000 keys
std::vector<Ed25519PublicKey> ParseTrustedKeys(std::string_view text, const std::string& source);

struct SignedLine {
  uint64_t step = 0;
  Digest hash{};
  Ed25519Signature signature{};
};
struct SignedRoot {
  uint64_t steps = 0;  // the root covers the chain lines of steps 0 .. steps - 1
  Digest root{};
  Ed25519Signature signature{};
};
struct SignedChain {
  Ed25519PublicKey key{};
  std::vector<SignedLine> lines;  // steps 0, 1, 2, ... (consecutive)
  std::vector<SignedRoot> roots;  // in the order signed
};
// The messages signed: "lockstep/chain-line/v1\0" || u64(step) || hash and
// "lockstep/chain-root/v1\0" || u64(steps) || root; the chain root is MerkleRoot over
// LeafHash(u64(step) || hash) of each line, in step order.
std::vector<uint8_t> ChainLineMessage(uint64_t step, const Digest& hash);
std::vector<uint8_t> ChainRootMessage(uint64_t steps, const Digest& root);
Digest ChainRoot(std::span<const SignedLine> lines);

// signatures.jsonl: the key line, then line and root entries as they are signed (appended and
// fsynced one by one).
void StartSignedChain(const std::filesystem::path& path, const Ed25519PublicKey& key);
void AppendSignedLine(const std::filesystem::path& path, const SignedLine& line);
void AppendSignedRoot(const std::filesystem::path& path, const SignedRoot& root);
// Parses strictly (exact keys, hex lengths, consecutive steps from 0, roots covering signed
// lines); signatures are not checked here. With TornLine::kDrop a last line without its newline
// (an append cut short by a crash) is dropped, as a resume does; the key line must be whole.
SignedChain ReadSignedChain(const std::filesystem::path& path,
                            TornLine torn = TornLine::kRefuse);
// Every problem of a chain, one line each: a signature that does not verify under the chain's
// key, a root that is not the root of its lines, a key other than `trusted` (when given).
std::vector<std::string> VerifySignedChain(const SignedChain& chain,
                                           const Ed25519PublicKey* trusted);
// Two histories signed by one key that contradict each other (equivocation): the first step
// with two different signed hashes, or a signed root of one that the other's lines do not
// reproduce (naming the first step where the lines differ). nullopt: consistent.
std::optional<std::string> FindEquivocation(const SignedChain& a, const SignedChain& b);

// ---- kits: kit.json and trajectory.json (docs/kits.md) ---------------------------------------
// Formats only: building, fetching and auditing a kit are the audit layer's (kit.h). Verifying a
// kit's files needs nothing else.
namespace kit {

inline constexpr int kKitFormatVersion = 1;
inline constexpr int kTrajectoryFormatVersion = 1;
inline constexpr std::string_view kManifestName = "kit.json";
inline constexpr std::string_view kTrajectoryName = "trajectory.json";

// ---- kit.json ----------------------------------------------------------------------------------
struct KitFile {
  std::string path;  // relative to the kit, '/'-separated (see ValidateKitPath)
  uint64_t size = 0;
  Digest sha256{};
};

struct KitManifest {
  std::string lockstep_version, git_commit;  // of the lockstep that built the kit
  int contract_version = 0;                  // numerics contract the kit's hashes were made under
  std::vector<KitFile> files;                // sorted by path, every file but kit.json itself
};

// Fails unless `path` is a safe relative kit path: non-empty '/'-separated segments of
// [A-Za-z0-9._-], none "." or "..", not kit.json. (Fetch writes DEST/<path>: nothing may escape
// DEST, and the path goes into a URL unescaped.) `what` names the source in errors.
void ValidateKitPath(std::string_view path, std::string_view what);

// The exact bytes of kit.json for `manifest` (sorted keys, 2-space indent, final newline).
std::string ManifestJson(const KitManifest& manifest);
// Parses and validates kit.json text (fields, versions, paths, sorted and unique); `what` names
// the source in errors.
KitManifest ParseManifest(std::string_view text, std::string_view what);
KitManifest ReadManifest(const std::filesystem::path& kit_dir);

// The size and sha256 of a file, hashed through a read-only mapping so that even a file of many
// GiB needs no buffer of its size.
KitFile DescribeFile(const std::filesystem::path& file, std::string relative_path);
KitFile DescribeFile(const File& file, std::string relative_path);  // an open file

// Checks a kit directory against its kit.json: the exact file set (a file kit.json does not list,
// or a listed file that is missing, is an error; so is anything that is not a regular file), and
// every file's size and sha256; then, when those hold, the units' links (VerifyKitChain).
// Returns one message per problem, each naming the file or unit; empty when the kit verifies.
// Throws Error when kit.json itself cannot be read or parsed.
std::vector<std::string> VerifyKit(const std::filesystem::path& kit_dir);
// The units chain, without a gap (docs/kits.md, "kit verify"): one init unit, first; each
// interval starts where the unit before it ends and the last ends at the kit's last checkpoint;
// every field of a unit agrees with the kit's files (its name, its checkpoints' paths, steps and
// state hashes, the init's seed against the descriptor's train.seed), so that an interval that
// replays to its hash also continues what the units before it proved. One message per problem,
// naming the unit, the field and the value.
std::vector<std::string> VerifyKitChain(const std::filesystem::path& kit_dir);

// The signed commitments of a kit (docs/kits.md, "Signed kits"): KIT/signatures.jsonl must
// exist, be signed by `trusted`, verify (every line and root), and sign each unit's
// expected_hash at its until_step and each interval's start checkpoint's state hash at its
// start_step; each of `known_histories` (signatures.jsonl files obtained
// earlier, e.g. from a previous publication) must not contradict it (equivocation, naming the
// step). Returns one message per problem; empty when all holds.
std::vector<std::string> VerifyKitSignatures(const std::filesystem::path& kit_dir,
                                             const Ed25519PublicKey& trusted,
                                             std::span<const std::filesystem::path> known_histories);
inline constexpr std::string_view kSignaturesName = RunLayout::kSignaturesName;  // in a kit too

// ---- trajectory.json -------------------------------------------------------------------------
enum class UnitKind { kInit, kInterval };
std::string_view UnitKindName(UnitKind kind);  // "init" | "interval"

struct Unit {
  std::string name;  // "init", or "interval_<start>_<until>"
  UnitKind kind = UnitKind::kInit;
  std::string config;  // kit path of the run config (YAML)
  std::string data;    // kit path of the dataset directory
  uint64_t seed = 0;   // init: the config's train.seed
  uint64_t start_step = 0, until_step = 0;  // init: both 0
  // interval: the checkpoint the replay starts from, and the publisher's checkpoint at
  // until_step (for localising a mismatch); kit paths of checkpoint directories.
  std::string start_checkpoint, target_checkpoint;
  Digest expected_hash{};  // state_hashes.jsonl at until_step
  // What the publisher measured: the sum of metrics.jsonl's step_seconds over the interval;
  // nullopt where the run did not measure it (the init's time, and peak RSS, which lockstep
  // train does not record).
  std::optional<double> publisher_wall_seconds;
  std::optional<uint64_t> publisher_peak_rss_bytes;
};

struct Trajectory {
  std::string descriptor;  // the run descriptor every checkpoint's meta.json records
  std::vector<Unit> units;  // init first, then intervals by start step
};

std::string TrajectoryJson(const Trajectory& trajectory);
Trajectory ParseTrajectory(std::string_view text, std::string_view what);
Trajectory ReadTrajectory(const std::filesystem::path& kit_dir);

}  // namespace kit

}  // namespace lockstep
