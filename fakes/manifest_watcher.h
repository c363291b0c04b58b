// kdm::fakes::ManifestWatcher: watches a static-pod manifest directory
// (the kubelet's --pod-manifest-path) with kdm::Env's directory watcher
// (inotify) on a Boost.Asio io_context and reports, per manifest file, "present (maybe changed)" or
// "gone".
//
// Only names IsManifestFileName accepts are reported ("*.yaml", "*.yml",
// "*.json", not hidden), so editors' temporary and swap files are ignored.
// Events are debounced per file: a burst of writes, or an editor's
// write-temp-then-rename, gives one report once the file has been quiet for
// `debounce`. Each report says what the file system holds at that moment
// (kPresent if a regular file of that name exists, else kGone), so a
// consumer compares contents to tell a real change from a touch. Start()
// reports every manifest already there (a full rescan, in name order);
// a watch queue overflow triggers another full rescan, which also
// reports kGone for files that vanished meanwhile.
//
// Not installed: an internal part of the fake kubelet (it names Boost types).
//
// Thread-safety: Create, Start and Stop from one thread; the callback runs
// on the io_context's thread(s). Stop() must be called, on the io_context's
// thread or while it is not running, before the watcher is destroyed.
//
// Example:
//   boost::asio::io_context io;
//   auto w = ManifestWatcher::Create(io, {.dir = root + "/manifests",
//       .on_event = [](const ManifestWatcher::Event& e) { ... }});
//   if (!w.ok()) return w.status();
//   KDM_RETURN_IF_ERROR((*w)->Start());
//   io.run();
#ifndef KDM_FAKES_MANIFEST_WATCHER_H_
#define KDM_FAKES_MANIFEST_WATCHER_H_

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "kdm/base/env.h"
#include "kdm/base/status.h"

namespace kdm::fakes {

class ManifestWatcher {
 public:
  enum class EventKind { kPresent, kGone };
  struct Event {
    EventKind kind;
    std::string path;       // absolute: dir + "/" + file_name
    std::string file_name;  // e.g. "train.yaml"
  };
  using Callback = std::function<void(const Event&)>;

  struct Options {
    std::string dir;
    // Quiet time before a file's changes are reported.
    std::chrono::milliseconds debounce{100};
    // Required.
    Callback on_event;
    // The OS seam of the directory watch. Not owned; must outlive the watcher.
    Env* env = Env::Default();
  };

  // Validates options (touches nothing on disk). INVALID_ARGUMENT for an
  // empty dir, a missing callback or a negative debounce.
  static StatusOr<std::unique_ptr<ManifestWatcher>> Create(boost::asio::io_context& io,
                                                           Options options);
  virtual ~ManifestWatcher() = default;

  // Watches `dir` (which must exist; NOT_FOUND otherwise, FAILED_PRECONDITION
  // if it is not a directory, else the errno policy of the watch) and posts a
  // kPresent report for every manifest in it to the io_context.
  virtual Status Start() = 0;
  // Stops watching and cancels pending reports; no callback runs after it
  // returns when called on the io_context's thread. Idempotent.
  virtual void Stop() = 0;
  // Posts a full rescan (kPresent for every manifest, kGone for reported
  // files that vanished).
  virtual void Rescan() = 0;
};

}  // namespace kdm::fakes

#endif  // KDM_FAKES_MANIFEST_WATCHER_H_
