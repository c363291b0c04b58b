#include "kdm/k8s/attributes.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "kdm/k8s/requirements.h"

namespace kdm::k8s {
namespace {

bool IsPrintableAscii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    auto u = static_cast<unsigned char>(c);
    return u >= 0x20 && u < 0x7f;
  });
}

StatusOr<int64_t> ParseMib(std::string_view value) {
  if (value.empty() || value.size() > 15 ||
      !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return InvalidArgumentError("attribute 'memory_mib': not a whole number of MiB: " +
                                ShowValue(value));
  }
  return std::stoll(std::string(value));
}

}  // namespace

std::string ShowValue(std::string_view s) {
  constexpr size_t kMaxShown = 64;
  std::string out;
  for (char c : s.substr(0, kMaxShown)) {
    auto u = static_cast<unsigned char>(c);
    out += (u >= 0x20 && u < 0x7f && c != '\'') ? c : '?';
  }
  if (s.size() > kMaxShown) out += "...";
  return "'" + out + "'";
}

bool IsVersionAttribute(std::string_view key) {
  return key == kAttrCuda || key == kAttrDriver || key == kAttrArch;
}

bool IsAttributeKey(std::string_view key) {
  return std::find(kAttributeKeys.begin(), kAttributeKeys.end(), key) != kAttributeKeys.end();
}

std::optional<std::string>* DeviceAttributes::Field(std::string_view key) {
  if (key == kAttrModel) return &model;
  if (key == kAttrDriver) return &driver;
  if (key == kAttrCuda) return &cuda;
  if (key == kAttrArch) return &arch;
  if (key == kAttrBrand) return &brand;
  return nullptr;
}

const std::optional<std::string>* DeviceAttributes::Field(std::string_view key) const {
  return const_cast<DeviceAttributes*>(this)->Field(key);
}

std::optional<std::string> DeviceAttributes::Get(std::string_view key) const {
  if (key == kAttrMemoryMib) {
    if (!memory_mib) return std::nullopt;
    return std::to_string(*memory_mib);
  }
  const std::optional<std::string>* f = Field(key);
  if (f == nullptr) return std::nullopt;
  return *f;
}

Status DeviceAttributes::Set(std::string_view key, std::string_view value) {
  if (key == kAttrMemoryMib) {
    KDM_ASSIGN_OR_RETURN(memory_mib, ParseMib(value));
    return OkStatus();
  }
  std::optional<std::string>* f = Field(key);
  if (f == nullptr) {
    return InvalidArgumentError("unknown attribute " + ShowValue(key) +
                                " (keys: model, memory_mib, driver, cuda, arch, brand)");
  }
  KDM_RETURN_IF_ERROR(CheckAttributeValue(key, value));
  *f = std::string(value);
  return OkStatus();
}

Status CheckAttributeValue(std::string_view key, std::string_view value) {
  std::string where = "attribute '" + std::string(key) + "': ";
  if (value.empty()) return InvalidArgumentError(where + "an empty value");
  if (value.size() > kMaxAttributeBytes) {
    return InvalidArgumentError(where + "longer than " + std::to_string(kMaxAttributeBytes) +
                                " bytes");
  }
  if (IsVersionAttribute(key)) {
    StatusOr<int> self = CompareVersions(value, value);
    if (!self.ok()) return InvalidArgumentError(where + self.status().message());
  } else if (key == kAttrBrand) {
    if (!std::all_of(value.begin(), value.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
        })) {
      return InvalidArgumentError(where + "not a brand name: " + ShowValue(value));
    }
  } else if (key == kAttrMemoryMib) {
    return ParseMib(value).status();
  } else if (!IsPrintableAscii(value)) {
    return InvalidArgumentError(where + "holds a control or non-ASCII byte: " + ShowValue(value));
  }
  return OkStatus();
}

StatusOr<DeviceAttributes> ParseAttributes(std::string_view text) {
  DeviceAttributes out;
  std::set<std::string> seen;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    std::string_view item = text.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      return InvalidArgumentError("attribute item " + ShowValue(item) + " is not KEY=VALUE");
    }
    std::string key(item.substr(0, eq));
    if (!IsAttributeKey(key)) {
      return InvalidArgumentError("unknown attribute " + ShowValue(key) +
                                  " (keys: model, memory_mib, driver, cuda, arch, brand)");
    }
    if (!seen.insert(key).second) return InvalidArgumentError("attribute '" + key + "' twice");
    KDM_RETURN_IF_ERROR(out.Set(key, item.substr(eq + 1)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace kdm::k8s
