// kdm::FileLock (base/file_lock.h): one owner per lock file, the holder's
// pid in the file, the lock gone the moment its process dies, bad paths
// refused by name, and the stale-socket sweep that spares held sockets.
#include "kdm/base/file_lock.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace kdm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

class FileLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-lock-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string P(const std::string& name) const { return dir_ + "/" + name; }
  static std::string Slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  void BindLockTestSocket(const std::string& path) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ::close(fd);
  }

  std::string dir_;
};

TEST_F(FileLockTest, AcquireWritesThePidAndExcludesASecondOwner) {
  StatusOr<FileLock> first = FileLock::Acquire(P("a.lock"));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->path(), P("a.lock"));
  EXPECT_EQ(Slurp(P("a.lock")), std::to_string(::getpid()) + "\n");
  EXPECT_EQ(IsFileLockHeld(P("a.lock")).value(), true);
  EXPECT_EQ(LockHolderPid(P("a.lock")), ::getpid());

  // A second Acquire opens its own file description: refused, even in-process.
  StatusOr<FileLock> second = FileLock::Acquire(P("a.lock"));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(second.status().message(),
            P("a.lock") + " is held by pid " + std::to_string(::getpid()));
  EXPECT_TRUE(IsLockHeldError(second.status()));
}

TEST_F(FileLockTest, ReleaseAndMoveHandTheLockOnOnce) {
  StatusOr<FileLock> lock = FileLock::Acquire(P("a.lock"));
  ASSERT_TRUE(lock.ok()) << lock.status();
  FileLock moved = std::move(*lock);
  EXPECT_EQ(IsFileLockHeld(P("a.lock")).value(), true);
  lock->Release();  // the moved-from object holds nothing
  EXPECT_EQ(IsFileLockHeld(P("a.lock")).value(), true);
  moved.Release();
  moved.Release();  // idempotent
  EXPECT_EQ(IsFileLockHeld(P("a.lock")).value(), false);
  // The file stays; the next owner overwrites the pid.
  EXPECT_TRUE(std::filesystem::exists(P("a.lock")));
  EXPECT_TRUE(FileLock::Acquire(P("a.lock")).ok());
}

TEST_F(FileLockTest, NoFileIsNotHeldAndIsNotCreatedByTheCheck) {
  EXPECT_EQ(IsFileLockHeld(P("none.lock")).value(), false);
  EXPECT_FALSE(std::filesystem::exists(P("none.lock")));
  EXPECT_FALSE(LockHolderPid(P("none.lock")).has_value());
}

// The kernel drops a SIGKILLed holder's lock: the next Acquire succeeds at
// once, with no wait and no cleanup, and overwrites the dead pid.
TEST_F(FileLockTest, SigkilledHolderFreesTheLockAtOnce) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    StatusOr<FileLock> held = FileLock::Acquire(P("a.lock"));
    const char byte = held.ok() ? '1' : '0';
    (void)!::write(ready[1], &byte, 1);
    while (true) ::pause();
  }
  ::close(ready[1]);
  // The child never outlives the test, whatever fails below.
  struct Reaper {
    pid_t pid;
    bool reaped = false;
    void Kill() {
      if (reaped) return;
      ::kill(pid, SIGKILL);
      int status = 0;
      ::waitpid(pid, &status, 0);
      reaped = true;
    }
    ~Reaper() { Kill(); }
  } reaper{child};
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::close(ready[0]);
  ASSERT_EQ(byte, '1');

  StatusOr<FileLock> refused = FileLock::Acquire(P("a.lock"));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(), P("a.lock") + " is held by pid " + std::to_string(child));
  EXPECT_EQ(IsFileLockHeld(P("a.lock")).value(), true);

  reaper.Kill();
  EXPECT_EQ(IsFileLockHeld(P("a.lock")).value(), false);
  StatusOr<FileLock> taken = FileLock::Acquire(P("a.lock"));
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(Slurp(P("a.lock")), std::to_string(::getpid()) + "\n");
}

TEST_F(FileLockTest, GarbageOrHugeContentIsNoPid) {
  // A free file full of garbage is taken and rewritten.
  std::ofstream(P("g.lock")) << "not a pid\n";
  {
    StatusOr<FileLock> lock = FileLock::Acquire(P("g.lock"));
    ASSERT_TRUE(lock.ok()) << lock.status();
    EXPECT_EQ(Slurp(P("g.lock")), std::to_string(::getpid()) + "\n");
  }
  // A held file whose content names no pid: refused without a pid, and a
  // huge file is never read whole.
  for (const std::string& content :
       {std::string("garbage"), std::string(""), std::string("0042\n"), std::string("-1\n"),
        std::string("99999999999\n"), std::string(4 << 20, '7')}) {
    StatusOr<FileLock> lock = FileLock::Acquire(P("h.lock"));
    ASSERT_TRUE(lock.ok()) << lock.status();
    std::ofstream(P("h.lock"), std::ios::trunc) << content;
    EXPECT_FALSE(LockHolderPid(P("h.lock")).has_value()) << content.substr(0, 20);
    StatusOr<FileLock> refused = FileLock::Acquire(P("h.lock"));
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().message(),
              P("h.lock") + " is held by another process (it names no pid)");
  }
}

TEST_F(FileLockTest, BadPathsAreRefusedByName) {
  // Empty and NUL.
  EXPECT_EQ(FileLock::Acquire("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(FileLock::Acquire(std::string("/tmp/a\0b", 8)).status().message(),
              HasSubstr("holds a NUL byte"));
  // A symlink is never followed, not even to a free lock file.
  std::ofstream(P("target.lock")) << "";
  std::filesystem::create_symlink(P("target.lock"), P("link.lock"));
  StatusOr<FileLock> link = FileLock::Acquire(P("link.lock"));
  EXPECT_EQ(link.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(link.status().message(), HasSubstr(P("link.lock") + " is a symlink"));
  EXPECT_EQ(IsFileLockHeld(P("link.lock")).status().code(), StatusCode::kInvalidArgument);
  // A directory, a FIFO (never blocks), a missing directory.
  std::filesystem::create_directory(P("d.lock"));
  StatusOr<FileLock> dir = FileLock::Acquire(P("d.lock"));
  EXPECT_EQ(dir.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(dir.status().message(), HasSubstr(P("d.lock")));
  ASSERT_EQ(::mkfifo(P("f.lock").c_str(), 0600), 0);
  StatusOr<FileLock> fifo = FileLock::Acquire(P("f.lock"));
  EXPECT_EQ(fifo.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(fifo.status().message(), "lock file " + P("f.lock") + " is not a regular file");
  EXPECT_FALSE(IsLockHeldError(fifo.status()));
  EXPECT_FALSE(IsLockHeldError(dir.status()));
  EXPECT_EQ(IsFileLockHeld(P("f.lock")).status().code(), StatusCode::kFailedPrecondition);
  StatusOr<FileLock> missing = FileLock::Acquire(P("no/such/dir/a.lock"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("cannot open lock file " + P("no/such/dir/a.lock")));
  // Path tricks: ".." resolves as the kernel resolves it; still one lock.
  std::filesystem::create_directory(P("sub"));
  StatusOr<FileLock> plain = FileLock::Acquire(P("x.lock"));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(FileLock::Acquire(P("sub/../x.lock")).status().code(), StatusCode::kFailedPrecondition);
  // A path longer than PATH_MAX.
  EXPECT_EQ(FileLock::Acquire(P(std::string(5000, 'a'))).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(FileLockTest, SocketLockPathIsBesideTheSocket) {
  EXPECT_EQ(SocketLockPath("/r/device-plugins/gpu.sock"), "/r/device-plugins/gpu.sock.lock");
}

// The Manager's sweep: a socket whose lock is held is kept (with the
// holder's pid); one whose lock file is free, or that has none (another
// vendor's plugin), is removed; kubelet.sock and every other entry stay.
TEST_F(FileLockTest, RemoveUnlockedSocketsKeepsHeldSockets) {
  for (const char* name : {"kubelet.sock", "held.sock", "free.sock", "foreign.sock"}) {
    BindLockTestSocket(P(name));
  }
  std::ofstream(P("notes.txt")) << "x";
  StatusOr<FileLock> held = FileLock::Acquire(SocketLockPath(P("held.sock")));
  ASSERT_TRUE(held.ok()) << held.status();
  { ASSERT_TRUE(FileLock::Acquire(SocketLockPath(P("free.sock"))).ok()); }

  StatusOr<SocketSweep> sweep = RemoveUnlockedSockets(*Env::Default(), dir_, "kubelet.sock");
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  EXPECT_THAT(sweep->removed, ElementsAre("foreign.sock", "free.sock"));
  EXPECT_THAT(sweep->kept, ElementsAre(Pair("held.sock", ::getpid())));
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    left.push_back(e.path().filename());
  }
  std::sort(left.begin(), left.end());
  EXPECT_THAT(left, ElementsAre("free.sock.lock", "held.sock", "held.sock.lock", "kubelet.sock",
                                "notes.txt"));
  // The sweep let go of the free lock it held while removing.
  EXPECT_EQ(IsFileLockHeld(SocketLockPath(P("free.sock"))).value(), false);
  EXPECT_EQ(RemoveUnlockedSockets(*Env::Default(), P("missing"), "x").status().code(),
            StatusCode::kNotFound);
}

// With the in-memory Env no lock file exists on disk: every socket is
// unowned, as before locks.
TEST_F(FileLockTest, RemoveUnlockedSocketsOnAMemoryEnvRemovesEverySocket) {
  std::unique_ptr<MemoryEnv> env = NewMemoryEnv();
  ASSERT_TRUE(env->CreateDirectories("/tmp/kdm-lock-mem", 0750).ok());
  ASSERT_TRUE(env->AddSocketForTest("/tmp/kdm-lock-mem/kubelet.sock").ok());
  ASSERT_TRUE(env->AddSocketForTest("/tmp/kdm-lock-mem/a.sock").ok());
  StatusOr<SocketSweep> sweep = RemoveUnlockedSockets(*env, "/tmp/kdm-lock-mem", "kubelet.sock");
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  EXPECT_THAT(sweep->removed, ElementsAre("a.sock"));
  EXPECT_TRUE(sweep->kept.empty());
}

}  // namespace
}  // namespace kdm
