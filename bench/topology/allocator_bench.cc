// Allocator speed: every size on 8 devices (target < 50 us) and on 16 devices
// (target < 5 ms), and 32 devices under the default 50 ms budget.
//   build-*/bin/bench/topology_bench
#include <benchmark/benchmark.h>

#include "kdm/topology/allocator.h"
#include "kdm/topology/node_score.h"
#include "kdm/topology/presets.h"

namespace kdm::topology {
namespace {

std::vector<int> Range(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

// `blocks` DGX-1 V100 boards joined by SYS: not symmetric, so few ties.
Topology V100Blocks(int blocks) {
  Topology v = *Preset("dgx1-v100");
  const int n = 8 * blocks;
  std::vector<DeviceInfo> d;
  for (int i = 0; i < n; ++i) d.push_back({"GPU" + std::to_string(i), i, i / 4});
  std::vector<std::vector<Link>> links(n, std::vector<Link>(n, Link{0, PcieLink::kSys}));
  for (int i = 0; i < n; ++i) {
    links[i][i] = Link{};
    for (int j = 0; j < n; ++j) {
      if (i != j && i / 8 == j / 8) links[i][j] = v.LinkBetween(i % 8, j % 8);
    }
  }
  return std::move(Topology::Create(d, links)).value();
}

void Run(benchmark::State& state, const Topology& t, Policy policy) {
  const int size = static_cast<int>(state.range(0));
  const std::vector<int> all = Range(t.size());
  bool optimal = true;
  for (auto _ : state) {
    auto a = Allocate(t, all, {}, size, policy);
    optimal = optimal && a->optimal;
    benchmark::DoNotOptimize(a);
  }
  state.counters["optimal"] = optimal ? 1 : 0;
}

void BM_Packed_Dgx1V100(benchmark::State& s) { Run(s, *Preset("dgx1-v100"), Policy::kPacked); }
void BM_BestSet_Dgx1V100(benchmark::State& s) { Run(s, *Preset("dgx1-v100"), Policy::kBestSet); }
void BM_Packed_HgxH100(benchmark::State& s) { Run(s, *Preset("hgx-h100"), Policy::kPacked); }
void BM_Packed_Dgx2(benchmark::State& s) { Run(s, *Preset("dgx2-16"), Policy::kPacked); }
void BM_BestSet_Dgx2(benchmark::State& s) { Run(s, *Preset("dgx2-16"), Policy::kBestSet); }
void BM_Packed_2xV100(benchmark::State& s) { Run(s, V100Blocks(2), Policy::kPacked); }
void BM_BestSet_2xV100(benchmark::State& s) { Run(s, V100Blocks(2), Policy::kBestSet); }
void BM_Packed_4xV100(benchmark::State& s) { Run(s, V100Blocks(4), Policy::kPacked); }
void BM_BestSet_4xV100(benchmark::State& s) { Run(s, V100Blocks(4), Policy::kBestSet); }

void BM_NodeScore_Dgx2(benchmark::State& state) {
  Topology t = *Preset("dgx2-16");
  for (auto _ : state) benchmark::DoNotOptimize(NodeScore(t, Range(16), 8));
}

BENCHMARK(BM_Packed_Dgx1V100)->DenseRange(1, 8)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_BestSet_Dgx1V100)->DenseRange(1, 8)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Packed_HgxH100)->DenseRange(1, 8)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Packed_Dgx2)->DenseRange(1, 16)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_BestSet_Dgx2)->DenseRange(1, 16)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Packed_2xV100)->DenseRange(1, 16)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_BestSet_2xV100)->DenseRange(1, 16)->Unit(benchmark::kMicrosecond);
// The 32-GPU node: both policies on the same doubling request sizes.
void Sizes32(benchmark::internal::Benchmark* b) {
  b->RangeMultiplier(2)->Range(1, 32)->Unit(benchmark::kMillisecond);
}
BENCHMARK(BM_Packed_4xV100)->Apply(Sizes32);
BENCHMARK(BM_BestSet_4xV100)->Apply(Sizes32);
BENCHMARK(BM_NodeScore_Dgx2)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kdm::topology

BENCHMARK_MAIN();
