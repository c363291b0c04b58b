#include "kdm/test/sim/scheduling_sim.h"

#include <algorithm>
#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <thread>

#include "kdm/fakes/status_file.h"
#include "kdm/k8s/devices_annotation.h"
#include "kdm/kube/client.h"
#include "kdm/kube/kubeconfig.h"
#include "kdm/scheduler/scorer.h"
#include "kdm/test/e2e/e2e_util.h"
#include "kdm/test/kube/fake_cluster.h"
#include "kdm/test/kube/test_api_server.h"
#include "kdm/test/kube/test_pki.h"

namespace kdm::sim {
namespace {

namespace fs = std::filesystem;
namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using json = nlohmann::json;
using e2e::Process;
using kube::test::FakeCluster;

constexpr char kSimGpu[] = "nvidia.com/gpu";
constexpr char kSimNamespace[] = "sim";

struct NodeSpec {
  std::string name;
  std::string preset;
  // The node's `kdm plugin --policy`, published with --plugin-policy: the
  // extender predicts each node's devices with its own plugin's policy.
  std::string plugin_policy;
};
// One clearly best node (NVSwitch: every pair NV18).
const std::vector<NodeSpec> kSimNodes = {
    {"dgx-1", "dgx1-v100", "packed"},    {"dgx-2", "dgx1-v100", "best-set"},
    {"dgx-3", "dgx1-v100", "packed"},    {"pcie-1", "pcie-8gpu", "packed"},
    {"pcie-2", "pcie-8gpu", "best-set"}, {"hgx-1", "hgx-h100", "packed"},
};

std::string PodSpecJson(int gpus) {
  return json{{"containers", json::array({{{"name", "main"},
                                           {"resources",
                                            {{"limits", {{kSimGpu, std::to_string(gpus)}}},
                                             {"requests", {{kSimGpu, std::to_string(gpus)}}}}}}})}}
      .dump();
}

// POST /VERB to the extender on 127.0.0.1:port; the answer's JSON.
StatusOr<json> PostExtender(uint16_t port, const std::string& verb, const std::string& body) {
  try {
    net::io_context ioc;
    beast::tcp_stream stream(ioc);
    stream.expires_after(std::chrono::seconds(10));
    stream.connect(net::ip::tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    http::request<http::string_body> req(http::verb::post, "/" + verb, 11);
    req.set(http::field::host, "127.0.0.1");
    req.set(http::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
    http::write(stream, req);
    beast::flat_buffer buffer;
    http::response<http::string_body> res;
    http::read(stream, buffer, res);
    if (res.result_int() != 200) {
      return UnavailableError("extender /" + verb + ": HTTP " + std::to_string(res.result_int()) +
                              ": " + res.body().substr(0, 200));
    }
    return json::parse(res.body());
  } catch (const std::exception& e) {
    return UnavailableError("extender /" + verb + ": " + e.what());
  }
}

// The free devices of a node's annotation, and its devices in order.
struct Published {
  std::vector<std::string> devices;
  std::set<std::string> available;
};
std::optional<Published> ReadPublished(const std::string& annotation) {
  if (annotation.empty()) return std::nullopt;
  auto a = k8s::DecodeDevicesAnnotation(annotation);
  if (!a.ok()) return std::nullopt;
  auto it = a->resources.find(kSimGpu);
  if (it == a->resources.end()) return std::nullopt;
  Published p;
  for (const auto& d : it->second.devices) p.devices.push_back(d.id);
  p.available.insert(it->second.available.begin(), it->second.available.end());
  return p;
}

// The asynchronous binder: POSTs each Binding to the API server from a
// small pool, as kube-scheduler's default binder does after a cycle.
class Binder {
 public:
  // `extender_port` != 0: bind through the extender's POST /bind.
  Binder(kube::Client* client, int threads, uint16_t extender_port = 0)
      : client_(client), extender_port_(extender_port) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
  }
  ~Binder() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void Submit(std::string name, std::string node) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.emplace_back(std::move(name), std::move(node));
    }
    cv_.notify_one();
  }
  // Waits until every submitted binding has been answered.
  bool Drain(std::chrono::milliseconds bound) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, bound, [&] { return queue_.empty() && busy_ == 0; });
  }
  std::map<std::string, std::string> Failures() {
    std::lock_guard<std::mutex> lock(mu_);
    return failures_;
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      auto [name, node] = queue_.front();
      queue_.pop_front();
      ++busy_;
      lock.unlock();
      if (extender_port_ != 0) {
        json args = {{"PodName", name},
                     {"PodNamespace", kSimNamespace},
                     {"PodUID", "uid-" + name},
                     {"Node", node}};
        StatusOr<json> r = PostExtender(extender_port_, "bind", args.dump());
        lock.lock();
        if (!r.ok() || !r->is_object() || r->value("Error", "?") != "") {
          failures_[name] = r.ok() ? r->dump() : std::string(r.status().message());
        }
        --busy_;
        cv_.notify_all();
        continue;
      }
      json binding = {{"apiVersion", "v1"},
                      {"kind", "Binding"},
                      {"metadata", {{"name", name}, {"namespace", kSimNamespace}}},
                      {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", node}}}};
      auto r = client_->Send(
          "POST", std::string("/api/v1/namespaces/") + kSimNamespace + "/pods/" + name + "/binding",
          binding.dump(), std::chrono::seconds(10));
      lock.lock();
      if (!r.ok() || r->status != 201) {
        failures_[name] = r.ok() ? "HTTP " + std::to_string(r->status) : r.status().message();
      }
      --busy_;
      cv_.notify_all();
    }
  }

  kube::Client* client_;
  const uint16_t extender_port_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::string, std::string>> queue_;
  int busy_ = 0;
  bool stop_ = false;
  std::map<std::string, std::string> failures_;
  std::vector<std::thread> threads_;
};

struct SimNode {
  NodeSpec spec;
  std::string root;
  std::unique_ptr<Process> kubelet;
  std::unique_ptr<Process> plugin;
  // The all-free view (topology and positions) for replaying scores.
  k8s::NodeDevices view;
  std::vector<std::string> devices;  // ids by position
};

class ClusterImpl : public Cluster {
 public:
  explicit ClusterImpl(ClusterOptions options) : options_(std::move(options)) {}
  ~ClusterImpl() override {
    StopExtender();
    for (auto& n : nodes_) {
      if (n.kubelet) n.kubelet->Signal(SIGTERM);
      if (n.plugin) n.plugin->Signal(SIGTERM);
    }
    for (auto& n : nodes_) {
      if (n.kubelet) n.kubelet->Wait();
      if (n.plugin) n.plugin->Wait();
    }
    nodes_.clear();
    if (server_) server_->Stop();
    if (owns_root_) {
      std::error_code ec;
      fs::remove_all(options_.root, ec);
    }
  }

  Status Init() {
    if (options_.root.empty()) {
      std::string tmpl = (fs::temp_directory_path() / "kdm-sim-XXXXXX").string();
      if (::mkdtemp(tmpl.data()) == nullptr) return InternalError("mkdtemp " + tmpl);
      options_.root = tmpl;
      owns_root_ = true;
    }
    auto pki = kube::test::MakeTestPki();
    if (!pki.ok()) return pki.status();
    auto server = kube::test::TestApiServer::Start(
        {.cert_pem = pki->server.cert_pem, .key_pem = pki->server.key_pem});
    if (!server.ok()) return server.status();
    server_ = std::move(*server);
    cluster_ = std::make_unique<FakeCluster>(
        FakeCluster::Options{.on_bound = [this](const kube::test::BoundPod& p) { OnBound(p); }});
    server_->SetHandler(cluster_->Handler());
    std::ofstream(options_.root + "/ca.crt") << pki->ca.cert_pem;
    kubeconfig_ = options_.root + "/kubeconfig";
    std::ofstream(kubeconfig_)
        << "apiVersion: v1\nkind: Config\ncurrent-context: t\nclusters:\n- name: c\n  cluster:\n"
           "    server: "
        << server_->url() << "\n    certificate-authority: " << options_.root
        << "/ca.crt\ncontexts:\n- name: t\n  context: {cluster: c, user: u}\nusers:\n- name: u\n"
           "  user: {token: secret}\n";
    auto config = kube::LoadKubeconfig(kubeconfig_);
    if (!config.ok()) return config.status();
    auto client = kube::Client::Create({.config = *config});
    if (!client.ok()) return client.status();
    client_ = std::move(*client);

    for (size_t i = 0; i < kSimNodes.size(); ++i) {
      SimNode n;
      n.spec = kSimNodes[i];
      n.root = options_.root + "/n" + std::to_string(i);
      fs::create_directories(n.root);
      KDM_RETURN_IF_ERROR(cluster_->AddNode(n.spec.name, {{kSimGpu, "8"}}));
      n.kubelet = std::make_unique<Process>(
          options_.kdm_binary,
          std::vector<std::string>{
              "kubelet", "--root", n.root, "--publish", "--node-name", n.spec.name, "--kubeconfig",
              kubeconfig_, "--topology", std::string(kSimGpu) + "=preset:" + n.spec.preset,
              "--plugin-policy", std::string(kSimGpu) + "=" + n.spec.plugin_policy},
          n.root + "/kubelet.log");
      nodes_.push_back(std::move(n));
    }
    for (auto& n : nodes_) {
      if (!e2e::WaitUntil([&] { return fs::exists(n.root + "/pod-resources/kubelet.sock"); },
                          options_.wait_bound)) {
        return DeadlineExceededError("node " + n.spec.name +
                                     ": the kubelet did not start: " + n.kubelet->Log());
      }
      n.plugin = std::make_unique<Process>(
          options_.kdm_binary,
          std::vector<std::string>{"plugin", "--root", n.root, "--preset", n.spec.preset,
                                   "--resource", kSimGpu, "--policy", n.spec.plugin_policy},
          n.root + "/plugin.log");
    }
    k8s::TopologyCache topologies;
    for (auto& n : nodes_) {
      std::optional<Published> p;
      if (!e2e::WaitUntil(
              [&] {
                p = ReadPublished(cluster_->NodeAnnotation(n.spec.name, "kdm.io/devices"));
                return p && p->devices.size() == 8 && p->available.size() == 8;
              },
              options_.wait_bound)) {
        return DeadlineExceededError("node " + n.spec.name + ": no annotation with 8 free GPUs: " +
                                     cluster_->NodeAnnotation(n.spec.name, "kdm.io/devices") +
                                     "\n" + n.kubelet->Log() + n.plugin->Log());
      }
      auto view = k8s::DecodeNodeDevices(cluster_->NodeAnnotation(n.spec.name, "kdm.io/devices"),
                                         &topologies_);
      if (!view.ok()) return view.status();
      n.view = std::move(*view);
      n.devices = p->devices;
    }
    return OkStatus();
  }

  Status StartExtender(const std::string& policy,
                       const std::vector<std::string>& extra_args) override {
    StopExtender();
    policy_ = policy;
    const std::string n = std::to_string(extender_runs_++);
    std::vector<std::string> args = {"extender",  "--listen", "127.0.0.1:0", "--kubeconfig",
                                     kubeconfig_, "--policy", policy};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    extender_err_ = options_.root + "/extender" + n + ".err";
    extender_ = std::make_unique<Process>(options_.kdm_binary, args, extender_err_);
    std::smatch m;
    if (!e2e::WaitUntil(
            [&] {
              std::string err = extender_->Log();
              if (!extender_->Running()) return true;
              if (!std::regex_search(err, m,
                                     std::regex("listening on 127\\.0\\.0\\.1:([0-9]+)[^\n]*\n"))) {
                return false;
              }
              port_ = static_cast<uint16_t>(std::stoi(m[1]));
              return true;
            },
            options_.wait_bound) ||
        !extender_->Running()) {
      return UnavailableError("kdm extender did not start: " + extender_->Log());
    }
    // The cache is full when every node passes a filter for its free GPUs
    // and fails one for a GPU more (no opinion would pass both).
    return WaitExtenderSees(std::map<std::string, int>{});
  }

  std::string ExtenderLog() const override { return extender_ ? extender_->Log() : ""; }

  bool ExtenderHasFlag(const std::string& flag) override {
    const std::string log = options_.root + "/extender-help.log";
    Process help(options_.kdm_binary, {"extender", "--help"}, log);
    help.Wait();
    return e2e::ReadFile(log).find(flag) != std::string::npos;
  }

  StatusOr<Results> Run(const ScenarioOptions& o) override;

 private:
  struct Decision {
    std::string pod;
    int gpus = 0;
    std::string node;    // "" when unplaced
    std::string scores;  // the extender's answer, for the notes
  };

  void StopExtender() {
    if (!extender_) return;
    extender_->Signal(SIGTERM);
    extender_->Wait();
    extender_.reset();
  }

  SimNode* NodeNamed(const std::string& name) {
    for (auto& n : nodes_) {
      if (n.spec.name == name) return &n;
    }
    return nullptr;
  }

  // The kubelet's "watch of its own pods": the manifest, in binding order.
  void OnBound(const kube::test::BoundPod& p) {
    SimNode* node = NodeNamed(p.node);
    if (node == nullptr) return;
    json manifest = {
        {"apiVersion", "v1"},
        {"kind", "Pod"},
        {"metadata", {{"name", p.name}, {"namespace", p.namespace_name}, {"uid", p.uid}}},
        {"spec", p.spec}};
    manifest["spec"].erase("nodeName");
    char seq[16];
    std::snprintf(seq, sizeof seq, "%08llu", static_cast<unsigned long long>(++manifest_seq_));
    const std::string file = node->root + "/manifests/" + seq + "-" + p.name + ".json";
    {
      std::lock_guard<std::mutex> lock(manifests_mu_);
      manifests_[p.name] = file;
    }
    fs::create_directories(node->root + "/manifests");
    e2e::WriteFileAtomically(file, manifest.dump());
  }

  // Waits until the extender's cache shows each node with exactly its free
  // GPUs (`busy`: node -> GPUs held): a pod of that many passes the node's
  // filter and a pod of one more fails it.
  Status WaitExtenderSees(const std::map<std::string, int>& busy) {
    auto probe = [&](const std::string& node, int gpus) {
      json args = {{"Pod",
                    // No uid: a probe is no scheduling cycle (the extender neither
                    // waits for its bind nor makes the next pod wait for it).
                    {{"metadata", {{"name", "probe"}, {"namespace", kSimNamespace}}},
                     {"spec", json::parse(PodSpecJson(gpus))}}},
                   {"NodeNames", json::array({node})}};
      return PostExtender(port_, "filter", args.dump());
    };
    for (auto& n : nodes_) {
      auto it = busy.find(n.spec.name);
      const int free = 8 - (it == busy.end() ? 0 : it->second);
      StatusOr<json> last = UnavailableError("not asked");
      if (!e2e::WaitUntil(
              [&] {
                if (free > 0) {
                  last = probe(n.spec.name, free);
                  if (!last.ok() || !(*last)["NodeNames"].is_array() ||
                      (*last)["NodeNames"].size() != 1) {
                    return false;
                  }
                }
                // Always, even with all 8 free: a node the extender has no
                // opinion on (its node cache not synced yet) passes every
                // filter, so only a pod of one more failing shows the
                // extender knows the node.
                last = probe(n.spec.name, free + 1);
                if (!last.ok() ||
                    ((*last)["NodeNames"].is_array() && !(*last)["NodeNames"].empty())) {
                  return false;
                }
                return true;
              },
              options_.wait_bound)) {
        return DeadlineExceededError(
            "the extender does not show " + std::to_string(free) + " free GPUs on " + n.spec.name +
            ": " + (last.ok() ? last->dump() : last.status().message()) + "\n" + ExtenderLog());
      }
    }
    return OkStatus();
  }

  // Waits until every node publishes exactly `free` (node -> free ids).
  Status WaitPublished(const std::map<std::string, std::set<std::string>>& free) {
    for (auto& n : nodes_) {
      std::set<std::string> want(n.devices.begin(), n.devices.end());
      if (auto it = free.find(n.spec.name); it != free.end()) want = it->second;
      std::optional<Published> p;
      if (!e2e::WaitUntil(
              [&] {
                p = ReadPublished(cluster_->NodeAnnotation(n.spec.name, "kdm.io/devices"));
                return p && p->available == want;
              },
              options_.wait_bound)) {
        return DeadlineExceededError("node " + n.spec.name + " does not publish the expected " +
                                     std::to_string(want.size()) + " free GPUs: " +
                                     cluster_->NodeAnnotation(n.spec.name, "kdm.io/devices"));
      }
    }
    return OkStatus();
  }

  // Waits for the admission result of each pod; name -> status.
  StatusOr<std::map<std::string, fakes::PodStatus>> WaitAdmitted(
      const std::vector<std::pair<std::string, std::string>>& pods) {  // name, node
    std::map<std::string, fakes::PodStatus> out;
    for (const auto& [name, node_name] : pods) {
      SimNode* node = NodeNamed(node_name);
      const std::string path =
          node->root + "/status/" + fakes::PodStatusFileName(kSimNamespace, name);
      StatusOr<fakes::PodStatus> s = NotFoundError(path);
      if (!e2e::WaitUntil(
              [&] {
                s = fakes::ReadPodStatusFile(path);
                return s.ok();
              },
              options_.wait_bound)) {
        return DeadlineExceededError("pod " + name + " on " + node_name +
                                     ": no admission result: " + s.status().message() + "\n" +
                                     node->kubelet->Log());
      }
      out[name] = *s;
    }
    return out;
  }

  static std::vector<std::string> DevicesOf(const fakes::PodStatus& s) {
    std::vector<std::string> out;
    if (s.phase != fakes::kPhaseAdmitted) return out;
    for (const auto& c : s.containers) {
      auto it = c.devices.find(kSimGpu);
      if (it != c.devices.end()) out.insert(out.end(), it->second.begin(), it->second.end());
    }
    return out;
  }

  // Removes the pods' manifests and API objects.
  void DeletePods(const std::vector<std::string>& names) {
    for (const auto& name : names) {
      std::string file;
      {
        std::lock_guard<std::mutex> lock(manifests_mu_);
        file = manifests_[name];
        manifests_.erase(name);
      }
      std::error_code ec;
      if (!file.empty()) fs::remove(file, ec);
      (void)cluster_->DeletePod(kSimNamespace, name);
    }
  }

  // Waits until each deleted pod's kubelet has let it go (its status file is
  // removed, then its devices released, in the same manifest event). Until
  // then a node may publish its devices as held, which the extender rightly
  // counts: the next burst must not start on a state the kubelets do not
  // have yet (an annotation from before the burst looks free all along).
  Status WaitReleased(const std::vector<std::pair<std::string, std::string>>& pods) {
    for (const auto& [name, node_name] : pods) {
      SimNode* node = NodeNamed(node_name);
      if (node == nullptr) continue;
      const std::string path =
          node->root + "/status/" + fakes::PodStatusFileName(kSimNamespace, name);
      if (!e2e::WaitUntil([&] { return !fs::exists(path); }, options_.wait_bound)) {
        return DeadlineExceededError("node " + node_name + " did not let pod " + name +
                                     " go: " + path + " is still there");
      }
    }
    return OkStatus();
  }

  // kdm's score of placing `gpus` on `node` whose free devices are `free`.
  double TrueScore(scheduler::Scorer& scorer, const SimNode& node,
                   const std::set<std::string>& free, int gpus) {
    k8s::NodeDevices view = node.view;
    auto& r = view.resources.at(kSimGpu);
    r.available.clear();
    for (size_t i = 0; i < node.devices.size(); ++i) {
      if (free.count(node.devices[i])) r.available.push_back(static_cast<int>(i));
    }
    scheduler::PodRequest pod{.name = "sim/replay", .resources = {{kSimGpu, gpus}}};
    return scorer.Score(pod, &view);
  }

  ClusterOptions options_;
  bool owns_root_ = false;
  std::unique_ptr<kube::test::TestApiServer> server_;
  std::unique_ptr<FakeCluster> cluster_;
  std::unique_ptr<kube::Client> client_;
  std::string kubeconfig_;
  std::vector<SimNode> nodes_;
  k8s::TopologyCache topologies_;
  std::unique_ptr<Process> extender_;
  std::string extender_err_;
  std::string policy_;
  uint16_t port_ = 0;
  int extender_runs_ = 0;
  int scenario_ = 0;
  std::atomic<uint64_t> manifest_seq_{0};
  std::mutex manifests_mu_;
  std::map<std::string, std::string> manifests_;  // pod name -> manifest path
};

StatusOr<Results> ClusterImpl::Run(const ScenarioOptions& o) {
  if (!extender_) return FailedPreconditionError("Run: start the extender first");
  std::mt19937_64 rng(o.seed);
  const std::string prefix = "s" + std::to_string(scenario_++) + "-";
  auto policy = scheduler::ParseScorePolicy(policy_);
  if (!policy.ok()) return policy.status();
  scheduler::Scorer scorer({.policy = *policy});
  Results results;

  // Partly busy: a fixed seeded set, bound directly, kept for the scenario.
  std::map<std::string, std::set<std::string>> base_free;  // node -> free ids
  for (auto& n : nodes_) base_free[n.spec.name] = {n.devices.begin(), n.devices.end()};
  std::vector<std::string> base_pods;
  std::vector<std::pair<std::string, std::string>> base_placed;  // name, node
  if (o.partly_busy) {
    std::mt19937_64 base_rng(o.seed ^ 0x5bd1e995);
    std::vector<std::pair<std::string, std::string>> placed;
    int i = 0;
    for (auto& n : nodes_) {
      int used = 0;
      const int count = static_cast<int>(base_rng() % 3);  // 0..2 pods
      for (int k = 0; k < count; ++k) {
        const int gpus = (base_rng() % 2) ? 1 : 2;
        if (used + gpus > 4) break;
        used += gpus;
        const std::string name = prefix + "base-" + std::to_string(i++);
        KDM_RETURN_IF_ERROR(
            cluster_->CreatePod(kSimNamespace, name, "uid-" + name, PodSpecJson(gpus)));
        KDM_RETURN_IF_ERROR(cluster_->Bind(kSimNamespace, name, n.spec.name));
        placed.emplace_back(name, n.spec.name);
        base_pods.push_back(name);
      }
    }
    KDM_ASSIGN_OR_RETURN(auto statuses, WaitAdmitted(placed));
    for (const auto& [name, node] : placed) {
      if (statuses[name].phase != fakes::kPhaseAdmitted) {
        return InternalError("partly-busy pod " + name +
                             " was rejected: " + statuses[name].message);
      }
      for (const auto& d : DevicesOf(statuses[name])) base_free[node].erase(d);
    }
    base_placed = placed;
    KDM_RETURN_IF_ERROR(WaitPublished(base_free));
  }
  std::map<std::string, int> base_busy;
  for (auto& [node, free] : base_free) base_busy[node] = 8 - static_cast<int>(free.size());
  KDM_RETURN_IF_ERROR(WaitExtenderSees(base_busy));

  std::vector<double> decision_ms;
  std::uniform_real_distribution<double> tie(0, 1);
  for (int burst = 0; burst < o.bursts; ++burst) {
    // The burst's sizes: a seeded mix of 1, 2 and 4 near the target.
    int free_total = 0;
    for (auto& [node, free] : base_free) free_total += static_cast<int>(free.size());
    const int target = static_cast<int>(free_total * o.burst_fraction + 0.5);
    std::vector<int> sizes;
    for (int i = 0; i < o.pods_per_burst; ++i)
      sizes.push_back(std::vector<int>{1, 1, 2, 2, 4}[rng() % 5]);
    auto sum = [&] {
      int s = 0;
      for (int v : sizes) s += v;
      return s;
    };
    for (int guard = 0; sum() != target && guard < 1000; ++guard) {
      const size_t i = rng() % sizes.size();
      if (sum() > target && sizes[i] > 1) sizes[i] /= 2;
      if (sum() < target && sizes[i] < 4) sizes[i] *= 2;
    }
    std::vector<std::string> names;
    for (size_t i = 0; i < sizes.size(); ++i) {
      names.push_back(prefix + "b" + std::to_string(burst) + "-" + std::to_string(i));
      KDM_RETURN_IF_ERROR(cluster_->CreatePod(kSimNamespace, names.back(), "uid-" + names.back(),
                                              PodSpecJson(sizes[i])));
    }

    // The scheduler loop: serial cycles, asynchronous binds.
    std::vector<Decision> decisions;
    std::map<std::string, int> assumed;  // the loop's own GPU count per node
    {
      Binder binder(client_.get(), o.binder_threads,
                    o.bind_through_extender ? port_ : static_cast<uint16_t>(0));
      const auto start = std::chrono::steady_clock::now();
      for (size_t i = 0; i < names.size(); ++i) {
        if (o.rate_per_second > 0) {
          std::this_thread::sleep_until(
              start + std::chrono::microseconds(static_cast<int64_t>(i * 1e6 / o.rate_per_second)));
        }
        const auto cycle = std::chrono::steady_clock::now();
        json node_names = json::array();
        for (auto& n : nodes_) {
          if (o.scheduler_gpu_count &&
              8 - base_busy[n.spec.name] - assumed[n.spec.name] < sizes[i]) {
            continue;
          }
          node_names.push_back(n.spec.name);
        }
        json pod = {
            {"apiVersion", "v1"},
            {"kind", "Pod"},
            {"metadata",
             {{"name", names[i]}, {"namespace", kSimNamespace}, {"uid", "uid-" + names[i]}}},
            {"spec", json::parse(PodSpecJson(sizes[i]))},
            {"status", {{"phase", "Pending"}}}};
        Decision d{.pod = names[i], .gpus = sizes[i]};
        KDM_ASSIGN_OR_RETURN(
            json filtered,
            PostExtender(port_, "filter", json{{"Pod", pod}, {"NodeNames", node_names}}.dump()));
        json passed = filtered.value("NodeNames", json::array());
        if (passed.is_array() && !passed.empty()) {
          KDM_ASSIGN_OR_RETURN(
              json scores,
              PostExtender(port_, "prioritize", json{{"Pod", pod}, {"NodeNames", passed}}.dump()));
          d.scores = scores.dump();
          int best = -1;
          double best_tie = 0;
          for (const auto& s : scores) {
            const std::string host = s.value("Host", "");
            if (std::find(passed.begin(), passed.end(), host) == passed.end()) continue;
            const int score = s.value("Score", 0);
            const double t = tie(rng);
            if (score > best || (score == best && t > best_tie)) {
              best = score;
              best_tie = t;
              d.node = host;
            }
          }
          if (d.node.empty()) d.node = passed[0].get<std::string>();
        }
        decision_ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - cycle)
                .count());
        if (!d.node.empty()) {
          assumed[d.node] += d.gpus;
          binder.Submit(d.pod, d.node);
        }
        decisions.push_back(d);
      }
      if (!binder.Drain(options_.wait_bound)) {
        return DeadlineExceededError("the binder did not finish within the bound");
      }
      for (const auto& [name, why] : binder.Failures()) {
        results.notes.push_back("bind " + name + " failed: " + why);
        for (auto& d : decisions) {
          if (d.pod == name) d.node.clear();
        }
      }
    }

    // Admission results, then the replay on the true committed free sets.
    std::vector<std::pair<std::string, std::string>> placed;
    for (const auto& d : decisions) {
      if (!d.node.empty()) placed.emplace_back(d.pod, d.node);
    }
    KDM_ASSIGN_OR_RETURN(auto statuses, WaitAdmitted(placed));
    std::map<std::string, std::set<std::string>> free = base_free;
    for (const auto& d : decisions) {
      ++results.pods;
      if (d.node.empty()) {
        ++results.unplaced;
        ++results.regrets;
        results.notes.push_back(d.pod + " (" + std::to_string(d.gpus) + " GPUs): not placed");
        continue;
      }
      const fakes::PodStatus& s = statuses[d.pod];
      double best = -1;
      std::string best_node;
      std::map<std::string, double> scores;
      for (auto& n : nodes_) {
        if (static_cast<int>(free[n.spec.name].size()) < d.gpus) continue;
        scores[n.spec.name] = TrueScore(scorer, n, free[n.spec.name], d.gpus);
        if (scores[n.spec.name] > best) {
          best = scores[n.spec.name];
          best_node = n.spec.name;
        }
      }
      const bool fits = scores.count(d.node) > 0;
      if (s.phase != fakes::kPhaseAdmitted) {
        ++results.rejections;
        ++results.regrets;
        results.notes.push_back(d.pod + " (" + std::to_string(d.gpus) + " GPUs) on " + d.node +
                                ": " + s.phase + " " + s.reason + ": " + s.message);
      } else if (!fits || scores[d.node] < best - 1e-6) {
        ++results.regrets;
        char buf[256];
        std::snprintf(buf, sizeof buf, "%s (%d GPUs) on %s: score %.1f, best %.1f on %s",
                      d.pod.c_str(), d.gpus, d.node.c_str(), fits ? scores[d.node] : 0.0, best,
                      best_node.c_str());
        results.notes.push_back(buf + std::string(" ") + d.scores);
      }
      for (const auto& dev : DevicesOf(s)) free[d.node].erase(dev);
    }

    // The burst goes; the kubelets let it go and publish its devices free.
    DeletePods(names);
    KDM_RETURN_IF_ERROR(WaitReleased(placed));
    KDM_RETURN_IF_ERROR(WaitPublished(base_free));
    KDM_RETURN_IF_ERROR(WaitExtenderSees(base_busy));
  }

  DeletePods(base_pods);
  KDM_RETURN_IF_ERROR(WaitReleased(base_placed));
  KDM_RETURN_IF_ERROR(WaitPublished({}));
  KDM_RETURN_IF_ERROR(WaitExtenderSees({}));

  results.regret_percent = results.pods ? 100.0 * results.regrets / results.pods : 0;
  if (!decision_ms.empty()) {
    double sum = 0;
    for (double v : decision_ms) sum += v;
    results.decision_ms_mean = sum / decision_ms.size();
    std::sort(decision_ms.begin(), decision_ms.end());
    results.decision_ms_p99 = decision_ms[std::min(
        decision_ms.size() - 1, static_cast<size_t>(std::ceil(0.99 * decision_ms.size())) - 1)];
  }
  return results;
}

}  // namespace

std::string Results::Summary() const {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "pods=%d rejections=%d regret=%.1f%% (%d) unplaced=%d decision_ms=%.2f/%.2f "
                "(mean/p99)",
                pods, rejections, regret_percent, regrets, unplaced, decision_ms_mean,
                decision_ms_p99);
  return buf;
}

StatusOr<std::unique_ptr<Cluster>> Cluster::Start(ClusterOptions options) {
  auto cluster = std::make_unique<ClusterImpl>(std::move(options));
  KDM_RETURN_IF_ERROR(cluster->Init());
  return std::unique_ptr<Cluster>(std::move(cluster));
}

}  // namespace kdm::sim
