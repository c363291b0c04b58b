#include "kdm/checkpoint/kubelet_json.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <nlohmann/json.hpp>
#include <utility>

namespace kdm::checkpoint {
namespace {

using Json = nlohmann::json;

constexpr char kBase64Alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<int8_t, 256> MakeBase64Table() {
  std::array<int8_t, 256> t{};
  for (auto& v : t) v = -1;
  for (int i = 0; i < 64; ++i)
    t[static_cast<unsigned char>(kBase64Alphabet[i])] = static_cast<int8_t>(i);
  return t;
}
constexpr std::array<int8_t, 256> kBase64Table = MakeBase64Table();

// Go's utf8.DecodeRuneInString: the code point at s[i] and its length, or
// (-1, 1) for an invalid byte.
std::pair<int32_t, size_t> DecodeRune(std::string_view s, size_t i) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = byte(i);
  if (c < 0x80) return {c, 1};
  size_t n = 0;
  int32_t cp = 0;
  int32_t min = 0;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2, cp = c & 0x1F, min = 0x80;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3, cp = c & 0x0F, min = 0x800;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4, cp = c & 0x07, min = 0x10000;
  } else {
    return {-1, 1};
  }
  if (i + n > s.size()) return {-1, 1};
  for (size_t k = 1; k < n; ++k) {
    unsigned char d = byte(i + k);
    if ((d & 0xC0) != 0x80) return {-1, 1};
    cp = (cp << 6) | (d & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {-1, 1};
  return {cp, n};
}

// Replaces each invalid UTF-8 byte with U+FFFD, as Go's JSON encoder does.
std::string ValidUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    auto [cp, n] = DecodeRune(s, i);
    if (cp < 0) {
      out += "\xEF\xBF\xBD";
    } else {
      out.append(s.substr(i, n));
    }
    i += n;
  }
  return out;
}

// A JSON string literal as Go's encoding/json writes it (HTML-safe).
void AppendGoJsonString(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (size_t i = 0; i < s.size();) {
    auto [cp, n] = DecodeRune(s, i);
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (cp < 0) {
      out += "\\ufffd";
    } else if (cp == 0x2028 || cp == 0x2029) {
      out += cp == 0x2028 ? "\\u2028" : "\\u2029";
    } else if (n > 1) {
      out.append(s.substr(i, n));
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\b') {
      out += "\\b";
    } else if (c == '\f') {
      out += "\\f";
    } else if (c < 0x20 || c == '<' || c == '>' || c == '&') {
      out += "\\u00";
      out += kHex[c >> 4];
      out += kHex[c & 0xF];
    } else {
      out += static_cast<char>(c);
    }
    i += n;
  }
  out += '"';
}

// Finds a field as Go does: the exact name, else a case-insensitive match.
const Json* FindField(const Json& object, std::string_view name) {
  auto it = object.find(std::string(name));
  if (it != object.end()) return &*it;
  for (auto i = object.begin(); i != object.end(); ++i) {
    const std::string& key = i.key();
    if (key.size() == name.size() &&
        std::equal(key.begin(), key.end(), name.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) ==
                 std::tolower(static_cast<unsigned char>(b));
        })) {
      return &i.value();
    }
  }
  return nullptr;
}

Status WrongType(const std::string& field, std::string_view want, const Json& got) {
  return InvalidArgumentError(field + ": expected " + std::string(want) + ", got " +
                              (got.is_number() ? "number" : got.type_name()));
}

// A Go string field: a JSON string, or null (left empty).
StatusOr<std::string> ReadString(const Json* j, const std::string& field) {
  if (j == nullptr || j->is_null()) return std::string();
  if (!j->is_string()) return WrongType(field, "a string", *j);
  return j->get<std::string>();
}

// A Go []string: nullopt for null.
StatusOr<std::optional<std::vector<std::string>>> ReadStringList(const Json* j,
                                                                 const std::string& field) {
  if (j == nullptr || j->is_null()) return std::optional<std::vector<std::string>>();
  if (!j->is_array()) return WrongType(field, "a list of strings", *j);
  std::vector<std::string> out;
  out.reserve(j->size());
  for (size_t i = 0; i < j->size(); ++i) {
    KDM_ASSIGN_OR_RETURN(std::string s,
                         ReadString(&(*j)[i], field + "[" + std::to_string(i) + "]"));
    out.push_back(std::move(s));
  }
  return std::optional<std::vector<std::string>>(std::move(out));
}

StatusOr<int64_t> ParseNumaKey(const std::string& key, const std::string& field) {
  std::string_view digits = key;
  if (!digits.empty() && digits[0] == '+') digits.remove_prefix(1);
  int64_t value = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() ||
      (key[0] == '+' && digits[0] == '-')) {
    return InvalidArgumentError(field + ": key \"" + key + "\" is not a NUMA node number");
  }
  return value;
}

StatusOr<KubeletEntry> ReadEntry(const Json& j, const std::string& field) {
  KubeletEntry e;
  if (j.is_null()) return e;
  if (!j.is_object()) return WrongType(field, "an object", j);
  KDM_ASSIGN_OR_RETURN(e.pod_uid, ReadString(FindField(j, "PodUID"), field + ".PodUID"));
  KDM_ASSIGN_OR_RETURN(e.container_name,
                       ReadString(FindField(j, "ContainerName"), field + ".ContainerName"));
  KDM_ASSIGN_OR_RETURN(e.resource_name,
                       ReadString(FindField(j, "ResourceName"), field + ".ResourceName"));
  const Json* ids = FindField(j, "DeviceIDs");
  if (ids != nullptr && !ids->is_null()) {
    std::string ids_field = field + ".DeviceIDs";
    if (!ids->is_object())
      return WrongType(ids_field, "an object of NUMA node to device ids", *ids);
    e.device_ids.emplace();
    for (auto it = ids->begin(); it != ids->end(); ++it) {
      KDM_ASSIGN_OR_RETURN(int64_t numa, ParseNumaKey(it.key(), ids_field));
      KDM_ASSIGN_OR_RETURN((*e.device_ids)[numa],
                           ReadStringList(&it.value(), ids_field + "[\"" + it.key() + "\"]"));
    }
  }
  const Json* resp = FindField(j, "AllocResp");
  if (resp != nullptr && !resp->is_null()) {
    std::string resp_field = field + ".AllocResp";
    if (!resp->is_string()) return WrongType(resp_field, "a base64 string", *resp);
    StatusOr<std::string> bytes = Base64Decode(resp->get_ref<const std::string&>());
    if (!bytes.ok()) return bytes.status().WithPrefix(resp_field);
    e.alloc_response = std::move(*bytes);
  }
  return e;
}

void RenderStringList(std::string& out, const std::optional<std::vector<std::string>>& ids) {
  if (!ids) {
    out += "<nil>";
    return;
  }
  out += '[';
  for (size_t i = 0; i < ids->size(); ++i) {
    if (i > 0) out += ' ';
    out += (*ids)[i];
  }
  out += ']';
}

void RenderEntry(std::string& out, const KubeletEntry& e) {
  out += "{PodUID:(string)";
  out += e.pod_uid;
  out += " ContainerName:(string)";
  out += e.container_name;
  out += " ResourceName:(string)";
  out += e.resource_name;
  out += " DeviceIDs:(checkpoint.DevicesPerNUMA)";
  if (!e.device_ids) {
    out += "<nil>";
  } else {
    out += "map[";
    bool first = true;
    for (const auto& [numa, ids] : *e.device_ids) {
      if (!first) out += ' ';
      first = false;
      out += std::to_string(numa);
      out += ':';
      RenderStringList(out, ids);
    }
    out += ']';
  }
  out += " AllocResp:([]uint8)";
  if (!e.alloc_response) {
    out += "<nil>";
  } else {
    out += '[';
    for (size_t i = 0; i < e.alloc_response->size(); ++i) {
      if (i > 0) out += ' ';
      out += std::to_string(static_cast<unsigned char>((*e.alloc_response)[i]));
    }
    out += ']';
  }
  out += '}';
}

void EncodeStringList(std::string& out, const std::optional<std::vector<std::string>>& ids) {
  if (!ids) {
    out += "null";
    return;
  }
  out += '[';
  for (size_t i = 0; i < ids->size(); ++i) {
    if (i > 0) out += ',';
    AppendGoJsonString(out, (*ids)[i]);
  }
  out += ']';
}

void EncodeEntry(std::string& out, const KubeletEntry& e) {
  out += "{\"PodUID\":";
  AppendGoJsonString(out, e.pod_uid);
  out += ",\"ContainerName\":";
  AppendGoJsonString(out, e.container_name);
  out += ",\"ResourceName\":";
  AppendGoJsonString(out, e.resource_name);
  out += ",\"DeviceIDs\":";
  if (!e.device_ids) {
    out += "null";
  } else {
    // Go's encoder sorts map keys by their string form ("-1" < "0" < "10" <
    // "2").
    std::vector<std::pair<std::string, const std::optional<std::vector<std::string>>*>> keyed;
    for (const auto& [numa, ids] : *e.device_ids) keyed.emplace_back(std::to_string(numa), &ids);
    std::sort(keyed.begin(), keyed.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    out += '{';
    for (size_t i = 0; i < keyed.size(); ++i) {
      if (i > 0) out += ',';
      AppendGoJsonString(out, keyed[i].first);
      out += ':';
      EncodeStringList(out, *keyed[i].second);
    }
    out += '}';
  }
  out += ",\"AllocResp\":";
  if (!e.alloc_response) {
    out += "null";
  } else {
    out += '"';
    out += Base64Encode(*e.alloc_response);
    out += '"';
  }
  out += '}';
}

KubeletData SanitizedForGo(KubeletData data) {
  if (data.entries) {
    for (KubeletEntry& e : *data.entries) {
      e.pod_uid = ValidUtf8(e.pod_uid);
      e.container_name = ValidUtf8(e.container_name);
      e.resource_name = ValidUtf8(e.resource_name);
      if (e.device_ids) {
        for (auto& [numa, ids] : *e.device_ids) {
          if (ids) {
            for (std::string& id : *ids) id = ValidUtf8(id);
          }
        }
      }
    }
  }
  if (data.registered_devices) {
    std::map<std::string, std::optional<std::vector<std::string>>> clean;
    for (auto& [resource, ids] : *data.registered_devices) {
      if (ids) {
        for (std::string& id : *ids) id = ValidUtf8(id);
      }
      clean[ValidUtf8(resource)] = std::move(ids);
    }
    data.registered_devices = std::move(clean);
  }
  return data;
}

}  // namespace

std::string Base64Encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  auto at = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(bytes[k])); };
  for (; i + 3 <= bytes.size(); i += 3) {
    uint32_t v = (at(i) << 16) | (at(i + 1) << 8) | at(i + 2);
    out += kBase64Alphabet[(v >> 18) & 63];
    out += kBase64Alphabet[(v >> 12) & 63];
    out += kBase64Alphabet[(v >> 6) & 63];
    out += kBase64Alphabet[v & 63];
  }
  size_t rest = bytes.size() - i;
  if (rest == 1) {
    uint32_t v = at(i) << 16;
    out += kBase64Alphabet[(v >> 18) & 63];
    out += kBase64Alphabet[(v >> 12) & 63];
    out += "==";
  } else if (rest == 2) {
    uint32_t v = (at(i) << 16) | (at(i + 1) << 8);
    out += kBase64Alphabet[(v >> 18) & 63];
    out += kBase64Alphabet[(v >> 12) & 63];
    out += kBase64Alphabet[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

StatusOr<std::string> Base64Decode(std::string_view text) {
  // Each significant character with its offset in `text` ('\r', '\n' skipped).
  std::vector<std::pair<char, size_t>> chars;
  chars.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\r' && text[i] != '\n') chars.emplace_back(text[i], i);
  }
  std::string out;
  out.reserve(chars.size() / 4 * 3);
  for (size_t q = 0; q < chars.size(); q += 4) {
    if (q + 4 > chars.size()) {
      return InvalidArgumentError("invalid base64 at byte " + std::to_string(text.size()) +
                                  ": input ends inside a 4-character group (missing padding?)");
    }
    uint32_t v = 0;
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      auto [c, offset] = chars[q + k];
      if (c == '=') {
        // Padding: only in the last two places of the last group, and "=x"
        // is never valid.
        if (k < 2 || q + 4 != chars.size() || (k == 2 && chars[q + 3].first != '=')) {
          return InvalidArgumentError("invalid base64 at byte " + std::to_string(offset) +
                                      ": unexpected '='");
        }
        ++pad;
        v <<= 6;
        continue;
      }
      int8_t d = kBase64Table[static_cast<unsigned char>(c)];
      if (d < 0) {
        std::string shown = (c >= 0x20 && c < 0x7f)
                                ? std::string("'") + c + "'"
                                : "byte " + std::to_string(static_cast<unsigned char>(c));
        return InvalidArgumentError("invalid base64 at byte " + std::to_string(offset) + ": " +
                                    shown + " is not in the base64 alphabet");
      }
      v = (v << 6) | static_cast<uint32_t>(d);
    }
    out += static_cast<char>((v >> 16) & 0xFF);
    if (pad < 2) out += static_cast<char>((v >> 8) & 0xFF);
    if (pad < 1) out += static_cast<char>(v & 0xFF);
  }
  return out;
}

uint32_t Fnv32a(std::string_view bytes) {
  uint32_t h = 2166136261u;
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 16777619u;
  }
  return h;
}

std::string RenderKubeletData(const KubeletData& data) {
  std::string out =
      "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint."
      "PodDevicesEntry)";
  if (!data.entries) {
    out += "<nil>";
  } else {
    out += '[';
    for (size_t i = 0; i < data.entries->size(); ++i) {
      if (i > 0) out += ' ';
      RenderEntry(out, (*data.entries)[i]);
    }
    out += ']';
  }
  out += " RegisteredDevices:(map[string][]string)";
  if (!data.registered_devices) {
    out += "<nil>";
  } else {
    out += "map[";
    bool first = true;
    for (const auto& [resource, ids] : *data.registered_devices) {
      if (!first) out += ' ';
      first = false;
      out += resource;
      out += ':';
      RenderStringList(out, ids);
    }
    out += ']';
  }
  out += '}';
  return out;
}

uint32_t KubeletChecksum(const KubeletData& data) { return Fnv32a(RenderKubeletData(data)); }

StatusOr<KubeletFile> ParseKubeletCheckpoint(std::string_view json) {
  // nlohmann's parser takes a NUL byte for the end of the input; Go's
  // decoder refuses it, and so do we rather than ignore what follows.
  if (size_t nul = json.find('\0'); nul != std::string_view::npos) {
    return InvalidArgumentError("not valid JSON: a NUL byte at offset " + std::to_string(nul));
  }
  Json root;
  try {
    root = Json::parse(json.begin(), json.end());
  } catch (const Json::exception& e) {
    return InvalidArgumentError(std::string("not valid JSON: ") + e.what());
  }
  KubeletFile file;
  if (root.is_null()) return file;
  if (!root.is_object()) return WrongType("top level", "an object", root);
  if (const Json* data = FindField(root, "Data"); data != nullptr && !data->is_null()) {
    if (!data->is_object()) return WrongType("Data", "an object", *data);
    const Json* entries = FindField(*data, "PodDeviceEntries");
    if (entries != nullptr && !entries->is_null()) {
      if (!entries->is_array()) return WrongType("Data.PodDeviceEntries", "a list", *entries);
      file.data.entries.emplace();
      file.data.entries->reserve(entries->size());
      for (size_t i = 0; i < entries->size(); ++i) {
        KDM_ASSIGN_OR_RETURN(KubeletEntry e, ReadEntry((*entries)[i], "Data.PodDeviceEntries[" +
                                                                          std::to_string(i) + "]"));
        file.data.entries->push_back(std::move(e));
      }
    }
    const Json* registered = FindField(*data, "RegisteredDevices");
    if (registered != nullptr && !registered->is_null()) {
      if (!registered->is_object()) {
        return WrongType("Data.RegisteredDevices", "an object of resource to device ids",
                         *registered);
      }
      file.data.registered_devices.emplace();
      for (auto it = registered->begin(); it != registered->end(); ++it) {
        KDM_ASSIGN_OR_RETURN(
            (*file.data.registered_devices)[it.key()],
            ReadStringList(&it.value(), "Data.RegisteredDevices[\"" + it.key() + "\"]"));
      }
    }
  }
  if (const Json* sum = FindField(root, "Checksum"); sum != nullptr && !sum->is_null()) {
    if (!sum->is_number_unsigned()) return WrongType("Checksum", "an unsigned integer", *sum);
    file.checksum = sum->get<uint64_t>();
  }
  return file;
}

KubeletData ToKubeletData(const CheckpointData& data) {
  KubeletData out;
  if (!data.entries.empty()) {
    out.entries.emplace();
    for (const PodDevicesEntry& e : data.entries) {
      KubeletEntry k;
      k.pod_uid = e.pod_uid;
      k.container_name = e.container_name;
      k.resource_name = e.resource_name;
      k.device_ids.emplace();
      for (const auto& [numa, ids] : e.device_ids) (*k.device_ids)[numa] = ids;
      k.alloc_response = e.alloc_response;
      out.entries->push_back(std::move(k));
    }
  }
  out.registered_devices.emplace();
  for (const auto& [resource, ids] : data.registered_devices) {
    (*out.registered_devices)[resource] = ids;
  }
  return out;
}

CheckpointData FromKubeletData(const KubeletData& data) {
  CheckpointData out;
  if (data.entries) {
    for (const KubeletEntry& k : *data.entries) {
      PodDevicesEntry e;
      e.pod_uid = k.pod_uid;
      e.container_name = k.container_name;
      e.resource_name = k.resource_name;
      if (k.device_ids) {
        for (const auto& [numa, ids] : *k.device_ids) {
          e.device_ids[numa] = ids.value_or(std::vector<std::string>{});
        }
      }
      e.alloc_response = k.alloc_response.value_or("");
      out.entries.push_back(std::move(e));
    }
  }
  if (data.registered_devices) {
    for (const auto& [resource, ids] : *data.registered_devices) {
      out.registered_devices[resource] = ids.value_or(std::vector<std::string>{});
    }
  }
  return out;
}

StatusOr<CheckpointData> DecodeKubeletCheckpoint(std::string_view json, bool verify_checksum) {
  KDM_ASSIGN_OR_RETURN(KubeletFile file, ParseKubeletCheckpoint(json));
  if (verify_checksum) {
    uint32_t computed = KubeletChecksum(file.data);
    if (computed != file.checksum) {
      return DataLossError("checksum mismatch: the file says " + std::to_string(file.checksum) +
                           ", its data hashes to " + std::to_string(computed));
    }
  }
  return FromKubeletData(file.data);
}

std::string EncodeKubeletCheckpoint(const CheckpointData& data) {
  // Go writes each invalid UTF-8 byte as \ufffd, so a reader hashes U+FFFD
  // there: hash the sanitized data, write the original.
  KubeletData k = ToKubeletData(data);
  const uint32_t checksum = KubeletChecksum(SanitizedForGo(k));
  std::string out = "{\"Data\":{\"PodDeviceEntries\":";
  if (!k.entries) {
    out += "null";
  } else {
    out += '[';
    for (size_t i = 0; i < k.entries->size(); ++i) {
      if (i > 0) out += ',';
      EncodeEntry(out, (*k.entries)[i]);
    }
    out += ']';
  }
  out += ",\"RegisteredDevices\":";
  if (!k.registered_devices) {
    out += "null";
  } else {
    out += '{';
    bool first = true;
    for (const auto& [resource, ids] : *k.registered_devices) {
      if (!first) out += ',';
      first = false;
      AppendGoJsonString(out, resource);
      out += ':';
      EncodeStringList(out, ids);
    }
    out += '}';
  }
  out += "},\"Checksum\":";
  out += std::to_string(checksum);
  out += '}';
  return out;
}

}  // namespace kdm::checkpoint
