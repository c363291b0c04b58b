// ManifestWatcher over a real directory and inotify: initial scan, create,
// modify, delete, rename, editors' temporary files ignored. Waits are
// bounded polls on the reported events, never sleeps that order events.
#include "kdm/fakes/manifest_watcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace kdm::fakes {
namespace {

using namespace std::chrono_literals;
using Kind = ManifestWatcher::EventKind;

std::string Show(const ManifestWatcher::Event& e) {
  return std::string(e.kind == Kind::kPresent ? "+" : "-") + e.file_name;
}

class ManifestWatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-watch-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    StopWatcher();
    std::filesystem::remove_all(dir_);
  }

  void StartWatcher() {
    ManifestWatcher::Options o;
    o.dir = dir_;
    o.debounce = 20ms;
    o.on_event = [this](const ManifestWatcher::Event& e) {
      std::lock_guard<std::mutex> lock(mu_);
      EXPECT_EQ(e.path, dir_ + "/" + e.file_name);
      events_.push_back(Show(e));
      cv_.notify_all();
    };
    auto w = ManifestWatcher::Create(io_, std::move(o));
    ASSERT_TRUE(w.ok()) << w.status();
    watcher_ = std::move(*w);
    ASSERT_TRUE(watcher_->Start().ok());
    thread_ = std::thread([this] { io_.run(); });
    // Start() posts its first full rescan to the io thread. A file the test
    // writes before that rescan ran would be reported twice (by the rescan
    // and by its own inotify event), which is right but not what the tests
    // count: wait until a handler posted after the rescan has run.
    auto scanned = std::make_shared<std::promise<void>>();
    std::future<void> done = scanned->get_future();
    boost::asio::post(io_, [scanned] { scanned->set_value(); });
    ASSERT_EQ(done.wait_for(10s), std::future_status::ready);
  }

  void StopWatcher() {
    if (!watcher_) return;
    std::promise<void> done;
    boost::asio::post(io_, [&] {
      watcher_->Stop();
      done.set_value();
    });
    done.get_future().wait();
    work_.reset();
    io_.stop();
    thread_.join();
    watcher_.reset();
  }

  // Waits (bounded) until `n` events were reported; returns them all.
  std::vector<std::string> WaitForEvents(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, 10s, [&] { return events_.size() >= n; });
    return events_;
  }

  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name) << text;
  }

  std::string dir_;
  boost::asio::io_context io_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_{
      boost::asio::make_work_guard(io_)};
  std::unique_ptr<ManifestWatcher> watcher_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> events_;
};

TEST_F(ManifestWatcherTest, InitialScanReportsExistingManifestsInNameOrder) {
  Write("b.json", "{}");
  Write("a.yaml", "x");
  Write("c.yml", "x");
  Write("notes.txt", "x");
  Write(".hidden.yaml", "x");
  std::filesystem::create_directory(dir_ + "/sub.yaml");  // not a regular file
  StartWatcher();
  EXPECT_THAT(WaitForEvents(3), ::testing::ElementsAre("+a.yaml", "+b.json", "+c.yml"));
}

TEST_F(ManifestWatcherTest, CreateModifyDelete) {
  StartWatcher();
  Write("pod.yaml", "one");
  EXPECT_THAT(WaitForEvents(1), ::testing::ElementsAre("+pod.yaml"));
  Write("pod.yaml", "two");
  EXPECT_THAT(WaitForEvents(2), ::testing::ElementsAre("+pod.yaml", "+pod.yaml"));
  std::filesystem::remove(dir_ + "/pod.yaml");
  EXPECT_THAT(WaitForEvents(3), ::testing::ElementsAre("+pod.yaml", "+pod.yaml", "-pod.yaml"));
}

TEST_F(ManifestWatcherTest, RenameReportsOldGoneAndNewPresent) {
  Write("old.yaml", "x");
  StartWatcher();
  ASSERT_THAT(WaitForEvents(1), ::testing::ElementsAre("+old.yaml"));
  std::filesystem::rename(dir_ + "/old.yaml", dir_ + "/new.yaml");
  auto events = WaitForEvents(3);
  EXPECT_THAT(events, ::testing::UnorderedElementsAre("+old.yaml", "-old.yaml", "+new.yaml"));
}

TEST_F(ManifestWatcherTest, EditorsTemporaryFilesAreIgnored) {
  StartWatcher();
  // vim's write test file, swap file and backup; emacs' lock; a hidden temp
  // renamed into place (as editors and `kubectl`-style tools save).
  Write("4913", "x");
  Write(".pod.yaml.swp", "x");
  Write("pod.yaml~", "x");
  Write(".#pod.yaml", "x");
  Write(".pod.yaml.tmp", "content");
  std::filesystem::rename(dir_ + "/.pod.yaml.tmp", dir_ + "/pod.yaml");
  // The sentinel's event comes after any event the files above could cause.
  Write("sentinel.json", "x");
  auto events = WaitForEvents(2);
  EXPECT_THAT(events, ::testing::UnorderedElementsAre("+pod.yaml", "+sentinel.json"));
}

TEST_F(ManifestWatcherTest, MovedOutOfTheDirectoryIsGone) {
  Write("pod.yaml", "x");
  StartWatcher();
  ASSERT_THAT(WaitForEvents(1), ::testing::ElementsAre("+pod.yaml"));
  std::filesystem::rename(dir_ + "/pod.yaml", dir_ + "/pod.yaml.disabled");
  EXPECT_THAT(WaitForEvents(2), ::testing::ElementsAre("+pod.yaml", "-pod.yaml"));
}

TEST_F(ManifestWatcherTest, RescanReportsFilesThatVanished) {
  Write("a.yaml", "x");
  Write("b.yaml", "x");
  StartWatcher();
  ASSERT_EQ(WaitForEvents(2).size(), 2u);
  // Stop watching inotify-wise by removing files while the io thread is
  // blocked, then rescan: the rescan sees what is there now.
  std::promise<void> blocked, release;
  boost::asio::post(io_, [&] {
    blocked.set_value();
    release.get_future().wait();
  });
  blocked.get_future().wait();
  std::filesystem::remove(dir_ + "/a.yaml");
  watcher_->Rescan();
  release.set_value();
  auto events = WaitForEvents(4);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events[2], "-a.yaml");
  EXPECT_EQ(events[3], "+b.yaml");
}

TEST(ManifestWatcherErrors, BadOptionsAndMissingDirectory) {
  boost::asio::io_context io;
  auto no_cb = ManifestWatcher::Create(io, {.dir = "/tmp", .on_event = nullptr});
  EXPECT_EQ(no_cb.status().code(), StatusCode::kInvalidArgument);
  auto no_dir = ManifestWatcher::Create(io, {.dir = "", .on_event = [](const auto&) {}});
  EXPECT_EQ(no_dir.status().code(), StatusCode::kInvalidArgument);
  auto w = ManifestWatcher::Create(
      io, {.dir = "/nonexistent/kdm/manifests", .on_event = [](const auto&) {}});
  ASSERT_TRUE(w.ok());
  Status s = (*w)->Start();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("/nonexistent/kdm/manifests"));
  (*w)->Stop();
}

}  // namespace
}  // namespace kdm::fakes
