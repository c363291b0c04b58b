// ExtenderUnderAttack (soak_extender.h): a real `kdm extender` against an
// in-process hostile API server.
#include "kdm/test/soak/soak_extender.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <deque>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "kdm/base/sync.h"
#include "kdm/k8s/devices_annotation.h"
#include "kdm/test/kube/test_api_server.h"
#include "kdm/test/kube/test_pki.h"
#include "kdm/test/soak/child_process.h"
#include "kdm/topology/presets.h"

namespace kdm::soak {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr char kDevicesKey[] = "kdm.io/devices";
constexpr auto kHttpBound = 5s;
constexpr auto kHonestBound = 45s;
constexpr auto kStopBound = 5s;
constexpr auto kModeLength = 3s;
constexpr int kMaxListsPer10s = 10;
constexpr int64_t kMaxRssBytes = 512ll << 20;
constexpr int kMaxFds = 256;
constexpr int kDeepNesting = 100'000;

// The API server's misbehaviour, for kModeLength after an attack picks it.
enum class Mode { kHonest, kWatchGone, kWatchEnds, kListGarbage, kDropAll };

const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kHonest:
      return "honest";
    case Mode::kWatchGone:
      return "apiserver: every WATCH 410";
    case Mode::kWatchEnds:
      return "apiserver: every WATCH ends at once";
    case Mode::kListGarbage:
      return "apiserver: LIST garbage";
    case Mode::kDropAll:
      return "apiserver: every request dropped";
  }
  return "?";
}

std::string Nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

// A kdm.io/devices value for `t` with the ids in `in_use` held.
std::string AnnotationFor(const std::string& node, const topology::Topology& t,
                          const std::set<std::string>& in_use) {
  k8s::ResourceInput input;
  for (const topology::DeviceInfo& d : t.devices()) input.allocatable[d.id] = d.numa;
  input.in_use = in_use;
  input.topology = &t;
  k8s::DevicesAnnotation a;
  a.node = node;
  a.updated = k8s::FormatRfc3339(std::chrono::system_clock::now());
  a.resources["nvidia.com/gpu"] = k8s::BuildResourceDevices(input);
  return k8s::EncodeDevicesAnnotation(a);
}

// n GPUs with random NVLinks and PCIe relations: a fresh matrix each time.
topology::Topology RandomTopology(int n, std::mt19937_64& rng) {
  std::vector<topology::DeviceInfo> devices;
  for (int i = 0; i < n; ++i) {
    devices.push_back({.id = "GPU" + std::to_string(i), .index = i, .numa = i * 2 / n});
  }
  std::vector<std::vector<topology::Link>> links(n, std::vector<topology::Link>(n));
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      topology::Link l{.nvlinks = static_cast<int>(rng() % 5),
                       .pcie = static_cast<topology::PcieLink>(1 + rng() % 6)};
      links[i][j] = links[j][i] = l;
    }
  }
  StatusOr<topology::Topology> t = topology::Topology::Create(devices, links);
  return std::move(*t);  // valid by construction
}

// The process's resident set and open fds, from /proc (-1 when gone).
int64_t RssBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}
int OpenFds(pid_t pid) {
  std::error_code ec;
  int n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return ec ? -1 : n;
}

class ExtenderUnderAttackImpl final : public ExtenderUnderAttack {
 public:
  explicit ExtenderUnderAttackImpl(Options options)
      : options_(std::move(options)), rng_(options_.seed) {}
  ~ExtenderUnderAttackImpl() override {
    if (extender_ && extender_->running()) extender_->Stop(SIGKILL, kStopBound);
    if (server_) server_->Stop();
  }

  Status Init() {
    StatusOr<topology::Topology> dgx = topology::Preset("dgx1-v100");
    if (!dgx.ok()) return dgx.status();
    {
      MutexLock lock(&mu_);
      nodes_["honest-a"] = NodeJsonLocked("honest-a", AnnotationFor("honest-a", *dgx, {}));
      nodes_["honest-b"] =
          NodeJsonLocked("honest-b", AnnotationFor("honest-b", *dgx, {"GPU0", "GPU1", "GPU2"}));
      nodes_["hostile"] = NodeJsonLocked("hostile", "{}");
    }
    KDM_ASSIGN_OR_RETURN(kube::test::TestPki pki, kube::test::MakeTestPki());
    KDM_ASSIGN_OR_RETURN(server_,
                         kube::test::TestApiServer::Start(
                             {.cert_pem = pki.server.cert_pem, .key_pem = pki.server.key_pem}));
    server_->SetHandler([this](const kube::test::RecordedRequest& r) { return Serve(r); });
    const std::string ca = options_.dir + "/extender-ca.crt";
    const std::string kubeconfig = options_.dir + "/extender-kubeconfig";
    std::ofstream(ca) << pki.ca.cert_pem;
    std::ofstream(kubeconfig)
        << "apiVersion: v1\nkind: Config\ncurrent-context: t\nclusters:\n- name: c\n  cluster:\n"
           "    server: "
        << server_->url() << "\n    certificate-authority: " << ca
        << "\ncontexts:\n- name: t\n  context: {cluster: c, user: u}\nusers:\n- name: u\n"
           "  user: {token: soak}\n";
    log_path_ = options_.dir + "/extender.log";
    extender_ = std::make_unique<ChildProcess>(
        "extender",
        std::vector<std::string>{options_.kdm, "extender", "--listen", "127.0.0.1:0",
                                 "--kubeconfig", kubeconfig, "--policy", "packed"},
        log_path_);
    return StartExtender();
  }

  std::string Attack() override {
    const int roll = static_cast<int>(rng_() % 11);
    if (roll >= 7) {
      const Mode m = static_cast<Mode>(1 + (roll - 7));
      MutexLock lock(&mu_);
      mode_ = m;
      mode_until_ = SteadyClock::now() + kModeLength;
      return ModeName(m);
    }
    std::string name;
    std::string event;
    {
      MutexLock lock(&mu_);
      ++version_;
      const std::string rv = std::to_string(version_);
      switch (roll) {
        case 0:
          name = "node: spec.podCIDRs nested 100,000 deep";
          event =
              "{\"type\":\"MODIFIED\",\"object\":{\"kind\":\"Node\",\"metadata\":{\"name\":"
              "\"hostile\",\"resourceVersion\":\"" +
              rv + "\"},\"spec\":{\"podCIDRs\":" + Nested(kDeepNesting) + "}}}\n";
          break;
        case 1:
          name = "node: garbage annotation";
          nodes_["hostile"] = NodeJsonLocked("hostile", "{\"version\":1,\"resources\":[}");
          break;
        case 2:
          name = "node: annotation over 256 KiB";
          nodes_["hostile"] = NodeJsonLocked(
              "hostile", "{\"version\":1,\"pad\":\"" + std::string(300 * 1024, 'x') + "\"}");
          break;
        case 3:
          name = "node: annotation nested 100,000 deep";
          nodes_["hostile"] = NodeJsonLocked("hostile", Nested(kDeepNesting));
          break;
        case 4:
          name = "node: 32 GPUs, random links";
          nodes_["hostile"] =
              NodeJsonLocked("hostile", AnnotationFor("hostile", RandomTopology(32, rng_), {}));
          break;
        case 5:
          name = "node: 64 GPUs, random links";
          nodes_["hostile"] =
              NodeJsonLocked("hostile", AnnotationFor("hostile", RandomTopology(64, rng_), {}));
          break;
        default:
          name = "watch: a 16 MiB line";
          event = std::string(16u << 20, ' ') + "{}\n";
          break;
      }
      if (event.empty()) {
        event = "{\"type\":\"MODIFIED\",\"object\":" + nodes_["hostile"] + "}\n";
      }
      if (feed_) feed_->Send(std::move(event));
    }
    return name;
  }

  void Check() override {
    EndModeIfDue();
    if (!Alive()) return;
    options_.count("extender: alive");
    if (!Healthz()) {
      options_.violation("extender-healthz", "GET /healthz got no 200 within " +
                                                 std::to_string(kHttpBound.count()) + " s");
    } else {
      options_.count("extender: /healthz answered");
    }
    const int64_t rss = RssBytes(extender_->pid());
    peak_rss_ = std::max(peak_rss_, rss);
    if (rss > kMaxRssBytes) {
      options_.violation("extender-memory", "RSS " + std::to_string(rss >> 20) + " MiB");
    }
    const int64_t fds = OpenFds(extender_->pid());
    peak_fds_ = std::max(peak_fds_, fds);
    if (fds > kMaxFds) options_.violation("extender-memory", std::to_string(fds) + " open fds");
    CheckListRate();
  }

  void Settle() override {
    {
      MutexLock lock(&mu_);
      mode_ = Mode::kHonest;
    }
    Check();
    if (!Alive()) return;
    // Both honest nodes pass a 2-GPU filter and are scored.
    const std::string args =
        "{\"Pod\":{\"metadata\":{\"name\":\"soak\",\"namespace\":\"default\",\"uid\":\"u1\"},"
        "\"spec\":{\"containers\":[{\"name\":\"main\",\"resources\":{\"limits\":{\"nvidia.com/"
        "gpu\":\"2\"}}}]}},\"NodeNames\":[\"honest-a\",\"honest-b\",\"hostile\"]}";
    std::string last;
    const auto end = SteadyClock::now() + kHonestBound;
    while (true) {
      std::optional<json> f = Post("/filter", args);
      std::optional<json> p = Post("/prioritize", args);
      bool ok = f && p && f->is_object() && p->is_array();
      if (ok) {
        const json names = f->value("NodeNames", json::array());
        ok = std::find(names.begin(), names.end(), "honest-a") != names.end() &&
             std::find(names.begin(), names.end(), "honest-b") != names.end();
        int scored = 0;
        for (const json& e : *p) {
          if (e.value("Host", "") == "honest-a" || e.value("Host", "") == "honest-b") ++scored;
        }
        ok = ok && scored == 2;
      }
      if (ok) {
        options_.count("extender: honest filter + prioritize");
        return;
      }
      last = (f ? f->dump() : "no answer") + " / " + (p ? p->dump() : "no answer");
      if (SteadyClock::now() > end || !Alive()) break;
      std::this_thread::sleep_for(200ms);
    }
    options_.violation("extender-honest", "no right answer for the honest nodes within " +
                                              std::to_string(kHonestBound.count()) +
                                              " s; last: " + last.substr(0, 300));
  }

  void Stop(bool check) override {
    if (!extender_ || !extender_->running()) return;
    const auto start = SteadyClock::now();
    int status = extender_->Stop(SIGTERM, kStopBound);
    stop_ms_ =
        std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - start).count();
    if (check && !(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      options_.violation("extender-process",
                         "kdm extender after SIGTERM: " + DescribeWaitStatus(status));
    }
  }

  std::map<std::string, int64_t> Report() const override {
    MutexLock lock(&mu_);
    return {{"extender LISTs served", lists_},
            {"extender WATCHes served", watches_},
            {"extender most LISTs in 10 s", max_lists_10s_},
            {"extender peak RSS MiB", peak_rss_ >> 20},
            {"extender peak fds", peak_fds_},
            {"extender starts", extender_ ? extender_->starts() : 0},
            {"extender ms to exit after SIGTERM", stop_ms_}};
  }

 private:
  Status StartExtender() {
    { std::ofstream truncate(log_path_, std::ios::trunc); }
    KDM_RETURN_IF_ERROR(extender_->Start());
    std::regex listening("listening on 127\\.0\\.0\\.1:([0-9]+)[^\n]*\n");
    const auto end = SteadyClock::now() + 30s;
    while (SteadyClock::now() < end) {
      std::ifstream in(log_path_);
      std::stringstream text;
      text << in.rdbuf();
      const std::string log = text.str();
      std::smatch m;
      if (std::regex_search(log, m, listening)) {
        port_ = static_cast<uint16_t>(std::stoi(m[1]));
        return OkStatus();
      }
      int status = 0;
      if (extender_->Reap(&status)) {
        return UnavailableError("kdm extender exited at start (" + DescribeWaitStatus(status) +
                                "): " + log.substr(0, 500));
      }
      std::this_thread::sleep_for(20ms);
    }
    return DeadlineExceededError("kdm extender did not say where it listens within 30 s; see " +
                                 log_path_);
  }

  // False (after a violation and a restart) when the extender died.
  bool Alive() {
    int status = 0;
    if (!extender_->Reap(&status)) return true;
    options_.violation("extender-process", "kdm extender exited on its own (" +
                                               DescribeWaitStatus(status) + "); see " + log_path_);
    if (Status s = StartExtender(); !s.ok()) options_.log("extender restart: " + s.message());
    return false;
  }

  void EndModeIfDue() {
    MutexLock lock(&mu_);
    if (mode_ != Mode::kHonest && SteadyClock::now() >= mode_until_) mode_ = Mode::kHonest;
  }

  void CheckListRate() {
    MutexLock lock(&mu_);
    const auto now = SteadyClock::now();
    while (!list_times_.empty() && now - list_times_.front() > 60s) list_times_.pop_front();
    for (size_t i = 0; i < list_times_.size(); ++i) {
      int64_t in_window = 0;
      for (size_t j = i; j < list_times_.size() && list_times_[j] - list_times_[i] < 10s; ++j) {
        ++in_window;
      }
      max_lists_10s_ = std::max(max_lists_10s_, in_window);
      if (in_window > kMaxListsPer10s && list_times_[i] > last_rate_violation_) {
        last_rate_violation_ = list_times_[i + in_window - 1];
        options_.violation("extender-lists", std::to_string(in_window) + " LISTs within 10 s");
      }
    }
  }

  bool Healthz() {
    std::optional<std::string> body = Round(bhttp::verb::get, "/healthz", "");
    return body.has_value();
  }
  std::optional<json> Post(const std::string& target, const std::string& body) {
    std::optional<std::string> answer = Round(bhttp::verb::post, target, body);
    if (!answer) return std::nullopt;
    json j = json::parse(*answer, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return std::nullopt;
    return j;
  }
  // The body of a 200 answer, within kHttpBound; nullopt otherwise.
  std::optional<std::string> Round(bhttp::verb verb, const std::string& target,
                                   const std::string& body) {
    try {
      net::io_context ioc;
      beast::tcp_stream stream(ioc);
      stream.expires_after(kHttpBound);
      stream.connect(net::ip::tcp::endpoint(net::ip::make_address("127.0.0.1"), port_));
      bhttp::request<bhttp::string_body> req(verb, target, 11);
      req.set(bhttp::field::host, "127.0.0.1");
      if (!body.empty()) req.set(bhttp::field::content_type, "application/json");
      req.body() = body;
      req.prepare_payload();
      bhttp::write(stream, req);
      beast::flat_buffer buffer;
      bhttp::response<bhttp::string_body> res;
      bhttp::read(stream, buffer, res);
      if (res.result_int() != 200) return std::nullopt;
      return std::move(res.body());
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }

  // The API server. Runs on its one thread; never blocks.
  kube::test::Reply Serve(const kube::test::RecordedRequest& r) {
    const std::string prefix = "/api/v1/nodes";
    MutexLock lock(&mu_);
    const Mode mode = SteadyClock::now() < mode_until_ ? mode_ : Mode::kHonest;
    if (mode == Mode::kDropAll) return {.drop = true};
    if (r.method != "GET" || r.path != prefix) {
      return {.status = 404,
              .body = "{\"kind\":\"Status\",\"code\":404,\"message\":\"not found\"}"};
    }
    if (r.query.find("watch=1") != std::string::npos) {
      ++watches_;
      if (mode == Mode::kWatchGone) {
        return {.status = 410,
                .body =
                    "{\"kind\":\"Status\",\"code\":410,\"reason\":\"Expired\",\"message\":"
                    "\"too old resource version\"}"};
      }
      if (mode == Mode::kWatchEnds) return {.body = ""};
      feed_ = std::make_shared<kube::test::WatchFeed>();
      return {.feed = feed_};
    }
    ++lists_;
    list_times_.push_back(SteadyClock::now());
    if (mode == Mode::kListGarbage) return {.body = "{\"kind\":\"NodeList\",\"items\":[{{{"};
    std::string items;
    for (const auto& [name, node] : nodes_) items += (items.empty() ? "" : ",") + node;
    return {.body =
                "{\"kind\":\"NodeList\",\"apiVersion\":\"v1\",\"metadata\":{"
                "\"resourceVersion\":\"" +
                std::to_string(version_) + "\"},\"items\":[" + items + "]}"};
  }

  std::string NodeJsonLocked(const std::string& name, const std::string& annotation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return "{\"kind\":\"Node\",\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"" + name +
           "\",\"resourceVersion\":\"" + std::to_string(version_) + "\",\"annotations\":{\"" +
           kDevicesKey + "\":" + json(annotation).dump() +
           "}},\"status\":{\"allocatable\":{\"nvidia.com/gpu\":\"8\"}}}";
  }

  const Options options_;
  std::mt19937_64 rng_;  // Attack() only (the soak's thread)
  std::unique_ptr<kube::test::TestApiServer> server_;
  std::unique_ptr<ChildProcess> extender_;
  std::string log_path_;
  uint16_t port_ = 0;
  int64_t peak_rss_ = 0;
  int64_t peak_fds_ = 0;
  int64_t stop_ms_ = -1;

  mutable Mutex mu_;
  std::map<std::string, std::string> nodes_ ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 1;
  Mode mode_ ABSL_GUARDED_BY(mu_) = Mode::kHonest;
  SteadyClock::time_point mode_until_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<kube::test::WatchFeed> feed_ ABSL_GUARDED_BY(mu_);
  int64_t lists_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t watches_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t max_lists_10s_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<SteadyClock::time_point> list_times_ ABSL_GUARDED_BY(mu_);
  SteadyClock::time_point last_rate_violation_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

StatusOr<std::unique_ptr<ExtenderUnderAttack>> ExtenderUnderAttack::Start(Options options) {
  auto impl = std::make_unique<ExtenderUnderAttackImpl>(std::move(options));
  KDM_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<ExtenderUnderAttack>(std::move(impl));
}

}  // namespace kdm::soak
