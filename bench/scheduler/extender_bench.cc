// `kdm extender` on a cluster-sized request (docs/extender.md, "Speed"):
// 5,000 full Node objects of realistic size (labels, annotations, status,
// capacity, conditions, images; about 8 KiB each, the kdm.io/devices
// annotation included), 8 GPUs each from mixed presets with random free
// sets, and a pod asking 2 GPUs.
//
// Rows (real time per request; p99 over the repetitions):
//   BM_Filter / BM_Prioritize / BM_FilterPrioritize  the extender's answers,
//       warm (one extender across requests, as it runs) and cold (a fresh
//       extender, empty memo and topology cache, per request);
//   BM_ParseFloorDom       simdjson's DOM parse of the same body (every byte
//                          validated: the floor of reading it at all);
//   BM_ParseFloorOnDemand  simdjson On-Demand reading only each node's name
//                          and annotation string;
//   BM_NodeNamesFromCache  filter + prioritize of 5,000 NodeNames answered
//                          from the node cache; pods:2000/published:0 with
//                          2,000 pods assumed bound (1 or 2 GPUs each) on
//                          random nodes, pods:2000/published:1 with the
//                          same pods already in the annotations (the same
//                          answers without the cache: docs/extender.md,
//                          "Assumed allocations").
#include <benchmark/benchmark.h>
#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kdm/k8s/devices_annotation.h"
#include "kdm/kube/node_informer.h"
#include "kdm/scheduler/assumptions.h"
#include "kdm/scheduler/extender.h"
#include "kdm/scheduler/extender_json.h"
#include "kdm/scheduler/http_server.h"
#include "kdm/scheduler/node_cache.h"
#include "kdm/topology/presets.h"

namespace {

using kdm::scheduler::AppendJsonString;

constexpr int kNodes = 5000;

double P99(const std::vector<double>& v) {
  std::vector<double> s = v;
  std::sort(s.begin(), s.end());
  size_t i = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(s.size())));
  return s[std::max<size_t>(i, 1) - 1];
}

// The preset's links with the node's own device ids.
kdm::topology::Topology Renamed(const kdm::topology::Topology& t, const std::string& node) {
  std::vector<kdm::topology::DeviceInfo> devices = t.devices();
  std::vector<std::vector<kdm::topology::Link>> links(t.size(),
                                                      std::vector<kdm::topology::Link>(t.size()));
  for (int i = 0; i < t.size(); ++i) {
    devices[i].id = "GPU-" + node + "-" + std::to_string(i) + "-6f1c2d3e-4b5a-6978-8a9b";
    for (int j = 0; j < t.size(); ++j) links[i][j] = t.LinkBetween(i, j);
  }
  return *kdm::topology::Topology::Create(devices, links);
}

std::string Annotation(const std::string& node, const kdm::topology::Topology& t,
                       std::mt19937& rng) {
  kdm::k8s::ResourceInput in;
  for (const auto& d : t.devices()) in.allocatable[d.id] = d.numa;
  for (const auto& d : t.devices()) {
    if (rng() % 2 == 0) in.in_use.insert(d.id);
  }
  in.topology = &t;
  in.attributes = kdm::k8s::DeviceAttributes{.model = "NVIDIA H100 80GB HBM3",
                                             .memory_mib = 81559,
                                             .driver = "550.54.15",
                                             .cuda = "12.4",
                                             .arch = "9.0",
                                             .brand = "nvidia"};
  kdm::k8s::DevicesAnnotation a{.node = node, .updated = "2026-11-24T23:00:00Z"};
  a.resources["nvidia.com/gpu"] = kdm::k8s::BuildResourceDevices(in);
  return kdm::k8s::EncodeDevicesAnnotation(a);
}

std::string NodeJson(const std::string& name, const std::string& annotation, int i) {
  std::string o = "{\"kind\":\"Node\",\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"" + name +
                  "\",\"uid\":\"0b6d3c1e-" + std::to_string(100000 + i) +
                  "-4d2c-9a61-8f0e7c3b2a19\",\"resourceVersion\":\"" + std::to_string(9000000 + i) +
                  "\",\"creationTimestamp\":\"2026-11-01T08:00:00Z\",\"labels\":{";
  const char* labels[][2] = {{"beta.kubernetes.io/arch", "amd64"},
                             {"beta.kubernetes.io/os", "linux"},
                             {"kubernetes.io/arch", "amd64"},
                             {"kubernetes.io/os", "linux"},
                             {"node.kubernetes.io/instance-type", "p5.48xlarge"},
                             {"topology.kubernetes.io/region", "us-east-1"},
                             {"topology.kubernetes.io/zone", "us-east-1a"},
                             {"nvidia.com/gpu.present", "true"},
                             {"nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"},
                             {"nvidia.com/gpu.count", "8"},
                             {"nvidia.com/cuda.driver.major", "550"},
                             {"feature.node.kubernetes.io/cpu-model.vendor_id", "Intel"},
                             {"feature.node.kubernetes.io/kernel-version.full", "6.1.0-18-amd64"},
                             {"node-role.kubernetes.io/gpu-worker", ""}};
  bool first = true;
  for (auto& l : labels) {
    if (!first) o += ",";
    first = false;
    o += "\"" + std::string(l[0]) + "\":\"" + l[1] + "\"";
  }
  o += ",\"kubernetes.io/hostname\":\"" + name + "\"},\"annotations\":{";
  o += "\"node.alpha.kubernetes.io/ttl\":\"0\",\"volumes.kubernetes.io/controller-managed-attach-"
       "detach\":\"true\",\"csi.volume.kubernetes.io/nodeid\":\"{\\\"ebs.csi.aws.com\\\":\\\"i-0" +
       std::to_string(i) + "\\\"}\",\"kdm.io/devices\":";
  AppendJsonString(annotation, &o);
  o += "},\"managedFields\":[{\"manager\":\"kubelet\",\"operation\":\"Update\",\"apiVersion\":"
       "\"v1\",\"time\":\"2026-11-24T22:59:00Z\",\"fieldsType\":\"FieldsV1\",\"fieldsV1\":{\"f:"
       "status\":{\"f:conditions\":{\"k:{\\\"type\\\":\\\"Ready\\\"}\":{\".\":{},\"f:"
       "lastHeartbeatTime\":{}}}}}}]},";
  o += "\"spec\":{\"podCIDR\":\"10.244." + std::to_string(i % 250) +
       ".0/24\",\"providerID\":\"aws:///us-east-1a/i-0" + std::to_string(i) +
       "\",\"taints\":[{\"key\":\"nvidia.com/gpu\",\"effect\":\"NoSchedule\"}]},";
  o += "\"status\":{\"capacity\":{\"cpu\":\"192\",\"ephemeral-storage\":\"7499362328Ki\","
       "\"hugepages-1Gi\":\"0\",\"hugepages-2Mi\":\"0\",\"memory\":\"2097152000Ki\",\"nvidia.com/"
       "gpu\":\"8\",\"pods\":\"110\"},\"allocatable\":{\"cpu\":\"191450m\",\"ephemeral-storage\":"
       "\"6911495270614\",\"hugepages-1Gi\":\"0\",\"hugepages-2Mi\":\"0\",\"memory\":"
       "\"2096000000Ki\",\"nvidia.com/gpu\":\"8\",\"pods\":\"110\"},\"conditions\":[";
  const char* conds[][3] = {
      {"MemoryPressure", "False", "KubeletHasSufficientMemory"},
      {"DiskPressure", "False", "KubeletHasNoDiskPressure"},
      {"PIDPressure", "False", "KubeletHasSufficientPID"},
      {"Ready", "True", "KubeletReady"},
  };
  for (int c = 0; c < 4; ++c) {
    if (c) o += ",";
    o += "{\"type\":\"" + std::string(conds[c][0]) + "\",\"status\":\"" + conds[c][1] +
         "\",\"lastHeartbeatTime\":\"2026-11-24T22:59:00Z\",\"lastTransitionTime\":\"2026-11-01T"
         "08:01:00Z\",\"reason\":\"" +
         conds[c][2] +
         "\",\"message\":\"kubelet has sufficient resources and is posting ready "
         "status\"}";
  }
  o += "],\"addresses\":[{\"type\":\"InternalIP\",\"address\":\"10.0." + std::to_string(i / 250) +
       "." + std::to_string(i % 250) + "\"},{\"type\":\"Hostname\",\"address\":\"" + name +
       "\"}],\"daemonEndpoints\":{\"kubeletEndpoint\":{\"Port\":10250}},\"nodeInfo\":{"
       "\"machineID\":\"ec2b1f0e9d8c7b6a5f4e3d2c1b0a9f8e\",\"systemUUID\":\"ec2b1f0e-9d8c-7b6a-"
       "5f4e-3d2c1b0a9f8e\",\"bootID\":\"3c1e9a1c-0e0f-4c69-8b16-1f2a3b4c5d6e\",\"kernelVersion\":"
       "\"6.1.0-18-amd64\",\"osImage\":\"Debian GNU/Linux 12 (bookworm)\","
       "\"containerRuntimeVersion\":\"containerd://1.7.13\",\"kubeletVersion\":\"v1.30.2\","
       "\"kubeProxyVersion\":\"v1.30.2\",\"operatingSystem\":\"linux\",\"architecture\":"
       "\"amd64\"},\"images\":[";
  for (int m = 0; m < 16; ++m) {
    if (m) o += ",";
    o += "{\"names\":[\"nvcr.io/nvidia/pytorch@sha256:" + std::string(56, "0123456789abcdef"[m]) +
         "\",\"nvcr.io/nvidia/pytorch:24.0" + std::to_string(m % 10) +
         "-py3\"],\"sizeBytes\":" + std::to_string(9876543210LL + m) + "}";
  }
  o += "]}}";
  return o;
}

struct Cluster {
  std::string pod;
  std::vector<std::string> names;
  std::vector<std::string> nodes;
  std::vector<std::string> annotations;  // each node's kdm.io/devices value
  std::string body;                      // full Nodes
  std::string names_body;                // NodeNames only
};

const Cluster& GetCluster() {
  static const Cluster* cluster = [] {
    auto* c = new Cluster;
    std::mt19937 rng(6);
    const std::vector<std::string> presets = {"dgx1-p100", "dgx1-v100", "dgx-a100", "hgx-h100",
                                              "pcie-8gpu"};
    std::vector<kdm::topology::Topology> tops;
    for (const auto& p : presets) tops.push_back(*kdm::topology::Preset(p));
    c->pod =
        "{\"metadata\":{\"name\":\"train-7\",\"namespace\":\"ml\"},\"spec\":{\"containers\":[{"
        "\"name\":\"trainer\",\"image\":\"nvcr.io/nvidia/pytorch:24.05-py3\",\"env\":[{\"name\":"
        "\"NVIDIA_REQUIRE_CUDA\",\"value\":\"cuda>=12.2\"}],\"resources\":{\"limits\":{\"cpu\":"
        "\"8\",\"nvidia.com/gpu\":\"2\"},\"requests\":{\"cpu\":\"8\",\"nvidia.com/"
        "gpu\":\"2\"}}}]}}";
    c->body = "{\"Pod\":" + c->pod + ",\"Nodes\":{\"metadata\":{},\"items\":[";
    c->names_body = "{\"Pod\":" + c->pod + ",\"Nodes\":null,\"NodeNames\":[";
    for (int i = 0; i < kNodes; ++i) {
      std::string name = "gpu-node-" + std::to_string(i);
      kdm::topology::Topology t = Renamed(tops[i % tops.size()], name);
      c->annotations.push_back(Annotation(name, t, rng));
      c->nodes.push_back(NodeJson(name, c->annotations.back(), i));
      c->names.push_back(name);
      if (i) {
        c->body += ",";
        c->names_body += ",";
      }
      c->body += c->nodes.back();
      c->names_body += "\"" + name + "\"";
    }
    c->body += "]},\"NodeNames\":null}";
    c->names_body += "]}";
    std::fprintf(stderr, "extender_bench: %d nodes, body %.1f MB (%.1f KiB per node)\n", kNodes,
                 static_cast<double>(c->body.size()) / 1e6,
                 static_cast<double>(c->body.size()) / kNodes / 1024);
    return c;
  }();
  return *cluster;
}

enum Verb { kFilter = 1, kPrioritize = 2, kBoth = 3 };

// The figures in docs/extender.md ("Speed") were taken with best-set, the
// extender's default until issue 30; kept so that runs stay comparable.
constexpr kdm::scheduler::ScorePolicy kBenchPolicy = kdm::scheduler::ScorePolicy::kBestSet;

void RunExtender(benchmark::State& state, Verb verb, bool cold) {
  const Cluster& c = GetCluster();
  std::string body = c.body;
  kdm::scheduler::PadBody(&body);
  auto extender = std::make_unique<kdm::scheduler::Extender>(
      kdm::scheduler::Extender::Options{.policy = kBenchPolicy});
  if (!cold) {
    extender->Filter(body);  // warm the memo and the topology cache
    extender->Prioritize(body);
  }
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      extender = std::make_unique<kdm::scheduler::Extender>(
          kdm::scheduler::Extender::Options{.policy = kBenchPolicy});
      state.ResumeTiming();
    }
    if (verb & kFilter) {
      auto a = extender->Filter(body);
      if (a.status != 200) state.SkipWithError(a.body.c_str());
      benchmark::DoNotOptimize(a);
    }
    if (verb & kPrioritize) {
      auto a = extender->Prioritize(body);
      if (a.status != 200) state.SkipWithError(a.body.c_str());
      benchmark::DoNotOptimize(a);
    }
  }
  state.counters["nodes"] = kNodes;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(body.size()) * (verb == kBoth ? 2 : 1));
}

void BM_Filter(benchmark::State& s) { RunExtender(s, kFilter, s.range(0) == 1); }
void BM_Prioritize(benchmark::State& s) { RunExtender(s, kPrioritize, s.range(0) == 1); }
void BM_FilterPrioritize(benchmark::State& s) { RunExtender(s, kBoth, s.range(0) == 1); }

void BM_ParseFloorDom(benchmark::State& state) {
  const Cluster& c = GetCluster();
  simdjson::padded_string padded(c.body);
  simdjson::dom::parser parser;
  for (auto _ : state) {
    simdjson::dom::element doc;
    if (parser.parse(padded).get(doc)) state.SkipWithError("parse failed");
    benchmark::DoNotOptimize(doc);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(c.body.size()));
}

void BM_ParseFloorOnDemand(benchmark::State& state) {
  const Cluster& c = GetCluster();
  simdjson::padded_string padded(c.body);
  simdjson::ondemand::parser parser;
  for (auto _ : state) {
    size_t bytes = 0;
    simdjson::ondemand::document doc = parser.iterate(padded);
    for (auto item : doc["Nodes"]["items"].get_array()) {
      auto meta = item["metadata"];
      std::string_view name = meta["name"].get_string();
      std::string_view a = meta["annotations"]["kdm.io/devices"].get_string();
      bytes += name.size() + a.size();
    }
    benchmark::DoNotOptimize(bytes);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(c.body.size()));
}

// The bench's 2,000 pods (1 or 2 GPUs each, seeded random nodes), bound.
std::vector<kdm::scheduler::BoundPod> BenchPods(const Cluster& c, int n) {
  std::vector<kdm::scheduler::BoundPod> out;
  std::mt19937_64 rng(29);
  for (int i = 0; i < n; ++i) {
    out.push_back({.uid = "uid-" + std::to_string(i),
                   .namespace_name = "bench",
                   .name = "pod-" + std::to_string(i),
                   .node = c.names[std::uniform_int_distribution<int>(0, kNodes - 1)(rng)],
                   .requests = {{"nvidia.com/gpu", 1 + i % 2}}});
  }
  return out;
}

// Arg 0: `pods` (0 or 2,000) assumed by the extender. Arg 1 = 1: the same
// pods already published instead (each node's annotation without the
// devices they take, no assumption): the same answers, so the difference
// between the two rows is what the assumption cache itself costs.
void BM_NodeNamesFromCache(benchmark::State& state) {
  const Cluster& c = GetCluster();
  const int pods = static_cast<int>(state.range(0));
  const bool published = state.range(1) == 1;
  kdm::k8s::TopologyCache topologies;
  kdm::scheduler::Assumptions assumptions(
      {.timeout = std::chrono::hours(1), .bind_wait = std::chrono::milliseconds(0)});
  for (const auto& p : BenchPods(c, pods)) {
    assumptions.Bound(p, kdm::scheduler::Assumptions::Source::kWatch);
  }
  std::vector<kdm::kube::NodeObject> objects;
  for (int i = 0; i < kNodes; ++i) {
    std::string annotation = c.annotations[i];
    if (published) {
      // The free devices the assumptions leave, written into the annotation.
      auto view = kdm::k8s::DecodeNodeDevices(annotation, &topologies);
      auto after = assumptions.View(c.names[i], *view, nullptr);
      if (after) {
        auto full = *kdm::k8s::DecodeDevicesAnnotation(annotation);
        auto& r = full.resources.at("nvidia.com/gpu");
        r.available.clear();
        for (int at : after->resources.at("nvidia.com/gpu").available) {
          r.available.push_back(r.devices[at].id);
        }
        annotation = kdm::k8s::EncodeDevicesAnnotation(full);
      }
    }
    kdm::kube::NodeObject o{.name = c.names[i], .resource_version = "1"};
    annotation.reserve(annotation.size() + kdm::k8s::DecodePadding());
    o.annotations.emplace(std::string(kdm::k8s::kDevicesAnnotationKey), std::move(annotation));
    objects.push_back(std::move(o));
  }
  const bool assume = pods > 0 && !published;
  kdm::scheduler::NodeCache cache(&topologies, assume ? &assumptions : nullptr);
  cache.Replace(objects);
  kdm::scheduler::Extender extender(
      {.cache = &cache, .topologies = &topologies, .assumptions = assume ? &assumptions : nullptr});
  std::string body = c.names_body;
  kdm::scheduler::PadBody(&body);
  extender.Prioritize(body);
  for (auto _ : state) {
    auto f = extender.Filter(body);
    auto p = extender.Prioritize(body);
    if (f.status != 200 || p.status != 200) state.SkipWithError("not 200");
    benchmark::DoNotOptimize(f);
    benchmark::DoNotOptimize(p);
  }
  state.counters["nodes"] = kNodes;
  state.counters["pods"] = pods;
  // How many nodes the filter fails: equal in both 2,000-pod rows.
  auto f = extender.Filter(body);
  size_t failed = 0;
  for (size_t at = f.body.find("kdm: "); at != std::string::npos;
       at = f.body.find("kdm: ", at + 1)) {
    ++failed;
  }
  state.counters["failed"] = static_cast<double>(failed);
}

#define KDM_P99(b)                                                                            \
  b->Unit(benchmark::kMillisecond)                                                            \
      ->Iterations(1)                                                                         \
      ->Repetitions(30)                                                                       \
      ->ComputeStatistics("p99", P99)                                                         \
      ->ComputeStatistics(                                                                    \
          "min",                                                                              \
          [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }) \
      ->ReportAggregatesOnly(true)                                                            \
      ->UseRealTime()

KDM_P99(BENCHMARK(BM_Filter)->ArgName("cold")->Arg(0)->Arg(1));
KDM_P99(BENCHMARK(BM_Prioritize)->ArgName("cold")->Arg(0)->Arg(1));
KDM_P99(BENCHMARK(BM_FilterPrioritize)->ArgName("cold")->Arg(0)->Arg(1));
KDM_P99(BENCHMARK(BM_ParseFloorDom));
KDM_P99(BENCHMARK(BM_ParseFloorOnDemand));
KDM_P99(BENCHMARK(BM_NodeNamesFromCache)
            ->ArgNames({"pods", "published"})
            ->Args({0, 0})
            ->Args({2000, 0})
            ->Args({2000, 1}));

}  // namespace

int main(int argc, char** argv) {
  // As `kdm extender` does at start.
  kdm::scheduler::KeepLargeAllocationsMapped();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
