// lockstep core: errors, parallel loops over independent work, floating-point environment.
#pragma once

#include <fmt/format.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lockstep {

// Every failure lockstep reports is an Error whose message names the operation (or file),
// the argument (or field) and the offending values.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void Fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

// A broken invariant of lockstep itself -- a bug, never the user's input. LOCKSTEP_CHECK and
// LOCKSTEP_INTERNAL report it as "internal error at FILE:LINE: ..." and the command exits with
// kInternalErrorExit (sysexits' EX_SOFTWARE) instead of 2, so that neither a user nor a test can
// take it for a refusal of bad input.
class InternalError : public Error {
 public:
  using Error::Error;
};
inline constexpr int kInternalErrorExit = 70;
[[noreturn]] void FailInternal(std::string_view file, int line, const std::string& what);
#define LOCKSTEP_INTERNAL(...) \
  ::lockstep::FailInternal(__FILE__, __LINE__, fmt::format(__VA_ARGS__))
#define LOCKSTEP_CHECK(condition, ...)                                                     \
  do {                                                                                     \
    if (!(condition)) LOCKSTEP_INTERNAL("{} (broken: {})", fmt::format(__VA_ARGS__), #condition); \
  } while (0)

// ---- numbers in text ------------------------------------------------------------------------
// `text` as a decimal integer from 0 to 2^64 - 1, or nothing: digits only (no sign, space or
// other base), no leading zero but the number 0 itself, and never wrapped or saturated.
std::optional<uint64_t> ParseDecimalU64(std::string_view text);

// ---- threads ------------------------------------------------------------------------------
// The number of worker threads kernels may use. Results never depend on it (the numerics
// contract); only speed does. Default: 1.
void SetThreads(int threads);
int Threads();

// From now on, every ParallelFor and ParallelForEachThread made by the calling thread runs its
// tasks inline, on that thread: for a thread that works beside the one that drives the worker
// pool (the exchange's thread of a distributed run), which must not take the pool's workers.
void KeepThisThreadSerial();

// Runs body(i) for i in [0, count) on up to Threads() threads. Tasks must write disjoint
// outputs; which thread runs which task is unspecified. A task that throws (a Fail, a failed
// allocation) ends the loop: no task is started after it, the tasks running finish, and the
// exception (the first, when several throw) is rethrown on the calling thread after the join.
// Every thread checks its floating-point environment (RequireIeeeFloatingPoint) before its first
// task of a loop, so a worker whose environment a library changed fails the loop.
void ParallelFor(int64_t count, void (*body)(int64_t, void*), void* context);

template <typename Body>
void ParallelFor(int64_t count, Body&& body) {
  ParallelFor(
      count, [](int64_t i, void* ctx) { (*static_cast<Body*>(ctx))(i); },
      const_cast<void*>(static_cast<const void*>(&body)));
}

// Runs body(t) once for each t in [0, Threads()): t = 0 on the calling thread, and each t > 0
// on the same worker thread in every call, so what thread t's task leaves in its core's caches
// (a block of a GEMM's output, its packed panels) is there for thread t's task of the next call.
// Use it where that locality is worth more than balancing the load: a thread slowed by other
// work is not helped. Inside a parallel loop the tasks run in order on the calling thread.
// Exceptions and the floating-point check as for ParallelFor.
void ParallelForEachThread(void (*body)(int64_t, void*), void* context);

template <typename Body>
void ParallelForEachThread(Body&& body) {
  ParallelForEachThread([](int64_t t, void* ctx) { (*static_cast<Body*>(ctx))(t); },
                        const_cast<void*>(static_cast<const void*>(&body)));
}

// ---- floating-point environment -------------------------------------------------------------
// Fails (Error) when the current thread flushes subnormals (x86 MXCSR FTZ/DAZ, Arm FPCR.FZ)
// or does not round to nearest-even: the numerics contract needs IEEE behaviour. `cause`, when
// given, names what last ran on this thread (a library just loaded) to blame in the message.
// A register read: cheap enough for the start of every step and every parallel loop.
void RequireIeeeFloatingPoint(std::string_view cause = {});

// Describes the floating-point control state, e.g. "MXCSR=0x1f80 (FTZ off, DAZ off, RN)".
std::string DescribeFloatingPointState();

// ---- Philox4x32-10 (Salmon et al., SC'11; the Random123 definition) ------------------------
using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;
// The 10-round Philox4x32 bijection of `counter` under `key`.
PhiloxCounter Philox4x32(PhiloxCounter counter, PhiloxKey key);
// The key of a 64-bit seed: {low 32 bits, high 32 bits}.
PhiloxKey PhiloxKeyFromSeed(uint64_t seed);

// ---- format versions (docs/formats/): every run descriptor pins them -----------------------
inline constexpr int kStateHashFormatVersion = 2;   // docs/formats/state-hash.md
inline constexpr int kCheckpointFormatVersion = 3;  // docs/formats/checkpoint.md
inline constexpr int kShardsFormatVersion = 2;      // docs/formats/shards.md

// ---- hashing: BLAKE2b-256 (libsodium's crypto_generichash, 32-byte output, no key) -----------
using Digest = std::array<uint8_t, 32>;
class Blake2b {
 public:
  Blake2b();
  Blake2b& Update(std::span<const uint8_t> bytes);
  Blake2b& Update(std::span<const std::byte> bytes) {
    return Update(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
  }
  Blake2b& Update(std::string_view text);
  Blake2b& Update(std::span<const float> values);  // the little-endian IEEE bytes
  Blake2b& UpdateU64(uint64_t value);              // 8 bytes little-endian
  Blake2b& UpdateU32(uint32_t value);              // 4 bytes little-endian
  Digest Final();

 private:
  alignas(64) std::array<uint8_t, 384> state_;  // crypto_generichash_state (opaque)
  bool finalized_ = false;
};
Digest Blake2b256(std::span<const uint8_t> bytes);
// Blake2b256 of equal-length messages (`bytes` bytes each, anywhere in memory) into
// out[0 .. messages.size()). Many at once where the lane-parallel form is faster
// (Blake2bImplementation) and serves them: lengths a positive multiple of 128 bytes, messages a
// multiple of 8 bytes apart; otherwise one at a time with libsodium.
void Blake2b256Many(std::span<const uint8_t* const> messages, size_t bytes, Digest* out);
// The lane-parallel form itself, whatever Blake2bImplementation chose (tests and benchmarks);
// fails on messages it does not serve.
void Blake2b256Lanes(std::span<const uint8_t* const> messages, size_t bytes, Digest* out);
// How Blake2b256Many hashes on this machine, chosen by measurement at first use after known
// answers against libsodium (for --version and benchmarks).
const std::string& Blake2bImplementation();
// SHA-256 (libsodium's crypto_hash_sha256), for kit manifests that tools like sha256sum check.
Digest Sha256(std::span<const uint8_t> bytes);
std::string ToHex(std::span<const uint8_t> bytes);
// Parses exactly 64 lowercase hex digits; fails naming `what` and the offending text otherwise.
Digest DigestFromHex(std::string_view hex, std::string_view what);

// ---- Merkle trees (RFC 6962's shape, BLAKE2b-256) -------------------------------------------
// leaf = H(0x00 || bytes), node = H(0x01 || left || right); n > 1 leaves split at the largest
// power of two below n; the root of no leaves is H(empty). Used for traces and signed chains.
Digest LeafHash(std::string_view bytes);
Digest MerkleRoot(std::span<const Digest> leaves);
// The audit path of leaf `index` (RFC 6962, section 2.1.1), bottom up.
std::vector<Digest> InclusionProof(std::span<const Digest> leaves, size_t index);
bool VerifyInclusion(const Digest& leaf, size_t index, size_t count, std::span<const Digest> proof,
                     const Digest& root);

// ---- Ed25519 signatures (libsodium's crypto_sign) -------------------------------------------
using Ed25519Seed = std::array<uint8_t, 32>;       // the secret key's seed
using Ed25519PublicKey = std::array<uint8_t, 32>;
using Ed25519Signature = std::array<uint8_t, 64>;
Ed25519Seed NewEd25519Seed();  // from the operating system's random source
Ed25519PublicKey PublicKeyOf(const Ed25519Seed& seed);
Ed25519Signature SignMessage(const Ed25519Seed& seed, std::span<const uint8_t> message);
bool VerifySignature(const Ed25519PublicKey& key, std::span<const uint8_t> message,
                     const Ed25519Signature& signature);
// Parses exactly 2 * N lowercase hex digits; fails naming `what` and the text otherwise.
template <size_t N>
std::array<uint8_t, N> BytesFromHex(std::string_view hex, std::string_view what);
extern template std::array<uint8_t, 32> BytesFromHex<32>(std::string_view, std::string_view);
extern template std::array<uint8_t, 64> BytesFromHex<64>(std::string_view, std::string_view);

// ---- memory ---------------------------------------------------------------------------------
uint64_t PeakRssBytes();       // VmHWM of /proc/self/status: the peak since start or reset
// VmHWM := VmRSS now, so work that follows has its own peak; false where the kernel does not
// allow it (then the peak stays the process's since its start).
bool ResetPeakRss();
uint64_t CurrentRssBytes();    // VmRSS of /proc/self/status
uint64_t MemAvailableBytes();  // MemAvailable of /proc/meminfo
uint64_t ProcessReadBytes();   // rchar of /proc/self/io: bytes read by read(2) and the like
// A size as lockstep shows it to people: "12.3 MiB".
std::string MiB(uint64_t bytes);

// The time now in UTC, ISO 8601 to the second: "2026-12-03T07:40:12Z".
std::string UtcNow();

// ---- progress -------------------------------------------------------------------------------
// A progress line on stderr for long work ("label: 37% (2.4 / 6.4 GiB, 12 s, 20 s left)"): on a
// terminal one line redrawn at most every 0.2 s, in a log a line per 10 %. Disabled: prints
// nothing.
class ProgressLine {
 public:
  ProgressLine(std::string label, uint64_t total_bytes, bool enabled);
  // Counting `unit` (e.g. "microbatches") instead of bytes, and drawing nothing before
  // `delay_seconds` have passed: work that ends sooner prints nothing.
  ProgressLine(std::string label, uint64_t total, bool enabled, std::string unit,
               double delay_seconds);
  void Add(uint64_t bytes);  // thread-compatible, not thread-safe
  void Finish();             // the final line; also done by the destructor if not called

  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

 private:
  void Draw(bool final);
  std::string label_, unit_;  // unit_ empty: bytes
  uint64_t total_, done_ = 0;
  bool enabled_, terminal_, finished_ = false, drawn_ = false;
  int last_decile_ = -1;
  double start_, delay_ = 0, last_draw_ = -1;
};

// ---- files ----------------------------------------------------------------------------------
// An open file descriptor, closed on every path out: the one way lockstep holds a file open
// (the helpers below are made of it). Every error names the path and the OS error.
// What O_DIRECT transfers are aligned to: a multiple of every logical block size Linux uses.
inline constexpr size_t kDirectIoAlignment = 4096;

class File {
 public:
  // A regular file, read-only; a FIFO, device or directory is refused at once ("not a regular
  // file"), never waited on.
  static File OpenForReading(const std::filesystem::path& path);
  // Write-only, created 0644 or truncated: a regular file only. A symbolic link at the path is
  // never followed, and a device, FIFO, socket or directory there is refused, untouched.
  static File Create(const std::filesystem::path& path);
  // Read-write, created with `permissions`; an existing file is refused (O_EXCL), so nothing of
  // someone else's is ever replaced, and a secret is never readable by others, even briefly.
  static File CreateExclusive(const std::filesystem::path& path, unsigned permissions = 0644);
  // Write-only at the end (O_APPEND), created 0644 if absent: a crash can at worst tear the last
  // write, never lose earlier ones.
  static File OpenForAppend(const std::filesystem::path& path);
  // A directory, read-only: to fsync it (SyncDirectory).
  static File OpenDirectory(const std::filesystem::path& dir);
  // An existing file, read-write with O_DIRECT: reads and writes bypass the page cache, and
  // their buffers, offsets and lengths must be multiples of kDirectIoAlignment. Nothing when
  // the filesystem does not offer O_DIRECT (tmpfs, for one); fails naming the path otherwise.
  static std::optional<File> OpenDirect(const std::filesystem::path& path);

  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  const std::filesystem::path& path() const { return path_; }
  // This open file again, read-only with O_DIRECT (through /proc/self/fd, so it is the same
  // file even if its path was replaced since). Nothing where the filesystem does not offer
  // O_DIRECT or /proc is not mounted; fails naming the path otherwise.
  std::optional<File> ReopenDirectForReading() const;
  // The descriptor, still owned by this File (for mmap and the like).
  int fd() const { return fd_; }
  uint64_t Size() const;
  // Bytes the file occupies on disk (st_blocks · 512).
  uint64_t AllocatedBytes() const;
  // Reads exactly out.size() bytes at `offset`; fails on a short file.
  void ReadAt(uint64_t offset, std::span<uint8_t> out) const;
  // Reads up to out.size() bytes at `offset`, fewer only where the file ends; returns how many.
  size_t ReadUpTo(uint64_t offset, std::span<uint8_t> out) const;
  // Reads to the end from the current position.
  std::vector<uint8_t> ReadAll() const;
  // Writes all of `bytes` at the current position (the end, with OpenForAppend), or at `offset`.
  void Write(std::span<const uint8_t> bytes);
  void Write(std::string_view text);
  void WriteAt(uint64_t offset, std::span<const uint8_t> bytes);
  void Sync() const;
  // Closes now, failing naming the path when the OS reports an error (a write may only fail
  // there, e.g. on NFS); the destructor closes silently.
  void Close();

 private:
  friend class Directory;
  File(int fd, std::filesystem::path path) : fd_(fd), path_(std::move(path)) {}
  static File Open(const std::filesystem::path& path, int flags, unsigned permissions,
                   const char* what);
  int fd_ = -1;
  std::filesystem::path path_;
};

// A directory held open, under which files are made, opened, renamed and removed relative to its
// descriptor (openat and the like), never through a symbolic link, and never a file with a second
// hard link: what a download into a destination uses (kit fetch), so that no link placed inside
// the destination, before or during the download, redirects a write to a file outside it.
// Errors name the path.
class Directory {
 public:
  // `path` itself (made, with its parents, when `create` and absent); refused when it is a
  // symbolic link or not a directory.
  static Directory Open(const std::filesystem::path& path, bool create);
  // The directory that holds `path` ("." for a bare name), which must exist; links in the
  // directory's own path are followed (it is where the user put the output).
  static Directory HolderOf(const std::filesystem::path& path);
  // The same directory, on a descriptor of its own.
  Directory Duplicate() const;
  // The subdirectory `relative` (no "..", no root): each component made when absent and opened
  // without following a link; a link among them is refused.
  Directory Subdirectory(const std::filesystem::path& relative) const;
  const std::filesystem::path& path() const { return dir_.path(); }
  // Whether `name` exists here, as anything (a link is not followed).
  bool Contains(std::string_view name) const;
  // Regular file `name` with a single link, read-only, or for appending (made 0644 if absent).
  // A symbolic link, a FIFO, a directory or a file with another hard link is refused.
  File OpenForReading(std::string_view name) const;
  File OpenForAppend(std::string_view name) const;
  // A new file `name`, read-write, made with O_EXCL: nothing when the name is taken (by
  // anything, a dangling link included); fails naming the path on any other error.
  std::optional<File> CreateNew(std::string_view name, unsigned permissions) const;
  // `text` as file `name`: a StagedFile of kind OutputKind::kFile (a regular file there is
  // replaced whole; anything else there is refused, untouched).
  void WriteFileSynced(std::string_view name, std::string_view text) const;
  void Rename(std::string_view from, std::string_view to) const;
  void Remove(std::string_view name) const;  // a file; nothing when absent
  void Sync() const { dir_.Sync(); }

 private:
  friend class StagedFile;
  friend class StagedDirectory;
  explicit Directory(File dir) : dir_(std::move(dir)) {}
  File OpenRegular(std::string_view name, int flags, const char* what) const;
  File dir_;
};

// Whole-file read; fails naming the path and the OS error.
std::vector<uint8_t> ReadFileBytes(const std::filesystem::path& path);
std::string ReadFileText(const std::filesystem::path& path);
// The same for a file a user gives, of at most `max_bytes`: sized before it is read, so a larger
// one (a 1 TiB sparse file included) is refused naming the file, its size and what `what` may
// hold, without a byte read or allocated; one that grows past the cap while read is refused too.
std::vector<uint8_t> ReadFileBytes(const std::filesystem::path& path, uint64_t max_bytes,
                                   std::string_view what);
std::string ReadFileText(const std::filesystem::path& path, uint64_t max_bytes,
                         std::string_view what);
// Writes the file and fsyncs it (not its directory). Fails naming the path.
void WriteFileSynced(const std::filesystem::path& path, std::span<const uint8_t> bytes);
void WriteFileSynced(const std::filesystem::path& path, std::string_view text);
// `text` as the file at `path`, which is replaced whole or not at all: a StagedFile of kind
// OutputKind::kFile in the directory that holds it, which must exist.
void ReplaceFileSynced(const std::filesystem::path& path, std::string_view text);
// Appends `text` (O_APPEND, created 0644 if absent) and fsyncs: for logs read line by line.
void AppendFileSynced(const std::filesystem::path& path, std::string_view text);
// The lines of `text` without their '\n', as std::getline gives them: a last line without a
// newline is a line, an empty text has none.
std::vector<std::string> Lines(std::string_view text);
// The lines of a log that lockstep appends to a line at a time (state_hashes.jsonl,
// metrics.jsonl), without their '\n'. A last line without its newline -- an append cut short by
// a crash or a full disk -- is refused naming the file and line, or with drop_torn dropped with
// a note on stderr.
std::vector<std::string> LogLines(const std::filesystem::path& path, bool drop_torn);
// fsync of a directory, so that renames and creations inside it are durable.
void SyncDirectory(const std::filesystem::path& dir);

// Fails naming `what`, `path` and both sizes unless the file system that will hold `path` (the
// nearest existing ancestor's) has `bytes` available: checked before a write whose size is known,
// rather than failing with ENOSPC part-way.
void RequireFreeSpace(const std::filesystem::path& path, uint64_t bytes, std::string_view what);

// A path a command was given, with the option (or argument) that named it, for messages.
struct NamedPath {
  std::string_view name;  // e.g. "--out", "--checkpoint", "RUN_OR_KIT"
  std::filesystem::path path;
};
// The one rule for outputs (every command, before it opens an output for writing): an output
// may not be one of the command's inputs, nor lie inside an input directory (a checkpoint, a
// kit, a run, a dataset). Compared by identity -- device and inode, links
// resolved -- so that another spelling, a symbolic link or a hard link is caught; an output that
// does not exist yet is judged by the directories that will hold it. Fails naming both options
// and both paths. Nor may two outputs be one file. Empty paths (options not given) and inputs
// that do not exist are skipped: the command refuses those itself.
void RefuseOutputsOntoInputs(const std::vector<NamedPath>& outputs,
                             const std::vector<NamedPath>& inputs);

// ---- outputs: what a command may write at a path (docs/cli.md, "Outputs") ---------------------
// Every output of every command is one of these kinds, checked when the command line is read
// (OutputProblem) and again by the writer when it commits (StagedFile, StagedDirectory,
// File::Create). A symbolic link, a device, a FIFO or a socket at an output path is refused for
// every kind: never written through, never replaced.
enum class OutputKind {
  kFile,          // a file replaced whole: absent, or a regular file
  kNewFile,       // a file that never replaces anything: absent
  kNewDirectory,  // a directory the command fills: absent (made with its parents) or empty
  kDirectory,     // a directory the command adds to (a run, a download, scratch space): absent
                  // (made with its parents) or a directory
};
// Why `path` cannot be an output of `kind`, as "PATH: reason" (e.g. "/dev/null: a character
// device, not a regular file: an output is never written into or over one"); nothing when it
// can. Also refused: an empty path; for a file, a path that names a directory ("DIR/", ".",
// "..") or whose directory does not exist.
std::optional<std::string> OutputProblem(const std::filesystem::path& path, OutputKind kind);
// Fails "OPTION PATH-problem" when OutputProblem finds one.
void CheckOutput(const NamedPath& out, OutputKind kind);

// A file written under a fresh name beside its destination (".NAME.PID-N.tmp", made with
// O_EXCL, so nothing already there is ever touched) and renamed onto it when whole: the one way
// lockstep writes an output file. The destination is checked (OutputProblem, for kFile or
// kNewFile) when the staging file is made, and the commit replaces nothing unseen: a rename with
// RENAME_NOREPLACE where the destination is absent (kNewFile: only there); where kFile's is
// present, the two are exchanged in one step (RENAME_EXCHANGE) and what came out is removed if
// it is a regular file, else exchanged back and refused -- a link, device or directory put there
// at any moment is never replaced. (A file system without renameat2's flags: checked, then
// renamed.) Until Commit,
// the destructor removes the staging file -- and only it: a failed write (a full disk) leaves
// nothing behind and nothing changed.
class StagedFile {
 public:
  StagedFile(const std::filesystem::path& out, OutputKind kind, unsigned permissions = 0644);
  StagedFile(const Directory& dir, std::string_view name, OutputKind kind,
             unsigned permissions = 0644);
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;
  ~StagedFile();
  File& file() { return file_; }
  // fsync, close, rename onto the destination, fsync the directory.
  void Commit();

 private:
  Directory dir_;
  std::string name_, temp_;
  OutputKind kind_;
  File file_;
  bool committed_ = false;
};

// A directory filled under a fresh name beside its destination (".NAME.PID-N.tmp", made with
// mkdir, which never takes an existing name) and renamed onto it when whole, so that the
// destination is absent or complete. The destination must be absent or an empty directory
// (kNewDirectory), checked when staging starts and by rename(2) itself at Commit. Until Commit,
// the destructor removes the staging directory with what the command put in it -- and nothing
// else: a directory of the user's at any name is never removed.
class StagedDirectory {
 public:
  explicit StagedDirectory(const std::filesystem::path& out);
  StagedDirectory(const StagedDirectory&) = delete;
  StagedDirectory& operator=(const StagedDirectory&) = delete;
  ~StagedDirectory();
  // Where to write: the staging directory.
  const std::filesystem::path& path() const { return staging_; }
  // fsync the staging directory, rename it onto the destination, fsync the holder.
  void Commit();

 private:
  Directory holder_;
  std::string name_, temp_;
  std::filesystem::path staging_;
  bool committed_ = false;
};

// Allocates buffers whose start is 64-byte aligned.
template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlignment{64};
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlignment)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlignment); }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const {
    return true;
  }
};

}  // namespace lockstep
