// `kdm extender`: kube-scheduler's HTTP extender (docs/extender.md). Serves
// POST /filter and POST /prioritize (plus /healthz and /metrics) on
// --listen, scoring nodes from their kdm.io/devices annotation with
// kdm::scheduler. With --kubeconfig, --context or --in-cluster it keeps a node
// cache (LIST + WATCH), so that a scheduler configured with
// nodeCacheCapable: true can send node names only, and watches bound pods to
// assume their devices taken until their node publishes them
// (--assume-timeout, --bind-wait), and POST /bind posts Bindings.
//
// Prints "kdm extender: listening on HOST:PORT" on stderr once serving;
// SIGINT/SIGTERM stop it (exit 0; a second one during the stop exits at once,
// 130/143). Exit codes: 0 stopped, 1 runtime error
// (cannot listen, cannot read a TLS file, cannot reach the API server), 2
// usage.
#include <signal.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <string>

#include "cli_common.h"
#include "cli_dialect.h"
#include "commands.h"
#include "duration_flag.h"
#include "kdm/base/env.h"
#include "kdm/http/listen_address.h"
#include "kdm/kube/binding.h"
#include "kdm/kube/client.h"
#include "kdm/scheduler/extender.h"
#include "kdm/scheduler/http_server.h"
#include "kdm/scheduler/metrics.h"
#include "kdm/scheduler/node_cache.h"
#include "kdm/scheduler/pod_watch.h"
#include "kube_flags.h"

namespace kdm::cli {
namespace {

constexpr uint64_t kMaxPemBytes = 1 << 20;

struct ExtenderFlags {
  std::string listen;
  std::string tls_cert;
  std::string tls_key;
  // topology::kDefaultPolicy, as every kdm command's.
  std::string policy{scheduler::ScorePolicyName(scheduler::kDefaultScorePolicy)};
  KubeClientFlags kube;  // optional: without it, no node cache
  int threads = 2;
  uint64_t max_body_bytes = 128ull << 20;
  uint64_t max_total_body_bytes = 192ull << 20;
  std::string request_budget = "500ms";
  uint64_t topology_cache_bytes = k8s::kDefaultTopologyCacheBytes;
  std::string assume_timeout = "30s";
  std::string bind_wait = "100ms";
  int verbosity = 0;
};

// A byte count as a whole decimal number: CLI11 alone takes "-5" for an
// unsigned flag (it wraps) and a number past 2^64 without a word.
std::string CheckByteCount(const std::string& v) {
  if (v.empty() || v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos) {
    return "must be a whole number of bytes (0 to 9999999999999999999), got '" + v + "'";
  }
  return "";
}

int RunExtender(const ExtenderFlags& flags) {
  SetUpStderrLogging("extender", LogLevelFor(flags.verbosity, spdlog::level::info));
  auto fail = [](int code, const std::string& m) {
    std::cerr << "kdm extender: " << m << "\n";
    return code;
  };
  if (flags.listen.empty()) return fail(kUsageError, "--listen is required");
  StatusOr<http::ListenAddress> listen = ParseListenFlag("--listen", flags.listen);
  if (!listen.ok()) return fail(kUsageError, std::string(listen.status().message()));
  const std::string& host = listen->host;
  if (flags.tls_cert.empty() != flags.tls_key.empty()) {
    return fail(kUsageError, "--tls-cert and --tls-key: give both or neither");
  }
  if (Status s = CheckKubeClientFlags(flags.kube); !s.ok()) {
    return fail(kUsageError, std::string(s.message()));
  }
  StatusOr<scheduler::ScorePolicy> policy = scheduler::ParseScorePolicy(flags.policy);
  if (!policy.ok()) return fail(kUsageError, "--policy: " + std::string(policy.status().message()));
  if (flags.threads < 1 || flags.threads > 64) return fail(kUsageError, "--threads: 1..64");
  if (flags.max_body_bytes < 1024) return fail(kUsageError, "--max-body-bytes: at least 1024");
  if (flags.max_total_body_bytes < flags.max_body_bytes) {
    return fail(kUsageError, "--max-total-body-bytes: at least --max-body-bytes (" +
                                 std::to_string(flags.max_body_bytes) + ")");
  }
  StatusOr<std::chrono::milliseconds> budget = ParseDurationFlag(flags.request_budget);
  if (!budget.ok() || budget->count() < 1 || *budget > std::chrono::seconds(60)) {
    return fail(kUsageError,
                "--request-budget: " + (budget.ok() ? std::string("must be 1ms..60s")
                                                    : std::string(budget.status().message())));
  }
  StatusOr<std::chrono::milliseconds> assume_timeout = ParseDurationFlag(flags.assume_timeout);
  if (!assume_timeout.ok() || *assume_timeout > std::chrono::hours(1)) {
    return fail(kUsageError,
                "--assume-timeout: " + (assume_timeout.ok()
                                            ? std::string("must be 0 (off) to 1h")
                                            : std::string(assume_timeout.status().message())));
  }
  StatusOr<std::chrono::milliseconds> bind_wait = ParseDurationFlag(flags.bind_wait);
  if (!bind_wait.ok() || *bind_wait > std::chrono::seconds(5)) {
    return fail(kUsageError,
                "--bind-wait: " + (bind_wait.ok() ? std::string("must be 0 (off) to 5s")
                                                  : std::string(bind_wait.status().message())));
  }
  // `kdm --dry-run extender`: every check above is pure; nothing below is.
  if (DryRun()) return kOk;

  scheduler::ExtenderServer::Options server_options;
  server_options.listen = flags.listen;
  server_options.threads = flags.threads;
  server_options.max_body_bytes = flags.max_body_bytes;
  server_options.max_total_body_bytes = flags.max_total_body_bytes;
  for (auto [flag, path, out] :
       {std::tuple{"--tls-cert", &flags.tls_cert, &server_options.tls_cert_pem},
        std::tuple{"--tls-key", &flags.tls_key, &server_options.tls_key_pem}}) {
    if (path->empty()) continue;
    StatusOr<std::string> pem = Env::Default()->ReadFile(*path, kMaxPemBytes);
    if (!pem.ok())
      return fail(kRuntimeError, std::string(flag) + ": " + std::string(pem.status().message()));
    *out = std::move(*pem);
  }

  // The API server client for the node cache (none without the flags).
  std::unique_ptr<kube::Client> client;
  if (flags.kube.given()) {
    StatusOr<std::unique_ptr<kube::Client>> made = MakeKubeClient(flags.kube);
    if (!made.ok()) return fail(kRuntimeError, std::string(made.status().message()));
    client = std::move(*made);
  }

  // Before any thread exists (see StopSignals): the first SIGTERM/SIGINT
  // stops the extender cleanly, a second one exits at once (130/143).
  StopSignals stop_signals("kdm extender");

  scheduler::KeepLargeAllocationsMapped();
  k8s::TopologyCache topologies(flags.topology_cache_bytes);
  std::unique_ptr<scheduler::ExtenderMetrics> metrics = scheduler::ExtenderMetrics::Create();
  metrics->WatchTopologyCache(&topologies);
  // Assumed allocations need the API server's bound pods.
  std::unique_ptr<scheduler::Assumptions> assumptions;
  if (client && assume_timeout->count() > 0) {
    assumptions = std::make_unique<scheduler::Assumptions>(scheduler::Assumptions::Options{
        .timeout = *assume_timeout, .bind_wait = *bind_wait, .metrics = metrics.get()});
  }
  std::unique_ptr<scheduler::NodeCache> cache;
  std::unique_ptr<scheduler::PodWatch> pod_watch;
  if (client) {
    cache = std::make_unique<scheduler::NodeCache>(&topologies, assumptions.get());
    if (Status s = cache->Start(client.get()); !s.ok()) {
      return fail(kRuntimeError, "node cache: " + std::string(s.message()));
    }
  }
  if (assumptions) {
    pod_watch = std::make_unique<scheduler::PodWatch>(assumptions.get());
    if (Status s = pod_watch->Start(client.get()); !s.ok()) {
      cache->Stop();
      return fail(kRuntimeError, "pod watch: " + std::string(s.message()));
    }
  }
  auto stop_watches = [&] {
    if (pod_watch) pod_watch->Stop();
    if (cache) cache->Stop();
  };
  scheduler::Extender::Options extender_options;
  extender_options.policy = *policy;
  extender_options.cache = cache.get();
  extender_options.metrics = metrics.get();
  extender_options.topologies = &topologies;
  extender_options.request_budget = *budget;
  extender_options.assumptions = assumptions.get();
  if (client) {
    // kube-scheduler's bind call must answer within its httpTimeout (5 s).
    kube::Client* c = client.get();
    extender_options.bind = [c](const scheduler::BindArgs& a) {
      return kube::CreateBinding(*c,
                                 kube::Binding{.namespace_name = a.pod_namespace,
                                               .name = a.pod_name,
                                               .uid = a.pod_uid,
                                               .node = a.node},
                                 std::chrono::seconds(4));
    };
  }
  scheduler::Extender extender(extender_options);
  server_options.extender = &extender;
  server_options.metrics = metrics.get();
  RaiseFdLimit();  // after every flag and file was checked: a bad one is one line
  auto server = scheduler::ExtenderServer::Start(std::move(server_options));
  if (!server.ok()) {
    stop_watches();
    // A PEM that does not load is named by its flag and file.
    std::string m(server.status().message());
    if (m.rfind("TLS certificate: ", 0) == 0) m = "--tls-cert " + flags.tls_cert + ": " + m;
    if (m.rfind("TLS key: ", 0) == 0) m = "--tls-key " + flags.tls_key + ": " + m;
    return fail(kRuntimeError, m);
  }
  std::cerr << "kdm extender: listening on " << host << ":" << (*server)->port() << " policy "
            << scheduler::ScorePolicyName(*policy) << (cache ? " with node cache" : "")
            << (assumptions ? " and assumed pods" : "") << std::endl;
  const int sig = stop_signals.Wait();
  const auto stop_start = std::chrono::steady_clock::now();
  spdlog::info("event=extender_stopping signal={}", StopSignalName(sig));
  (*server)->Stop();
  stop_watches();
  spdlog::info("event=extender_stopped took_ms={}",
               std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::steady_clock::now() - stop_start)
                   .count());
  return kOk;
}

}  // namespace

void AddExtenderCommand(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<ExtenderFlags>();
  auto* cmd = app.add_subcommand(
      "extender", "Serve kube-scheduler's HTTP extender: topology-aware filter and prioritize");
  cmd->add_option("--listen", flags->listen, "HOST:PORT to serve on (:PORT for every address)")
      ->type_name("ADDR");
  cmd->add_option("--tls-cert", flags->tls_cert, "Serve HTTPS with this PEM certificate (chain)")
      ->type_name("FILE");
  cmd->add_option("--tls-key", flags->tls_key, "The PEM key of --tls-cert")->type_name("FILE");
  cmd->add_option("--policy", flags->policy, "Scoring: packed or best-set (the KEP's)")
      ->capture_default_str();
  // With either, the extender keeps a node cache from the API server.
  AddKubeClientFlags(cmd, &flags->kube);
  cmd->add_option("--threads", flags->threads, "Threads running filter and prioritize")
      ->capture_default_str();
  cmd->add_option("--max-body-bytes", flags->max_body_bytes, "The largest request body accepted")
      ->check(CheckByteCount)
      ->capture_default_str();
  cmd->add_option("--topology-cache-bytes", flags->topology_cache_bytes,
                  "Bytes of decoded link matrices kept for reuse (least recently used evicted)")
      ->check(CheckByteCount)
      ->capture_default_str();
  cmd->add_option("--max-total-body-bytes", flags->max_total_body_bytes,
                  "All request bodies in flight together; past it 503 with Retry-After")
      ->check(CheckByteCount)
      ->capture_default_str();
  cmd->add_option("--request-budget", flags->request_budget,
                  "Time one request may spend on its nodes; the rest pass unjudged / score 0")
      ->capture_default_str()
      ->type_name("DURATION");
  cmd->add_option("--assume-timeout", flags->assume_timeout,
                  "With --kubeconfig/--in-cluster: how long a bound pod's devices count as "
                  "taken while its node's annotation does not show it (0: off)")
      ->capture_default_str()
      ->type_name("DURATION");
  cmd->add_option("--bind-wait", flags->bind_wait,
                  "How long a filter waits for the bind of the pod before it (0: not at all)")
      ->capture_default_str()
      ->type_name("DURATION");
  AddVerbosityFlag(cmd, &flags->verbosity);
  cmd->callback([flags, &exit_code] { exit_code = RunExtender(*flags); });
}

}  // namespace kdm::cli
