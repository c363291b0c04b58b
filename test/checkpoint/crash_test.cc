// Crash safety of the SQLite store: a child process applies changes in a
// loop and reports "begin k" before and "acked k" after each Apply(); the
// parent kills it with SIGKILL at a random moment, 200 times, reopening the
// store and continuing from the recovered state each time. After every kill
// the store must pass `PRAGMA integrity_check` and hold exactly the state
// after the last acknowledged change, or after the one change in flight.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <random>
#include <sstream>

#include "kdm/checkpoint/sqlite_store.h"
#include "test_util.h"

namespace kdm::checkpoint {
namespace {

using testing::Entry;
using testing::TempDir;

constexpr int kKills = 200;

// Change number k, a function of k only: several operations over a small set
// of pods, so one change touches several rows (and tables) at once.
Change ChangeNumber(int64_t k) {
  std::mt19937 rng(static_cast<uint32_t>(k * 7919 + 1));
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  Change c;
  int ops = 1 + pick(4);
  for (int i = 0; i < ops; ++i) {
    std::string pod = "pod-" + std::to_string(pick(12));
    switch (pick(6)) {
      case 0:
        c.removed_pods.push_back(pod);
        break;
      case 1:
        c.removals.push_back({pod, "main", "vendor.com/gpu"});
        break;
      case 2:
        c.registered_devices["vendor.com/r" + std::to_string(pick(3))] = {
            "d" + std::to_string(k), "d" + std::to_string(pick(50))};
        break;
      case 3:
        c.removed_resources.push_back("vendor.com/r" + std::to_string(pick(3)));
        break;
      default: {
        // Large enough responses that a change spans several pages.
        std::string resp(static_cast<size_t>(500 + pick(3000)), static_cast<char>('a' + pick(26)));
        c.upserts.push_back(Entry(pod, pick(2) == 0 ? "main" : "side", "vendor.com/gpu",
                                  {{pick(2), {"gpu-" + std::to_string(k)}}}, resp));
      }
    }
  }
  return c;
}

// The child: applies changes start, start+1, ... forever, reporting on `fd`.
[[noreturn]] void RunChild(const std::string& path, int64_t start, int fd) {
  auto say = [fd](const std::string& line) {
    std::string l = line + "\n";
    if (::write(fd, l.data(), l.size()) != static_cast<ssize_t>(l.size())) ::_exit(3);
  };
  StatusOr<OpenResult> r = OpenSqliteStore({.path = path, .quarantine_corrupt = false});
  if (!r.ok() || !r->recovered.ok()) {
    say("error " + (r.ok() ? r->recovered.ToString() : r.status().ToString()));
    ::_exit(2);
  }
  say("ready");
  for (int64_t k = start;; ++k) {
    say("begin " + std::to_string(k));
    Status s = r->store->Apply(ChangeNumber(k));
    if (!s.ok()) {
      say("error " + s.ToString());
      ::_exit(2);
    }
    say("acked " + std::to_string(k));
  }
}

// Reads lines from the pipe until `stop(line)` says so or the pipe ends.
class LineReader {
 public:
  explicit LineReader(int fd) : fd_(fd) {}
  // Returns false at end of stream.
  bool Next(std::string& line) {
    while (true) {
      size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return true;
      }
      char chunk[4096];
      ssize_t n = ::read(fd_, chunk, sizeof(chunk));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      buf_.append(chunk, static_cast<size_t>(n));
    }
  }

 private:
  int fd_;
  std::string buf_;
};

std::string IntegrityCheck(const std::string& path) {
  sqlite3* db = nullptr;
  std::string out;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) == SQLITE_OK) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, nullptr) == SQLITE_OK) {
      while (sqlite3_step(st) == SQLITE_ROW) {
        out += reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
      }
    }
    sqlite3_finalize(st);
  } else {
    out = sqlite3_errmsg(db);
  }
  sqlite3_close(db);
  return out;
}

TEST(SqliteCrash, KilledAtRandomMomentsLosesNothingAckedAndKeepsNothingHalfDone) {
  TempDir dir;
  const std::string path = dir.File("checkpoint.db");
  std::mt19937 rng(20261122);
  // model[k] = the state after changes 0..k-1.
  std::vector<CheckpointData> model(1);
  auto model_at = [&](int64_t k) -> const CheckpointData& {
    while (static_cast<int64_t>(model.size()) <= k) {
      std::unique_ptr<Store> m = NewMemoryStore();
      EXPECT_TRUE(m->Replace(model.back()).ok());
      EXPECT_TRUE(m->Apply(ChangeNumber(static_cast<int64_t>(model.size()) - 1)).ok());
      model.push_back(*m->Load());
    }
    return model[static_cast<size_t>(k)];
  };

  int64_t applied = 0;  // changes 0..applied-1 are in the store
  int in_flight_kills = 0, acked_kills = 0;
  for (int round = 0; round < kKills; ++round) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      RunChild(path, applied, fds[1]);
    }
    ::close(fds[1]);
    LineReader reader(fds[0]);

    // Kill after a random number of begun changes (0: right after opening)
    // plus a random delay of up to 3 ms, so the kill lands anywhere in an
    // Apply (or in the open itself).
    // One round in ten does not even wait for the child to open the store.
    bool wait = rng() % 10 != 0;
    int target_begins = static_cast<int>(rng() % 6);
    int64_t last_begin = -1, last_acked = -1;
    int begins = 0;
    std::string line;
    bool ready = false;
    while (wait && (!ready || begins < target_begins) && reader.Next(line)) {
      ASSERT_NE(line.rfind("error", 0), 0u) << line;
      if (line == "ready") ready = true;
      if (line.rfind("begin ", 0) == 0) {
        ++begins;
        last_begin = std::stoll(line.substr(6));
      }
      if (line.rfind("acked ", 0) == 0) last_acked = std::stoll(line.substr(6));
    }
    ASSERT_TRUE(ready || !wait) << "child exited before opening the store";
    ::usleep(static_cast<useconds_t>(rng() % 3000));
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child ended on its own, status " << status;

    // Everything the child said before it died is in the pipe.
    while (reader.Next(line)) {
      ASSERT_NE(line.rfind("error", 0), 0u) << line;
      if (line.rfind("begin ", 0) == 0) last_begin = std::stoll(line.substr(6));
      if (line.rfind("acked ", 0) == 0) last_acked = std::stoll(line.substr(6));
    }
    ::close(fds[0]);
    // The changes acknowledged so far: 0..last_acked; in flight: last_begin
    // when it was not acknowledged.
    int64_t acked_count = last_acked >= 0 ? last_acked + 1 : applied;
    bool in_flight = last_begin > last_acked;

    ASSERT_EQ(IntegrityCheck(path), "ok") << "round " << round;
    StatusOr<OpenResult> r = OpenSqliteStore({.path = path, .quarantine_corrupt = false});
    ASSERT_TRUE(r.ok()) << "round " << round << ": " << r.status();
    StatusOr<CheckpointData> got = r->store->Load();
    ASSERT_TRUE(got.ok()) << got.status();
    r->store.reset();  // no connection is held across fork()

    if (*got == model_at(acked_count)) {
      applied = acked_count;
      ++acked_kills;
    } else {
      ASSERT_TRUE(in_flight) << "round " << round << ": state is not the one after the last "
                             << "acknowledged change " << last_acked
                             << " and nothing was in flight";
      ASSERT_EQ(*got, model_at(acked_count + 1))
          << "round " << round << ": state is neither after acked change " << last_acked
          << " nor after in-flight change " << last_begin;
      applied = acked_count + 1;
      ++in_flight_kills;
    }
  }
  // The run must have exercised real traffic, not only kills at open.
  EXPECT_GT(applied, kKills);
  RecordProperty("changes_applied", static_cast<int>(applied));
  RecordProperty("kills_with_change_committed_but_unacked", in_flight_kills);
  RecordProperty("kills_matching_last_ack", acked_kills);
}

}  // namespace
}  // namespace kdm::checkpoint
