#include "kdm/pluginapi/sdk/device_plugin_handler.h"

#include <memory>
#include <string_view>
#include <utility>

#include "google/protobuf/arena.h"
#include "kdm/pluginapi/constants.h"

namespace kdm::plugin {

void FillListAndWatchResponse(const std::vector<Device>& devices,
                              v1beta1::ListAndWatchResponse* response) {
  response->mutable_devices()->Reserve(static_cast<int>(devices.size()));
  for (const Device& d : devices) {
    v1beta1::Device* out = response->add_devices();
    out->set_id(d.id);
    const std::string_view health = d.healthy ? pluginapi::kHealthy : pluginapi::kUnhealthy;
    out->set_health(health.data(), health.size());
    for (int64_t node : d.numa_nodes) out->mutable_topology()->add_nodes()->set_id(node);
  }
}

v1beta1::ListAndWatchResponse ToListAndWatchResponse(const std::vector<Device>& devices) {
  v1beta1::ListAndWatchResponse response;
  FillListAndWatchResponse(devices, &response);
  return response;
}

Status StreamSnapshots(ListAndWatchStream& stream) {
  uint64_t sent = 0;
  bool first = true;
  while (true) {
    uint64_t version = 0;
    std::shared_ptr<const std::vector<Device>> devices = stream.Devices(&version);
    if (first || version != sent) {
      first = false;
      sent = version;
      // On an arena: a snapshot of 10,000 devices is 10,000 small messages,
      // and freeing them one by one cost as much as building them.
      google::protobuf::Arena arena;
      auto* snapshot =
          google::protobuf::Arena::CreateMessage<v1beta1::ListAndWatchResponse>(&arena);
      FillListAndWatchResponse(*devices, snapshot);
      devices.reset();
      if (!stream.Write(*snapshot)) return OkStatus();  // the client went away
      continue;
    }
    if (stream.WaitForChange(sent, std::nullopt) == WaitResult::kEnded) return OkStatus();
  }
}

Status DevicePluginHandler::ListAndWatch(ListAndWatchStream& stream) {
  return StreamSnapshots(stream);
}

StatusOr<v1beta1::PreferredAllocationResponse> DevicePluginHandler::GetPreferredAllocation(
    const v1beta1::PreferredAllocationRequest&, CallContext&) {
  return UnimplementedError("GetPreferredAllocation is not offered by this plugin");
}

Status DevicePluginHandler::PreStartContainer(const std::vector<std::string>&, CallContext&) {
  return OkStatus();
}

StatusOr<v1beta1::AllocateResponse> AllocateEachContainer(
    const v1beta1::AllocateRequest& request,
    const std::function<StatusOr<v1beta1::ContainerAllocateResponse>(
        const v1beta1::ContainerAllocateRequest&)>& answer) {
  v1beta1::AllocateResponse response;
  for (const auto& container : request.container_requests()) {
    KDM_ASSIGN_OR_RETURN(*response.add_container_responses(), answer(container));
  }
  return response;
}

StatusOr<v1beta1::PreferredAllocationResponse> PreferEachContainer(
    const v1beta1::PreferredAllocationRequest& request,
    const std::function<StatusOr<v1beta1::ContainerPreferredAllocationResponse>(
        const v1beta1::ContainerPreferredAllocationRequest&)>& answer) {
  v1beta1::PreferredAllocationResponse response;
  for (const auto& container : request.container_requests()) {
    KDM_ASSIGN_OR_RETURN(*response.add_container_responses(), answer(container));
  }
  return response;
}

StatusOr<v1beta1::AllocateResponse> PerContainerHandler::Allocate(
    const v1beta1::AllocateRequest& request, CallContext&) {
  return AllocateEachContainer(
      request, [this](const v1beta1::ContainerAllocateRequest& c) { return AllocateContainer(c); });
}

StatusOr<v1beta1::PreferredAllocationResponse> PerContainerHandler::GetPreferredAllocation(
    const v1beta1::PreferredAllocationRequest& request, CallContext&) {
  return PreferEachContainer(
      request,
      [this](const v1beta1::ContainerPreferredAllocationRequest& c) { return PreferContainer(c); });
}

}  // namespace kdm::plugin
