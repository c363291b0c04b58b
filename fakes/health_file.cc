#include "kdm/fakes/health_file.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <vector>

#include "kdm/base/env.h"
#include "kdm/base/sync.h"

namespace kdm::fakes {
namespace {

namespace fs = std::filesystem;

class HealthFileWatcherImpl final : public HealthFileWatcher {
 public:
  HealthFileWatcherImpl(std::string path, ChangeCallback on_change, ErrorCallback on_error,
                        std::chrono::milliseconds poll_bound, Env* env)
      : env_(env),
        path_(std::move(path)),
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
      kdm::MutexLock lock(&mu_);
      if (started_) return FailedPreconditionError("health file watcher already started");
      started_ = true;
    }
    std::error_code ec;
    if (!fs::is_directory(dir_, ec)) {
      return NotFoundError("health file " + path_ + ": directory " + dir_ + " does not exist");
    }
    StatusOr<std::unique_ptr<DirectoryWatcher>> watcher = env_->WatchDirectory(dir_);
    if (!watcher.ok()) return watcher.status().WithPrefix("health file " + path_);
    watcher_ = std::move(*watcher);
    // Watch first, then read: a write between the two is seen either way.
    ReadAndApply();
    thread_ = std::thread([this] { Loop(); });
    return OkStatus();
  }

  void Stop() override {
    {
      kdm::MutexLock lock(&mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    if (watcher_) watcher_->Wake();
    if (thread_.joinable()) thread_.join();
    watcher_.reset();
  }

  Stats GetStats() const override {
    kdm::MutexLock lock(&mu_);
    return stats_;
  }

  bool WaitForReads(int64_t reads, std::chrono::milliseconds timeout) const override {
    kdm::MutexLock lock(&mu_);
    // No signal needed: the Condition is re-checked whenever mu_ is released.
    auto enough = [this, reads]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stats_.reads >= reads; };
    return mu_.AwaitWithTimeout(kdm::Condition(&enough), absl::FromChrono(timeout));
  }

 private:
  void Loop() {
    using Kind = DirectoryWatcher::EventKind;
    while (true) {
      // Bounded: the stop flag is checked at least every poll_bound.
      std::vector<DirectoryWatcher::Event> events = watcher_->Wait(poll_bound_);
      {
        kdm::MutexLock lock(&mu_);
        if (stopping_) return;
      }
      enum class Seen { kNothing, kWritten, kRemoved } seen = Seen::kNothing;
      for (const DirectoryWatcher::Event& e : events) {
        if (e.name != name_) continue;
        // The last event decides: a file replaced and then removed is gone.
        // A creation or a write still in progress waits for its close.
        if (e.kind == Kind::kWritten || e.kind == Kind::kMovedIn) {
          seen = Seen::kWritten;
        } else if (e.kind == Kind::kRemoved || e.kind == Kind::kMovedOut) {
          seen = Seen::kRemoved;
        }
      }
      if (seen == Seen::kWritten) {
        ReadAndApply();
      } else if (seen == Seen::kRemoved) {
        Report(NotFoundError("health file " + path_ + " was removed; keeping the last good state"));
      }
    }
  }

  void ReadAndApply() {
    StatusOr<HealthMap> read = ReadHealthFile(path_, env_);
    if (!read.ok()) {
      Report(read.status());
      return;
    }
    bool changed = !last_ || *last_ != *read;
    if (changed) {
      last_ = *read;
      on_change_(*read);
    }
    kdm::MutexLock lock(&mu_);
    ++stats_.reads;
    if (changed) ++stats_.applied;
  }

  void Report(const Status& error) {
    if (on_error_) on_error_(error);
    kdm::MutexLock lock(&mu_);
    ++stats_.reads;
    ++stats_.rejected;
  }

  Env* const env_;
  const std::string path_;
  std::string dir_;
  std::string name_;
  const ChangeCallback on_change_;
  const ErrorCallback on_error_;
  const std::chrono::milliseconds poll_bound_;

  // Owned by the watcher thread (and by Start before the thread exists).
  std::optional<HealthMap> last_;
  std::unique_ptr<DirectoryWatcher> watcher_;  // set by Start, reset by Stop after the join
  std::thread thread_;

  mutable kdm::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
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

StatusOr<HealthMap> ReadHealthFile(const std::string& path, Env* env) {
  StatusOr<std::string> text = env->ReadFile(path, kMaxHealthFileBytes);
  if (!text.ok()) {
    // Every refusal is the file's fault (INVALID_ARGUMENT, as documented),
    // except a file that is not there (yet).
    switch (text.status().code()) {
      case StatusCode::kNotFound:
        return NotFoundError(path + ": no such file");
      case StatusCode::kFailedPrecondition:
        return InvalidArgumentError(path + ": not a regular file");
      default:
        return InvalidArgumentError(text.status().message());
    }
  }
  StatusOr<HealthMap> parsed = ParseHealthJson(*text);
  if (!parsed.ok()) return parsed.status().WithPrefix(path);
  return parsed;
}

StatusOr<std::unique_ptr<HealthFileWatcher>> HealthFileWatcher::Create(
    std::string path, ChangeCallback on_change, ErrorCallback on_error,
    std::chrono::milliseconds poll_bound, Env* env) {
  if (path.empty()) return InvalidArgumentError("health file path is empty");
  if (fs::path(path).filename().empty()) {
    return InvalidArgumentError("health file path " + path + " names a directory, not a file");
  }
  if (!on_change) return InvalidArgumentError("health file watcher needs a change callback");
  if (poll_bound.count() <= 0) poll_bound = std::chrono::milliseconds(200);
  return std::unique_ptr<HealthFileWatcher>(new HealthFileWatcherImpl(
      std::move(path), std::move(on_change), std::move(on_error), poll_bound, env));
}

}  // namespace kdm::fakes
