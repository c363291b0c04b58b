#include "kdm/kube/pod_informer.h"

#include <utility>

#include "kdm/kube/reflector.h"

namespace kdm::kube {
namespace {

// What the reflector needs to know of Pods (kube/reflector.h).
struct PodCodec {
  using Object = PodObject;
  using EventType = PodEventType;
  using List = PodList;
  using Event = PodWatchEvent;
  StatusOr<PodList> DecodeList(std::string_view body) const { return DecodePodList(body); }
  StatusOr<PodWatchEvent> DecodeLine(std::string_view line) const {
    return DecodePodWatchLine(line);
  }
  static std::vector<PodObject>& Items(PodList& list) { return list.pods; }
  static const PodObject& ObjectOf(const PodWatchEvent& event) { return event.pod; }
};

class PodInformerImpl final : public PodInformer {
 public:
  explicit PodInformerImpl(Options options)
      : reflector_("pod_informer", static_cast<const ListWatchOptions&>(options),
                   std::move(options.path), PodCodec{}, std::move(options.on_list),
                   std::move(options.on_event)) {}
  ~PodInformerImpl() override { Stop(); }

  void StartThread() { reflector_.StartThread(); }
  void Stop() override { reflector_.Stop(); }
  Stats stats() const override { return reflector_.stats(); }

 private:
  internal::Reflector<PodCodec> reflector_;
};

}  // namespace

StatusOr<std::unique_ptr<PodInformer>> PodInformer::Start(Options options) {
  KDM_RETURN_IF_ERROR(internal::CheckListWatchOptions(
      "pod informer", options.on_list && options.on_event, options));
  auto informer = std::make_unique<PodInformerImpl>(std::move(options));
  informer->StartThread();
  return std::unique_ptr<PodInformer>(std::move(informer));
}

}  // namespace kdm::kube
