// `lockstep kit fetch` from a local HTTP server (127.0.0.1, started and stopped by each test) and
// from a file:// URL: a full fetch verifies, a truncated .part resumes with a Range request (or
// starts over from a server without them), a corrupted file is deleted and reported, and each
// transfer error names what the user can change.
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "audit/kit_test_util.h"
#include "common/expect_error.h"
#include "lockstep/kit.h"

namespace lockstep::kit_test {
namespace {

// http.server answers every GET with the whole file; this handler also honours "Range:
// bytes=N-" (206 with Content-Range) unless `ranges` is "0", logs each request's path and Range
// header, and can serve one file with its first byte altered. It listens on 127.0.0.1 only, on a
// port the OS picks, and stops when its stdin closes (the test ends) or after two minutes,
// whichever comes first.
constexpr std::string_view kServer = R"py(
import http.server, os, sys, threading
root, port_file, log_file, corrupt, ranges = sys.argv[1:6]

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        rel = self.path.lstrip('/')
        if rel.startswith('loop/'):  # a redirect to itself, forever
            self.send_response(302)
            self.send_header('Location', self.path)
            self.send_header('Content-Length', '0')
            self.end_headers()
            return
        path = os.path.join(root, rel)
        if '..' in rel.split('/') or not os.path.isfile(path):
            self.send_error(404)
            return
        with open(path, 'rb') as f:
            data = f.read()
        if rel == corrupt:
            data = bytes([data[0] ^ 1]) + data[1:]
        byte_range = self.headers.get('Range')
        with open(log_file, 'a') as log:
            log.write(f'{rel} {byte_range}\n')
        start = 0
        if byte_range and ranges == '1':
            start = int(byte_range.removeprefix('bytes=').split('-')[0])
            self.send_response(206)
            self.send_header('Content-Range', f'bytes {start}-{len(data) - 1}/{len(data)}')
        else:
            self.send_response(200)
        self.send_header('Content-Length', str(len(data) - start))
        self.end_headers()
        try:
            self.wfile.write(data[start:])
        except ConnectionError:
            pass  # the client hung up (lockstep refusing a whole file to a range request)

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
with open(port_file + '.tmp', 'w') as f:
    f.write(str(server.server_address[1]))
os.rename(port_file + '.tmp', port_file)
threading.Thread(target=lambda: (sys.stdin.read(), server.shutdown()), daemon=True).start()
timeout = threading.Timer(120, server.shutdown)
timeout.daemon = True
timeout.start()
server.serve_forever()
)py";

// Serves `root` for the lifetime of the object.
class LocalServer {
 public:
  LocalServer(const fs::path& root, const fs::path& scratch, const std::string& corrupt = "-",
              bool ranges = true)
      : log_(scratch / "requests.log") {
    const fs::path script = scratch / "server.py", port_file = scratch / "port";
    WriteFileSynced(script, kServer);
    const std::string command = "python3 " + script.string() + " " + root.string() + " " +
                                port_file.string() + " " + log_.string() + " " + corrupt +
                                (ranges ? " 1" : " 0");
    stdin_ = ::popen(command.c_str(), "w");  // its stdin: closing it stops the server
    for (int i = 0; i < 500 && !fs::exists(port_file); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (fs::exists(port_file)) url_ = "http://127.0.0.1:" + ReadFileText(port_file);
  }
  ~LocalServer() {
    if (stdin_ != nullptr) ::pclose(stdin_);  // waits for the server to exit
  }
  LocalServer(const LocalServer&) = delete;
  LocalServer& operator=(const LocalServer&) = delete;

  const std::string& url() const { return url_; }  // empty when the server did not start
  std::string requests() const { return fs::exists(log_) ? ReadFileText(log_) : ""; }

 private:
  fs::path log_;
  std::FILE* stdin_ = nullptr;
  std::string url_;
};

constexpr std::string_view kModel = "checkpoints/step_000000010/model.safetensors";

// What an interrupted fetch of the published kit leaves: its kit.json, and the first half of
// the published file as DEST/<path>.part.
void LeaveTruncatedPart(const fs::path& dest, std::string_view path) {
  const std::vector<uint8_t> bytes = ReadFileBytes(PublishedKit::Get().kit / path);
  const fs::path part = dest / (std::string(path) + ".part");
  fs::create_directories(part.parent_path());
  fs::copy_file(PublishedKit::Get().kit / "kit.json", dest / "kit.json");
  WriteFileSynced(part, std::span(bytes).first(bytes.size() / 2));
}

// A first fetch into a directory that holds someone's files (no kit.json of this kit) is
// refused, and nothing in it touched: not the file at a kit path, nor a .part there.
TEST_F(KitTest, AFirstFetchIntoSomeonesDirectoryIsRefused) {
  const fs::path dest = dir_ / "dest";
  fs::create_directories(dest / "checkpoints/step_000000010");
  WriteFileSynced(dest / "config.yaml", std::string_view("my notes\n"));
  WriteFileSynced(dest / (std::string(kModel) + ".part"), std::string_view("precious"));
  const Result r =
      Lockstep("kit fetch file://" + fs::absolute(published().kit).string() + " " + dest.string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("not empty, and holds no kit.json"), std::string::npos) << r.output;
  EXPECT_EQ(ReadFileText(dest / "config.yaml"), "my notes\n");
  EXPECT_EQ(ReadFileText(dest / (std::string(kModel) + ".part")), "precious");
  EXPECT_FALSE(fs::exists(dest / "kit.json"));
}

TEST_F(KitTest, HttpFetchVerifiesEveryFile) {
  LocalServer server(published().kit, dir_);
  ASSERT_FALSE(server.url().empty()) << "the local HTTP server did not start";
  const fs::path dest = dir_ / "dest";
  const Result r = Lockstep("kit fetch " + server.url() + "/ " + dest.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("17 fetched (0 resumed)"), std::string::npos) << r.output;
  EXPECT_EQ(server.requests().find("bytes="), std::string::npos) << server.requests();
  const Result verify = Lockstep("kit verify " + dest.string());
  EXPECT_EQ(verify.exit_code, 0) << verify.output;

  // Fetching again finds every file present and downloads nothing but kit.json.
  const Result again = Lockstep("kit fetch " + server.url() + " " + dest.string());
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("0 fetched (0 resumed), 17 already present"), std::string::npos)
      << again.output;
}

TEST_F(KitTest, ATruncatedDownloadResumesWithARangeRequest) {
  LocalServer server(published().kit, dir_);
  ASSERT_FALSE(server.url().empty()) << "the local HTTP server did not start";
  const fs::path dest = dir_ / "dest";
  LeaveTruncatedPart(dest, kModel);
  const Result r = Lockstep("kit fetch " + server.url() + " " + dest.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("17 fetched (1 resumed)"), std::string::npos) << r.output;
  const uint64_t half = fs::file_size(published().kit / kModel) / 2;
  EXPECT_NE(server.requests().find(fmt::format("{} bytes={}-", kModel, half)), std::string::npos)
      << server.requests();
  EXPECT_FALSE(fs::exists(dest / (std::string(kModel) + ".part")));
  const Result verify = Lockstep("kit verify " + dest.string());
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
}

TEST_F(KitTest, ACorruptedDownloadIsDeletedAndReported) {
  LocalServer server(published().kit, dir_, std::string(kModel));
  ASSERT_FALSE(server.url().empty()) << "the local HTTP server did not start";
  const fs::path dest = dir_ / "dest";
  const Result r = Lockstep("kit fetch " + server.url() + " " + dest.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("16 fetched (0 resumed), 0 already present, 1 failed"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find((dest / kModel).string() + ": sha256"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("deleted"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dest / kModel));
  EXPECT_FALSE(fs::exists(dest / (std::string(kModel) + ".part")));
  // What was fetched verifies; the kit as a whole does not, naming the missing file.
  const Result verify = Lockstep("kit verify " + dest.string());
  EXPECT_EQ(verify.exit_code, 1) << verify.output;
  EXPECT_NE(verify.output.find((dest / kModel).string() + ": missing"), std::string::npos)
      << verify.output;
}

TEST_F(KitTest, FileUrlFetchesAndResumes) {
  const fs::path dest = dir_ / "dest";
  LeaveTruncatedPart(dest, kModel);
  const Result r =
      Lockstep("kit fetch file://" + fs::absolute(published().kit).string() + " " + dest.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("17 fetched (1 resumed)"), std::string::npos) << r.output;
  const Result verify = Lockstep("kit verify " + dest.string());
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
}

TEST_F(KitTest, FetchRefusesAnUnsupportedUrl) {
  const Result r = Lockstep("kit fetch ftp://127.0.0.1/kit " + (dir_ / "dest").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("only file://, http:// and https://"), std::string::npos) << r.output;
}

TEST_F(KitTest, FetchRestartsAPartFromByteZeroWhenTheServerIgnoresRanges) {
  LocalServer server(published().kit, dir_, "-", /*ranges=*/false);
  ASSERT_FALSE(server.url().empty()) << "the local HTTP server did not start";
  const fs::path dest = dir_ / "dest";
  LeaveTruncatedPart(dest, kModel);
  const Result r = Lockstep("kit fetch " + server.url() + " " + dest.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("17 fetched (0 resumed)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no byte ranges"), std::string::npos) << r.output;
  const uint64_t half = fs::file_size(published().kit / kModel) / 2;
  EXPECT_NE(server.requests().find(fmt::format("{} bytes={}-", kModel, half)), std::string::npos)
      << server.requests();
  const Result verify = Lockstep("kit verify " + dest.string());
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
}

// FetchKit's options for `url` into the test's DEST, without progress bars.
audit::KitFetchOptions FetchOptions(const std::string& url, const fs::path& dest) {
  audit::KitFetchOptions options;
  options.url = url;
  options.dest = dest;
  options.progress = false;
  return options;
}

TEST_F(KitTest, FetchNamesAPortWhereNothingAnswers) {
  test::ExpectError([&] { audit::FetchKit(FetchOptions("http://127.0.0.1:9", dir_ / "dest")); },
                    {"http://127.0.0.1:9/kit.json: nothing answers at 127.0.0.1 port 9",
                     "check the URL's host and port", "(libcurl: "});
}

TEST_F(KitTest, FetchRefusesAUrlWithoutAHostOrMalformed) {
  test::ExpectError([&] { audit::FetchKit(FetchOptions("http://", dir_ / "dest")); },
                    {"URL \"http://\": no host"});
  test::ExpectError([&] { audit::FetchKit(FetchOptions("https://:443/kit", dir_ / "dest")); },
                    {"no host"});
  test::ExpectError([&] { audit::FetchKit(FetchOptions("http://a b/kit", dir_ / "dest")); },
                    {"URL \"http://a b/kit\" is malformed", "(libcurl: "});
}

TEST_F(KitTest, ARedirectLoopEndsAfterTenRedirects) {
  LocalServer server(published().kit, dir_);
  ASSERT_FALSE(server.url().empty()) << "the local HTTP server did not start";
  test::ExpectError([&] { audit::FetchKit(FetchOptions(server.url() + "/loop", dir_ / "dest")); },
                    {"/loop/kit.json", "Maximum (10) redirects followed"});
}

TEST_F(KitTest, FetchWithoutKitJsonSaysUrlMustBeTheKitsDirectory) {
  LocalServer server(published().kit, dir_);
  ASSERT_FALSE(server.url().empty()) << "the local HTTP server did not start";
  test::ExpectError(
      [&] { audit::FetchKit(FetchOptions(server.url() + "/checkpoints", dir_ / "dest")); },
      {"no kit.json at " + server.url() + "/checkpoints/kit.json (HTTP 404)",
       "URL must be the kit's directory, the one that holds kit.json", "(libcurl: "});
  EXPECT_FALSE(fs::exists(dir_ / "dest"));
}

TEST_F(KitTest, FetchOfAFileTheServerLacksNamesItAndKeepsNoEmptyPart) {
  const fs::path kit = CopyKit();
  fs::remove(kit / kModel);
  LocalServer server(kit, dir_);
  ASSERT_FALSE(server.url().empty()) << "the local HTTP server did not start";
  const fs::path dest = dir_ / "dest";
  test::ExpectError([&] { audit::FetchKit(FetchOptions(server.url(), dest)); },
                    {server.url() + "/" + std::string(kModel) +
                         ": the server has no such file (HTTP 404), though kit.json lists it",
                     "(libcurl: "});
  EXPECT_FALSE(fs::exists(dest / (std::string(kModel) + ".part")));
}

TEST_F(KitTest, FetchOverTlsFromAPlainHttpServerAsksForHttp) {
  LocalServer server(published().kit, dir_);
  ASSERT_FALSE(server.url().empty()) << "the local HTTP server did not start";
  const std::string port = server.url().substr(server.url().rfind(':') + 1);
  test::ExpectError(
      [&] { audit::FetchKit(FetchOptions("https://127.0.0.1:" + port, dir_ / "dest")); },
      {"127.0.0.1:" + port + " does not speak TLS: is the URL http://?", "(libcurl: "});
}

TEST_F(KitTest, FetchFromAStalledServerNamesTheTimeoutOptions) {
  // A socket that listens but never answers: the connection is made, no byte ever comes.
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), length), 0);
  ASSERT_EQ(::listen(listener, 1), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  audit::KitFetchOptions options =
      FetchOptions(fmt::format("http://127.0.0.1:{}", ntohs(address.sin_port)), dir_ / "dest");
  options.stall_seconds = 1;
  test::ExpectError([&] { audit::FetchKit(options); },
                    {"too slow for --stall-timeout 1 s and --min-rate 1024 bytes/s",
                     "raise --stall-timeout or lower --min-rate", "(libcurl: "});
  ::close(listener);
}

TEST_F(KitTest, FetchOfAKitJsonOverTheCapSaysItIsNoManifest) {
  const fs::path source = dir_ / "source";
  fs::create_directories(source);
  WriteFileSynced(source / "kit.json", std::string_view("{"));
  fs::resize_file(source / "kit.json", (uint64_t{64} << 20) + 1);  // sparse: cheap
  const std::string url = "file://" + fs::absolute(source).string();
  test::ExpectError(
      [&] { audit::FetchKit(FetchOptions(url, dir_ / "dest")); },
      {url + "/kit.json is over 64 MiB: not a kit manifest", "is URL the kit's directory?"});
}

}  // namespace
}  // namespace lockstep::kit_test
