// The Env seam: the POSIX Env on real temporary directories, the in-memory
// Env, and the contract both keep (run against each, see EnvContractTest).
#include "kdm/base/env.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "kdm/base/file_system.h"

namespace kdm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using Kind = DirectoryWatcher::EventKind;

constexpr auto kWaitBound = std::chrono::seconds(5);

// Collects a watcher's events until `want` has been seen for `name`, or the
// bound passes. Returns every event seen.
std::vector<DirectoryWatcher::Event> WaitForEvent(DirectoryWatcher& w, Kind want,
                                                  const std::string& name) {
  std::vector<DirectoryWatcher::Event> seen;
  const auto deadline = std::chrono::steady_clock::now() + kWaitBound;
  while (std::chrono::steady_clock::now() < deadline) {
    for (auto& e : w.Wait(std::chrono::milliseconds(100))) {
      bool match = e.kind == want && e.name == name;
      seen.push_back(std::move(e));
      if (match) return seen;
    }
  }
  ADD_FAILURE() << "no event " << static_cast<int>(want) << " for " << name << " within "
                << kWaitBound.count() << " s";
  return seen;
}

bool Saw(const std::vector<DirectoryWatcher::Event>& events, Kind kind, const std::string& name) {
  return std::any_of(events.begin(), events.end(),
                     [&](const auto& e) { return e.kind == kind && e.name == name; });
}

// One fixture for both Envs: a fresh directory `dir_` in it.
class EnvContractTest : public ::testing::TestWithParam<bool /*memory*/> {
 protected:
  void SetUp() override {
    if (GetParam()) {
      memory_ = NewMemoryEnv();
      env_ = memory_.get();
      dir_ = "/tmp/kdm-env-test";
      ASSERT_TRUE(env_->CreateDirectories(dir_, 0700).ok());
    } else {
      env_ = Env::Default();
      char tmpl[] = "/tmp/kdm-env-XXXXXX";
      ASSERT_NE(::mkdtemp(tmpl), nullptr);
      dir_ = tmpl;
    }
  }
  void TearDown() override {
    if (!GetParam()) std::filesystem::remove_all(dir_);
  }
  std::string P(const std::string& name) const { return JoinPath(dir_, name); }
  std::vector<std::string> List() {
    StatusOr<std::vector<std::string>> names = env_->ListDirectory(dir_);
    EXPECT_TRUE(names.ok()) << names.status();
    return names.ok() ? *names : std::vector<std::string>{};
  }

  std::unique_ptr<MemoryEnv> memory_;
  Env* env_ = nullptr;
  std::string dir_;
};

TEST_P(EnvContractTest, AtomicWriteReplacesAndLeavesOnlyTheFile) {
  ASSERT_TRUE(env_->WriteFileAtomically(P("a.json"), "one").ok());
  ASSERT_TRUE(env_->WriteFileAtomically(P("a.json"), "two", {.mode = 0600}).ok());
  EXPECT_EQ(*env_->ReadFile(P("a.json"), 100), "two");
  EXPECT_EQ(env_->Stat(P("a.json"))->mode, 0600u);
  EXPECT_EQ(env_->Stat(P("a.json"))->type, FileType::kRegular);
  ASSERT_TRUE(env_->WriteFileAtomically(P("c"), "x", {.naming = TempFileNaming::kWriterPid}).ok());
  EXPECT_THAT(List(), ElementsAre("a.json", "c"));
}

TEST_P(EnvContractTest, AtomicWriteFailureLeavesNoTempFileAndNamesThePath) {
  ASSERT_TRUE(env_->CreateDirectories(P("taken/inside"), 0700).ok());
  for (TempFileNaming naming : {TempFileNaming::kHiddenRandom, TempFileNaming::kWriterPid}) {
    Status s = env_->WriteFileAtomically(P("taken"), "x", {.naming = naming});
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), HasSubstr("cannot write " + P("taken")));
    EXPECT_THAT(List(), ElementsAre("taken"));
  }
  Status missing = env_->WriteFileAtomically(P("missing/x.json"), "x");
  EXPECT_EQ(missing.code(), StatusCode::kNotFound) << missing;
  EXPECT_THAT(missing.message(), HasSubstr(P("missing/x.json")));
}

TEST_P(EnvContractTest, ReadFileRefusesATooBigFileNamingPathAndSize) {
  ASSERT_TRUE(env_->WriteFileAtomically(P("big"), std::string(1000, 'x')).ok());
  EXPECT_EQ(env_->ReadFile(P("big"), 1000)->size(), 1000u);
  StatusOr<std::string> r = env_->ReadFile(P("big"), 999);
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_THAT(r.status().message(), HasSubstr(P("big")));
  EXPECT_THAT(r.status().message(), HasSubstr("1000 bytes"));
  EXPECT_THAT(r.status().message(), HasSubstr("999-byte limit"));
  // A huge cap is no problem: nothing is reserved beyond the file's size.
  EXPECT_EQ(env_->ReadFile(P("big"), UINT64_MAX)->size(), 1000u);
  EXPECT_EQ(env_->ReadFile(P("missing"), 10).status().code(), StatusCode::kNotFound);
}

TEST_P(EnvContractTest, BadPathsAreRefusedWithInvalidArgument) {
  const std::string with_nul = P("a") + std::string(1, '\0') + "b";
  EXPECT_EQ(env_->ReadFile("", 10).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(env_->ReadFile(with_nul, 10).status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(env_->ReadFile(with_nul, 10).status().message(), HasSubstr("NUL byte"));
  EXPECT_EQ(env_->WriteFileAtomically("", "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(env_->WriteFileAtomically(with_nul, "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(env_->WriteFileAtomically(dir_ + "/", "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(env_->CreateDirectories("", 0700).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(env_->CreateDirectories(with_nul, 0700).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(env_->Stat("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(env_->ListDirectory(with_nul).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(env_->WatchDirectory("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(env_->RemoveStaleTempFiles("", TempFileNaming::kHiddenRandom).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_THAT(List(), IsEmpty());  // nothing was created by any of them
}

TEST_P(EnvContractTest, DirectoryWhereAFileIsExpected) {
  ASSERT_TRUE(env_->CreateDirectories(P("d"), 0700).ok());
  StatusOr<std::string> r = env_->ReadFile(P("d"), 10);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(),
              HasSubstr(P("d") + " is not a regular file: it is a directory"));
  EXPECT_EQ(env_->RemoveFile(P("d")).code(), StatusCode::kFailedPrecondition);
  // And a file where a directory is expected.
  ASSERT_TRUE(env_->WriteFileAtomically(P("f"), "x").ok());
  Status s = env_->CreateDirectories(P("f"), 0700);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("is not a directory"));
  s = env_->CreateDirectories(P("f/below"), 0700);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("cannot create directory " + P("f/below")));
  EXPECT_EQ(env_->WatchDirectory(P("f")).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(env_->TightenDirectoryMode(P("f"), 0700).status().code(),
            StatusCode::kFailedPrecondition);
}

TEST_P(EnvContractTest, DirectoriesGetTheirModesAndTightenOnlyRemovesBits) {
  ASSERT_TRUE(env_->CreateDirectories(P("a/b/c"), 0750).ok());
  EXPECT_EQ(env_->Stat(P("a"))->mode, 0750u);
  EXPECT_EQ(env_->Stat(P("a/b/c"))->mode, 0750u);
  EXPECT_TRUE(env_->CreateDirectories(P("a/b/c"), 0700).ok());  // existing: kept
  EXPECT_EQ(env_->Stat(P("a/b/c"))->mode, 0750u);
  EXPECT_EQ(*env_->TightenDirectoryMode(P("a/b/c"), 0700), 0750u);
  EXPECT_EQ(env_->Stat(P("a/b/c"))->mode, 0700u);
  EXPECT_EQ(*env_->TightenDirectoryMode(P("a/b/c"), 0750), 0700u);  // stricter: left alone
  EXPECT_EQ(env_->Stat(P("a/b/c"))->mode, 0700u);
  EXPECT_EQ(env_->TightenDirectoryMode(P("none"), 0700).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(ModeText(0750), "0750");
}

TEST_P(EnvContractTest, WatcherSeesCreateRenameDeleteWithABoundedWait) {
  StatusOr<std::unique_ptr<DirectoryWatcher>> w = env_->WatchDirectory(dir_);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_GE((*w)->ReadyFd(), 0);
  EXPECT_THAT((*w)->Wait(std::chrono::milliseconds(1)), IsEmpty());  // bounded: returns

  ASSERT_TRUE(env_->WriteFileAtomically(P("h.json"), "{}").ok());
  auto events = WaitForEvent(**w, Kind::kMovedIn, "h.json");
  // The temporary file came and went under its own name.
  EXPECT_FALSE(Saw(events, Kind::kWritten, "h.json"));

  ASSERT_TRUE(env_->RenameFile(P("h.json"), P("g.json")).ok());
  events = WaitForEvent(**w, Kind::kMovedIn, "g.json");
  EXPECT_TRUE(Saw(events, Kind::kMovedOut, "h.json"));

  ASSERT_TRUE(env_->RemoveFile(P("g.json")).ok());
  WaitForEvent(**w, Kind::kRemoved, "g.json");

  ASSERT_TRUE(env_->CreateDirectories(P("sub"), 0700).ok());
  WaitForEvent(**w, Kind::kCreated, "sub");
}

TEST_P(EnvContractTest, WakeEndsAWaitAtOnce) {
  auto w = env_->WatchDirectory(dir_);
  ASSERT_TRUE(w.ok());
  (*w)->Wake();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT((*w)->Wait(std::chrono::seconds(30)), IsEmpty());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST_P(EnvContractTest, WatchingAMissingDirectoryIsNotFound) {
  EXPECT_EQ(env_->WatchDirectory(P("none")).status().code(), StatusCode::kNotFound);
}

TEST_P(EnvContractTest, HiddenRandomCleanupRemovesOnlyItsOwnPattern) {
  const std::vector<std::string> stale = {".a.json.tmp-Ab12Cd", ".node.json.tmp-zZ09xy"};
  const std::vector<std::string> kept = {
      "a.json",      ".a.json.tmp-short", "a.json.tmp-Ab12Cd", ".a.json.tmp-Ab1-Cd",
      ".tmp-Ab12Cd", "notes.txt",         "x.tmp-12345"};
  for (const auto& f : stale) ASSERT_TRUE(env_->WriteFileAtomically(P(f), "partial").ok());
  for (const auto& f : kept) ASSERT_TRUE(env_->WriteFileAtomically(P(f), "keep").ok());
  ASSERT_TRUE(env_->CreateDirectories(P(".sub.json.tmp-Ab12Cd"), 0700).ok());  // not a file
  auto removed = env_->RemoveStaleTempFiles(dir_, TempFileNaming::kHiddenRandom);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, UnorderedElementsAre(P(stale[0]), P(stale[1])));
  std::vector<std::string> want = kept;
  want.push_back(".sub.json.tmp-Ab12Cd");
  std::sort(want.begin(), want.end());
  EXPECT_EQ(List(), want);
  EXPECT_EQ(env_->RemoveStaleTempFiles(P("missing"), TempFileNaming::kHiddenRandom).status().code(),
            StatusCode::kNotFound);
}

TEST_P(EnvContractTest, WriterPidCleanupRemovesOnlyDeadWritersFiles) {
  // A pid that is surely gone: a child that has exited and been reaped.
  int64_t dead = 0;
  if (memory_) {
    dead = 4242;
  } else {
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) ::_exit(0);
    ASSERT_EQ(::waitpid(child, nullptr, 0), child);
    dead = child;
  }
  const std::string live = std::to_string(::getpid());
  const std::string gone = std::to_string(dead);
  const std::vector<std::string> kept = {
      "state",      "state.tmp-" + live,  "state.tmp-" + gone + "x",
      "state.tmp-", "state.tmp-0" + gone, "other.tmp-" + gone};
  for (const auto& f : kept) ASSERT_TRUE(env_->WriteFileAtomically(P(f), "keep").ok());
  ASSERT_TRUE(env_->WriteFileAtomically(P("state.tmp-" + gone), "partial").ok());
  auto removed = env_->RemoveStaleTempFiles(P("state"), TempFileNaming::kWriterPid);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, ElementsAre(P("state.tmp-" + gone)));
  std::vector<std::string> want = kept;
  std::sort(want.begin(), want.end());
  EXPECT_EQ(List(), want);
}

TEST_P(EnvContractTest, RemoveSocketsExceptKeepsOneSocketAndEveryOtherEntry) {
  ASSERT_TRUE(env_->WriteFileAtomically(P("checkpoint"), "x").ok());
  ASSERT_TRUE(env_->CreateDirectories(P("sub"), 0700).ok());
  for (const char* name : {"kubelet.sock", "a.sock", "b"}) {
    if (memory_) {
      ASSERT_TRUE(memory_->AddSocketForTest(P(name)).ok());
    } else {
      int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::strncpy(addr.sun_path, P(name).c_str(), sizeof(addr.sun_path) - 1);
      ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
      ::close(fd);
    }
  }
  EXPECT_EQ(env_->Stat(P("a.sock"))->type, FileType::kSocket);
  auto removed = RemoveSocketsExcept(*env_, dir_, "kubelet.sock");
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, ElementsAre("a.sock", "b"));
  EXPECT_THAT(List(), ElementsAre("checkpoint", "kubelet.sock", "sub"));
  EXPECT_EQ(RemoveSocketsExcept(*env_, P("missing"), "x").status().code(), StatusCode::kNotFound);
}

TEST_P(EnvContractTest, BootIdIsReadAndTrimmed) {
  StatusOr<std::string> id = env_->ReadBootId();
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->size(), 36u) << *id;
  ASSERT_TRUE(
      env_->WriteFileAtomically(P("boot_id"), "1f2e3d4c-0000-4000-8000-000000000001\n").ok());
  EXPECT_EQ(*ReadBootIdFile(*env_, P("boot_id")), "1f2e3d4c-0000-4000-8000-000000000001");
  ASSERT_TRUE(env_->WriteFileAtomically(P("empty"), "\n").ok());
  EXPECT_THAT(ReadBootIdFile(*env_, P("empty")).status().message(), HasSubstr("is empty"));
  StatusOr<std::string> missing = ReadBootIdFile(*env_, P("missing"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("cannot read boot id from " + P("missing")));
}

INSTANTIATE_TEST_SUITE_P(Envs, EnvContractTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Memory" : "Posix"; });

TEST(ErrnoPolicyTest, OneCodePerErrno) {
  EXPECT_EQ(ErrnoToStatus(ENOENT, "x").code(), StatusCode::kNotFound);
  for (int err : {EACCES, EPERM, EROFS}) {
    EXPECT_EQ(ErrnoToStatus(err, "x").code(), StatusCode::kPermissionDenied) << err;
  }
  for (int err : {ENOSPC, EDQUOT, EMFILE, ENFILE}) {
    EXPECT_EQ(ErrnoToStatus(err, "x").code(), StatusCode::kResourceExhausted) << err;
  }
  EXPECT_EQ(ErrnoToStatus(EEXIST, "x").code(), StatusCode::kAlreadyExists);
  for (int err : {ENOTDIR, EISDIR, ENOTEMPTY}) {
    EXPECT_EQ(ErrnoToStatus(err, "x").code(), StatusCode::kFailedPrecondition) << err;
  }
  for (int err : {ENAMETOOLONG, EINVAL, ELOOP}) {
    EXPECT_EQ(ErrnoToStatus(err, "x").code(), StatusCode::kInvalidArgument) << err;
  }
  for (int err : {EIO, EINTR, EAGAIN, EBUSY}) {
    EXPECT_EQ(ErrnoToStatus(err, "x").code(), StatusCode::kUnavailable) << err;
  }
  EXPECT_EQ(ErrnoToStatus(ENOENT, "cannot open /a").message(),
            "cannot open /a: " + std::string(std::strerror(ENOENT)));
}

// POSIX only: what a real file system adds.
class PosixEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-env-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    ::chmod(dir_.c_str(), 0700);
    std::filesystem::remove_all(dir_);
  }
  std::string dir_;
  Env* env_ = Env::Default();
};

TEST_F(PosixEnvTest, ModeIsHonouredWhateverTheUmask) {
  mode_t old = ::umask(0077);
  ASSERT_TRUE(env_->WriteFileAtomically(dir_ + "/r", "x", {.mode = 0644}).ok());
  ASSERT_TRUE(env_->CreateDirectories(dir_ + "/d", 0755).ok());
  ::umask(old);
  struct stat st {};
  ASSERT_EQ(::stat((dir_ + "/r").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  ASSERT_EQ(::stat((dir_ + "/d").c_str(), &st), 0);
  // mkdir is subject to the umask, as for every program; kdm tightens
  // directories it owns with TightenDirectoryMode.
  EXPECT_EQ(st.st_mode & 07777, 0700u);
}

TEST_F(PosixEnvTest, AFifoIsRefusedWithoutBlocking) {
  ASSERT_EQ(::mkfifo((dir_ + "/fifo").c_str(), 0600), 0);
  StatusOr<std::string> r = env_->ReadFile(dir_ + "/fifo", 10);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("not a regular file"));
}

TEST_F(PosixEnvTest, UnwritableDirectoryIsPermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory modes";
  ASSERT_EQ(::chmod(dir_.c_str(), 0500), 0);
  Status s = env_->WriteFileAtomically(dir_ + "/x", "x");
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(s.message(), HasSubstr("cannot write " + dir_ + "/x"));
}

TEST_F(PosixEnvTest, WatcherSeesAPlainWriteAsWritten) {
  auto w = env_->WatchDirectory(dir_);
  ASSERT_TRUE(w.ok());
  std::ofstream(dir_ + "/plain") << "x";
  auto events = WaitForEvent(**w, Kind::kWritten, "plain");
  EXPECT_TRUE(Saw(events, Kind::kCreated, "plain"));
}

// Memory only: the hooks tests use to script the disk.
TEST(MemoryEnvTest, InjectedWriteFailureLeavesTheOldContent) {
  std::unique_ptr<MemoryEnv> env = NewMemoryEnv();
  ASSERT_TRUE(env->WriteFileAtomically("/tmp/f", "old").ok());
  env->FailWritesForTest(1, ResourceExhaustedError("disk full"));
  Status s = env->WriteFileAtomically("/tmp/f", "new");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("cannot write /tmp/f"));
  EXPECT_EQ(*env->ReadFile("/tmp/f", 10), "old");
  EXPECT_THAT(*env->ListDirectory("/tmp"), ElementsAre("f"));
  EXPECT_TRUE(env->WriteFileAtomically("/tmp/f", "new").ok());  // only one failure
}

TEST(MemoryEnvTest, BootIdAndPidsAreScripted) {
  std::unique_ptr<MemoryEnv> env = NewMemoryEnv();
  env->SetBootIdForTest("b2");
  EXPECT_EQ(*env->ReadBootId(), "b2");
  EXPECT_TRUE(env->ProcessExists(::getpid()));
  env->SetLivePidsForTest({7});
  EXPECT_TRUE(env->ProcessExists(7));
  EXPECT_FALSE(env->ProcessExists(::getpid()));
}

TEST(MemoryEnvTest, InPlaceWriteIsSeenAsCreatedThenWritten) {
  std::unique_ptr<MemoryEnv> env = NewMemoryEnv();
  auto w = env->WatchDirectory("/tmp");
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(env->WriteFileInPlaceForTest("/tmp/h", "{}").ok());
  auto events = (*w)->ReadEvents();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].kind, Kind::kCreated);
  EXPECT_EQ(events[2].kind, Kind::kWritten);
  EXPECT_EQ(events[2].name, "h");
  EXPECT_THAT((*w)->ReadEvents(), IsEmpty());
}

}  // namespace
}  // namespace kdm
