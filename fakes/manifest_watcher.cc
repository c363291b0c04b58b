#include "kdm/fakes/manifest_watcher.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <filesystem>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "kdm/base/env.h"
#include "kdm/fakes/pod_manifest.h"

namespace kdm::fakes {
namespace {

namespace asio = boost::asio;

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Shared by the watcher and its pending handlers, so that a handler that
// runs after Stop() (a cancelled read or timer) finds valid memory.
// Touched only on the io_context's thread (after Start).
struct Core : std::enable_shared_from_this<Core> {
  Core(asio::io_context& io, ManifestWatcher::Options o) : io(io), options(std::move(o)) {}

  asio::io_context& io;
  const ManifestWatcher::Options options;
  // Set by Start. `ready` waits on a duplicate of the watcher's ReadyFd (Asio
  // closes what it holds; the watcher closes its own).
  std::unique_ptr<DirectoryWatcher> watcher;
  std::unique_ptr<asio::posix::stream_descriptor> ready;
  std::map<std::string, std::unique_ptr<asio::steady_timer>> timers;
  std::set<std::string> reported_present;
  bool stopped = false;

  void Report(const std::string& file_name) {
    if (stopped) return;
    ManifestWatcher::Event e;
    e.file_name = file_name;
    e.path = options.dir + "/" + file_name;
    e.kind = IsRegularFile(e.path) ? ManifestWatcher::EventKind::kPresent
                                   : ManifestWatcher::EventKind::kGone;
    if (e.kind == ManifestWatcher::EventKind::kPresent) {
      reported_present.insert(file_name);
    } else if (!reported_present.erase(file_name)) {
      return;  // never reported present: nothing to take back
    }
    options.on_event(e);
  }

  void Touch(const std::string& file_name) {
    if (stopped || !IsManifestFileName(file_name)) return;
    auto& timer = timers[file_name];
    if (!timer) timer = std::make_unique<asio::steady_timer>(io);
    timer->expires_after(options.debounce);
    timer->async_wait([self = shared_from_this(), file_name](const boost::system::error_code& ec) {
      if (ec || self->stopped) return;
      self->timers.erase(file_name);
      self->Report(file_name);
    });
  }

  void FullRescan() {
    if (stopped) return;
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(options.dir, ec)) {
      std::string name = entry.path().filename().string();
      if (IsManifestFileName(name)) names.push_back(name);
    }
    if (ec)
      spdlog::warn("event=manifest_rescan_failed dir={} error=\"{}\"", options.dir, ec.message());
    std::sort(names.begin(), names.end());
    std::set<std::string> gone = reported_present;
    for (const auto& n : names) gone.erase(n);
    for (const auto& n : gone) Report(n);
    for (const auto& n : names) Report(n);
  }

  // Waits for the watcher's descriptor, then reads what is pending. Asio
  // waits edge-triggered, so the read comes after the wait is armed: events
  // that arrived before it are read now, later ones wake the wait.
  void Arm() {
    if (stopped) return;
    ready->async_wait(asio::posix::stream_descriptor::wait_read,
                      [self = shared_from_this()](const boost::system::error_code& ec) {
                        if (self->stopped) return;
                        if (ec) {
                          spdlog::error("event=manifest_watch_failed dir={} error=\"{}\"",
                                        self->options.dir, ec.message());
                          return;
                        }
                        self->Arm();
                      });
    Handle(watcher->ReadEvents());
  }

  void Handle(const std::vector<DirectoryWatcher::Event>& events) {
    using Kind = DirectoryWatcher::EventKind;
    bool rescan = false;
    for (const DirectoryWatcher::Event& e : events) {
      if (stopped) return;
      if (e.kind == Kind::kOverflow) {
        rescan = true;
      } else if (e.kind == Kind::kDirectoryGone) {
        spdlog::error("event=manifest_dir_gone dir={}", options.dir);
      } else if (!e.name.empty()) {
        spdlog::debug("event=manifest_dir_event file={} kind={}", e.name, static_cast<int>(e.kind));
        Touch(e.name);
      }
    }
    if (rescan) {
      spdlog::warn("event=manifest_watch_overflow dir={} action=rescan", options.dir);
      FullRescan();
    }
  }

  void Stop() {
    stopped = true;
    for (auto& [name, timer] : timers) timer->cancel();
    timers.clear();
    if (ready) {
      boost::system::error_code ignored;
      ready->cancel(ignored);
      ready->close(ignored);
    }
  }
};

class ManifestWatcherImpl final : public ManifestWatcher {
 public:
  explicit ManifestWatcherImpl(std::shared_ptr<Core> core) : core_(std::move(core)) {}

  Status Start() override {
    if (started_) return FailedPreconditionError("manifest watcher already started");
    KDM_ASSIGN_OR_RETURN(std::unique_ptr<DirectoryWatcher> watcher,
                         core_->options.env->WatchDirectory(core_->options.dir));
    int fd = ::dup(watcher->ReadyFd());
    if (fd < 0) return ErrnoToStatus(errno, "cannot watch " + core_->options.dir + ": dup");
    core_->watcher = std::move(watcher);
    core_->ready = std::make_unique<asio::posix::stream_descriptor>(core_->io, fd);
    started_ = true;
    // On the io_context's thread: the core is touched there only.
    asio::post(core_->io, [core = core_] {
      core->Arm();
      core->FullRescan();
    });
    return OkStatus();
  }

  void Stop() override { core_->Stop(); }

  void Rescan() override {
    asio::post(core_->io, [core = core_] { core->FullRescan(); });
  }

 private:
  std::shared_ptr<Core> core_;
  bool started_ = false;
};

}  // namespace

StatusOr<std::unique_ptr<ManifestWatcher>> ManifestWatcher::Create(asio::io_context& io,
                                                                   Options options) {
  if (options.dir.empty()) return InvalidArgumentError("manifest watcher: empty directory");
  if (!options.on_event) return InvalidArgumentError("manifest watcher: no callback");
  if (options.debounce.count() < 0)
    return InvalidArgumentError("manifest watcher: negative debounce");
  while (options.dir.size() > 1 && options.dir.back() == '/') options.dir.pop_back();
  auto core = std::make_shared<Core>(io, std::move(options));
  return std::unique_ptr<ManifestWatcher>(new ManifestWatcherImpl(std::move(core)));
}

}  // namespace kdm::fakes
