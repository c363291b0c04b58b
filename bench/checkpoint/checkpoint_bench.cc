// checkpoint_bench: what one allocation change costs with 10, 100, 1,000 and
// 10,000 pods already recorded, for the SQLite store (synchronous=FULL, one
// transaction per change) and the kubelet JSON file store (full rewrite,
// fsync, rename). One benchmark iteration is one Apply(): even iterations
// upsert one container entry, odd ones remove it again.
//
// After Google Benchmark's own table it prints the ratios the issue sets
// targets for: SQLite at 10,000 within 2x of SQLite at 10, and at 10,000
// pods SQLite at least 20x cheaper than the JSON store.
//
// The files live in a temporary directory under $KDM_BENCH_DIR (default: the
// current directory), which should be a real disk: fsync on tmpfs is free.
//
//   build/bin/bench/checkpoint_bench
#include <benchmark/benchmark.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "kdm/checkpoint/kubelet_json_store.h"
#include "kdm/checkpoint/sqlite_store.h"

namespace kdm::checkpoint {
namespace {

constexpr long kSizes[] = {10, 100, 1000, 10000};

std::string& BenchDir() {
  static std::string dir;
  return dir;
}

PodDevicesEntry PodEntry(long i) {
  // About what a GPU plugin answers: two device nodes, an env var, a mount.
  std::string resp(180, static_cast<char>('a' + i % 26));
  return PodDevicesEntry{"pod-" + std::to_string(i) + "-6b0d3a6e-1c2f-4d1e-9a57-3f1f6b1e2a10",
                         "main",
                         "nvidia.com/gpu",
                         {{static_cast<int64_t>(i % 2),
                           {"GPU-" + std::to_string(i % 8), "GPU-" + std::to_string((i + 1) % 8)}}},
                         resp};
}

std::unique_ptr<Store> OpenStore(bool sqlite, long pods) {
  static int counter = 0;
  std::string path = BenchDir() + "/" + (sqlite ? "sqlite-" : "json-") + std::to_string(pods) +
                     "-" + std::to_string(counter++);
  StatusOr<OpenResult> opened = sqlite ? OpenSqliteStore({.path = path, .synchronous_full = true})
                                       : OpenKubeletJsonStore(path);
  if (!opened.ok()) {
    std::fprintf(stderr, "open %s: %s\n", path.c_str(), opened.status().ToString().c_str());
    std::exit(1);
  }
  CheckpointData data;
  for (long i = 0; i < pods; ++i) data.entries.push_back(PodEntry(i));
  data.registered_devices["nvidia.com/gpu"] = {"GPU-0", "GPU-1", "GPU-2", "GPU-3",
                                               "GPU-4", "GPU-5", "GPU-6", "GPU-7"};
  if (Status s = opened->store->Replace(data); !s.ok()) {
    std::fprintf(stderr, "fill %s: %s\n", path.c_str(), s.ToString().c_str());
    std::exit(1);
  }
  return std::move(opened->store);
}

void AllocationChange(benchmark::State& state, bool sqlite) {
  const long pods = state.range(0);
  std::unique_ptr<Store> store = OpenStore(sqlite, pods);
  PodDevicesEntry extra = PodEntry(pods + 1);
  extra.pod_uid = "new-pod";
  Change add;
  add.upserts = {extra};
  Change remove;
  remove.removals = {extra.key()};
  bool present = false;
  for (auto _ : state) {
    Status s = store->Apply(present ? remove : add);
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
    present = !present;
  }
  state.counters["pods"] = static_cast<double>(pods);
}

void BM_Sqlite(benchmark::State& state) { AllocationChange(state, true); }
void BM_KubeletJson(benchmark::State& state) { AllocationChange(state, false); }

BENCHMARK(BM_Sqlite)->Arg(10)->Arg(100)->Arg(1000)->Arg(10000)->UseRealTime()->MinTime(1.0)->Unit(
    benchmark::kMicrosecond);
BENCHMARK(BM_KubeletJson)
    ->Arg(10)
    ->Arg(100)
    ->Arg(1000)
    ->Arg(10000)
    ->UseRealTime()
    ->MinTime(1.0)
    ->Unit(benchmark::kMicrosecond);

// Keeps Google Benchmark's console output and remembers each result.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  // Colours only on a terminal.
  RatioReporter() : ConsoleReporter(isatty(STDOUT_FILENO) ? OO_Defaults : OO_Tabular) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.error_occurred || run.run_type != Run::RT_Iteration) continue;
      // Per-iteration real time in microseconds.
      double us = run.GetAdjustedRealTime() *
                  benchmark::GetTimeUnitMultiplier(benchmark::kMicrosecond) /
                  benchmark::GetTimeUnitMultiplier(run.time_unit);
      std::string name = run.benchmark_name();
      long pods = std::atol(name.substr(name.find('/') + 1).c_str());
      (name.rfind("BM_Sqlite", 0) == 0 ? sqlite_ : json_)[pods] = us;
    }
  }

  void PrintTable() const {
    std::printf(
        "\nCost of one allocation change (one Apply), microseconds, real "
        "time:\n");
    std::printf("%8s  %14s  %14s  %12s\n", "pods", "sqlite (FULL)", "kubelet-json", "json/sqlite");
    for (long pods : kSizes) {
      auto s = sqlite_.find(pods);
      auto j = json_.find(pods);
      if (s == sqlite_.end() || j == json_.end()) continue;
      std::printf("%8ld  %14.1f  %14.1f  %11.1fx\n", pods, s->second, j->second,
                  j->second / s->second);
    }
    auto s10 = sqlite_.find(10), s10k = sqlite_.find(10000), j10k = json_.find(10000);
    if (s10 != sqlite_.end() && s10k != sqlite_.end()) {
      double growth = s10k->second / s10->second;
      std::printf("sqlite at 10000 / sqlite at 10: %.2fx (target <= 2x: %s)\n", growth,
                  growth <= 2.0 ? "met" : "NOT met");
    }
    if (s10k != sqlite_.end() && j10k != json_.end()) {
      double gain = j10k->second / s10k->second;
      std::printf("kubelet-json / sqlite at 10000: %.1fx (target >= 20x: %s)\n", gain,
                  gain >= 20.0 ? "met" : "NOT met");
    }
  }

 private:
  std::map<long, double> sqlite_, json_;
};

std::string FilesystemType(const std::string& dir) {
  struct statfs fs {};
  if (statfs(dir.c_str(), &fs) != 0) return "unknown";
  if (fs.f_type == 0x01021994) return "tmpfs (fsync is free: figures are not meaningful)";
  if (fs.f_type == 0xEF53) return "ext4";
  if (fs.f_type == 0x58465342) return "xfs";
  if (fs.f_type == 0x9123683E) return "btrfs";
  if (fs.f_type == 0x794C7630) return "overlayfs";
  char hex[32];
  std::snprintf(hex, sizeof(hex), "0x%lx", static_cast<unsigned long>(fs.f_type));
  return hex;
}

}  // namespace
}  // namespace kdm::checkpoint

int main(int argc, char** argv) {
  using namespace kdm::checkpoint;
  const char* base = std::getenv("KDM_BENCH_DIR");
  std::string tmpl =
      std::string(base != nullptr && *base != '\0' ? base : ".") + "/kdm-ckpt-bench-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  BenchDir() = tmpl;
  std::printf("checkpoint files in %s (%s)\n", tmpl.c_str(), FilesystemType(tmpl).c_str());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.PrintTable();
  benchmark::Shutdown();
  std::string cleanup = "rm -rf '" + tmpl + "'";
  return std::system(cleanup.c_str()) == 0 ? 0 : 1;
}
