#include "model/testing/golden_json.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "model/unicode.h"

namespace pdserve::model::golden {
namespace {

class JsonParser {
 public:
  explicit JsonParser(absl::string_view text) : s_(text) {}

  std::optional<Json> Parse() {
    Json value;
    if (!Value(&value)) return std::nullopt;
    Space();
    if (i_ != s_.size()) return std::nullopt;
    return value;
  }

 private:
  void Space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' ||
                              s_[i_] == '\r' || s_[i_] == '\t')) {
      ++i_;
    }
  }
  bool Literal(absl::string_view word) {
    if (s_.substr(i_, word.size()) != word) return false;
    i_ += word.size();
    return true;
  }
  bool Hex4(uint32_t* out) {
    if (i_ + 4 > s_.size()) return false;
    *out = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[i_++];
      *out <<= 4;
      if (c >= '0' && c <= '9') {
        *out |= c - '0';
      } else if (c >= 'a' && c <= 'f') {
        *out |= c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        *out |= c - 'A' + 10;
      } else {
        return false;
      }
    }
    return true;
  }
  bool String(std::string* out) {
    if (i_ >= s_.size() || s_[i_] != '"') return false;
    ++i_;
    while (i_ < s_.size() && s_[i_] != '"') {
      const char c = s_[i_++];
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (i_ >= s_.size()) return false;
      const char e = s_[i_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out->push_back(e);
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          uint32_t cp;
          if (!Hex4(&cp)) return false;
          if (cp >= 0xD800 && cp <= 0xDBFF && Literal("\\u")) {
            uint32_t low;
            if (!Hex4(&low)) return false;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          return false;
      }
    }
    if (i_ >= s_.size()) return false;
    ++i_;
    return true;
  }
  bool Value(Json* v) {
    Space();
    if (i_ >= s_.size()) return false;
    const char c = s_[i_];
    if (c == '{') {
      v->kind = Json::Kind::kObject;
      ++i_;
      Space();
      if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
        return true;
      }
      while (true) {
        Space();
        std::string key;
        if (!String(&key)) return false;
        Space();
        if (!Literal(":")) return false;
        Json item;
        if (!Value(&item)) return false;
        v->object.emplace_back(std::move(key), std::move(item));
        Space();
        if (Literal("}")) return true;
        if (!Literal(",")) return false;
      }
    }
    if (c == '[') {
      v->kind = Json::Kind::kArray;
      ++i_;
      Space();
      if (i_ < s_.size() && s_[i_] == ']') {
        ++i_;
        return true;
      }
      while (true) {
        Json item;
        if (!Value(&item)) return false;
        v->array.push_back(std::move(item));
        Space();
        if (Literal("]")) return true;
        if (!Literal(",")) return false;
      }
    }
    if (c == '"') {
      v->kind = Json::Kind::kString;
      return String(&v->string);
    }
    if (Literal("true")) {
      v->kind = Json::Kind::kBool;
      v->boolean = true;
      return true;
    }
    if (Literal("false")) {
      v->kind = Json::Kind::kBool;
      return true;
    }
    if (Literal("null")) return true;
    const size_t start = i_;
    while (i_ < s_.size() &&
           std::string("+-.eE0123456789").find(s_[i_]) != std::string::npos) {
      ++i_;
    }
    if (i_ == start) return false;
    v->kind = Json::Kind::kNumber;
    v->number =
        std::strtod(std::string(s_.substr(start, i_ - start)).c_str(), nullptr);
    return true;
  }

  absl::string_view s_;
  size_t i_ = 0;
};

}  // namespace

const Json& Json::operator[](absl::string_view key) const {
  static const Json* const kNull = new Json;
  const Json* v = Find(key);
  return v == nullptr ? *kNull : *v;
}

std::optional<Json> ParseGoldenJson(absl::string_view text) {
  return JsonParser(text).Parse();
}

std::optional<Json> LoadGoldenJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParseGoldenJson(buffer.str());
}

}  // namespace pdserve::model::golden
