#include "kdm/kube/node_informer.h"

#include <utility>

#include "kdm/kube/reflector.h"

namespace kdm::kube {
namespace {

// What the reflector needs to know of Nodes (kube/reflector.h).
struct NodeCodec {
  using Object = NodeObject;
  using EventType = NodeEventType;
  using List = NodeList;
  using Event = WatchEvent;
  std::vector<std::string> annotation_keys;
  StatusOr<NodeList> DecodeList(std::string_view body) const {
    return DecodeNodeList(body, annotation_keys);
  }
  StatusOr<WatchEvent> DecodeLine(std::string_view line) const {
    return DecodeWatchLine(line, annotation_keys);
  }
  static std::vector<NodeObject>& Items(NodeList& list) { return list.nodes; }
  static const NodeObject& ObjectOf(const WatchEvent& event) { return event.node; }
};

class NodeInformerImpl final : public NodeInformer {
 public:
  explicit NodeInformerImpl(Options options)
      : reflector_("node_informer", static_cast<const ListWatchOptions&>(options),
                   std::move(options.path), NodeCodec{std::move(options.annotation_keys)},
                   std::move(options.on_list), std::move(options.on_event)) {}
  ~NodeInformerImpl() override { Stop(); }

  void StartThread() { reflector_.StartThread(); }
  void Stop() override { reflector_.Stop(); }
  Stats stats() const override { return reflector_.stats(); }

 private:
  internal::Reflector<NodeCodec> reflector_;
};

}  // namespace

StatusOr<std::unique_ptr<NodeInformer>> NodeInformer::Start(Options options) {
  KDM_RETURN_IF_ERROR(internal::CheckListWatchOptions(
      "node informer", options.on_list && options.on_event, options));
  auto informer = std::make_unique<NodeInformerImpl>(std::move(options));
  informer->StartThread();
  return std::unique_ptr<NodeInformer>(std::move(informer));
}

}  // namespace kdm::kube
