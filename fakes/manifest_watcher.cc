#include "kdm/fakes/manifest_watcher.h"

#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include <boost/asio/post.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <spdlog/spdlog.h>

#include "kdm/fakes/pod_manifest.h"

namespace kdm::fakes {
namespace {

namespace asio = boost::asio;

constexpr uint32_t kMask = IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_CREATE |
                           IN_MODIFY | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR;

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Shared by the watcher and its pending handlers, so that a handler that
// runs after Stop() (a cancelled read or timer) finds valid memory.
// Touched only on the io_context's thread (after Start).
struct Core : std::enable_shared_from_this<Core> {
  Core(asio::io_context& io, ManifestWatcher::Options o, int fd)
      : io(io), options(std::move(o)), stream(io, fd) {}

  asio::io_context& io;
  const ManifestWatcher::Options options;
  asio::posix::stream_descriptor stream;
  std::array<char, 64 * 1024> buffer{};
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
    if (ec) spdlog::warn("event=manifest_rescan_failed dir={} error=\"{}\"", options.dir, ec.message());
    std::sort(names.begin(), names.end());
    std::set<std::string> gone = reported_present;
    for (const auto& n : names) gone.erase(n);
    for (const auto& n : gone) Report(n);
    for (const auto& n : names) Report(n);
  }

  void Read() {
    stream.async_read_some(
        asio::buffer(buffer), [self = shared_from_this()](const boost::system::error_code& ec,
                                                          size_t n) {
          if (self->stopped) return;
          if (ec) {
            spdlog::error("event=manifest_watch_failed dir={} error=\"{}\"", self->options.dir,
                          ec.message());
            return;
          }
          self->Parse(n);
          if (!self->stopped) self->Read();
        });
  }

  void Parse(size_t n) {
    size_t offset = 0;
    bool rescan = false;
    while (offset + sizeof(inotify_event) <= n) {
      inotify_event ev;
      std::memcpy(&ev, buffer.data() + offset, sizeof ev);
      std::string name;
      if (ev.len > 0) name = std::string(buffer.data() + offset + sizeof(inotify_event));
      name.resize(std::strlen(name.c_str()));
      offset += sizeof(inotify_event) + ev.len;
      if (ev.mask & IN_Q_OVERFLOW) {
        rescan = true;
      } else if (ev.mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED)) {
        spdlog::error("event=manifest_dir_gone dir={}", options.dir);
      } else if (!name.empty()) {
        spdlog::debug("event=manifest_inotify file={} mask={:#x}", name, ev.mask);
        Touch(name);
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
    boost::system::error_code ignored;
    stream.cancel(ignored);
    stream.close(ignored);
  }
};

class ManifestWatcherImpl final : public ManifestWatcher {
 public:
  explicit ManifestWatcherImpl(std::shared_ptr<Core> core) : core_(std::move(core)) {}

  Status Start() override {
    if (started_) return FailedPreconditionError("manifest watcher already started");
    int wd = ::inotify_add_watch(core_->stream.native_handle(), core_->options.dir.c_str(), kMask);
    if (wd < 0) {
      int err = errno;
      std::string what = "cannot watch " + core_->options.dir + ": " + std::strerror(err);
      return err == ENOENT ? NotFoundError(what) : UnavailableError(what);
    }
    started_ = true;
    core_->Read();
    asio::post(core_->io, [core = core_] { core->FullRescan(); });
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
  if (options.debounce.count() < 0) return InvalidArgumentError("manifest watcher: negative debounce");
  while (options.dir.size() > 1 && options.dir.back() == '/') options.dir.pop_back();
  int fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (fd < 0) {
    return UnavailableError(std::string("inotify_init1: ") + std::strerror(errno));
  }
  auto core = std::make_shared<Core>(io, std::move(options), fd);
  return std::unique_ptr<ManifestWatcher>(new ManifestWatcherImpl(std::move(core)));
}

}  // namespace kdm::fakes
