#include "kdm/conformance/runner.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <algorithm>
#include <iterator>
#include <latch>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "kdm/base/sync.h"
#include "kdm/conformance/registrar.h"
#include "kdm/conformance/validators.h"
// The wire layer's rules, the ones the device manager applies at
// registration too, so that `kdm conform` and `kdm kubelet` can never
// disagree.
#include "kdm/base/file_system.h"
#include "kdm/base/log_value.h"
#include "kdm/base/subprocess.h"
#include "kdm/pluginapi/api_rules.h"
#include "kdm/pluginapi/constants.h"
#include "kdm/pluginapi/grpc_status.h"
#include "kdm/pluginapi/unix_target.h"
#include "spdlog/spdlog.h"

namespace kdm::conformance {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kMaxFirstSnapshotBound{5'000};
constexpr int kConcurrentThreads = 8;
constexpr int kConcurrentCalls = 64;
constexpr int kDeterministicRepeats = 5;

struct Outcome {
  Verdict verdict;
  std::string reason;
};

Outcome Pass(std::string reason) { return {Verdict::kPass, std::move(reason)}; }
Outcome Fail(std::string reason) { return {Verdict::kFail, std::move(reason)}; }
Outcome Skip(std::string reason) { return {Verdict::kSkip, std::move(reason)}; }

std::string DurationText(milliseconds d) {
  if (d.count() >= 1000 && d.count() % 1000 == 0) return std::to_string(d.count() / 1000) + "s";
  return std::to_string(d.count()) + "ms";
}

milliseconds Since(Clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start);
}

std::chrono::system_clock::time_point DeadlineIn(milliseconds d) {
  return std::chrono::system_clock::now() + d;
}

// "<CODE>: <message>" of an RPC's outcome ("OK" for OK).
std::string GrpcText(const grpc::Status& s) { return pluginapi::FromGrpcStatus(s).ToString(); }

std::string Join(const std::vector<std::string>& ids) {
  std::string out;
  for (const std::string& id : ids) out += (out.empty() ? "" : ",") + id;
  return out;
}

template <typename Repeated>
std::vector<std::string> ToVector(const Repeated& r) {
  return std::vector<std::string>(r.begin(), r.end());
}

std::set<std::string> IdSet(const v1beta1::ListAndWatchResponse& m) {
  std::set<std::string> ids;
  for (const v1beta1::Device& d : m.devices()) ids.insert(d.id());
  return ids;
}

// Reads one ListAndWatch stream on its own thread and keeps every message.
// The destructor cancels the stream and joins the thread.
class StreamWatcher {
 public:
  StreamWatcher(v1beta1::DevicePlugin::Stub* stub, milliseconds deadline) {
    context_.set_deadline(DeadlineIn(deadline));
    thread_ = std::thread([this, stub] { Read(stub); });
  }
  ~StreamWatcher() {
    context_.TryCancel();
    thread_.join();
  }
  StreamWatcher(const StreamWatcher&) = delete;
  StreamWatcher& operator=(const StreamWatcher&) = delete;

  // Waits until `pred(messages)` holds or the stream ended or `bound`
  // passed; returns whether `pred` held.
  template <typename Pred>
  bool WaitUntil(Pred pred, milliseconds bound) {
    kdm::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return pred(messages_) || finished_.has_value();
    };
    mu_.AwaitWithTimeout(kdm::Condition(&done), absl::FromChrono(bound));
    return pred(messages_);
  }

  bool WaitForMessages(size_t n, milliseconds bound) {
    return WaitUntil([n](const auto& m) { return m.size() >= n; }, bound);
  }

  std::vector<v1beta1::ListAndWatchResponse> Messages() const {
    kdm::MutexLock lock(&mu_);
    return messages_;
  }

  // The stream's final status once it ended.
  std::optional<grpc::Status> Finished() const {
    kdm::MutexLock lock(&mu_);
    return finished_;
  }

 private:
  void Read(v1beta1::DevicePlugin::Stub* stub) {
    v1beta1::Empty empty;
    std::unique_ptr<grpc::ClientReader<v1beta1::ListAndWatchResponse>> reader =
        stub->ListAndWatch(&context_, empty);
    v1beta1::ListAndWatchResponse message;
    while (reader->Read(&message)) {
      kdm::MutexLock lock(&mu_);
      messages_.push_back(message);
    }
    grpc::Status status = reader->Finish();
    kdm::MutexLock lock(&mu_);
    finished_ = status;
  }

  grpc::ClientContext context_;
  mutable kdm::Mutex mu_;
  std::vector<v1beta1::ListAndWatchResponse> messages_ ABSL_GUARDED_BY(mu_);
  std::optional<grpc::Status> finished_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: starts after the members it uses exist
};

// One run: the plugin's connection, what was learned so far, and one method
// per check. Used by one thread.
class Session {
 public:
  explicit Session(const Runner::Options& options)
      : options_(options),
        first_snapshot_bound_(std::min(options.timeout, kMaxFirstSnapshotBound)) {}

  ~Session() {
    stream1_.reset();
    if (registrar_) registrar_->Stop();
  }

  Status Setup();
  Report RunChecks();

 private:
  using CheckFn = Outcome (Session::*)();

  // --- prerequisites: nullopt when met, else the SKIP outcome ---
  std::optional<Outcome> NeedRegistration() const;
  std::optional<Outcome> NeedSocket() const;
  std::optional<Outcome> NeedDevices();
  std::optional<Outcome> NeedOptions();
  std::optional<Outcome> NeedAllocateAnswer();
  std::optional<Outcome> NeedPreferred();
  std::optional<Outcome> NeedHealthTrigger() const;
  // True when the check `id` ran in this session and failed.
  bool Failed(std::string_view id) const {
    auto it = verdicts_.find(id);
    return it != verdicts_.end() && it->second == Verdict::kFail;
  }

  // Runs --health-trigger for `id`; nullopt when it exited 0, else the FAIL.
  std::optional<Outcome> RunHealthTrigger(const std::string& id);
  // Waits until a message of `stream` after its first `seen` ones lists `id`
  // as Unhealthy; false after `options_.timeout`.
  bool WaitForUnhealthy(StreamWatcher& stream, size_t seen, const std::string& id);
  // `id` is no longer offered to the checks that need a healthy device.
  void ForgetHealthy(const std::string& id);

  void EnsureOptions();
  void EnsureSnapshot();
  void EnsureFirstAllocate();
  std::vector<v1beta1::ListAndWatchResponse> Stream1Messages() const;

  grpc::Status Allocate(const std::vector<std::string>& ids, v1beta1::AllocateResponse* out);
  grpc::Status Preferred(const std::vector<std::string>& available,
                         const std::vector<std::string>& must_include, int size,
                         v1beta1::ContainerPreferredAllocationResponse* out);
  // Runs Preferred and turns an error or a missing container response into
  // a FAIL outcome.
  std::optional<Outcome> AskPreferred(const std::vector<std::string>& available,
                                      const std::vector<std::string>& must_include, int size,
                                      std::vector<std::string>* answer);

  // --- checks, in catalogue order ---
  Outcome RegVersion();
  Outcome RegResourceName();
  Outcome RegEndpoint();
  Outcome RegOptionsMatch();
  Outcome LwFirstSnapshot();
  Outcome LwIds();
  Outcome LwHealth();
  Outcome LwNuma();
  Outcome HealthTrigger();
  Outcome LwFullSnapshots();
  Outcome AllocOneResponse();
  Outcome AllocUnknownId();
  Outcome AllocPaths();
  Outcome AllocPermissions();
  Outcome AllocEnvNames();
  Outcome AllocCdiNames();
  Outcome AllocConcurrent();
  Outcome PrefSize();
  Outcome PrefSubset();
  Outcome PrefMustInclude();
  Outcome PrefNoDuplicates();
  Outcome PrefDeterministic();
  Outcome PrefDeadline();
  Outcome PrestartAnswered();
  Outcome LwStreamDrop();
  Outcome HealthReconnect();
  Outcome RegRestart();

  static const std::map<std::string, CheckFn, std::less<>>& Checks();

  const Runner::Options options_;
  const milliseconds first_snapshot_bound_;

  // Registration mode only.
  std::string plugin_dir_;
  std::unique_ptr<Registrar> registrar_;
  std::optional<v1beta1::RegisterRequest> registration_;

  // Why the plugin's socket cannot be used (empty: it can).
  std::string endpoint_error_;
  std::string socket_path_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub_;

  bool options_tried_ = false;
  grpc::Status options_status_;
  v1beta1::DevicePluginOptions plugin_options_;

  bool snapshot_tried_ = false;
  Outcome snapshot_outcome_ = Skip("not run");
  std::unique_ptr<StreamWatcher> stream1_;
  std::vector<v1beta1::ListAndWatchResponse> stream1_final_;  // once stream1_ is gone
  std::optional<v1beta1::ListAndWatchResponse> first_snapshot_;
  std::vector<std::string> ids_;          // unique ids of the first snapshot, in order
  std::vector<std::string> healthy_ids_;  // those of them that are "Healthy"

  // The verdict of every check run so far (a later check can need an
  // earlier one to have passed).
  std::map<std::string, Verdict, std::less<>> verdicts_;

  bool allocate_tried_ = false;
  std::vector<std::string> allocate_ids_;
  grpc::Status allocate_status_;
  v1beta1::AllocateResponse allocate_answer_;
};

const std::map<std::string, Session::CheckFn, std::less<>>& Session::Checks() {
  static const std::map<std::string, CheckFn, std::less<>> kChecks = {
      {"reg.version", &Session::RegVersion},
      {"reg.resource-name", &Session::RegResourceName},
      {"reg.endpoint", &Session::RegEndpoint},
      {"reg.options-match", &Session::RegOptionsMatch},
      {"lw.first-snapshot", &Session::LwFirstSnapshot},
      {"lw.ids", &Session::LwIds},
      {"lw.health", &Session::LwHealth},
      {"lw.numa", &Session::LwNuma},
      {"health.trigger", &Session::HealthTrigger},
      {"lw.full-snapshots", &Session::LwFullSnapshots},
      {"alloc.one-response", &Session::AllocOneResponse},
      {"alloc.unknown-id", &Session::AllocUnknownId},
      {"alloc.paths", &Session::AllocPaths},
      {"alloc.permissions", &Session::AllocPermissions},
      {"alloc.env-names", &Session::AllocEnvNames},
      {"alloc.cdi-names", &Session::AllocCdiNames},
      {"alloc.concurrent", &Session::AllocConcurrent},
      {"pref.size", &Session::PrefSize},
      {"pref.subset", &Session::PrefSubset},
      {"pref.must-include", &Session::PrefMustInclude},
      {"pref.no-duplicates", &Session::PrefNoDuplicates},
      {"pref.deterministic", &Session::PrefDeterministic},
      {"pref.deadline", &Session::PrefDeadline},
      {"prestart.answered", &Session::PrestartAnswered},
      {"health.reconnect", &Session::HealthReconnect},
      {"lw.stream-drop", &Session::LwStreamDrop},
      {"reg.restart", &Session::RegRestart},
  };
  return kChecks;
}

// --- setup -----------------------------------------------------------------

Status Session::Setup() {
  if (!options_.root.empty()) {
    plugin_dir_ = JoinPath(options_.root, "device-plugins");
    KDM_ASSIGN_OR_RETURN(registrar_, Registrar::Start(plugin_dir_));
    spdlog::info("event=waiting_for_registration socket={} timeout={}", registrar_->socket_path(),
                 DurationText(options_.timeout));
    if (!registrar_->WaitForCount(1, options_.timeout)) {
      return DeadlineExceededError("no plugin registered on " + registrar_->socket_path() +
                                   " within " + DurationText(options_.timeout));
    }
    registration_ = registrar_->Registrations().front().request;
    const std::string& endpoint = registration_->endpoint();
    struct stat st;
    std::string candidate = JoinPath(plugin_dir_, endpoint);
    StatusOr<std::string> socket = pluginapi::CheckPluginEndpoint(plugin_dir_, endpoint);
    if (!socket.ok()) {
      endpoint_error_ = socket.status().message();
    } else if (::lstat(candidate.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      endpoint_error_ = "invalid endpoint \"" + endpoint + "\": is a symlink";
    } else {
      socket_path_ = *socket;
    }
    if (!endpoint_error_.empty()) {
      spdlog::warn("event=endpoint_unusable endpoint=\"{}\" error=\"{}\"", endpoint,
                   endpoint_error_);
      return OkStatus();
    }
  } else {
    StatusOr<std::string> abs = pluginapi::AbsoluteSocketPath(options_.plugin_socket);
    if (!abs.ok()) return abs.status().WithPrefix("plugin socket");
    socket_path_ = *abs;
    struct stat st;
    if (::stat(socket_path_.c_str(), &st) != 0) {
      return UnavailableError("cannot dial " + socket_path_ + ": no such file");
    }
    if (!S_ISSOCK(st.st_mode)) {
      return UnavailableError("cannot dial " + socket_path_ + ": not a unix socket");
    }
  }
  KDM_ASSIGN_OR_RETURN(std::string target, pluginapi::UnixSocketTarget(socket_path_));
  channel_ = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  stub_ = v1beta1::DevicePlugin::NewStub(channel_);
  if (registrar_ == nullptr && !channel_->WaitForConnected(DeadlineIn(options_.timeout))) {
    return UnavailableError("cannot dial " + socket_path_ + " within " +
                            DurationText(options_.timeout));
  }
  return OkStatus();
}

Report Session::RunChecks() {
  std::set<std::string, std::less<>> only(options_.only.begin(), options_.only.end());
  Report report;
  for (const CheckInfo& info : Catalogue()) {
    if (!only.empty() && !only.contains(info.id)) continue;
    auto fn = Checks().find(info.id);
    Clock::time_point start = Clock::now();
    Outcome o = fn == Checks().end() ? Skip("not implemented") : (this->*(fn->second))();
    verdicts_[info.id] = o.verdict;
    CheckResult r{info, o.verdict, std::move(o.reason), Since(start)};
    spdlog::info("event=check id={} verdict={} duration={}ms", r.info.id, VerdictName(r.verdict),
                 r.duration.count());
    report.results.push_back(std::move(r));
  }
  return report;
}

// --- prerequisites ---------------------------------------------------------

std::optional<Outcome> Session::NeedRegistration() const {
  if (!registration_) return Skip("no registration: --plugin-socket");
  return std::nullopt;
}

std::optional<Outcome> Session::NeedSocket() const {
  if (!endpoint_error_.empty()) return Skip("endpoint unusable: " + endpoint_error_);
  return std::nullopt;
}

std::optional<Outcome> Session::NeedDevices() {
  if (auto skip = NeedSocket()) return skip;
  EnsureSnapshot();
  if (!first_snapshot_) return Skip("needs a device list: lw.first-snapshot did not pass");
  if (healthy_ids_.empty()) return Skip("needs a healthy device: the first snapshot has none");
  return std::nullopt;
}

std::optional<Outcome> Session::NeedOptions() {
  EnsureOptions();
  if (!options_status_.ok()) {
    return Skip("needs the plugin's options: GetDevicePluginOptions failed: " +
                GrpcText(options_status_));
  }
  return std::nullopt;
}

std::optional<Outcome> Session::NeedAllocateAnswer() {
  if (auto skip = NeedDevices()) return skip;
  EnsureFirstAllocate();
  if (!allocate_status_.ok() || allocate_answer_.container_responses_size() == 0) {
    return Skip("needs an Allocate answer: alloc.one-response did not pass");
  }
  return std::nullopt;
}

std::optional<Outcome> Session::NeedPreferred() {
  if (auto skip = NeedDevices()) return skip;
  if (auto skip = NeedOptions()) return skip;
  if (!plugin_options_.get_preferred_allocation_available()) {
    return Skip("not offered: get_preferred_allocation_available is false");
  }
  return std::nullopt;
}

void Session::EnsureOptions() {
  if (options_tried_) return;
  options_tried_ = true;
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(options_.timeout));
  options_status_ = stub_->GetDevicePluginOptions(&ctx, v1beta1::Empty(), &plugin_options_);
}

void Session::EnsureSnapshot() {
  if (snapshot_tried_) return;
  snapshot_tried_ = true;
  Clock::time_point start = Clock::now();
  // Stream 1 lives through lw.full-snapshots: the first message, the
  // observation window, stream 2's first message and a catch-up wait.
  // With a health trigger it also lives through health.trigger: the
  // trigger's run and the wait for its report.
  const milliseconds trigger_time =
      options_.health_trigger.empty() ? milliseconds(0) : 2 * options_.timeout;
  stream1_ = std::make_unique<StreamWatcher>(
      stub_.get(),
      3 * first_snapshot_bound_ + options_.snapshot_window + options_.timeout + trigger_time);
  if (!stream1_->WaitForMessages(1, first_snapshot_bound_)) {
    std::optional<grpc::Status> end = stream1_->Finished();
    snapshot_outcome_ =
        end ? Fail("ListAndWatch ended before its first message: " + GrpcText(*end))
            : Fail("no ListAndWatch message within " + DurationText(first_snapshot_bound_));
    return;
  }
  v1beta1::ListAndWatchResponse first = stream1_->Messages().front();
  if (first.devices_size() == 0) {
    snapshot_outcome_ = Fail("the first ListAndWatch message lists no device");
    return;
  }
  std::set<std::string> seen;
  for (const v1beta1::Device& d : first.devices()) {
    if (d.id().empty() || !seen.insert(d.id()).second) continue;
    ids_.push_back(d.id());
    if (d.health() == pluginapi::kHealthy) healthy_ids_.push_back(d.id());
  }
  first_snapshot_ = first;
  snapshot_outcome_ =
      Pass(std::to_string(first.devices_size()) + " devices (" +
           std::to_string(healthy_ids_.size()) + " healthy) after " + DurationText(Since(start)));
}

std::vector<v1beta1::ListAndWatchResponse> Session::Stream1Messages() const {
  return stream1_ ? stream1_->Messages() : stream1_final_;
}

void Session::EnsureFirstAllocate() {
  if (allocate_tried_) return;
  allocate_tried_ = true;
  allocate_ids_.assign(healthy_ids_.begin(),
                       healthy_ids_.begin() + std::min<size_t>(2, healthy_ids_.size()));
  allocate_status_ = Allocate(allocate_ids_, &allocate_answer_);
}

grpc::Status Session::Allocate(const std::vector<std::string>& ids,
                               v1beta1::AllocateResponse* out) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(options_.timeout));
  v1beta1::AllocateRequest request;
  v1beta1::ContainerAllocateRequest* c = request.add_container_requests();
  for (const std::string& id : ids) c->add_devices_ids(id);
  return stub_->Allocate(&ctx, request, out);
}

grpc::Status Session::Preferred(const std::vector<std::string>& available,
                                const std::vector<std::string>& must_include, int size,
                                v1beta1::ContainerPreferredAllocationResponse* out) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(options_.timeout));
  v1beta1::PreferredAllocationRequest request;
  v1beta1::ContainerPreferredAllocationRequest* c = request.add_container_requests();
  for (const std::string& id : available) c->add_available_deviceids(id);
  for (const std::string& id : must_include) c->add_must_include_deviceids(id);
  c->set_allocation_size(size);
  v1beta1::PreferredAllocationResponse response;
  grpc::Status s = stub_->GetPreferredAllocation(&ctx, request, &response);
  if (s.ok() && response.container_responses_size() == 0) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "the answer has no container response");
  }
  if (s.ok()) *out = response.container_responses(0);
  return s;
}

std::optional<Outcome> Session::AskPreferred(const std::vector<std::string>& available,
                                             const std::vector<std::string>& must_include, int size,
                                             std::vector<std::string>* answer) {
  v1beta1::ContainerPreferredAllocationResponse r;
  grpc::Status s = Preferred(available, must_include, size, &r);
  if (!s.ok()) {
    return Fail("GetPreferredAllocation(size " + std::to_string(size) + ") failed: " + GrpcText(s));
  }
  *answer = ToVector(r.deviceids());
  return std::nullopt;
}

// --- registration ----------------------------------------------------------

Outcome Session::RegVersion() {
  if (auto skip = NeedRegistration()) return *skip;
  Status s = pluginapi::ValidateVersion(registration_->version());
  if (!s.ok()) return Fail(s.message());
  return Pass("version \"" + registration_->version() + "\"");
}

Outcome Session::RegResourceName() {
  if (auto skip = NeedRegistration()) return *skip;
  const std::string& name = registration_->resource_name();
  Status s = pluginapi::ValidateResourceName(name);
  if (!s.ok()) return Fail(s.message());
  if (name != options_.resource) {
    return Fail("registered \"" + name + "\", expected --resource \"" + options_.resource + "\"");
  }
  return Pass("\"" + name + "\"");
}

Outcome Session::RegEndpoint() {
  if (auto skip = NeedRegistration()) return *skip;
  if (!endpoint_error_.empty()) return Fail(endpoint_error_);
  return Pass("\"" + registration_->endpoint() + "\" is a unix socket in " + plugin_dir_);
}

Outcome Session::RegOptionsMatch() {
  if (auto skip = NeedRegistration()) return *skip;
  if (auto skip = NeedSocket()) return *skip;
  EnsureOptions();
  if (!options_status_.ok()) {
    return Fail("GetDevicePluginOptions failed: " + GrpcText(options_status_));
  }
  const v1beta1::DevicePluginOptions& reg = registration_->options();
  const v1beta1::DevicePluginOptions& got = plugin_options_;
  auto b = [](bool v) { return std::string(v ? "true" : "false"); };
  std::string diff;
  if (reg.pre_start_required() != got.pre_start_required()) {
    diff += "pre_start_required: RegisterRequest " + b(reg.pre_start_required()) +
            ", GetDevicePluginOptions " + b(got.pre_start_required());
  }
  if (reg.get_preferred_allocation_available() != got.get_preferred_allocation_available()) {
    diff += std::string(diff.empty() ? "" : "; ") +
            "get_preferred_allocation_available: RegisterRequest " +
            b(reg.get_preferred_allocation_available()) + ", GetDevicePluginOptions " +
            b(got.get_preferred_allocation_available());
  }
  if (!diff.empty()) return Fail(diff);
  return Pass("pre_start_required=" + b(got.pre_start_required()) +
              " get_preferred_allocation_available=" + b(got.get_preferred_allocation_available()));
}

Outcome Session::RegRestart() {
  if (auto skip = NeedRegistration()) return *skip;
  size_t before = registrar_->Registrations().size();
  Clock::time_point start = Clock::now();
  if (Status s = registrar_->Restart(); !s.ok()) {
    return Skip("could not recreate kubelet.sock: " + s.message());
  }
  if (!registrar_->WaitForCount(before + 1, options_.timeout)) {
    return Fail("no new Register within " + DurationText(options_.timeout) +
                " after kubelet.sock was removed and created again");
  }
  return Pass("registered again " + DurationText(Since(start)) +
              " after kubelet.sock was created again");
}

// --- ListAndWatch ----------------------------------------------------------

Outcome Session::LwFirstSnapshot() {
  if (auto skip = NeedSocket()) return *skip;
  EnsureSnapshot();
  return snapshot_outcome_;
}

Outcome Session::LwIds() {
  if (auto skip = NeedSocket()) return *skip;
  EnsureSnapshot();
  if (!first_snapshot_) return Skip("needs a device list: lw.first-snapshot did not pass");
  std::vector<v1beta1::ListAndWatchResponse> messages = Stream1Messages();
  size_t devices = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    std::vector<std::string> ids;
    for (const v1beta1::Device& d : messages[i].devices()) ids.push_back(d.id());
    devices += ids.size();
    if (Status s = CheckDeviceIds(ids); !s.ok()) {
      return Fail("message " + std::to_string(i + 1) + ": " + s.message());
    }
  }
  return Pass(std::to_string(devices) + " ids in " + std::to_string(messages.size()) + " messages");
}

Outcome Session::LwHealth() {
  if (auto skip = NeedSocket()) return *skip;
  EnsureSnapshot();
  if (!first_snapshot_) return Skip("needs a device list: lw.first-snapshot did not pass");
  std::vector<v1beta1::ListAndWatchResponse> messages = Stream1Messages();
  for (size_t i = 0; i < messages.size(); ++i) {
    for (const v1beta1::Device& d : messages[i].devices()) {
      if (Status s = CheckHealth(d.health()); !s.ok()) {
        return Fail("message " + std::to_string(i + 1) + ", device \"" + d.id() +
                    "\": " + s.message());
      }
    }
  }
  return Pass("every health is \"Healthy\" or \"Unhealthy\" in " + std::to_string(messages.size()) +
              " messages");
}

Outcome Session::LwNuma() {
  if (auto skip = NeedSocket()) return *skip;
  EnsureSnapshot();
  if (!first_snapshot_) return Skip("needs a device list: lw.first-snapshot did not pass");
  std::vector<v1beta1::ListAndWatchResponse> messages = Stream1Messages();
  size_t nodes = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    for (const v1beta1::Device& d : messages[i].devices()) {
      for (const v1beta1::NUMANode& n : d.topology().nodes()) {
        ++nodes;
        if (Status s = CheckNumaNode(n.id()); !s.ok()) {
          return Fail("message " + std::to_string(i + 1) + ", device \"" + d.id() +
                      "\": " + s.message());
        }
      }
    }
  }
  return Pass(std::to_string(nodes) + " NUMA node ids, none negative");
}

Outcome Session::LwFullSnapshots() {
  if (auto skip = NeedSocket()) return *skip;
  EnsureSnapshot();
  if (!first_snapshot_ || !stream1_) {
    return Skip("needs a device list: lw.first-snapshot did not pass");
  }
  // Watch stream 1 for the window; a stream that ends early ends the window.
  stream1_->WaitUntil([](const auto&) { return false; }, options_.snapshot_window);
  std::optional<v1beta1::ListAndWatchResponse> second;
  {
    StreamWatcher stream2(stub_.get(), 2 * first_snapshot_bound_);
    if (!stream2.WaitForMessages(1, first_snapshot_bound_)) {
      std::optional<grpc::Status> end = stream2.Finished();
      return Fail(end ? "a second ListAndWatch stream ended before its first message: " +
                            GrpcText(*end)
                      : "a second ListAndWatch stream sent nothing within " +
                            DurationText(first_snapshot_bound_));
    }
    second = stream2.Messages().front();
  }
  const std::set<std::string> full = IdSet(*second);
  // A later message on stream 1 that lists a strict subset of the first
  // while the new stream still lists the missing devices is a delta.
  auto delta =
      [&](const std::vector<v1beta1::ListAndWatchResponse>& messages) -> std::optional<Outcome> {
    const std::set<std::string> first = IdSet(messages.front());
    for (size_t i = 1; i < messages.size(); ++i) {
      std::set<std::string> ids = IdSet(messages[i]);
      if (ids.size() >= first.size()) continue;
      if (!std::includes(first.begin(), first.end(), ids.begin(), ids.end())) continue;
      std::vector<std::string> missing;
      std::set_difference(first.begin(), first.end(), ids.begin(), ids.end(),
                          std::back_inserter(missing));
      if (std::includes(full.begin(), full.end(), missing.begin(), missing.end())) {
        return Fail("message " + std::to_string(i + 1) + " of stream 1 lists " +
                    std::to_string(ids.size()) + " of " + std::to_string(first.size()) +
                    " devices while a new stream still lists the others (a delta, not a full "
                    "snapshot)");
      }
    }
    return std::nullopt;
  };
  if (auto fail = delta(stream1_->Messages())) {
    stream1_final_ = stream1_->Messages();
    stream1_.reset();
    return *fail;
  }
  // Stream 1 may lag behind stream 2 by a message in flight: give it the
  // bound to show the same devices.
  bool caught_up = stream1_->WaitUntil(
      [&](const std::vector<v1beta1::ListAndWatchResponse>& m) {
        return !m.empty() && IdSet(m.back()) == full;
      },
      first_snapshot_bound_);
  std::vector<v1beta1::ListAndWatchResponse> messages = stream1_->Messages();
  stream1_final_ = messages;
  stream1_.reset();
  if (auto fail = delta(messages)) return *fail;
  if (!caught_up) {
    return Fail("stream 1's newest message lists " + std::to_string(IdSet(messages.back()).size()) +
                " devices, a new stream's first snapshot " + std::to_string(full.size()));
  }
  return Pass(std::to_string(messages.size()) + " messages on stream 1 in " +
              DurationText(options_.snapshot_window) + ", each a full snapshot of " +
              std::to_string(full.size()) + " devices");
}

Outcome Session::LwStreamDrop() {
  if (auto skip = NeedDevices()) return *skip;
  const int n = options_.stream_drop_iterations;
  for (int i = 0; i < n; ++i) {
    StreamWatcher stream(stub_.get(), options_.timeout);
    if (!stream.WaitForMessages(1, first_snapshot_bound_)) {
      std::optional<grpc::Status> end = stream.Finished();
      return Fail("stream " + std::to_string(i + 1) + " of " + std::to_string(n) +
                  (end ? " ended before its first message: " + GrpcText(*end)
                       : " sent nothing within " + DurationText(first_snapshot_bound_)));
    }
  }  // each stream is cancelled as it goes out of scope
  StreamWatcher fresh(stub_.get(), options_.timeout);
  bool got = fresh.WaitUntil(
      [](const std::vector<v1beta1::ListAndWatchResponse>& m) {
        return !m.empty() && m.front().devices_size() > 0;
      },
      first_snapshot_bound_);
  if (!got) {
    std::optional<grpc::Status> end = fresh.Finished();
    return Fail("after " + std::to_string(n) + " cancelled streams a new stream " +
                (end ? "ended: " + GrpcText(*end) : "sent no snapshot"));
  }
  v1beta1::AllocateResponse answer;
  grpc::Status s = Allocate({healthy_ids_.front()}, &answer);
  if (!s.ok()) {
    return Fail("after " + std::to_string(n) +
                " cancelled streams Allocate failed: " + GrpcText(s));
  }
  return Pass(std::to_string(n) + " streams cancelled; a new stream and Allocate still work");
}

// --- health ----------------------------------------------------------------

std::optional<Outcome> Session::NeedHealthTrigger() const {
  if (options_.health_trigger.empty()) {
    return Skip("needs --health-trigger CMD (a command that makes a device unhealthy)");
  }
  return std::nullopt;
}

std::optional<Outcome> Session::RunHealthTrigger(const std::string& id) {
  SubprocessOptions o;
  o.argv = {"/bin/sh", "-c", options_.health_trigger + " \"$@\"", "kdm-health-trigger", id};
  o.extra_env = {{"KDM_DEVICE_ID", id}, {"KDM_RESOURCE", options_.resource}};
  o.timeout = options_.timeout;
  o.max_output_bytes = 4096;
  Clock::time_point start = Clock::now();
  StatusOr<SubprocessResult> r = RunSubprocess(o);
  if (!r.ok())
    return Fail("--health-trigger for " + id + " could not run: " + r.status().message());
  spdlog::debug("event=health_trigger_ran device={} result={} took_ms={}", QuoteLogValue(id),
                QuoteLogValue(r->Describe()), Since(start).count());
  if (!r->ok()) {
    std::string what =
        r->timed_out ? "ran past --timeout " + DurationText(options_.timeout) + " and was killed"
                     : r->Describe();
    return Fail("--health-trigger for " + id + " " + what);
  }
  return std::nullopt;
}

bool Session::WaitForUnhealthy(StreamWatcher& stream, size_t seen, const std::string& id) {
  return stream.WaitUntil(
      [&](const std::vector<v1beta1::ListAndWatchResponse>& messages) {
        for (size_t i = seen; i < messages.size(); ++i) {
          for (const v1beta1::Device& d : messages[i].devices()) {
            if (d.id() == id && d.health() == pluginapi::kUnhealthy) return true;
          }
        }
        return false;
      },
      options_.timeout);
}

void Session::ForgetHealthy(const std::string& id) {
  healthy_ids_.erase(std::remove(healthy_ids_.begin(), healthy_ids_.end(), id), healthy_ids_.end());
}

// On stream 1, open since lw.first-snapshot: the stream a kubelet keeps.
// The device is the last healthy one; at least one other stays healthy for
// the checks that follow.
Outcome Session::HealthTrigger() {
  if (auto skip = NeedHealthTrigger()) return *skip;
  if (auto skip = NeedDevices()) return *skip;
  if (!stream1_) return Skip("needs the first stream: lw.first-snapshot did not pass");
  if (healthy_ids_.size() < 2) {
    return Skip("needs 2 healthy devices (one stays healthy for the other checks)");
  }
  const std::string id = healthy_ids_.back();
  const size_t seen = stream1_->Messages().size();
  Clock::time_point start = Clock::now();
  std::optional<Outcome> failed = RunHealthTrigger(id);
  ForgetHealthy(id);
  if (failed) return *failed;
  if (!WaitForUnhealthy(*stream1_, seen, id)) {
    std::optional<grpc::Status> end = stream1_->Finished();
    return Fail(id + " was not reported Unhealthy on the open stream within " +
                DurationText(options_.timeout) + " of the trigger" +
                (end ? " (the stream ended: " + GrpcText(*end) + ")" : ""));
  }
  return Pass(id + " reported Unhealthy on the open stream " + DurationText(Since(start)) +
              " after the trigger");
}

// A kubelet that restarts (or whose stream breaks) cancels its stream and
// opens a new one; a plugin whose cancelled streams linger and take health
// events (NVIDIA's v0.13 did) loses those events. Up to two devices, the
// last healthy ones, one at a time.
Outcome Session::HealthReconnect() {
  if (auto skip = NeedHealthTrigger()) return *skip;
  if (auto skip = NeedDevices()) return *skip;
  if (Failed("health.trigger")) {
    return Skip("needs a plugin that reports health changes: health.trigger did not pass");
  }
  if (Failed("lw.stream-drop")) {
    return Skip("needs new streams after cancelled ones: lw.stream-drop did not pass");
  }
  std::vector<std::string> targets;
  for (size_t i = healthy_ids_.size(); i > 0 && targets.size() < 2; --i) {
    targets.push_back(healthy_ids_[i - 1]);
  }
  if (targets.empty()) return Skip("needs a healthy device: none is left");
  const int n = options_.health_reconnects;
  for (int i = 0; i < n; ++i) {
    StreamWatcher stream(stub_.get(), options_.timeout);
    if (!stream.WaitForMessages(1, first_snapshot_bound_)) {
      return Fail("stream " + std::to_string(i + 1) + " of " + std::to_string(n) +
                  " sent nothing within " + DurationText(first_snapshot_bound_));
    }
  }  // each stream is cancelled as it goes out of scope
  const std::string after = "the stream opened after " + std::to_string(n) + " cancelled streams";
  StreamWatcher fresh(stub_.get(), first_snapshot_bound_ + 4 * options_.timeout);
  if (!fresh.WaitForMessages(1, first_snapshot_bound_)) {
    return Fail(after + " sent nothing within " + DurationText(first_snapshot_bound_));
  }
  int reached = 0;
  std::string missed;
  for (const std::string& id : targets) {
    const size_t seen = fresh.Messages().size();
    std::optional<Outcome> failed = RunHealthTrigger(id);
    ForgetHealthy(id);
    if (failed) return *failed;
    if (WaitForUnhealthy(fresh, seen, id)) {
      ++reached;
    } else if (missed.empty()) {
      missed = id;
    }
  }
  const std::string count = std::to_string(reached) + " of " + std::to_string(targets.size()) +
                            " health changes reached " + after;
  if (reached < static_cast<int>(targets.size())) {
    return Fail(count + " (" + missed + " was not reported Unhealthy within " +
                DurationText(options_.timeout) +
                " of its trigger: a cancelled stream may have taken it)");
  }
  return Pass(count);
}

// --- Allocate --------------------------------------------------------------

Outcome Session::AllocOneResponse() {
  if (auto skip = NeedDevices()) return *skip;
  EnsureFirstAllocate();
  std::string call = "Allocate([" + Join(allocate_ids_) + "])";
  if (!allocate_status_.ok()) return Fail(call + " failed: " + GrpcText(allocate_status_));
  int n = allocate_answer_.container_responses_size();
  if (n != 1) {
    return Fail(call + " answered " + std::to_string(n) +
                " container responses for one container request");
  }
  return Pass(call + " answered one container response");
}

Outcome Session::AllocUnknownId() {
  if (auto skip = NeedDevices()) return *skip;
  std::string unknown = "kdm-conform-unknown";
  while (std::find(ids_.begin(), ids_.end(), unknown) != ids_.end()) unknown += "-x";
  v1beta1::AllocateResponse answer;
  grpc::Status s = Allocate({unknown}, &answer);
  if (s.ok()) return Fail("Allocate([" + unknown + "]) answered OK for an id never listed");
  return Pass("Allocate([" + unknown + "]) refused: " + GrpcText(s));
}

Outcome Session::AllocPaths() {
  if (auto skip = NeedAllocateAnswer()) return *skip;
  int specs = 0, mounts = 0;
  for (const v1beta1::ContainerAllocateResponse& c : allocate_answer_.container_responses()) {
    for (const v1beta1::DeviceSpec& d : c.devices()) {
      ++specs;
      if (Status s = CheckAbsolutePath(d.container_path(), "device spec container_path"); !s.ok()) {
        return Fail(s.message());
      }
      if (Status s = CheckAbsolutePath(d.host_path(), "device spec host_path"); !s.ok()) {
        return Fail(s.message());
      }
    }
    for (const v1beta1::Mount& m : c.mounts()) {
      ++mounts;
      if (Status s = CheckAbsolutePath(m.container_path(), "mount container_path"); !s.ok()) {
        return Fail(s.message());
      }
      if (Status s = CheckAbsolutePath(m.host_path(), "mount host_path"); !s.ok()) {
        return Fail(s.message());
      }
    }
  }
  return Pass(std::to_string(specs) + " device specs and " + std::to_string(mounts) +
              " mounts, every path absolute");
}

Outcome Session::AllocPermissions() {
  if (auto skip = NeedAllocateAnswer()) return *skip;
  int specs = 0;
  for (const v1beta1::ContainerAllocateResponse& c : allocate_answer_.container_responses()) {
    for (const v1beta1::DeviceSpec& d : c.devices()) {
      ++specs;
      if (Status s = CheckPermissions(d.permissions()); !s.ok()) {
        return Fail("device " + d.host_path() + ": " + s.message());
      }
    }
  }
  return Pass(std::to_string(specs) + " device specs, permissions within \"rwm\"");
}

Outcome Session::AllocEnvNames() {
  if (auto skip = NeedAllocateAnswer()) return *skip;
  int envs = 0;
  for (const v1beta1::ContainerAllocateResponse& c : allocate_answer_.container_responses()) {
    for (const auto& [name, value] : c.envs()) {
      ++envs;
      if (Status s = CheckEnvName(name); !s.ok()) return Fail(s.message());
    }
  }
  return Pass(std::to_string(envs) + " env names, all valid");
}

Outcome Session::AllocCdiNames() {
  if (auto skip = NeedAllocateAnswer()) return *skip;
  int names = 0;
  for (const v1beta1::ContainerAllocateResponse& c : allocate_answer_.container_responses()) {
    for (const v1beta1::CDIDevice& d : c.cdi_devices()) {
      ++names;
      if (Status s = CheckCdiName(d.name()); !s.ok()) return Fail(s.message());
    }
  }
  if (names == 0) return Pass("no CDI devices answered");
  return Pass(std::to_string(names) + " CDI device names, all fully qualified");
}

Outcome Session::AllocConcurrent() {
  if (auto skip = NeedDevices()) return *skip;
  // One request per device (at most kConcurrentThreads distinct ones), each
  // answered once sequentially first: the reference for the concurrent calls.
  size_t distinct = std::min<size_t>(kConcurrentThreads, healthy_ids_.size());
  std::vector<v1beta1::AllocateResponse> expected(distinct);
  for (size_t i = 0; i < distinct; ++i) {
    v1beta1::AllocateResponse answer;
    grpc::Status s = Allocate({healthy_ids_[i]}, &answer);
    if (!s.ok() || answer.container_responses_size() == 0) {
      // Not a concurrency problem: alloc.one-response judges it.
      return Skip("needs a sequential answer: Allocate([" + healthy_ids_[i] + "]) " +
                  (s.ok() ? "answered no container response" : "failed: " + GrpcText(s)));
    }
    expected[i] = answer;
  }
  kdm::Mutex mu;
  int failures = 0;
  std::string first_failure;
  std::latch start(kConcurrentThreads);
  std::vector<std::thread> threads;
  constexpr int kPerThread = kConcurrentCalls / kConcurrentThreads;
  for (int t = 0; t < kConcurrentThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();  // every thread calls at once
      for (int i = 0; i < kPerThread; ++i) {
        size_t k = static_cast<size_t>(t * kPerThread + i) % distinct;
        const std::string& id = healthy_ids_[k];
        v1beta1::AllocateResponse answer;
        grpc::Status s = Allocate({id}, &answer);
        std::string problem;
        if (!s.ok()) {
          problem = "failed: " + GrpcText(s);
        } else if (answer.container_responses_size() != expected[k].container_responses_size()) {
          problem = "answered " + std::to_string(answer.container_responses_size()) +
                    " container responses, the sequential call " +
                    std::to_string(expected[k].container_responses_size());
        } else {
          const auto& got = answer.container_responses(0).envs();
          const auto& want = expected[k].container_responses(0).envs();
          bool same = got.size() == want.size();
          for (const auto& [name, value] : want) {
            auto it = got.find(name);
            if (it == got.end() || it->second != value) same = false;
          }
          if (!same) problem = "answered envs that differ from the sequential answer";
        }
        if (!problem.empty()) {
          kdm::MutexLock lock(&mu);
          if (failures++ == 0) first_failure = "Allocate([" + id + "]) " + problem;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  kdm::MutexLock lock(&mu);
  if (failures > 0) {
    return Fail(std::to_string(failures) + " of " + std::to_string(kConcurrentCalls) +
                " concurrent calls went wrong; first: " + first_failure);
  }
  return Pass(std::to_string(kConcurrentCalls) + " calls from " +
              std::to_string(kConcurrentThreads) +
              " threads all answered like the sequential calls");
}

// --- GetPreferredAllocation -------------------------------------------------
//
// The plain requests ask for 2 or 3 devices of all healthy ones (fewer when
// the plugin has fewer); only pref.deadline asks for count-1 of them, so a
// plugin that is slow only on large requests fails pref.deadline alone.

namespace {
int SmallSize(size_t n, int want) { return static_cast<int>(std::min<size_t>(want, n)); }
}  // namespace

Outcome Session::PrefSize() {
  if (auto skip = NeedPreferred()) return *skip;
  int size = SmallSize(healthy_ids_.size(), 2);
  std::vector<std::string> answer;
  if (auto fail = AskPreferred(healthy_ids_, {}, size, &answer)) return *fail;
  if (static_cast<int>(answer.size()) != size) {
    return Fail("asked for " + std::to_string(size) + " devices, answered " +
                std::to_string(answer.size()) + " [" + Join(answer) + "]");
  }
  return Pass("asked for " + std::to_string(size) + ", answered [" + Join(answer) + "]");
}

Outcome Session::PrefSubset() {
  if (auto skip = NeedPreferred()) return *skip;
  std::vector<std::string> available = healthy_ids_;
  if (available.size() >= 3) available.erase(available.begin());
  int size = SmallSize(available.size(), 2);
  std::vector<std::string> answer;
  if (auto fail = AskPreferred(available, {}, size, &answer)) return *fail;
  for (const std::string& id : answer) {
    if (std::find(available.begin(), available.end(), id) == available.end()) {
      return Fail("answered \"" + id + "\", which is not in available_deviceIDs [" +
                  Join(available) + "]");
    }
  }
  return Pass("[" + Join(answer) + "] all in available_deviceIDs");
}

Outcome Session::PrefMustInclude() {
  if (auto skip = NeedPreferred()) return *skip;
  std::vector<std::string> must = {healthy_ids_.front()};
  int size = SmallSize(healthy_ids_.size(), 3);
  std::vector<std::string> answer;
  if (auto fail = AskPreferred(healthy_ids_, must, size, &answer)) return *fail;
  for (const std::string& id : must) {
    if (std::find(answer.begin(), answer.end(), id) == answer.end()) {
      return Fail("must_include [" + Join(must) + "], answered [" + Join(answer) + "]");
    }
  }
  return Pass("must_include [" + Join(must) + "], answered [" + Join(answer) + "]");
}

Outcome Session::PrefNoDuplicates() {
  if (auto skip = NeedPreferred()) return *skip;
  int size = SmallSize(healthy_ids_.size(), 3);
  std::vector<std::string> answer;
  if (auto fail = AskPreferred(healthy_ids_, {}, size, &answer)) return *fail;
  std::set<std::string> seen;
  for (const std::string& id : answer) {
    if (!seen.insert(id).second) {
      return Fail("answered \"" + id + "\" twice: [" + Join(answer) + "]");
    }
  }
  return Pass("[" + Join(answer) + "] without duplicates");
}

Outcome Session::PrefDeterministic() {
  if (auto skip = NeedPreferred()) return *skip;
  int size = SmallSize(healthy_ids_.size(), 2);
  std::vector<std::string> first;
  for (int i = 0; i < kDeterministicRepeats; ++i) {
    std::vector<std::string> answer;
    if (auto fail = AskPreferred(healthy_ids_, {}, size, &answer)) return *fail;
    std::sort(answer.begin(), answer.end());
    if (i == 0) {
      first = answer;
    } else if (answer != first) {
      return Fail("answer " + std::to_string(i + 1) + " [" + Join(answer) +
                  "] differs from answer 1 [" + Join(first) + "]");
    }
  }
  return Pass(std::to_string(kDeterministicRepeats) + " answers, all [" + Join(first) + "]");
}

Outcome Session::PrefDeadline() {
  if (auto skip = NeedPreferred()) return *skip;
  int size = std::max(1, static_cast<int>(healthy_ids_.size()) - 1);
  Clock::time_point start = Clock::now();
  v1beta1::ContainerPreferredAllocationResponse r;
  grpc::Status s = Preferred(healthy_ids_, {}, size, &r);
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return Fail("GetPreferredAllocation(size " + std::to_string(size) +
                ") was not answered within " + DurationText(options_.timeout));
  }
  if (!s.ok()) {
    return Fail("GetPreferredAllocation(size " + std::to_string(size) + ") failed: " + GrpcText(s));
  }
  return Pass("size " + std::to_string(size) + " answered in " + DurationText(Since(start)));
}

// --- PreStartContainer -----------------------------------------------------

Outcome Session::PrestartAnswered() {
  if (auto skip = NeedDevices()) return *skip;
  if (auto skip = NeedOptions()) return *skip;
  if (!plugin_options_.pre_start_required()) {
    return Skip("not required: pre_start_required is false");
  }
  std::vector<std::string> ids(healthy_ids_.begin(),
                               healthy_ids_.begin() + std::min<size_t>(2, healthy_ids_.size()));
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(options_.timeout));
  v1beta1::PreStartContainerRequest request;
  for (const std::string& id : ids) request.add_devices_ids(id);
  v1beta1::PreStartContainerResponse response;
  Clock::time_point start = Clock::now();
  grpc::Status s = stub_->PreStartContainer(&ctx, request, &response);
  if (!s.ok()) return Fail("PreStartContainer([" + Join(ids) + "]) failed: " + GrpcText(s));
  return Pass("PreStartContainer([" + Join(ids) + "]) answered OK in " +
              DurationText(Since(start)));
}

}  // namespace

Status Runner::CheckOptions(const Options& options) {
  if (options.resource.empty()) return InvalidArgumentError("--resource NAME is required");
  if (Status s = pluginapi::ValidateResourceName(options.resource); !s.ok()) {
    return InvalidArgumentError("--resource: " + s.message());
  }
  if (options.root.empty() == options.plugin_socket.empty()) {
    return InvalidArgumentError(
        "give exactly one of --root DIR (act as the kubelet in DIR/device-plugins) or "
        "--plugin-socket PATH (dial a running plugin)");
  }
  if (options.timeout.count() <= 0) return InvalidArgumentError("--timeout must be more than 0");
  if (options.snapshot_window.count() < 0 || options.snapshot_window > std::chrono::minutes(1)) {
    return InvalidArgumentError("the snapshot window must be between 0 and 1 minute");
  }
  if (options.stream_drop_iterations < 1 || options.stream_drop_iterations > 1000) {
    return InvalidArgumentError("stream-drop iterations must be between 1 and 1000");
  }
  if (options.health_trigger.size() > 4096 ||
      options.health_trigger.find('\0') != std::string::npos) {
    return InvalidArgumentError(
        "--health-trigger must be a shell command of at most 4096 bytes "
        "without NUL bytes");
  }
  if (options.health_reconnects < 1 || options.health_reconnects > 100) {
    return InvalidArgumentError("health reconnects must be between 1 and 100");
  }
  for (const std::string& id : options.only) {
    if (FindCheck(id) != nullptr) continue;
    std::string known;
    for (const CheckInfo& c : Catalogue()) known += (known.empty() ? "" : ", ") + c.id;
    return InvalidArgumentError("unknown check id \"" + id + "\" (known: " + known + ")");
  }
  return OkStatus();
}

StatusOr<Report> Runner::Run(const Options& options) {
  KDM_RETURN_IF_ERROR(CheckOptions(options));
  Session session(options);
  KDM_RETURN_IF_ERROR(session.Setup());
  return session.RunChecks();
}

}  // namespace kdm::conformance
