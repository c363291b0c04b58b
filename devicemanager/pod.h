// The device manager's pod model is kdm::k8s::Pod (kdm/k8s/pod.h, the one
// home of the pod model and its device request rules); these names keep the
// embedder API of earlier releases (kdm::devicemanager::Pod, ...) working.
#ifndef KDM_DEVICEMANAGER_POD_H_
#define KDM_DEVICEMANAGER_POD_H_

#include "kdm/devicemanager/quantity.h"
#include "kdm/k8s/pod.h"

namespace kdm::devicemanager {

using k8s::Container;
using k8s::ContainerKind;
using k8s::ExtendedResourcesOf;
using k8s::Pod;

}  // namespace kdm::devicemanager

#endif  // KDM_DEVICEMANAGER_POD_H_
