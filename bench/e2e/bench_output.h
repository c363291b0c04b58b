// Helpers shared by the end-to-end benchmarks in bench/e2e: percentiles of
// latency samples, a bounded wait, and the machine-readable output that
// bench/report.py reads.
//
// Output: one JSON object per line and per figure,
//   {"bench":"alloc_e2e","name":"alloc_p50_us","value":812.4,"unit":"us"}
// written to stdout and, with `--json=PATH`, appended to PATH as well. Names
// and units are the contract with bench/report.py (which holds the floors,
// targets and verdicts); the benchmarks only measure.
//
// Thread-safety: Figures is not thread-safe; use it from main's thread.
//
// Example:
//   kdm::bench::Figures out("alloc_e2e", kdm::bench::FlagValue(argc, argv, "json"));
//   out.Add("alloc_p50_us", kdm::bench::Percentile(samples_us, 50), "us");
//   return out.Write() ? 0 : 1;
#ifndef KDM_BENCH_E2E_BENCH_OUTPUT_H_
#define KDM_BENCH_E2E_BENCH_OUTPUT_H_

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace kdm::bench {

// The value of `--name=VALUE` among argv[1..], or `fallback`.
inline std::string FlagValue(int argc, char** argv, std::string_view name,
                             std::string fallback = "") {
  const std::string prefix = "--" + std::string(name) + "=";
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg.substr(0, prefix.size()) == prefix) return std::string(arg.substr(prefix.size()));
  }
  return fallback;
}

// `--name=N` as a positive integer; exits with status 2 and a message naming
// the flag on anything else.
inline long IntFlag(int argc, char** argv, std::string_view name, long fallback) {
  std::string text = FlagValue(argc, argv, name);
  if (text.empty()) return fallback;
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || v <= 0) {
    std::fprintf(stderr, "--%.*s: want a positive integer, got \"%s\"\n",
                 static_cast<int>(name.size()), name.data(), text.c_str());
    std::exit(2);
  }
  return v;
}

// The p-th percentile (0..100, nearest rank) of `samples`; 0 when empty.
inline double Percentile(std::vector<double> samples, double p) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * samples.size()));
  if (rank == 0) rank = 1;
  return samples[std::min(rank, samples.size()) - 1];
}

inline double Mean(const std::vector<double>& samples) {
  if (samples.empty()) return 0;
  double sum = 0;
  for (double s : samples) sum += s;
  return sum / samples.size();
}

inline double MicrosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

// Polls `pred` every `step` until it holds or `timeout` passes; returns
// whether it held.
template <typename Pred>
bool WaitUntil(Pred pred, std::chrono::milliseconds timeout,
               std::chrono::microseconds step = std::chrono::microseconds(500)) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= end) return pred();
    std::this_thread::sleep_for(step);
  }
  return true;
}

// The figures of one benchmark run.
class Figures {
 public:
  Figures(std::string bench, std::string json_path)
      : bench_(std::move(bench)), json_path_(std::move(json_path)) {}

  void Add(const std::string& name, double value, const std::string& unit) {
    char buf[512];
    std::snprintf(buf, sizeof(buf),
                  "{\"bench\":\"%s\",\"name\":\"%s\",\"value\":%.6g,\"unit\":\"%s\"}",
                  bench_.c_str(), name.c_str(), value, unit.c_str());
    lines_.emplace_back(buf);
  }

  // Prints every figure to stdout and appends them to the --json file.
  // False (with a message) when that file cannot be written.
  bool Write() const {
    for (const std::string& l : lines_) std::printf("%s\n", l.c_str());
    std::fflush(stdout);
    if (json_path_.empty()) return true;
    FILE* f = std::fopen(json_path_.c_str(), "a");
    if (f == nullptr) {
      std::perror(json_path_.c_str());
      return false;
    }
    for (const std::string& l : lines_) std::fprintf(f, "%s\n", l.c_str());
    return std::fclose(f) == 0;
  }

 private:
  std::string bench_;
  std::string json_path_;
  std::vector<std::string> lines_;
};

}  // namespace kdm::bench

#endif  // KDM_BENCH_E2E_BENCH_OUTPUT_H_
