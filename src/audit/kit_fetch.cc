// `lockstep kit fetch`: download a kit over file://, http:// or https:// with libcurl, resuming
// partial downloads and verifying every file against kit.json before it takes its final name.
#include <curl/curl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <optional>
#include <utility>

#include "lockstep/kit.h"

namespace lockstep::audit {
// The kit formats (the state layer's, state.h).
using kit::DescribeFile;
using kit::KitFile;
using kit::KitManifest;
using kit::kManifestName;
using kit::ParseManifest;
using kit::ValidateKitPath;

namespace {
namespace fs = std::filesystem;

constexpr size_t kMaxManifestBytes = size_t{64} << 20;
constexpr uint64_t kProgressMinBytes = uint64_t{1} << 20;  // smaller files finish at once

// The host and port of `url` as libcurl reads it ("" for a part it cannot find).
std::pair<std::string, std::string> HostAndPort(const std::string& url) {
  std::pair<std::string, std::string> parts;
  CURLU* parsed = curl_url();
  if (parsed != nullptr &&
      curl_url_set(parsed, CURLUPART_URL, url.c_str(), CURLU_NON_SUPPORT_SCHEME) == CURLUE_OK) {
    char* part = nullptr;
    if (curl_url_get(parsed, CURLUPART_HOST, &part, 0) == CURLUE_OK) parts.first = part;
    curl_free(part);
    part = nullptr;
    if (curl_url_get(parsed, CURLUPART_PORT, &part, CURLU_DEFAULT_PORT) == CURLUE_OK) {
      parts.second = part;
    }
    curl_free(part);
  }
  curl_url_cleanup(parsed);
  return parts;
}

void RequireSupportedUrl(const std::string& url) {
  if (url.starts_with("file://")) return;
  if (!url.starts_with("http://") && !url.starts_with("https://")) {
    Fail("URL \"{}\": only file://, http:// and https:// are supported", url);
  }
  // Refused here, not left to libcurl: joined with "kit.json", "http://" would be
  // "http:/kit.json", which libcurl reads as the host "kit.json".
  CURLU* parsed = curl_url();
  const CURLUcode rc = parsed == nullptr ? CURLUE_OUT_OF_MEMORY
                                         : curl_url_set(parsed, CURLUPART_URL, url.c_str(),
                                                        CURLU_NON_SUPPORT_SCHEME);
  curl_url_cleanup(parsed);
  if (rc == CURLUE_NO_HOST) Fail("URL \"{}\": no host", url);
  if (rc != CURLUE_OK) {
    Fail("URL \"{}\" is malformed: check it (libcurl: {})", url, curl_url_strerror(rc));
  }
}

// What a transfer of `url` that ended with `rc` (and HTTP `status`, 0 when none) means for the
// user, naming what to change; `manifest` when `url` is the kit's kit.json, `curl_text` libcurl's
// own words (which the caller appends in brackets, for a bug report).
std::string TransferError(CURLcode rc, long status, const std::string& url, bool manifest,
                          const KitFetchOptions& options, std::string_view curl_text) {
  const auto [host, port] = HostAndPort(url);
  switch (rc) {
    case CURLE_URL_MALFORMAT:
      return fmt::format("URL \"{}\" is malformed: check it", url);
    case CURLE_COULDNT_RESOLVE_HOST:
      return fmt::format("{}: the host {} is not known (DNS): check the URL", url, host);
    case CURLE_COULDNT_CONNECT:
      return fmt::format("{}: nothing answers at {} port {}: check the URL's host and port", url,
                         host, port);
    case CURLE_PEER_FAILED_VERIFICATION:
      return fmt::format(
          "{}: the server's certificate was refused: it must chain to a CA in the "
          "system store (update-ca-certificates)",
          url);
    case CURLE_SSL_CONNECT_ERROR:
      if (curl_text.find("wrong version number") != std::string_view::npos) {
        return fmt::format("{}: {}:{} does not speak TLS: is the URL http://?", url, host, port);
      }
      return fmt::format("{}: the TLS handshake with {}:{} failed", url, host, port);
    case CURLE_OPERATION_TIMEDOUT:
      return fmt::format(
          "{}: too slow for --stall-timeout {} s and --min-rate {} bytes/s (no "
          "connection, a stall, or past the deadline they set): raise "
          "--stall-timeout or lower --min-rate{}",
          url, options.stall_seconds, options.min_rate, manifest ? "" : ", or run again to resume");
    case CURLE_WRITE_ERROR:  // kit.json's only write error: the cap (a file's are its own)
      if (manifest) {
        return fmt::format("{} is over {} MiB: not a kit manifest; is URL the kit's directory?",
                           url, kMaxManifestBytes >> 20);
      }
      break;
    case CURLE_FILE_COULDNT_READ_FILE:
    case CURLE_HTTP_RETURNED_ERROR:
      if (rc == CURLE_FILE_COULDNT_READ_FILE || status == 404) {
        const std::string_view code = status == 404 ? " (HTTP 404)" : "";
        if (manifest) {
          return fmt::format(
              "no kit.json at {}{}: URL must be the kit's directory, the one that "
              "holds kit.json",
              url, code);
        }
        return fmt::format(
            "{}: {}, though kit.json lists it: the kit there is incomplete (tell "
            "its publisher)",
            url, status == 404 ? "the server has no such file (HTTP 404)" : "no such file");
      }
      if (status >= 500) {
        return fmt::format("{}: the server failed (HTTP {}): run again later{}", url, status,
                           manifest ? "" : " to resume");
      }
      return fmt::format("{}: the server refused it (HTTP {}): check the URL", url, status);
    default:
      break;
  }
  return fmt::format("{}: the transfer failed", url);
}

std::string JoinUrl(std::string_view base, std::string_view path) {
  while (base.ends_with('/')) base.remove_suffix(1);
  return fmt::format("{}/{}", base, path);  // kit paths need no escaping (ValidateKitPath)
}

// One easy handle per transfer; curl_global_init runs once per process. A server that does not
// connect within `stall_seconds`, or sends less than `min_rate` bytes per second for that long,
// ends the transfer with an error, and so does one whose transfer outlasts `deadline_seconds`
// (a dead, trickling or hostile server must not hold a fetch forever; the .part stays for a
// resume).
class CurlHandle {
 public:
  CurlHandle(const KitFetchOptions& options, long deadline_seconds) : options_(options) {
    static std::once_flag once;
    std::call_once(once, [] {
      if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) Fail("libcurl: global init failed");
    });
    handle_ = curl_easy_init();
    if (handle_ == nullptr) Fail("libcurl: cannot create a transfer handle");
    error_[0] = '\0';
    curl_easy_setopt(handle_, CURLOPT_ERRORBUFFER, error_);
    curl_easy_setopt(handle_, CURLOPT_PROTOCOLS_STR, "file,http,https");
    curl_easy_setopt(handle_, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(handle_, CURLOPT_FOLLOWLOCATION, 1L);
    // A redirect loop ends in "Number of redirects hit maximum amount", not in headers piling up.
    curl_easy_setopt(handle_, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(handle_, CURLOPT_FAILONERROR, 1L);  // an HTTP status >= 400 is an error
    curl_easy_setopt(handle_, CURLOPT_CONNECTTIMEOUT, options.stall_seconds);
    curl_easy_setopt(handle_, CURLOPT_LOW_SPEED_LIMIT, options.min_rate);
    curl_easy_setopt(handle_, CURLOPT_LOW_SPEED_TIME, options.stall_seconds);
    curl_easy_setopt(handle_, CURLOPT_TIMEOUT, deadline_seconds);
  }
  ~CurlHandle() { curl_easy_cleanup(handle_); }
  CurlHandle(const CurlHandle&) = delete;
  CurlHandle& operator=(const CurlHandle&) = delete;

  CURL* get() const { return handle_; }
  // Runs the transfer of `url`: CURLE_OK, or the code that Explain turns into a message.
  CURLcode Perform(const std::string& url) {
    url_ = url;
    curl_easy_setopt(handle_, CURLOPT_URL, url_.c_str());
    return curl_easy_perform(handle_);
  }
  // The failed transfer's message (TransferError, at the URL a redirect may have led to), then
  // `note`, then libcurl's own words in brackets.
  std::string Explain(CURLcode rc, bool manifest, std::string_view note = {}) const {
    long status = 0;
    curl_easy_getinfo(handle_, CURLINFO_RESPONSE_CODE, &status);
    const char* url = nullptr;
    curl_easy_getinfo(handle_, CURLINFO_EFFECTIVE_URL, &url);
    const std::string_view curl_text = error_[0] != '\0' ? error_ : curl_easy_strerror(rc);
    return fmt::format("{}{} (libcurl: {})",
                       TransferError(rc, status, url != nullptr && *url != '\0' ? url : url_,
                                     manifest, options_, curl_text),
                       note, curl_text);
  }

 private:
  CURL* handle_ = nullptr;
  const KitFetchOptions& options_;
  std::string url_;  // the last Perform's
  char error_[CURL_ERROR_SIZE];
};

// What a transfer of `bytes` may take in all: the stall allowance, then the bytes at the minimum
// rate.
long DeadlineSeconds(const KitFetchOptions& options, uint64_t bytes) {
  return options.stall_seconds + static_cast<long>(bytes / static_cast<uint64_t>(options.min_rate));
}

std::string FetchText(const std::string& url, const KitFetchOptions& options) {
  CurlHandle curl(options, DeadlineSeconds(options, kMaxManifestBytes));
  std::string body;
  curl_easy_setopt(curl.get(), CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(curl.get(), CURLOPT_WRITEFUNCTION,
                   +[](char* data, size_t size, size_t count, void* context) -> size_t {
                     auto* out = static_cast<std::string*>(context);
                     if (out->size() + size * count > kMaxManifestBytes) return 0;  // aborts
                     out->append(data, size * count);
                     return size * count;
                   });
  const CURLcode rc = curl.Perform(url);
  if (rc != CURLE_OK) Fail("{}", curl.Explain(rc, /*manifest=*/true));
  return body;
}

// One file's download into its .part, appending from `offset`.
struct Transfer {
  std::optional<File> out;
  std::string write_error;  // a failed write (the callback cannot throw through libcurl)
  uint64_t offset = 0;    // bytes already in the .part when the transfer began
  uint64_t written = 0;   // bytes this transfer appended
  uint64_t expected = 0;  // the size kit.json lists
  bool oversize = false;  // the source sent more than `expected`: aborted, fails verification
  std::string label;
  bool show_progress = false;
  std::chrono::steady_clock::time_point last_draw{};
};

size_t WriteToPart(char* data, size_t size, size_t count, void* context) {
  auto* t = static_cast<Transfer*>(context);
  const size_t bytes = size * count;
  if (t->offset + t->written + bytes > t->expected) {
    t->oversize = true;  // don't let a wrong source fill the disk
    return 0;
  }
  try {
    t->out->Write({reinterpret_cast<const uint8_t*>(data), bytes});
  } catch (const Error& e) {
    t->write_error = e.what();
    return 0;
  }
  t->written += bytes;
  return bytes;
}

void DrawProgress(const Transfer& t) {
  constexpr int kWidth = 30;
  const uint64_t done = t.offset + t.written;
  const double fraction = t.expected == 0 ? 1.0 : static_cast<double>(done) / t.expected;
  const int filled = static_cast<int>(fraction * kWidth);
  std::fprintf(stderr, "\r%s [%s%s] %3d%% %.1f/%.1f MiB\033[K", t.label.c_str(),
               std::string(filled, '#').c_str(), std::string(kWidth - filled, ' ').c_str(),
               static_cast<int>(fraction * 100), done / 1048576.0, t.expected / 1048576.0);
}

int OnProgress(void* context, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(context);
  const auto now = std::chrono::steady_clock::now();
  if (now - t->last_draw >= std::chrono::milliseconds(100)) {
    t->last_draw = now;
    DrawProgress(*t);
  }
  return 0;
}

enum class Downloaded { kComplete, kOversize, kNoRanges };

// Appends the source's bytes from `offset` on to `part` in `dir`. kOversize: the source sent
// more than the listed size; kNoRanges: a server that answered the range request for `offset`
// with the whole file, or found no such range (nothing appended). Fails on any other transfer
// error, keeping the .part for a resume (or deleting it when it is empty).
Downloaded DownloadPart(const std::string& url, const Directory& dir, const std::string& part,
                        uint64_t offset, const KitFile& file, const KitFetchOptions& options,
                        bool progress) {
  Transfer t;
  t.offset = offset;
  t.expected = file.size;
  t.label = file.path;
  t.show_progress = progress && file.size >= kProgressMinBytes;
  t.out.emplace(dir.OpenForAppend(part));

  CurlHandle curl(options, DeadlineSeconds(options, file.size - offset));
  curl_easy_setopt(curl.get(), CURLOPT_WRITEFUNCTION, WriteToPart);
  curl_easy_setopt(curl.get(), CURLOPT_WRITEDATA, &t);
  // With an offset, HTTP sends "Range: bytes=offset-" and libcurl refuses a server that answers
  // with the whole file instead of 206 (CURLE_RANGE_ERROR) before writing any of it.
  curl_easy_setopt(curl.get(), CURLOPT_RESUME_FROM_LARGE, static_cast<curl_off_t>(offset));
  if (t.show_progress) {
    curl_easy_setopt(curl.get(), CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl.get(), CURLOPT_XFERINFOFUNCTION, OnProgress);
    curl_easy_setopt(curl.get(), CURLOPT_XFERINFODATA, &t);
  }
  const CURLcode rc = curl.Perform(url);
  std::string sync_error;
  try {
    t.out->Sync();
    t.out->Close();
  } catch (const Error& e) {
    sync_error = e.what();
  }
  if (t.show_progress) {
    DrawProgress(t);
    std::fputc('\n', stderr);
  }
  long status = 0;
  curl_easy_getinfo(curl.get(), CURLINFO_RESPONSE_CODE, &status);
  // 416: the server's file ends before the .part does (it changed): start it again, and the
  // verification names what differs.
  if (offset > 0 &&
      (rc == CURLE_RANGE_ERROR || (rc == CURLE_HTTP_RETURNED_ERROR && status == 416))) {
    return Downloaded::kNoRanges;
  }
  if (rc != CURLE_OK && !t.oversize) {
    std::string note;
    if (t.offset + t.written == 0) {
      dir.Remove(part);  // nothing to resume
    } else {
      note =
          fmt::format("; partial download kept in {} for a resume", (dir.path() / part).string());
    }
    if (!t.write_error.empty()) Fail("{}{}", t.write_error, note);
    Fail("{}", curl.Explain(rc, /*manifest=*/false, note));
  }
  if (!sync_error.empty()) Fail("{}", sync_error);
  return t.oversize ? Downloaded::kOversize : Downloaded::kComplete;
}

// Empty when file `name` of `dir` has the listed size and sha256, else what differs.
std::string Mismatch(const Directory& dir, const std::string& name, const KitFile& expected) {
  const KitFile actual = DescribeFile(dir.OpenForReading(name), expected.path);
  if (actual.size != expected.size) {
    return fmt::format("size {} bytes, kit.json says {}", actual.size, expected.size);
  }
  if (actual.sha256 != expected.sha256) {
    return fmt::format("sha256 {}, kit.json says {}", ToHex(actual.sha256),
                       ToHex(expected.sha256));
  }
  return {};
}

}  // namespace

// Every file is written inside DEST through a descriptor of its directory (lockstep::Directory):
// no symbolic link is followed, no file with a second hard link is written, and kit.json is
// renamed into place from a fresh temporary name, so nothing prepared inside DEST redirects a
// write outside it.
KitFetchReport FetchKit(const KitFetchOptions& options) {
  RequireSupportedUrl(options.url);
  const bool progress = options.progress && ::isatty(STDERR_FILENO);
  KitFetchReport report;

  const std::string manifest_url = JoinUrl(options.url, kManifestName);
  if (!(options.stall_seconds >= 1)) {
    Fail("--stall-timeout {} (must be at least 1 second)", options.stall_seconds);
  }
  if (!(options.min_rate >= 1)) Fail("--min-rate {} (must be at least 1 byte/s)", options.min_rate);
  if (fs::exists(options.dest) && (fs::is_symlink(options.dest) || !fs::is_directory(options.dest))) {
    Fail("{}: exists and is not a directory", options.dest.string());
  }
  const std::string manifest_text = FetchText(manifest_url, options);
  report.manifest_sha256 = Sha256({reinterpret_cast<const uint8_t*>(manifest_text.data()),
                                   manifest_text.size()});
  const KitManifest manifest = ParseManifest(manifest_text, manifest_url);
  const Directory dest = Directory::Open(options.dest, /*create=*/true);
  if (dest.Contains(kManifestName)) {
    const std::vector<uint8_t> held = dest.OpenForReading(kManifestName).ReadAll();
    if (std::string_view(reinterpret_cast<const char*>(held.data()), held.size()) !=
        manifest_text) {
      Fail("{}: holds a different kit.json than {}: fetch into an empty directory",
           (options.dest / kManifestName).string(), manifest_url);
    }
  } else {
    // A first fetch: DEST holds nothing, so that every file the fetch later checks, resumes or
    // deletes is one a fetch of this kit made.
    if (fs::directory_iterator(options.dest) != fs::directory_iterator()) {
      Fail(
          "{}: not empty, and holds no kit.json of an earlier fetch of this kit: fetch into an "
          "empty or new directory (nothing in it was changed)",
          options.dest.string());
    }
    dest.WriteFileSynced(kManifestName, manifest_text);
  }

  for (const KitFile& file : manifest.files) {
    const fs::path relative(file.path);  // ValidateKitPath: relative, no "..", no empty part
    const Directory dir = dest.Subdirectory(relative.parent_path());
    const std::string name = relative.filename().string(), part = name + ".part";
    const fs::path final_path = options.dest / file.path;
    if (dir.Contains(name)) {
      const std::string mismatch = Mismatch(dir, name, file);
      if (mismatch.empty()) {
        report.present.push_back(file.path);
      } else {
        dir.Remove(name);
        report.failed.push_back(
            fmt::format("{}: already present but {}; deleted", final_path.string(), mismatch));
      }
      continue;
    }
    uint64_t offset = dir.Contains(part) ? dir.OpenForReading(part).Size() : 0;
    if (offset > file.size) {
      std::fprintf(stderr, "%s.part: %llu bytes, more than the %llu kit.json lists: starting over\n",
                   final_path.c_str(), static_cast<unsigned long long>(offset),
                   static_cast<unsigned long long>(file.size));
      dir.Remove(part);
      offset = 0;
    }
    bool complete_source = true;
    if (offset < file.size || !dir.Contains(part)) {
      const std::string url = JoinUrl(options.url, file.path);
      Downloaded got = DownloadPart(url, dir, part, offset, file, options, progress);
      if (got == Downloaded::kNoRanges) {
        std::fprintf(stderr,
                     "%s: the server cannot resume it (no byte ranges, or none that far): "
                     "downloading it whole\n",
                     final_path.c_str());
        dir.Remove(part);
        offset = 0;  // fetched, not resumed
        got = DownloadPart(url, dir, part, offset, file, options, progress);
      }
      complete_source = got == Downloaded::kComplete;
    }
    const std::string mismatch =
        complete_source ? Mismatch(dir, part, file)
                        : fmt::format("the source sent more than the {} bytes kit.json lists",
                                      file.size);
    if (!mismatch.empty()) {
      dir.Remove(part);
      report.failed.push_back(fmt::format("{}: {}; deleted", final_path.string(), mismatch));
      continue;
    }
    dir.Rename(part, name);
    dir.Sync();
    report.fetched.push_back(file.path);
    if (offset > 0) report.resumed.push_back(file.path);
  }
  return report;
}

}  // namespace lockstep::audit
