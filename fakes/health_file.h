// The health file of the fake device plugin: a JSON object mapping device ids
// to "Healthy" or "Unhealthy", used to inject faults into a running plugin.
//
//   {"GPU3": "Unhealthy", "GPU5": "Healthy"}
//
// A device the file does not name is healthy, so removing an entry (or
// writing `{}`) heals it. HealthFileWatcher follows the file: it watches the
// file's directory with kdm::Env's directory watcher (inotify), so a file
// that is written in place, replaced by rename, deleted or created later is
// all seen; it re-reads the file when it
// is closed after writing or renamed into place, and hands each new, valid
// state to a callback. A file that does not parse is reported through the
// error callback and ignored: the last good state stays in force.
//
// Thread-safety: ParseHealthJson and ReadHealthFile are free functions
// without shared state. HealthFileWatcher's methods may be called from any
// thread; its callbacks run one at a time (the first read on the thread calling
// Start, later ones on the watcher's own thread) and must not call Stop().
//
// Example:
//   auto w = kdm::fakes::HealthFileWatcher::Create(
//       "/tmp/health.json",
//       [&](const kdm::fakes::HealthMap& h) { plugin.ApplyHealth(h); },
//       [](const kdm::Status& s) { spdlog::warn("{}", s.message()); });
//   if (!w.ok()) return Fail(w.status());
//   if (auto s = (*w)->Start(); !s.ok()) return Fail(s);
//   ...
//   (*w)->Stop();
#ifndef KDM_FAKES_HEALTH_FILE_H_
#define KDM_FAKES_HEALTH_FILE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "kdm/base/env.h"
#include "kdm/base/status.h"

namespace kdm::fakes {

// Device id -> healthy.
using HealthMap = std::map<std::string, bool>;

// The largest health file read.
inline constexpr uint64_t kMaxHealthFileBytes = 1 << 20;

// Parses the JSON text of a health file. INVALID_ARGUMENT when the text is
// not JSON (naming the byte offset), not an object, or a value is not the
// string "Healthy" or "Unhealthy" (naming the id and the value).
StatusOr<HealthMap> ParseHealthJson(std::string_view text);

// Reads and parses a health file. NOT_FOUND when it does not exist;
// INVALID_ARGUMENT when it is not a regular file, is larger than
// kMaxHealthFileBytes or does not parse. Messages start with the path.
StatusOr<HealthMap> ReadHealthFile(const std::string& path, Env* env = Env::Default());

class HealthFileWatcher {
 public:
  // Called with every new valid state (different from the last one applied).
  using ChangeCallback = std::function<void(const HealthMap& health)>;
  // Called when the file cannot be read or parsed, or was removed; the last
  // good state stays in force.
  using ErrorCallback = std::function<void(const Status& error)>;

  struct Stats {
    int64_t applied = 0;   // states handed to the change callback
    int64_t rejected = 0;  // reads that failed (error callback calls)
    int64_t reads = 0;     // reads attempted, failed or not
  };

  // Validates the arguments (a non-empty path with a file name, a change
  // callback). Touches nothing on disk.
  static StatusOr<std::unique_ptr<HealthFileWatcher>> Create(
      std::string path, ChangeCallback on_change, ErrorCallback on_error,
      std::chrono::milliseconds poll_bound = std::chrono::milliseconds(200),
      Env* env = Env::Default());

  virtual ~HealthFileWatcher() = default;

  // Starts watching the file's directory, then reads the file once (a missing
  // or bad file is reported through the error callback, not here). Errors:
  // the directory does not exist or cannot be watched, Start called twice.
  virtual Status Start() = 0;
  // Stops watching and joins the thread; waits at most about poll_bound.
  // Idempotent; safe without Start().
  virtual void Stop() = 0;

  virtual Stats GetStats() const = 0;
  // Waits until GetStats().reads >= reads or `timeout` passes; true if
  // reached. A sync point for tests and callers that must know a write was
  // seen.
  virtual bool WaitForReads(int64_t reads, std::chrono::milliseconds timeout) const = 0;
};

}  // namespace kdm::fakes

#endif  // KDM_FAKES_HEALTH_FILE_H_
