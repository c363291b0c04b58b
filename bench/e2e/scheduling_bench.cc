// scheduling_bench: issue 29's bench row. The scheduling simulation
// (test/sim/scheduling_sim.h: six `kdm kubelet --publish` nodes, `kdm
// extender`, a kube-scheduler-like loop at full speed) run "before"
// (`--assume-timeout 0s`, or no flag for an extender that predates it) and
// "after" (the assumption cache on, `--assume-timeout 30s`), for best-set
// and packed, from an empty and from a partly busy cluster. Prints a table
// and one JSON line per figure (bench_output.h):
//   sim_{before,after}_{best_set,packed}_{empty,busy}_{regret_pct,rejections,decision_ms}
//
// Usage: scheduling_bench [--kdm=PATH] [--bursts=N] [--json=PATH]
//   --kdm     the kdm binary (default: bin/kdm beside this binary's bin/bench/)
//   --bursts  bursts of 18 pods per scenario (default 6)
// Exit status: 0; 1 when a configuration could not run (an "after" that
// is not available, an extender without --assume-timeout, is reported and
// skipped).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "kdm/bench/e2e/bench_output.h"
#include "kdm/test/sim/scheduling_sim.h"

namespace {

std::string DefaultKdm() {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "kdm";
  return (self.parent_path().parent_path() / "kdm").string();
}

}  // namespace

int main(int argc, char** argv) {
  using kdm::bench::FlagValue;
  kdm::bench::Figures out("scheduling", FlagValue(argc, argv, "json"));
  const std::string kdm_binary = FlagValue(argc, argv, "kdm", DefaultKdm());
  const int bursts = static_cast<int>(kdm::bench::IntFlag(argc, argv, "bursts", 6));
  if (::access(kdm_binary.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "scheduling_bench: --kdm: %s is not an executable\n", kdm_binary.c_str());
    return 2;
  }
  kdm::sim::ClusterOptions options;
  options.kdm_binary = kdm_binary;
  auto cluster = kdm::sim::Cluster::Start(options);
  if (!cluster.ok()) {
    std::fprintf(stderr, "scheduling_bench: FAILED: %s\n", cluster.status().message().c_str());
    return 1;
  }
  const bool has_flag = (*cluster)->ExtenderHasFlag("--assume-timeout");
  int status = 0;
  std::printf("%-7s %-9s %-12s %8s %10s %6s %12s\n", "config", "policy", "start", "regret",
              "rejected", "pods", "decision ms");
  for (const char* config : {"before", "after"}) {
    std::vector<std::string> args;
    if (std::string(config) == "after") {
      if (!has_flag) {
        std::printf("%-7s (not available: this kdm extender has no --assume-timeout)\n", config);
        continue;
      }
      args = {"--assume-timeout", "30s"};
    } else if (has_flag) {
      args = {"--assume-timeout", "0s"};
    }
    for (const char* policy : {"best-set", "packed"}) {
      kdm::Status started = (*cluster)->StartExtender(policy, args);
      if (!started.ok()) {
        std::fprintf(stderr, "scheduling_bench: %s %s: %s\n", config, policy,
                     started.message().c_str());
        status = 1;
        continue;
      }
      for (bool busy : {false, true}) {
        kdm::sim::ScenarioOptions scenario;
        scenario.bursts = bursts;
        scenario.partly_busy = busy;
        auto r = (*cluster)->Run(scenario);
        if (!r.ok()) {
          std::fprintf(stderr, "scheduling_bench: %s %s: %s\n", config, policy,
                       r.status().message().c_str());
          status = 1;
          continue;
        }
        std::printf("%-7s %-9s %-12s %7.1f%% %10d %6d %12.2f\n", config, policy,
                    busy ? "partly busy" : "empty", r->regret_percent, r->rejections, r->pods,
                    r->decision_ms_mean);
        // With the cache every regret is a defect worth reading: say which.
        if (std::string(config) == "after") {
          for (const std::string& note : r->notes) std::printf("          %s\n", note.c_str());
        }
        std::string name = std::string("sim_") + config + "_" +
                           (std::string(policy) == "packed" ? "packed" : "best_set") + "_" +
                           (busy ? "busy" : "empty") + "_";
        out.Add(name + "regret_pct", r->regret_percent, "%");
        out.Add(name + "rejections", r->rejections, "pods");
        out.Add(name + "decision_ms", r->decision_ms_mean, "ms");
      }
    }
  }
  return out.Write() && status == 0 ? 0 : 1;
}
