// lockstep::File, the one way lockstep holds a file open: what each way of opening allows and
// refuses, reads and writes at offsets, and the whole-file helpers made of it.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <string>

#include "common/expect_error.h"
#include "common/scratch_dir.h"
#include "lockstep/core.h"

namespace lockstep {
namespace {
namespace fs = std::filesystem;

class FileTest : public test::ScratchDirTest {};

TEST_F(FileTest, EachWayOfOpeningDoesWhatItSays) {
  const fs::path path = dir_ / "a";
  File created = File::Create(path);
  created.Write("hello world");
  created.Sync();
  created.Close();
  EXPECT_EQ(ReadFileText(path), "hello world");

  // Exclusive creation refuses an existing file and leaves it alone; permissions as asked.
  test::ExpectError([&] { File::CreateExclusive(path, 0600); }, {path.string(), "File exists"});
  EXPECT_EQ(ReadFileText(path), "hello world");
  const fs::path secret = dir_ / "secret";
  File::CreateExclusive(secret, 0600).Close();
  struct stat st {};
  ASSERT_EQ(::stat(secret.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  // Append adds at the end; Create truncates.
  File log = File::OpenForAppend(path);
  log.Write("!");
  log.Close();
  EXPECT_EQ(ReadFileText(path), "hello world!");
  File::Create(path).Close();
  EXPECT_EQ(ReadFileText(path), "");

  // Reads and writes at offsets; a read past the end is refused naming the bytes.
  File rw = File::CreateExclusive(dir_ / "rw");
  const std::string text = "0123456789";
  rw.WriteAt(4, {reinterpret_cast<const uint8_t*>(text.data()), text.size()});
  EXPECT_EQ(rw.Size(), 14u);
  uint8_t got[3];
  rw.ReadAt(6, got);
  EXPECT_EQ(std::string(got, got + 3), "234");
  test::ExpectError([&] { rw.ReadAt(12, got); }, {"rw", "ends at byte 14"});

  // Moved-from files are closed once; the directory can be synced.
  File moved = std::move(rw);
  EXPECT_EQ(moved.path(), dir_ / "rw");
  EXPECT_NO_THROW(SyncDirectory(dir_));
}

TEST_F(FileTest, ReadingRefusesWhatIsNotARegularFileWithoutWaiting) {
  test::ExpectError([&] { File::OpenForReading(dir_ / "missing"); },
                    {"missing", "cannot open for reading", "No such file"});
  test::ExpectError([&] { File::OpenForReading(dir_); }, {dir_.string(), "not a regular file"});
  const fs::path fifo = dir_ / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  test::ExpectError([&] { ReadFileBytes(fifo); }, {"fifo", "not a regular file"});
  test::ExpectError([&] { File::OpenForAppend(dir_ / "no" / "such" / "dir"); }, {"cannot open"});
}

// A user's file is sized before it is read: a sparse 1 TiB file is refused at once, naming the
// file, its size and what it was taken for, without its bytes read or allocated.
TEST_F(FileTest, ACappedReadSizesTheFileFirst) {
  const fs::path huge = dir_ / "huge";
  File::Create(huge);
  fs::resize_file(huge, uint64_t{1} << 40);
  try {
    ReadFileBytes(huge, 1 << 20, "a receipt");
    ADD_FAILURE() << "a 1 TiB file was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("huge: 1099511627776 bytes, more than a receipt may hold "
                                         "(1048576 bytes)"),
              std::string::npos)
        << e.what();
  }
  WriteFileSynced(dir_ / "small", "abc");
  EXPECT_EQ(ReadFileText(dir_ / "small", 3, "a key"), "abc");
  EXPECT_THROW(ReadFileText(dir_ / "small", 2, "a key"), Error);
}

TEST_F(FileTest, LogLinesRefuseOrDropATornLastLine) {
  const fs::path log = dir_ / "log.jsonl";
  WriteFileSynced(log, "{\"a\": 1}\n{\"a\": 2}\n");
  EXPECT_EQ(LogLines(log, false), (std::vector<std::string>{"{\"a\": 1}", "{\"a\": 2}"}));
  WriteFileSynced(log, "{\"a\": 1}\n{\"a\"");
  test::ExpectError([&] { LogLines(log, false); }, {log.string(), "line 2", "no final newline"});
  EXPECT_EQ(LogLines(log, true), std::vector<std::string>{"{\"a\": 1}"});
  WriteFileSynced(log, "");
  EXPECT_TRUE(LogLines(log, false).empty());
}

// A Directory never reaches outside itself: a symbolic link on the way or at the name, and a
// file with a second hard link, are refused by name (WriteFileSynced neither writes through a
// link at its name nor replaces it); Subdirectory makes what is missing.
TEST_F(FileTest, ADirectoryNeverReachesOutsideItself) {
  const fs::path outside = dir_ / "outside.txt";
  WriteFileSynced(outside, "theirs");
  const Directory dest = Directory::Open(dir_ / "dest", /*create=*/true);
  const Directory sub = dest.Subdirectory("a/b");
  EXPECT_TRUE(fs::is_directory(dir_ / "dest/a/b"));
  sub.OpenForAppend("new").Write(std::string_view("x"));
  EXPECT_EQ(ReadFileText(dir_ / "dest/a/b/new"), "x");

  fs::create_hard_link(outside, dir_ / "dest/a/b/linked");
  EXPECT_THROW(sub.OpenForAppend("linked"), Error);
  EXPECT_THROW(sub.OpenForReading("linked"), Error);
  fs::create_symlink(outside, dir_ / "dest/a/b/symlinked");
  EXPECT_TRUE(sub.Contains("symlinked"));
  EXPECT_THROW(sub.OpenForAppend("symlinked"), Error);
  fs::create_directory_symlink(dir_, dir_ / "dest/up");
  EXPECT_THROW(dest.Subdirectory("up/x"), Error);
  EXPECT_FALSE(fs::exists(dir_ / "x"));
  EXPECT_THROW(Directory::Open(dir_ / "dest/up", false), Error);

  // A link is neither written through nor replaced (the output rule), and no staging is left.
  EXPECT_THROW(sub.WriteFileSynced("symlinked", "mine"), Error);
  EXPECT_TRUE(fs::is_symlink(dir_ / "dest/a/b/symlinked"));
  EXPECT_EQ(ReadFileText(outside), "theirs");
  sub.WriteFileSynced("plain", "mine");
  sub.WriteFileSynced("plain", "mine again");
  EXPECT_EQ(ReadFileText(dir_ / "dest/a/b/plain"), "mine again");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_ / "dest/a/b"), fs::directory_iterator()), 4);
  sub.Rename("new", "renamed");
  sub.Remove("renamed");
  sub.Remove("renamed");  // absent: nothing
  EXPECT_FALSE(sub.Contains("renamed"));
}

// What is put at a file output's path while it is written (after the staging file is made, the
// moment its first check passed) is never replaced unseen: a symbolic link, a FIFO or a directory
// there at the commit is refused and left as it was, with the output's own staging removed; a
// regular file there is replaced; a file at a new file's path is not.
TEST_F(FileTest, WhatAppearsAtAnOutputWhileItIsWrittenIsNeverReplacedUnseen) {
  const fs::path out = dir_ / "out.txt", theirs = dir_ / "theirs.txt";
  WriteFileSynced(theirs, "theirs");
  const auto staged_then = [&](OutputKind kind, const std::function<void()>& meanwhile) {
    StagedFile staged(out, kind);
    staged.file().Write(std::string_view("mine"));
    meanwhile();
    staged.Commit();
  };
  const auto only = [&](std::vector<std::string> names) {
    std::vector<std::string> there;
    for (const auto& e : fs::directory_iterator(dir_)) there.push_back(e.path().filename());
    std::ranges::sort(there);
    std::ranges::sort(names);
    EXPECT_EQ(there, names);
  };
  EXPECT_THROW(staged_then(OutputKind::kFile, [&] { fs::create_symlink(theirs, out); }), Error);
  EXPECT_TRUE(fs::is_symlink(out));
  EXPECT_EQ(ReadFileText(theirs), "theirs");
  only({"out.txt", "theirs.txt"});
  fs::remove(out);
  EXPECT_THROW(staged_then(OutputKind::kFile, [&] { ASSERT_EQ(::mkfifo(out.c_str(), 0600), 0); }),
               Error);
  EXPECT_TRUE(fs::is_fifo(fs::symlink_status(out)));
  only({"out.txt", "theirs.txt"});
  fs::remove(out);
  EXPECT_THROW(staged_then(OutputKind::kFile, [&] { fs::create_directory(out); }), Error);
  EXPECT_TRUE(fs::is_directory(out));
  only({"out.txt", "theirs.txt"});
  fs::remove(out);
  staged_then(OutputKind::kFile, [&] { WriteFileSynced(out, "a file meanwhile"); });
  EXPECT_EQ(ReadFileText(out), "mine");
  only({"out.txt", "theirs.txt"});
  fs::remove(out);
  EXPECT_THROW(staged_then(OutputKind::kNewFile, [&] { WriteFileSynced(out, "theirs too"); }),
               Error);
  EXPECT_EQ(ReadFileText(out), "theirs too");
  only({"out.txt", "theirs.txt"});
}

TEST(Lines, SplitsAsGetlineDoes) {
  EXPECT_EQ(Lines(""), std::vector<std::string>{});
  EXPECT_EQ(Lines("a"), std::vector<std::string>{"a"});
  EXPECT_EQ(Lines("a\n"), std::vector<std::string>{"a"});
  EXPECT_EQ(Lines("a\n\nb"), (std::vector<std::string>{"a", "", "b"}));
  EXPECT_EQ(Lines("\n"), std::vector<std::string>{""});
}

}  // namespace
}  // namespace lockstep
