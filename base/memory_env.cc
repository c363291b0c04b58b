// The in-memory Env for tests: one map from path to entry, under one lock.
// Errors use the same errno policy and the same message shapes as the POSIX
// Env, so a test written against one reads the same against the other.
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <map>
#include <random>
#include <set>

#include "kdm/base/env.h"
#include "kdm/base/env_internal.h"
#include "kdm/base/file_system.h"
#include "kdm/base/sync.h"

namespace kdm {
namespace {

using env_internal::BaseName;
using env_internal::CheckPath;
using env_internal::DirName;
using Kind = DirectoryWatcher::EventKind;

// "//a//b/" -> "/a/b"; "/" stays "/".
std::string Normalize(std::string_view path) {
  std::string out;
  for (char c : path) {
    if (c == '/' && !out.empty() && out.back() == '/') continue;
    out += c;
  }
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

class MemoryEnvImpl;

class MemoryDirectoryWatcher final : public DirectoryWatcher {
 public:
  MemoryDirectoryWatcher(MemoryEnvImpl* env, std::string dir, int ready_fd)
      : env_(env), dir_(std::move(dir)), ready_fd_(ready_fd) {}
  ~MemoryDirectoryWatcher() override;

  std::vector<Event> ReadEvents() override {
    kdm::MutexLock lock(&mu_);
    return TakeLocked();
  }

  std::vector<Event> Wait(std::chrono::milliseconds timeout) override {
    kdm::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return woken_ || !queue_.empty(); };
    mu_.AwaitWithTimeout(kdm::Condition(&ready),
                         absl::FromChrono(std::max(timeout, std::chrono::milliseconds(0))));
    woken_ = false;
    return TakeLocked();
  }

  void Wake() override {
    kdm::MutexLock lock(&mu_);
    woken_ = true;  // the unlock wakes Wait's Await
  }

  int ReadyFd() const override { return ready_fd_; }

  const std::string& dir() const { return dir_; }

  // Called by the Env with its lock held.
  void Push(Kind kind, std::string name) {
    kdm::MutexLock lock(&mu_);
    queue_.push_back({kind, std::move(name)});
    uint64_t one = 1;
    (void)!::write(ready_fd_, &one, sizeof one);
  }

 private:
  std::vector<Event> TakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    uint64_t count;
    (void)!::read(ready_fd_, &count, sizeof count);
    std::vector<Event> out(queue_.begin(), queue_.end());
    queue_.clear();
    return out;
  }

  MemoryEnvImpl* const env_;
  const std::string dir_;
  const int ready_fd_;
  kdm::Mutex mu_;
  std::deque<Event> queue_ ABSL_GUARDED_BY(mu_);
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
};

class MemoryEnvImpl final : public MemoryEnv {
 public:
  MemoryEnvImpl() {
    nodes_["/"] = {FileType::kDirectory, 0755, ""};
    nodes_["/tmp"] = {FileType::kDirectory, 01777, ""};
    live_pids_.insert(::getpid());
  }

  StatusOr<std::string> ReadFile(const std::string& raw, uint64_t max_bytes) override {
    KDM_RETURN_IF_ERROR(CheckPath(raw, "file"));
    const std::string path = Normalize(raw);
    kdm::MutexLock lock(&mu_);
    const Node* node = Find(path);
    if (!node) return ErrnoToStatus(ENOENT, "cannot open " + raw);
    if (node->type == FileType::kDirectory) {
      return FailedPreconditionError(raw + " is not a regular file: it is a directory");
    }
    if (node->type != FileType::kRegular) {
      return FailedPreconditionError(raw + " is not a regular file");
    }
    if (node->data.size() > max_bytes) {
      return env_internal::TooBig(raw, node->data.size(), max_bytes);
    }
    return node->data;
  }

  Status WriteFileAtomically(const std::string& raw, std::string_view contents,
                             const AtomicWriteOptions& options) override {
    KDM_RETURN_IF_ERROR(CheckPath(raw, "file"));
    if (raw.back() == '/') return InvalidArgumentError(raw + " names a directory, not a file");
    const std::string path = Normalize(raw);
    const std::string dir = DirName(path);
    const std::string name = BaseName(path);
    kdm::MutexLock lock(&mu_);
    const std::string tmp_name = options.naming == TempFileNaming::kHiddenRandom
                                     ? "." + name + ".tmp-" + RandomSuffixLocked()
                                     : name + ".tmp-" + std::to_string(::getpid());
    const std::string tmp = JoinPath(dir, tmp_name);
    if (Status s = CheckParentLocked(path, "cannot write " + raw + ": create " + tmp); !s.ok()) {
      return s;
    }
    if (Status s = TakeInjectedFailureLocked(); !s.ok()) {
      return s.WithPrefix("cannot write " + raw + ": write " + tmp);
    }
    const Node* target = Find(path);
    if (target && target->type == FileType::kDirectory) {
      return ErrnoToStatus(EISDIR, "cannot write " + raw + ": rename " + tmp + " onto it");
    }
    Notify(dir, Kind::kCreated, tmp_name);
    Notify(dir, Kind::kChanged, tmp_name);
    Notify(dir, Kind::kWritten, tmp_name);
    nodes_[path] = {FileType::kRegular, options.mode & 07777, std::string(contents)};
    Notify(dir, Kind::kMovedOut, tmp_name);
    Notify(dir, Kind::kMovedIn, name);
    return OkStatus();
  }

  StatusOr<std::vector<std::string>> RemoveStaleTempFiles(const std::string& path_or_dir,
                                                          TempFileNaming naming) override {
    KDM_RETURN_IF_ERROR(CheckPath(path_or_dir, "path"));
    const bool by_pid = naming == TempFileNaming::kWriterPid;
    const std::string norm = Normalize(path_or_dir);
    const std::string dir = by_pid ? DirName(norm) : norm;
    const std::string target = by_pid ? BaseName(norm) : "";
    KDM_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(dir));
    kdm::MutexLock lock(&mu_);
    std::vector<std::string> removed;
    for (const std::string& name : names) {
      if (by_pid) {
        std::optional<int64_t> pid = env_internal::WriterPidTempFile(name, target);
        if (!pid || live_pids_.count(*pid)) continue;
      } else if (!env_internal::IsHiddenRandomTempFile(name)) {
        continue;
      }
      const std::string full = JoinPath(dir, name);
      const Node* node = Find(full);
      if (!node || node->type != FileType::kRegular) continue;
      nodes_.erase(full);
      Notify(dir, Kind::kRemoved, name);
      removed.push_back(full);
    }
    return removed;
  }

  Status CreateDirectories(const std::string& raw, unsigned mode) override {
    KDM_RETURN_IF_ERROR(CheckPath(raw, "directory"));
    const std::string dir = Normalize(raw);
    kdm::MutexLock lock(&mu_);
    size_t pos = 0;
    while (pos != std::string::npos) {
      pos = dir.find('/', pos + 1);
      const std::string partial = dir.substr(0, pos);
      if (partial.empty() || partial == "/" || Find(partial)) continue;
      KDM_RETURN_IF_ERROR(CheckParentLocked(partial, "cannot create directory " + partial));
      if (Status s = TakeInjectedFailureLocked(); !s.ok()) {
        return s.WithPrefix("cannot create directory " + partial);
      }
      nodes_[partial] = {FileType::kDirectory, mode & 07777, ""};
      Notify(DirName(partial), Kind::kCreated, BaseName(partial));
    }
    const Node* node = Find(dir);
    if (!node) return ErrnoToStatus(ENOENT, "cannot stat " + raw);
    if (node->type != FileType::kDirectory) {
      return FailedPreconditionError(raw + " exists and is not a directory");
    }
    return OkStatus();
  }

  StatusOr<unsigned> TightenDirectoryMode(const std::string& raw, unsigned max_mode) override {
    KDM_RETURN_IF_ERROR(CheckPath(raw, "directory"));
    kdm::MutexLock lock(&mu_);
    Node* node = Find(Normalize(raw));
    if (!node) return ErrnoToStatus(ENOENT, "cannot stat " + raw);
    if (node->type != FileType::kDirectory) {
      return FailedPreconditionError(raw + " is not a directory");
    }
    const unsigned mode = node->mode;
    node->mode = mode & max_mode;
    return mode;
  }

  StatusOr<FileInfo> Stat(const std::string& raw) override {
    KDM_RETURN_IF_ERROR(CheckPath(raw, "path"));
    kdm::MutexLock lock(&mu_);
    const Node* node = Find(Normalize(raw));
    if (!node) return ErrnoToStatus(ENOENT, "cannot stat " + raw);
    return FileInfo{node->type, node->mode, node->data.size()};
  }

  StatusOr<std::vector<std::string>> ListDirectory(const std::string& raw) override {
    KDM_RETURN_IF_ERROR(CheckPath(raw, "directory"));
    const std::string dir = Normalize(raw);
    kdm::MutexLock lock(&mu_);
    const Node* node = Find(dir);
    if (!node) return ErrnoToStatus(ENOENT, "cannot list " + raw);
    if (node->type != FileType::kDirectory) return ErrnoToStatus(ENOTDIR, "cannot list " + raw);
    std::vector<std::string> names;
    const std::string prefix = dir == "/" ? "/" : dir + "/";
    for (auto it = nodes_.lower_bound(prefix); it != nodes_.end() && it->first.starts_with(prefix);
         ++it) {
      std::string_view rest = std::string_view(it->first).substr(prefix.size());
      if (!rest.empty() && rest.find('/') == std::string_view::npos) names.emplace_back(rest);
    }
    return names;  // a std::map: already sorted
  }

  Status RemoveFile(const std::string& raw) override {
    KDM_RETURN_IF_ERROR(CheckPath(raw, "file"));
    const std::string path = Normalize(raw);
    kdm::MutexLock lock(&mu_);
    const Node* node = Find(path);
    if (!node) return ErrnoToStatus(ENOENT, "cannot remove " + raw);
    if (node->type == FileType::kDirectory) return ErrnoToStatus(EISDIR, "cannot remove " + raw);
    nodes_.erase(path);
    Notify(DirName(path), Kind::kRemoved, BaseName(path));
    return OkStatus();
  }

  Status RenameFile(const std::string& raw_from, const std::string& raw_to) override {
    KDM_RETURN_IF_ERROR(CheckPath(raw_from, "path"));
    KDM_RETURN_IF_ERROR(CheckPath(raw_to, "path"));
    const std::string from = Normalize(raw_from);
    const std::string to = Normalize(raw_to);
    const std::string what = "cannot rename " + raw_from + " to " + raw_to;
    kdm::MutexLock lock(&mu_);
    const Node* source = Find(from);
    if (!source) return ErrnoToStatus(ENOENT, what);
    KDM_RETURN_IF_ERROR(CheckParentLocked(to, what));
    const Node* target = Find(to);
    if (source->type == FileType::kDirectory) {
      // Directories: only onto nothing (enough for tests; POSIX allows an
      // empty directory too).
      if (target) return ErrnoToStatus(ENOTEMPTY, what);
      if (to.starts_with(from + "/")) return ErrnoToStatus(EINVAL, what);
      std::map<std::string, Node> moved;
      for (auto it = nodes_.lower_bound(from + "/");
           it != nodes_.end() && it->first.starts_with(from + "/");) {
        moved[to + it->first.substr(from.size())] = std::move(it->second);
        it = nodes_.erase(it);
      }
      moved[to] = std::move(nodes_[from]);
      nodes_.erase(from);
      nodes_.merge(moved);
    } else {
      if (target && target->type == FileType::kDirectory) return ErrnoToStatus(EISDIR, what);
      if (from == to) return OkStatus();
      Node node = std::move(nodes_[from]);
      nodes_.erase(from);
      nodes_[to] = std::move(node);
    }
    Notify(DirName(from), Kind::kMovedOut, BaseName(from));
    Notify(DirName(to), Kind::kMovedIn, BaseName(to));
    return OkStatus();
  }

  Status SyncDirectory(const std::string& raw) override {
    KDM_RETURN_IF_ERROR(CheckPath(raw, "directory"));
    kdm::MutexLock lock(&mu_);
    const Node* node = Find(Normalize(raw));
    if (!node) return ErrnoToStatus(ENOENT, "cannot open directory " + raw);
    if (node->type != FileType::kDirectory) {
      return ErrnoToStatus(ENOTDIR, "cannot open directory " + raw);
    }
    return OkStatus();
  }

  StatusOr<std::unique_ptr<DirectoryWatcher>> WatchDirectory(const std::string& raw) override {
    KDM_RETURN_IF_ERROR(CheckPath(raw, "directory"));
    const std::string dir = Normalize(raw);
    kdm::MutexLock lock(&mu_);
    const Node* node = Find(dir);
    if (!node) return ErrnoToStatus(ENOENT, "cannot watch " + raw);
    if (node->type != FileType::kDirectory) {
      return FailedPreconditionError("cannot watch " + raw + ": not a directory");
    }
    int ready_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ready_fd < 0) return ErrnoToStatus(errno, "cannot watch " + raw + ": eventfd");
    auto watcher = std::make_unique<MemoryDirectoryWatcher>(this, dir, ready_fd);
    watchers_.insert(watcher.get());
    return std::unique_ptr<DirectoryWatcher>(std::move(watcher));
  }

  StatusOr<std::string> ReadBootId() override {
    kdm::MutexLock lock(&mu_);
    return boot_id_;
  }

  bool ProcessExists(int64_t pid) override {
    kdm::MutexLock lock(&mu_);
    return live_pids_.count(pid) > 0;
  }

  void SetBootIdForTest(std::string boot_id) override {
    kdm::MutexLock lock(&mu_);
    boot_id_ = std::move(boot_id);
  }

  void SetLivePidsForTest(std::vector<int64_t> pids) override {
    kdm::MutexLock lock(&mu_);
    live_pids_ = std::set<int64_t>(pids.begin(), pids.end());
  }

  Status AddSocketForTest(const std::string& raw) override {
    KDM_RETURN_IF_ERROR(CheckPath(raw, "path"));
    const std::string path = Normalize(raw);
    kdm::MutexLock lock(&mu_);
    KDM_RETURN_IF_ERROR(CheckParentLocked(path, "cannot bind " + raw));
    if (Find(path)) return ErrnoToStatus(EADDRINUSE, "cannot bind " + raw);
    nodes_[path] = {FileType::kSocket, 0755, ""};
    Notify(DirName(path), Kind::kCreated, BaseName(path));
    return OkStatus();
  }

  Status WriteFileInPlaceForTest(const std::string& raw, std::string_view contents) override {
    KDM_RETURN_IF_ERROR(CheckPath(raw, "file"));
    const std::string path = Normalize(raw);
    kdm::MutexLock lock(&mu_);
    KDM_RETURN_IF_ERROR(CheckParentLocked(path, "cannot open " + raw));
    if (Status s = TakeInjectedFailureLocked(); !s.ok()) return s.WithPrefix("cannot write " + raw);
    Node* node = Find(path);
    if (node && node->type == FileType::kDirectory) {
      return ErrnoToStatus(EISDIR, "cannot open " + raw);
    }
    const std::string dir = DirName(path);
    const std::string name = BaseName(path);
    if (!node) {
      nodes_[path] = {FileType::kRegular, 0644, ""};
      node = &nodes_[path];
      Notify(dir, Kind::kCreated, name);
    }
    node->data = std::string(contents);
    Notify(dir, Kind::kChanged, name);
    Notify(dir, Kind::kWritten, name);
    return OkStatus();
  }

  void FailWritesForTest(int count, Status error) override {
    kdm::MutexLock lock(&mu_);
    failures_left_ = count;
    failure_ = std::move(error);
  }

  void Unregister(MemoryDirectoryWatcher* watcher) {
    kdm::MutexLock lock(&mu_);
    watchers_.erase(watcher);
  }

 private:
  struct Node {
    FileType type = FileType::kRegular;
    unsigned mode = 0644;
    std::string data;
  };

  // REQUIRES: mu_ held (these helpers touch nodes_).
  Node* Find(const std::string& path) {
    auto it = nodes_.find(path);
    return it == nodes_.end() ? nullptr : &it->second;
  }

  // The parent of `path` must be an existing directory, as for open(2).
  Status CheckParentLocked(const std::string& path, const std::string& what) {
    const Node* parent = Find(DirName(path));
    if (!parent) return ErrnoToStatus(ENOENT, what);
    if (parent->type != FileType::kDirectory) return ErrnoToStatus(ENOTDIR, what);
    return OkStatus();
  }

  Status TakeInjectedFailureLocked() {
    if (failures_left_ <= 0) return OkStatus();
    --failures_left_;
    return failure_;
  }

  std::string RandomSuffixLocked() {
    static constexpr char kChars[] =
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    std::uniform_int_distribution<size_t> pick(0, sizeof(kChars) - 2);
    std::string out;
    for (int i = 0; i < 6; ++i) out += kChars[pick(random_)];
    return out;
  }

  void Notify(const std::string& dir, Kind kind, const std::string& name) {
    for (MemoryDirectoryWatcher* w : watchers_) {
      if (w->dir() == dir) w->Push(kind, name);
    }
  }

  kdm::Mutex mu_;  // taken before a watcher's own lock
  std::map<std::string, Node> nodes_;
  std::set<MemoryDirectoryWatcher*> watchers_;
  std::string boot_id_ = "00000000-0000-4000-8000-000000000000";
  std::set<int64_t> live_pids_;
  int failures_left_ = 0;
  Status failure_;
  std::minstd_rand random_{12345};
};

MemoryDirectoryWatcher::~MemoryDirectoryWatcher() {
  env_->Unregister(this);
  ::close(ready_fd_);
}

}  // namespace

std::unique_ptr<MemoryEnv> NewMemoryEnv() { return std::make_unique<MemoryEnvImpl>(); }

}  // namespace kdm
