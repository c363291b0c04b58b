// Fuzz target: the extender's request decoding (scheduler/extender_json.h)
// and the answers built from it (scheduler/extender.h): kube-scheduler's
// ExtenderArgs with full Nodes (annotations included) or NodeNames, as any
// pod that reaches the extender's port may send them.
//
// Properties of every input:
// - DecodeExtenderArgs gives the same verdict read in place (padded) and
//   copied; a refusal is INVALID_ARGUMENT with a message;
// - an accepted body has Nodes or NodeNames; every node has a name and a
//   span inside the body that is one JSON object ({...});
// - Filter and Prioritize answer 200 exactly when it decodes, else 400 with
//   {"Error": ...}; a filter answer puts every node in exactly one of
//   passed, FailedNodes and FailedAndUnresolvableNodes, each reason at most
//   kMaxReasonBytes (a reason is repeated per node: it must not grow with
//   the request); a priority list has one entry per node, in order, each
//   score 0..10.
// NodeNames are looked up in a node cache holding a good, a full and an
// unreadable node; Nodes go through one topology cache shared by the run.
#include <spdlog/spdlog.h>

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "kdm/k8s/devices_annotation.h"
#include "kdm/scheduler/extender.h"
#include "kdm/scheduler/extender_json.h"
#include "kdm/scheduler/node_cache.h"
#include "kdm/topology/presets.h"

namespace {

// The longest reason a node may get: "kdm: container " + a 63-byte name
// (cut, with "...") + ": " + a 512-byte requirement message, or "kdm: pod
// refused: " + 512 bytes, or the free-count text naming a resource.
constexpr size_t kMaxReasonBytes = 1024;

struct World {
  kdm::k8s::TopologyCache topologies{size_t{8} << 20};
  kdm::scheduler::NodeCache cache{&topologies};
  kdm::scheduler::Extender extender{ExtenderOptions(&cache, &topologies)};

  static kdm::scheduler::Extender::Options ExtenderOptions(kdm::scheduler::NodeCache* cache,
                                                           kdm::k8s::TopologyCache* topologies) {
    kdm::scheduler::Extender::Options o;
    // best-set, the default when this target and its corpus were made (the
    // default is packed since issue 30; its scores are bounded by the same
    // request budget).
    o.policy = kdm::scheduler::ScorePolicy::kBestSet;
    o.cache = cache;
    o.topologies = topologies;
    return o;
  }

  World() {
    spdlog::set_level(spdlog::level::off);  // annotation_unreadable lines
    kdm::topology::Topology t = *kdm::topology::Preset("dgx1-v100");
    auto add = [&](const std::string& name, const std::string& annotation) {
      kdm::kube::NodeObject n;
      n.name = name;
      n.annotations[std::string(kdm::k8s::kDevicesAnnotationKey)] = annotation;
      cache.Apply(kdm::kube::NodeEventType::kAdded, n);
    };
    for (const auto& [name, free] :
         {std::pair<std::string, std::set<std::string>>{"gpu-a", {"GPU0", "GPU1", "GPU2"}},
          {"gpu-full", {}}}) {
      kdm::k8s::ResourceInput in;
      for (const auto& d : t.devices()) {
        in.allocatable[d.id] = d.numa;
        if (!free.count(d.id)) in.in_use.insert(d.id);
      }
      in.topology = &t;
      in.attributes.emplace();
      in.attributes->driver = "550.54.15";
      in.attributes->cuda = "12.4";
      kdm::k8s::DevicesAnnotation a;
      a.node = name;
      a.updated = "2026-11-24T23:00:00Z";
      a.resources["nvidia.com/gpu"] = kdm::k8s::BuildResourceDevices(in);
      add(name, kdm::k8s::EncodeDevicesAnnotation(a));
    }
    add("gpu-bad", "{\"version\":");
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static World* world = new World();
  const std::string body(reinterpret_cast<const char*>(data), size);
  std::string padded = body;
  kdm::scheduler::PadBody(&padded);

  kdm::StatusOr<kdm::scheduler::ExtenderArgs> args = kdm::scheduler::DecodeExtenderArgs(padded);
  {
    std::string copied = body;
    copied.shrink_to_fit();
    kdm::StatusOr<kdm::scheduler::ExtenderArgs> again = kdm::scheduler::DecodeExtenderArgs(copied);
    FUZZ_CHECK(again.ok() == args.ok(),
               "in place vs copied: " << args.status() << " vs " << again.status());
    if (!args.ok()) FUZZ_CHECK(again.status() == args.status(), "messages differ");
  }
  kdm::scheduler::HttpAnswer filter = world->extender.Filter(padded);
  kdm::scheduler::HttpAnswer prioritize = world->extender.Prioritize(padded);
  if (!args.ok()) {
    FUZZ_CHECK(args.status().code() == kdm::StatusCode::kInvalidArgument,
               "refusal code: " << args.status());
    FUZZ_CHECK(!args.status().message().empty(), "a refusal without a message");
    for (const auto* a : {&filter, &prioritize}) {
      FUZZ_CHECK(a->status == 400, "a refused body answered " << a->status);
      nlohmann::json e = nlohmann::json::parse(a->body, nullptr, false);
      FUZZ_CHECK(e.is_object() && e["Error"].is_string(), "400 body: " << a->body);
    }
    return 0;
  }
  FUZZ_CHECK(args->nodes || args->node_names, "neither Nodes nor NodeNames accepted");
  std::vector<std::string> names;
  if (args->nodes) {
    const char* begin = padded.data();
    const char* end = padded.data() + padded.size();
    for (const kdm::scheduler::NodeItem& n : *args->nodes) {
      FUZZ_CHECK(!n.name.empty(), "a node without a name");
      FUZZ_CHECK(n.raw.data() >= begin && n.raw.data() + n.raw.size() <= end,
                 "a node's span outside the body");
      // simdjson's raw span keeps the blanks after the object.
      std::string_view raw = n.raw;
      while (!raw.empty() && (raw.back() == ' ' || raw.back() == '\n' || raw.back() == '\t' ||
                              raw.back() == '\r')) {
        raw.remove_suffix(1);
      }
      FUZZ_CHECK(raw.size() >= 2 && raw.front() == '{' && raw.back() == '}',
                 "a node's span is not an object: " << raw.substr(0, 80));
      names.push_back(n.name);
    }
  } else {
    names = *args->node_names;
  }

  FUZZ_CHECK(filter.status == 200, "filter answered " << filter.status << ": " << filter.body);
  nlohmann::json f = nlohmann::json::parse(filter.body, nullptr, false);
  FUZZ_CHECK(f.is_object(), "filter answer is not JSON: " << filter.body.substr(0, 200));
  std::set<std::string> passed, failed, unresolvable;
  size_t passed_items = 0;
  if (f["Nodes"].is_object()) passed_items = f["Nodes"]["items"].size();
  if (f["NodeNames"].is_array()) {
    for (const auto& n : f["NodeNames"]) passed.insert(n.get<std::string>());
  }
  for (const auto& [map, out] : {std::pair{"FailedNodes", &failed},
                                 std::pair{"FailedAndUnresolvableNodes", &unresolvable}}) {
    for (const auto& [name, reason] : f[map].items()) {
      out->insert(name);
      FUZZ_CHECK(reason.is_string() && reason.get<std::string>().size() <= kMaxReasonBytes,
                 map << " reason of " << reason.dump().size() << " bytes for " << name);
    }
  }
  if (args->node_names && !args->nodes) {
    // One node per name: in exactly one part of the answer.
    for (const std::string& n : names) {
      const size_t in = passed.count(n) + failed.count(n) + unresolvable.count(n);
      FUZZ_CHECK(in == 1, "node " << n << " is in " << in << " parts of the answer");
    }
  } else {
    // Full Nodes (a name may come twice, each copy judged on its own): the
    // passing objects are copies of request nodes, and every name not
    // failed has one of them.
    FUZZ_CHECK(passed_items <= names.size(), passed_items << " passed of " << names.size());
    std::set<std::string> judged_ok;
    for (const std::string& n : names) {
      if (!failed.count(n) && !unresolvable.count(n)) judged_ok.insert(n);
    }
    FUZZ_CHECK(judged_ok.size() <= passed_items,
               judged_ok.size() << " names not failed, " << passed_items << " passed");
  }

  FUZZ_CHECK(prioritize.status == 200, "prioritize answered " << prioritize.status);
  nlohmann::json p = nlohmann::json::parse(prioritize.body, nullptr, false);
  FUZZ_CHECK(p.is_array() && p.size() == names.size(),
             "priority list of " << (p.is_array() ? p.size() : 0) << " for " << names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    FUZZ_CHECK(p[i]["Host"] == names[i], "host " << i);
    const int score = p[i]["Score"].get<int>();
    FUZZ_CHECK(score >= 0 && score <= 10, "score " << score);
  }
  return 0;
}
