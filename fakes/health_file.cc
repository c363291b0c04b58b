#include "kdm/fakes/health_file.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

namespace kdm::fakes {
namespace {

namespace fs = std::filesystem;

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

class HealthFileWatcherImpl final : public HealthFileWatcher {
 public:
  HealthFileWatcherImpl(std::string path, ChangeCallback on_change, ErrorCallback on_error,
                        std::chrono::milliseconds poll_bound)
      : path_(std::move(path)),
        on_change_(std::move(on_change)),
        on_error_(std::move(on_error)),
        poll_bound_(poll_bound) {
    fs::path p(path_);
    name_ = p.filename().string();
    dir_ = p.has_parent_path() ? p.parent_path().string() : ".";
  }

  ~HealthFileWatcherImpl() override { Stop(); }

  Status Start() override {
    {
      std::lock_guard lock(mu_);
      if (started_) return FailedPreconditionError("health file watcher already started");
      started_ = true;
    }
    std::error_code ec;
    if (!fs::is_directory(dir_, ec)) {
      return NotFoundError("health file " + path_ + ": directory " + dir_ + " does not exist");
    }
    inotify_fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (inotify_fd_ < 0) return InternalError(Errno("health file " + path_ + ": inotify_init1"));
    if (::inotify_add_watch(inotify_fd_, dir_.c_str(),
                            IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE) < 0) {
      Status s = InternalError(Errno("health file " + path_ + ": cannot watch " + dir_));
      CloseFds();
      return s;
    }
    stop_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (stop_fd_ < 0) {
      Status s = InternalError(Errno("health file " + path_ + ": eventfd"));
      CloseFds();
      return s;
    }
    // Watch first, then read: a write between the two is seen either way.
    ReadAndApply();
    thread_ = std::thread([this] { Loop(); });
    return OkStatus();
  }

  void Stop() override {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    if (stop_fd_ >= 0) {
      uint64_t one = 1;
      (void)!::write(stop_fd_, &one, sizeof(one));
    }
    if (thread_.joinable()) thread_.join();
    CloseFds();
  }

  Stats GetStats() const override {
    std::lock_guard lock(mu_);
    return stats_;
  }

  bool WaitForReads(int64_t reads, std::chrono::milliseconds timeout) const override {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return stats_.reads >= reads; });
  }

 private:
  void CloseFds() {
    if (inotify_fd_ >= 0) ::close(inotify_fd_);
    if (stop_fd_ >= 0) ::close(stop_fd_);
    inotify_fd_ = -1;
    stop_fd_ = -1;
  }

  void Loop() {
    alignas(struct inotify_event) char buf[16 * 1024];
    while (true) {
      pollfd fds[2] = {{inotify_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
      // Bounded: the stop flag is checked at least every poll_bound.
      int n = ::poll(fds, 2, static_cast<int>(poll_bound_.count()));
      {
        std::lock_guard lock(mu_);
        if (stopping_) return;
      }
      if (n <= 0 || !(fds[0].revents & POLLIN)) continue;
      enum class Seen { kNothing, kWritten, kRemoved } seen = Seen::kNothing;
      while (true) {
        ssize_t len = ::read(inotify_fd_, buf, sizeof(buf));
        if (len <= 0) break;
        for (char* p = buf; p < buf + len;) {
          auto* ev = reinterpret_cast<struct inotify_event*>(p);
          p += sizeof(struct inotify_event) + ev->len;
          if (ev->len == 0 || name_ != ev->name) continue;
          // The last event decides: a file replaced and then removed is gone.
          seen = (ev->mask & (IN_DELETE | IN_MOVED_FROM)) ? Seen::kRemoved : Seen::kWritten;
        }
      }
      if (seen == Seen::kWritten) {
        ReadAndApply();
      } else if (seen == Seen::kRemoved) {
        Report(NotFoundError("health file " + path_ +
                             " was removed; keeping the last good state"));
      }
    }
  }

  void ReadAndApply() {
    StatusOr<HealthMap> read = ReadHealthFile(path_);
    if (!read.ok()) {
      Report(read.status());
      return;
    }
    bool changed = !last_ || *last_ != *read;
    if (changed) {
      last_ = *read;
      on_change_(*read);
    }
    std::lock_guard lock(mu_);
    ++stats_.reads;
    if (changed) ++stats_.applied;
    cv_.notify_all();
  }

  void Report(const Status& error) {
    if (on_error_) on_error_(error);
    std::lock_guard lock(mu_);
    ++stats_.reads;
    ++stats_.rejected;
    cv_.notify_all();
  }

  const std::string path_;
  std::string dir_;
  std::string name_;
  const ChangeCallback on_change_;
  const ErrorCallback on_error_;
  const std::chrono::milliseconds poll_bound_;

  // Owned by the watcher thread (and by Start before the thread exists).
  std::optional<HealthMap> last_;
  int inotify_fd_ = -1;
  int stop_fd_ = -1;
  std::thread thread_;

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool started_ = false;   // guarded by mu_
  bool stopping_ = false;  // guarded by mu_
  Stats stats_;            // guarded by mu_
};

}  // namespace

StatusOr<HealthMap> ParseHealthJson(std::string_view text) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    return InvalidArgumentError("not valid JSON at byte " + std::to_string(e.byte) +
                                " (expected an object of device id -> \"Healthy\" or "
                                "\"Unhealthy\")");
  } catch (const nlohmann::json::exception& e) {  // e.g. out_of_range for 1e400
    return InvalidArgumentError(std::string("not valid JSON: ") + e.what());
  }
  if (!doc.is_object()) {
    return InvalidArgumentError(std::string("expected a JSON object of device id -> \"Healthy\" "
                                            "or \"Unhealthy\", got ") +
                                doc.type_name());
  }
  HealthMap out;
  for (const auto& [id, value] : doc.items()) {
    if (id.empty()) return InvalidArgumentError("a device id is empty");
    if (!value.is_string() ||
        (value.get<std::string>() != "Healthy" && value.get<std::string>() != "Unhealthy")) {
      return InvalidArgumentError("device \"" + id + "\": health must be \"Healthy\" or " +
                                  "\"Unhealthy\", got " + value.dump());
    }
    out[id] = value.get<std::string>() == "Healthy";
  }
  return out;
}

StatusOr<HealthMap> ReadHealthFile(const std::string& path) {
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) return NotFoundError(path + ": no such file");
  if (!fs::is_regular_file(st)) return InvalidArgumentError(path + ": not a regular file");
  uint64_t size = fs::file_size(path, ec);
  if (ec) return InvalidArgumentError(path + ": " + ec.message());
  if (size > kMaxHealthFileBytes) {
    return InvalidArgumentError(path + ": " + std::to_string(size) + " bytes is larger than the " +
                                std::to_string(kMaxHealthFileBytes) + "-byte limit");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgumentError(path + ": cannot be opened");
  std::ostringstream text;
  text << in.rdbuf();
  StatusOr<HealthMap> parsed = ParseHealthJson(text.str());
  if (!parsed.ok()) return parsed.status().WithPrefix(path);
  return parsed;
}

StatusOr<std::unique_ptr<HealthFileWatcher>> HealthFileWatcher::Create(
    std::string path, ChangeCallback on_change, ErrorCallback on_error,
    std::chrono::milliseconds poll_bound) {
  if (path.empty()) return InvalidArgumentError("health file path is empty");
  if (fs::path(path).filename().empty()) {
    return InvalidArgumentError("health file path " + path + " names a directory, not a file");
  }
  if (!on_change) return InvalidArgumentError("health file watcher needs a change callback");
  if (poll_bound.count() <= 0) poll_bound = std::chrono::milliseconds(200);
  return std::unique_ptr<HealthFileWatcher>(new HealthFileWatcherImpl(
      std::move(path), std::move(on_change), std::move(on_error), poll_bound));
}

}  // namespace kdm::fakes
