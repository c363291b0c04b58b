#include "kdm/base/log_value.h"

#include <algorithm>

namespace kdm {

std::string QuoteLogValue(std::string_view text, std::size_t max_bytes) {
  const std::size_t shown = std::min(text.size(), max_bytes);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(shown + 2);
  out += '"';
  for (std::size_t i = 0; i < shown; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += "\\x";
          out += kHex[c >> 4];
          out += kHex[c & 0xf];
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
  if (shown < text.size()) out += "...(+" + std::to_string(text.size() - shown) + " bytes)";
  return out;
}

}  // namespace kdm
