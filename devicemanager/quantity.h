// The device manager's quantity is kdm::k8s::Quantity (kdm/k8s/quantity.h,
// the one home of the Kubernetes quantity grammar); this name keeps the
// embedder API of earlier releases (kdm::devicemanager::Quantity) working.
#ifndef KDM_DEVICEMANAGER_QUANTITY_H_
#define KDM_DEVICEMANAGER_QUANTITY_H_

#include "kdm/k8s/quantity.h"

namespace kdm::devicemanager {

using k8s::Quantity;

}  // namespace kdm::devicemanager

#endif  // KDM_DEVICEMANAGER_QUANTITY_H_
