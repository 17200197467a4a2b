#include "common/ir/text_format.h"

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/bytes.h"
#include "common/ir/profile_fields.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

// ---------------------------------------------------------------------------
// Printing.

// A string prints bare when it cannot be mistaken for syntax; anything else
// (empty, spaces, quotes, '#', '=', ',', backslashes, control bytes) is
// written as a double-quoted string with C-style escapes.
bool IsBareChar(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (u <= 0x20 || u == 0x7f) return false;
  return c != '"' && c != '#' && c != '=' && c != ',' && c != '\\';
}

std::string FormatString(absl::string_view s) {
  bool bare = !s.empty();
  for (char c : s) bare = bare && IsBareChar(c);
  if (bare) return std::string(s);
  std::string out = "\"";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
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
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (u < 0x20 || u == 0x7f) {
          static constexpr char kHex[] = "0123456789abcdef";
          out += "\\x";
          out += kHex[u >> 4];
          out += kHex[u & 0xf];
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

// Shortest text that parses back to the same double, bit for bit.
std::string FormatDouble(double v) {
  char buf[64];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

// Only +0.0 counts as the default: -0.0 is printed so that it round-trips.
bool IsPositiveZero(double v) { return v == 0 && !std::signbit(v); }

std::string FormatId(char prefix, int64_t id) {
  return absl::StrCat(absl::string_view(&prefix, 1), id);
}

std::string FormatIdList(char prefix, const std::vector<int32_t>& ids) {
  return absl::StrJoin(ids, ",", [prefix](std::string* out, int32_t id) {
    out->append(FormatId(prefix, id));
  });
}

std::string FormatWindow(int64_t first, int64_t last) {
  return absl::StrCat(first, "..", last);
}

// ---------------------------------------------------------------------------
// Lexing.

struct Token {
  // The whole token, quotes included.
  absl::string_view text;
  // Before the first '=' outside quotes; the whole token when there is none.
  absl::string_view key;
  // After that '='.
  absl::string_view value;
  bool has_value = false;
};

struct Line {
  int number = 0;
  std::vector<Token> tokens;
};

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

// Tokens echoed in messages are capped so one bad line stays readable.
std::string Shown(absl::string_view token) {
  constexpr size_t kMax = 48;
  if (token.size() <= kMax) return absl::StrCat("'", token, "'");
  return absl::StrCat("'", token.substr(0, kMax), "...'");
}

absl::Status LineError(int line, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", message));
}

// Splits `text` into lines of tokens, dropping comments and blank lines.
absl::StatusOr<std::vector<Line>> Tokenize(absl::string_view text) {
  std::vector<Line> lines;
  int number = 0;
  size_t pos = 0;
  while (true) {
    size_t end = text.find('\n', pos);
    const bool last = end == absl::string_view::npos;
    if (last) end = text.size();
    const absl::string_view raw = text.substr(pos, end - pos);
    ++number;
    Line line;
    line.number = number;
    size_t i = 0;
    while (i < raw.size()) {
      if (IsSpace(raw[i])) {
        ++i;
        continue;
      }
      if (raw[i] == '#') break;
      const size_t start = i;
      size_t equals = absl::string_view::npos;
      bool in_quotes = false;
      while (i < raw.size()) {
        const char c = raw[i];
        if (in_quotes) {
          if (c == '\\') {
            i += 2;
            continue;
          }
          if (c == '"') in_quotes = false;
          ++i;
          continue;
        }
        if (IsSpace(c) || c == '#') break;
        if (c == '"') {
          in_quotes = true;
        } else if (c == '=' && equals == absl::string_view::npos) {
          equals = i;
        }
        ++i;
      }
      if (i > raw.size()) i = raw.size();
      Token token;
      token.text = raw.substr(start, i - start);
      if (in_quotes) {
        return LineError(number, absl::StrCat("unterminated quoted string in ",
                                              Shown(token.text)));
      }
      if (equals == absl::string_view::npos) {
        token.key = token.text;
      } else {
        token.key = raw.substr(start, equals - start);
        token.value = raw.substr(equals + 1, i - equals - 1);
        token.has_value = true;
      }
      line.tokens.push_back(token);
    }
    if (!line.tokens.empty()) lines.push_back(std::move(line));
    if (last) break;
    pos = end + 1;
  }
  return lines;
}

// ---------------------------------------------------------------------------
// Values. Each parser's error says what it expected and what it got; the
// caller adds the line and the statement.

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A bare string or a double-quoted one with escapes \" \\ \n \t \r \xHH.
absl::StatusOr<std::string> ParseString(absl::string_view raw) {
  if (raw.empty() || raw[0] != '"') {
    if (raw.find('"') != absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("a quote may only start a string, got ", Shown(raw)));
    }
    return std::string(raw);
  }
  std::string out;
  size_t i = 1;
  while (i < raw.size()) {
    const char c = raw[i];
    if (c == '"') {
      if (i + 1 != raw.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "unexpected text after the closing quote in ", Shown(raw)));
      }
      return out;
    }
    if (c != '\\') {
      out += c;
      ++i;
      continue;
    }
    if (i + 1 >= raw.size()) break;
    const char e = raw[i + 1];
    switch (e) {
      case '"':
      case '\\':
        out += e;
        break;
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case 'x': {
        const int hi = i + 2 < raw.size() ? HexDigit(raw[i + 2]) : -1;
        const int lo = i + 3 < raw.size() ? HexDigit(raw[i + 3]) : -1;
        if (hi < 0 || lo < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "expected two hex digits after \\x in ", Shown(raw)));
        }
        out += static_cast<char>(hi * 16 + lo);
        i += 4;
        continue;
      }
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            "unknown escape '\\", absl::string_view(&e, 1), "' in ", Shown(raw),
            " (expected \\\" \\\\ \\n \\t \\r or \\xHH)"));
    }
    i += 2;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unterminated quoted string ", Shown(raw)));
}

template <typename Int>
std::optional<Int> ParseIntText(absl::string_view s, bool* out_of_range) {
  Int v = 0;
  const char* end = s.data() + s.size();
  const std::from_chars_result r = std::from_chars(s.data(), end, v);
  if (out_of_range) *out_of_range = r.ec == std::errc::result_out_of_range;
  if (s.empty() || r.ec != std::errc() || r.ptr != end) return std::nullopt;
  return v;
}

std::optional<double> ParseDoubleText(absl::string_view s) {
  double v = 0;
  const char* end = s.data() + s.size();
  const std::from_chars_result r = std::from_chars(s.data(), end, v);
  if (s.empty() || r.ec != std::errc() || r.ptr != end) return std::nullopt;
  return v;
}

template <typename Int>
absl::StatusOr<Int> ParseInteger(absl::string_view s) {
  bool out_of_range = false;
  if (std::optional<Int> v = ParseIntText<Int>(s, &out_of_range)) return *v;
  return absl::InvalidArgumentError(
      absl::StrCat("expected an integer, got ", Shown(s),
                   out_of_range ? " (out of range)" : ""));
}

absl::StatusOr<double> ParseNumber(absl::string_view s) {
  if (std::optional<double> v = ParseDoubleText(s)) return *v;
  return absl::InvalidArgumentError(
      absl::StrCat("expected a number such as 1e6 or 0.25, got ", Shown(s)));
}

bool ConsumeSuffix(absl::string_view* s, absl::string_view suffix) {
  if (s->size() < suffix.size() ||
      s->substr(s->size() - suffix.size()) != suffix) {
    return false;
  }
  s->remove_suffix(suffix.size());
  return true;
}

// Seconds, or a number with one of the suffixes s, ms, us, ns.
absl::StatusOr<double> ParseTime(absl::string_view s) {
  absl::string_view number = s;
  int exponent = 0;
  if (ConsumeSuffix(&number, "ns")) {
    exponent = 9;
  } else if (ConsumeSuffix(&number, "us")) {
    exponent = 6;
  } else if (ConsumeSuffix(&number, "ms")) {
    exponent = 3;
  } else {
    ConsumeSuffix(&number, "s");
  }
  std::optional<double> v;
  if (exponent == 0) {
    v = ParseDoubleText(number);
  } else if (number.find_first_not_of("+-.0123456789") ==
             absl::string_view::npos) {
    // Shift the decimal exponent in the text so that "3ms" parses to the
    // double nearest 0.003, exactly as "0.003" does.
    v = ParseDoubleText(absl::StrCat(number, "e-", exponent));
  } else if ((v = ParseDoubleText(number))) {
    *v /= std::pow(10.0, exponent);
  }
  if (v) return *v;
  return absl::InvalidArgumentError(absl::StrCat(
      "expected a time such as 0.002, 2ms, 150us or 40ns, got ", Shown(s)));
}

// Bytes, or a number with one of the suffixes B, KiB, MiB, GiB.
absl::StatusOr<int64_t> ParseBytes(absl::string_view s) {
  absl::string_view number = s;
  int64_t scale = 1;
  if (ConsumeSuffix(&number, "KiB")) {
    scale = int64_t{1} << 10;
  } else if (ConsumeSuffix(&number, "MiB")) {
    scale = int64_t{1} << 20;
  } else if (ConsumeSuffix(&number, "GiB")) {
    scale = int64_t{1} << 30;
  } else {
    ConsumeSuffix(&number, "B");
  }
  bool out_of_range = false;
  if (std::optional<int64_t> n = ParseIntText<int64_t>(number, &out_of_range)) {
    int64_t product = 0;
    if (!__builtin_mul_overflow(*n, scale, &product)) return product;
    out_of_range = true;
  } else if (std::optional<double> d = ParseDoubleText(number)) {
    // Fractions are fine as long as the result is a whole number of bytes.
    const double product = *d * static_cast<double>(scale);
    if (std::isfinite(product) && std::floor(product) == product) {
      if (product >= -9.2233720368547758e18 &&
          product < 9.2233720368547758e18) {
        return static_cast<int64_t>(product);
      }
      out_of_range = true;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "expected a whole byte count such as 4096, 4KiB, 16MiB or 1.5GiB, got ",
      Shown(s), out_of_range ? " (out of range)" : ""));
}

absl::string_view IdNoun(char prefix) {
  switch (prefix) {
    case 'p':
      return "param";
    case 'n':
      return "node";
    case 'g':
      return "group";
    case 'o':
      return "offload";
    case 'v':
      return "version";
  }
  return "id";
}

absl::string_view IdExample(char prefix) {
  switch (prefix) {
    case 'p':
      return "p3";
    case 'n':
      return "n7";
    case 'g':
      return "g2";
    case 'o':
      return "o1";
    case 'v':
      return "v3";
  }
  return "x1";
}

// "a param id like p3".
std::string IdExpectation(char prefix) {
  return absl::StrCat(prefix == 'o' ? "an " : "a ", IdNoun(prefix), " id like ",
                      IdExample(prefix));
}

template <typename Int = int32_t>
absl::StatusOr<Int> ParseId(absl::string_view s, char prefix) {
  if (!s.empty() && s[0] == prefix) {
    bool out_of_range = false;
    if (std::optional<Int> v = ParseIntText<Int>(s.substr(1), &out_of_range)) {
      return *v;
    }
    if (out_of_range) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected ", IdExpectation(prefix), ", got ", Shown(s),
                       " (out of range)"));
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("expected ", IdExpectation(prefix), ", got ", Shown(s)));
}

// Comma-separated ids; the empty string is the empty list.
absl::StatusOr<std::vector<int32_t>> ParseIdList(absl::string_view s,
                                                 char prefix) {
  std::vector<int32_t> ids;
  if (s.empty()) return ids;
  size_t pos = 0;
  while (true) {
    size_t comma = s.find(',', pos);
    const bool last = comma == absl::string_view::npos;
    if (last) comma = s.size();
    absl::StatusOr<int32_t> id = ParseId(s.substr(pos, comma - pos), prefix);
    if (!id.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(id.status().message(), " in list ", Shown(s)));
    }
    ids.push_back(*id);
    if (last) break;
    pos = comma + 1;
  }
  return ids;
}

// Comma-separated strings, each bare or quoted; empty is the empty list.
absl::StatusOr<std::vector<std::string>> ParseStringList(absl::string_view s) {
  std::vector<std::string> out;
  if (s.empty()) return out;
  size_t start = 0;
  bool in_quotes = false;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i < s.size()) {
      const char c = s[i];
      if (in_quotes && c == '\\' && i + 1 < s.size()) {
        ++i;
        continue;
      }
      if (c == '"') in_quotes = !in_quotes;
      if (in_quotes || c != ',') continue;
    }
    const absl::string_view element = s.substr(start, i - start);
    if (in_quotes) {
      return absl::InvalidArgumentError(
          absl::StrCat("unterminated quoted string in list ", Shown(s)));
    }
    if (element.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("empty element in list ", Shown(s),
                       " (write \"\" for an empty string)"));
    }
    ASSIGN_OR_RETURN(std::string value, ParseString(element));
    out.push_back(std::move(value));
    start = i + 1;
  }
  return out;
}

struct Window {
  int64_t first = 0;
  int64_t last = 0;
};

absl::StatusOr<Window> ParseWindow(absl::string_view s) {
  const size_t dots = s.find("..");
  if (dots != absl::string_view::npos) {
    bool unused = false;
    std::optional<int64_t> first =
        ParseIntText<int64_t>(s.substr(0, dots), &unused);
    std::optional<int64_t> last =
        ParseIntText<int64_t>(s.substr(dots + 2), &unused);
    if (first && last) return Window{*first, *last};
  }
  return absl::InvalidArgumentError(
      absl::StrCat("expected an iteration window like 10..20, got ", Shown(s)));
}

struct TypedShape {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

// dtype[d0,d1,...], e.g. f32[1024,64]; f32[] is a scalar.
absl::StatusOr<TypedShape> ParseTypedShape(absl::string_view s) {
  const size_t open = s.find('[');
  if (open == absl::string_view::npos || s.empty() || s.back() != ']') {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected dtype[shape] like f32[1024,64], got ", Shown(s)));
  }
  TypedShape out;
  const absl::string_view dtype = s.substr(0, open);
  std::optional<DType> parsed = ParseDType(dtype);
  if (!parsed) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown dtype ", Shown(dtype), " in ", Shown(s),
                     " (expected f32, bf16 or f16)"));
  }
  out.dtype = *parsed;
  const absl::string_view dims = s.substr(open + 1, s.size() - open - 2);
  if (dims.empty()) return out;
  size_t pos = 0;
  while (true) {
    size_t comma = dims.find(',', pos);
    const bool last = comma == absl::string_view::npos;
    if (last) comma = dims.size();
    const absl::string_view dim = dims.substr(pos, comma - pos);
    bool out_of_range = false;
    std::optional<int64_t> d = ParseIntText<int64_t>(dim, &out_of_range);
    if (!d) {
      return absl::InvalidArgumentError(absl::StrCat(
          "expected an integer dimension, got ", Shown(dim), " in ", Shown(s),
          out_of_range ? " (out of range)" : ""));
    }
    out.shape.push_back(*d);
    if (last) break;
    pos = comma + 1;
  }
  return out;
}

// ---------------------------------------------------------------------------
// Statements: a keyword, positional tokens, then key=value attributes and
// flags in any order.

class Statement {
 public:
  explicit Statement(const Line& line) : line_(line) {}

  // Prefixes errors, e.g. "node n3".
  void set_context(std::string context) { context_ = std::move(context); }

  absl::Status Error(absl::string_view message) const {
    if (context_.empty()) return LineError(line_.number, message);
    return LineError(line_.number, absl::StrCat(context_, ": ", message));
  }

  // Adds this statement's line and context (and the attribute, if any) to a
  // value parser's error.
  template <typename T>
  absl::StatusOr<T> Check(absl::StatusOr<T> result,
                          absl::string_view attribute = {}) const {
    if (result.ok()) return result;
    if (attribute.empty()) return Error(result.status().message());
    return Error(absl::StrCat(attribute, ": ", result.status().message()));
  }

  // The next positional token; `what` names it in errors ("the node name").
  absl::StatusOr<absl::string_view> Positional(absl::string_view what) {
    if (next_ >= line_.tokens.size()) {
      return Error(absl::StrCat("missing ", what));
    }
    const Token& token = line_.tokens[next_];
    if (token.has_value) {
      return Error(absl::StrCat("expected ", what, ", got attribute ",
                                Shown(token.text)));
    }
    ++next_;
    return token.text;
  }

  // The next token when it is positional (has no '='), else nothing.
  std::optional<absl::string_view> OptionalPositional() {
    if (next_ >= line_.tokens.size() || line_.tokens[next_].has_value) {
      return std::nullopt;
    }
    return line_.tokens[next_++].text;
  }

  // Reads the remaining tokens as attributes named in `keys` and flags named
  // in `flags`; each may appear once.
  absl::Status ReadAttributes(absl::Span<const absl::string_view> keys,
                              absl::Span<const absl::string_view> flags = {}) {
    for (; next_ < line_.tokens.size(); ++next_) {
      const Token& token = line_.tokens[next_];
      const bool is_key = Contains(keys, token.key);
      const bool is_flag = Contains(flags, token.key);
      if (token.has_value && is_flag) {
        return Error(absl::StrCat("'", token.key,
                                  "' is a flag and takes no value, got ",
                                  Shown(token.text)));
      }
      if (!(token.has_value ? is_key : is_flag)) {
        const std::string valid = Valid(keys, flags);
        if (valid.empty()) {
          return Error(absl::StrCat("unexpected ", Shown(token.text),
                                    " at the end of the line"));
        }
        if (token.has_value) {
          return Error(absl::StrCat("unknown attribute ", Shown(token.key),
                                    " (expected one of ", valid, ")"));
        }
        return Error(absl::StrCat("unexpected ", Shown(token.text),
                                  " (expected key=value attributes, one of ",
                                  valid, ")"));
      }
      for (const Token* seen : seen_) {
        if (seen->key == token.key) {
          return Error(absl::StrCat("duplicate attribute '", token.key, "'"));
        }
      }
      seen_.push_back(&token);
    }
    return absl::OkStatus();
  }

  // The raw value of an attribute read by ReadAttributes.
  std::optional<absl::string_view> Attribute(absl::string_view key) const {
    for (const Token* token : seen_) {
      if (token->has_value && token->key == key) return token->value;
    }
    return std::nullopt;
  }

  bool Flag(absl::string_view name) const {
    for (const Token* token : seen_) {
      if (!token->has_value && token->key == name) return true;
    }
    return false;
  }

  // Parses attribute `key` into `out` when present; `out` keeps its value
  // otherwise.
  template <typename T, typename Parser>
  absl::Status Read(absl::string_view key, Parser parse, T* out) const {
    std::optional<absl::string_view> value = Attribute(key);
    if (!value) return absl::OkStatus();
    ASSIGN_OR_RETURN(*out, Check(parse(*value), key));
    return absl::OkStatus();
  }

  absl::Status Require(absl::string_view key, absl::string_view example) const {
    if (Attribute(key)) return absl::OkStatus();
    return Error(absl::StrCat("missing attribute ", key, "= (e.g. ", key, "=",
                              example, ")"));
  }

 private:
  static bool Contains(absl::Span<const absl::string_view> names,
                       absl::string_view name) {
    for (absl::string_view n : names) {
      if (n == name) return true;
    }
    return false;
  }

  static std::string Valid(absl::Span<const absl::string_view> keys,
                           absl::Span<const absl::string_view> flags) {
    std::vector<absl::string_view> all(keys.begin(), keys.end());
    all.insert(all.end(), flags.begin(), flags.end());
    return absl::StrJoin(all, ", ");
  }

  const Line& line_;
  size_t next_ = 1;  // tokens[0] is the keyword.
  std::string context_;
  std::vector<const Token*> seen_;
};

auto IdParser(char prefix) {
  return [prefix](absl::string_view s) { return ParseId(s, prefix); };
}

auto IdListParser(char prefix) {
  return [prefix](absl::string_view s) { return ParseIdList(s, prefix); };
}

// Statement keywords by document, used to point a misplaced line at the
// document it belongs in.
constexpr absl::string_view kGraphKeywords[] = {"param", "node"};
constexpr absl::string_view kScheduleKeywords[] = {
    "group",   "persistent", "offload", "before",  "after",
    "predict", "provenance", "explain", "decision"};
constexpr absl::string_view kProfileKeywords[] = {"time", "collective",
                                                  "memory"};

template <size_t N>
bool In(const absl::string_view (&list)[N], absl::string_view word) {
  for (absl::string_view w : list) {
    if (w == word) return true;
  }
  return false;
}

// Which document kind (graph, schedule, profile) uses `word` as a statement
// or header keyword, or empty.
absl::string_view OwnerOf(absl::string_view word) {
  if (word == "graph" || In(kGraphKeywords, word)) return "graph";
  if (word == "schedule" || In(kScheduleKeywords, word)) return "schedule";
  if (word == "profile" || In(kProfileKeywords, word)) return "profile";
  return {};
}

// Checks that `lines` start with the `header` line and hold no second one.
absl::Status CheckHeader(const std::vector<Line>& lines,
                         absl::string_view header,
                         absl::string_view header_example) {
  if (lines.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "missing '", header, "' header line: the text has no ",
        "statements (expected a first line like '", header_example, "')"));
  }
  const Token& first = lines[0].tokens[0];
  if (first.text != header) {
    const absl::string_view owner = OwnerOf(first.text);
    if (owner == first.text) {
      return LineError(
          lines[0].number,
          absl::StrCat("expected the '", header, "' header line, got a '",
                       owner, "' header: this text is a ", owner, ", not a ",
                       header));
    }
    return LineError(
        lines[0].number,
        absl::StrCat("missing '", header,
                     "' header line: ", "expected a first line like '",
                     header_example, "', got ", Shown(first.text)));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    if (lines[i].tokens[0].text == header) {
      return LineError(lines[i].number,
                       absl::StrCat("duplicate '", header,
                                    "' header line (the first is at line ",
                                    lines[0].number, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status UnknownStatement(const Line& line, absl::string_view document,
                              absl::string_view expected) {
  const absl::string_view word = line.tokens[0].text;
  const absl::string_view owner = OwnerOf(word);
  std::string message =
      absl::StrCat("unknown statement ", Shown(word), " in a ", document,
                   " (expected ", expected, ")");
  if (!owner.empty() && owner != document) {
    absl::StrAppend(&message, "; '", word, "' lines belong in a ", owner);
  }
  return LineError(line.number, message);
}

// ---------------------------------------------------------------------------
// Graph.

constexpr absl::string_view kGraphExample =
    "graph NAME world=2 micro_batches=1 tokens=512";

// The graph's optional reduce=DTYPE.
absl::StatusOr<DType> ParseReduceDType(absl::string_view s) {
  std::optional<DType> parsed = ParseDType(s);
  if (!parsed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown dtype ", Shown(s), " (expected f32, bf16 or f16)"));
  }
  return *parsed;
}

absl::Status ParseGraphHeader(const Line& line, Graph* graph) {
  Statement st(line);
  st.set_context("graph");
  ASSIGN_OR_RETURN(absl::string_view name, st.Positional("the graph name"));
  ASSIGN_OR_RETURN(graph->name, st.Check(ParseString(name)));
  RETURN_IF_ERROR(
      st.ReadAttributes({"world", "micro_batches", "tokens", "reduce"}));
  RETURN_IF_ERROR(st.Read("world", ParseInteger<int32_t>, &graph->world_size));
  RETURN_IF_ERROR(
      st.Read("micro_batches", ParseInteger<int32_t>, &graph->micro_batches));
  RETURN_IF_ERROR(
      st.Read("tokens", ParseInteger<int64_t>, &graph->tokens_per_micro_batch));
  DType reduce = DType::kF32;
  RETURN_IF_ERROR(st.Read("reduce", ParseReduceDType, &reduce));
  if (st.Attribute("reduce")) graph->reduce_dtype = reduce;
  return absl::OkStatus();
}

absl::Status ParseParamLine(const Line& line, Graph* graph) {
  Statement st(line);
  st.set_context("param");
  Param param;
  ASSIGN_OR_RETURN(absl::string_view id, st.Positional(IdExpectation('p')));
  ASSIGN_OR_RETURN(param.id, st.Check(ParseId(id, 'p')));
  st.set_context(absl::StrCat("param ", id));
  ASSIGN_OR_RETURN(absl::string_view name, st.Positional("the param name"));
  ASSIGN_OR_RETURN(param.name, st.Check(ParseString(name)));
  ASSIGN_OR_RETURN(absl::string_view shape,
                   st.Positional("dtype[shape] like f32[1024,64]"));
  ASSIGN_OR_RETURN(TypedShape typed, st.Check(ParseTypedShape(shape)));
  param.dtype = typed.dtype;
  param.shape = std::move(typed.shape);
  RETURN_IF_ERROR(st.ReadAttributes({"unit"}, {"frozen"}));
  RETURN_IF_ERROR(st.Read("unit", ParseString, &param.unit));
  param.trainable = !st.Flag("frozen");
  graph->params.push_back(std::move(param));
  return absl::OkStatus();
}

absl::StatusOr<Phase> ParsePhaseToken(absl::string_view s) {
  if (std::optional<Phase> phase = ParsePhase(s)) return *phase;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown phase ", Shown(s), " (expected fwd, bwd or opt)"));
}

absl::Status ParseNodeLine(const Line& line, Graph* graph) {
  Statement st(line);
  st.set_context("node");
  Node node;
  ASSIGN_OR_RETURN(absl::string_view id, st.Positional(IdExpectation('n')));
  ASSIGN_OR_RETURN(node.id, st.Check(ParseId(id, 'n')));
  st.set_context(absl::StrCat("node ", id));
  ASSIGN_OR_RETURN(absl::string_view name, st.Positional("the node name"));
  ASSIGN_OR_RETURN(node.name, st.Check(ParseString(name)));
  ASSIGN_OR_RETURN(absl::string_view phase,
                   st.Positional("a phase (fwd, bwd or opt)"));
  ASSIGN_OR_RETURN(node.phase, st.Check(ParsePhaseToken(phase)));
  RETURN_IF_ERROR(st.ReadAttributes(
      {"mb", "of", "params", "flops", "time", "act", "ws"}, {"recompute"}));
  RETURN_IF_ERROR(st.Read("mb", ParseInteger<int32_t>, &node.micro_batch));
  int32_t forward_id = 0;
  if (st.Attribute("of")) {
    RETURN_IF_ERROR(st.Read("of", IdParser('n'), &forward_id));
    node.forward_id = forward_id;
  }
  node.recompute = st.Flag("recompute");
  RETURN_IF_ERROR(st.Read("params", IdListParser('p'), &node.param_ids));
  RETURN_IF_ERROR(st.Read("flops", ParseNumber, &node.flops));
  RETURN_IF_ERROR(st.Read("time", ParseTime, &node.time_s));
  RETURN_IF_ERROR(st.Read("act", ParseBytes, &node.activation_bytes));
  RETURN_IF_ERROR(st.Read("ws", ParseBytes, &node.workspace_bytes));
  graph->nodes.push_back(std::move(node));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Schedule.

constexpr absl::string_view kScheduleExample =
    "schedule v3 graph=0123456789abcdef mode=zero3 budget=80GiB";

absl::StatusOr<ShardingMode> ParseModeToken(absl::string_view s) {
  if (std::optional<ShardingMode> mode = ParseShardingMode(s)) return *mode;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown mode ", Shown(s), " (expected zero3 or zero1)"));
}

absl::Status ParseScheduleHeader(const Line& line, Schedule* schedule) {
  Statement st(line);
  st.set_context("schedule");
  ASSIGN_OR_RETURN(absl::string_view version,
                   st.Positional(IdExpectation('v')));
  ASSIGN_OR_RETURN(schedule->version, st.Check(ParseId<int64_t>(version, 'v')));
  RETURN_IF_ERROR(st.ReadAttributes({"graph", "mode", "budget"}));
  RETURN_IF_ERROR(st.Require("graph", "0123456789abcdef"));
  RETURN_IF_ERROR(st.Read("graph", ParseString, &schedule->graph_hash));
  RETURN_IF_ERROR(st.Read("mode", ParseModeToken, &schedule->mode));
  RETURN_IF_ERROR(st.Read("budget", ParseBytes, &schedule->budget_bytes));
  return absl::OkStatus();
}

absl::Status ParseGroupLine(const Line& line, Schedule* schedule) {
  Statement st(line);
  st.set_context("group");
  GatherGroup group;
  ASSIGN_OR_RETURN(absl::string_view id, st.Positional(IdExpectation('g')));
  ASSIGN_OR_RETURN(group.id, st.Check(ParseId(id, 'g')));
  st.set_context(absl::StrCat("group ", id));
  if (std::optional<absl::string_view> ids = st.OptionalPositional()) {
    ASSIGN_OR_RETURN(group.param_ids, st.Check(ParseIdList(*ids, 'p')));
  }
  RETURN_IF_ERROR(st.ReadAttributes({}));
  schedule->groups.push_back(std::move(group));
  return absl::OkStatus();
}

// Several `persistent` lines append to one set.
absl::Status ParsePersistentLine(const Line& line, Schedule* schedule) {
  Statement st(line);
  st.set_context("persistent");
  if (std::optional<absl::string_view> ids = st.OptionalPositional()) {
    ASSIGN_OR_RETURN(std::vector<int32_t> parsed,
                     st.Check(ParseIdList(*ids, 'p')));
    schedule->persistent_param_ids.insert(schedule->persistent_param_ids.end(),
                                          parsed.begin(), parsed.end());
  }
  return st.ReadAttributes({});
}

absl::Status ParseOffloadLine(const Line& line, Schedule* schedule) {
  Statement st(line);
  st.set_context("offload");
  OffloadEntry entry;
  ASSIGN_OR_RETURN(absl::string_view id, st.Positional(IdExpectation('o')));
  ASSIGN_OR_RETURN(entry.id, st.Check(ParseId(id, 'o')));
  st.set_context(absl::StrCat("offload ", id));
  if (std::optional<absl::string_view> ids = st.OptionalPositional()) {
    ASSIGN_OR_RETURN(entry.param_ids, st.Check(ParseIdList(*ids, 'p')));
  }
  RETURN_IF_ERROR(st.ReadAttributes({"bytes"}));
  RETURN_IF_ERROR(st.Read("bytes", ParseBytes, &entry.bytes));
  schedule->offloads.push_back(std::move(entry));
  return absl::OkStatus();
}

absl::StatusOr<ActionKind> ParseActionKindToken(absl::string_view s) {
  if (std::optional<ActionKind> kind = ParseActionKind(s)) return *kind;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown action ", Shown(s),
                   " (expected allgather, wait, release, reduce_scatter, "
                   "offload or reload)"));
}

// `before|after nID KIND ARG`: ARG is the group (allgather, wait, release),
// the param list (reduce_scatter, may be empty) or the offload entry
// (offload, reload). Fields the kind does not use print as attributes only
// when set, so that every Action round-trips.
absl::Status ParseActionLine(const Line& line, AnchorPosition position,
                             Schedule* schedule) {
  Statement st(line);
  st.set_context(std::string(AnchorPositionName(position)));
  Action action;
  action.position = position;
  ASSIGN_OR_RETURN(absl::string_view node, st.Positional(IdExpectation('n')));
  ASSIGN_OR_RETURN(action.node_id, st.Check(ParseId(node, 'n')));
  st.set_context(absl::StrCat(AnchorPositionName(position), " ", node));
  ASSIGN_OR_RETURN(
      absl::string_view kind,
      st.Positional("an action (allgather, wait, release, reduce_scatter, "
                    "offload or reload)"));
  ASSIGN_OR_RETURN(action.kind, st.Check(ParseActionKindToken(kind)));
  st.set_context(
      absl::StrCat(AnchorPositionName(position), " ", node, " ", kind));
  switch (action.kind) {
    case ActionKind::kAllGather:
    case ActionKind::kWait:
    case ActionKind::kRelease: {
      ASSIGN_OR_RETURN(absl::string_view group,
                       st.Positional(IdExpectation('g')));
      ASSIGN_OR_RETURN(action.group_id, st.Check(ParseId(group, 'g')));
      RETURN_IF_ERROR(st.ReadAttributes({"params", "offload"}));
      break;
    }
    case ActionKind::kReduceScatter: {
      if (std::optional<absl::string_view> ids = st.OptionalPositional()) {
        ASSIGN_OR_RETURN(action.param_ids, st.Check(ParseIdList(*ids, 'p')));
      }
      RETURN_IF_ERROR(st.ReadAttributes({"group", "offload"}));
      break;
    }
    case ActionKind::kOffload:
    case ActionKind::kReload: {
      ASSIGN_OR_RETURN(absl::string_view entry,
                       st.Positional(IdExpectation('o')));
      ASSIGN_OR_RETURN(action.offload_id, st.Check(ParseId(entry, 'o')));
      RETURN_IF_ERROR(st.ReadAttributes({"group", "params"}));
      break;
    }
  }
  RETURN_IF_ERROR(st.Read("group", IdParser('g'), &action.group_id));
  RETURN_IF_ERROR(st.Read("params", IdListParser('p'), &action.param_ids));
  RETURN_IF_ERROR(st.Read("offload", IdParser('o'), &action.offload_id));
  schedule->actions.push_back(std::move(action));
  return absl::OkStatus();
}

absl::Status ParsePredictLine(const Line& line, Prediction* prediction) {
  Statement st(line);
  st.set_context("predict");
  RETURN_IF_ERROR(st.ReadAttributes(
      {"iteration", "compute", "comm", "exposed", "copy", "peak", "work"}));
  RETURN_IF_ERROR(st.Read("iteration", ParseTime, &prediction->iteration_s));
  RETURN_IF_ERROR(st.Read("compute", ParseTime, &prediction->compute_s));
  RETURN_IF_ERROR(st.Read("comm", ParseTime, &prediction->comm_s));
  RETURN_IF_ERROR(st.Read("exposed", ParseTime, &prediction->exposed_comm_s));
  RETURN_IF_ERROR(st.Read("copy", ParseTime, &prediction->copy_s));
  RETURN_IF_ERROR(st.Read("peak", ParseBytes, &prediction->peak_bytes));
  RETURN_IF_ERROR(st.Read("work", ParseNumber, &prediction->work));
  return absl::OkStatus();
}

absl::Status ParseProvenanceLine(const Line& line, Provenance* provenance) {
  Statement st(line);
  st.set_context("provenance");
  RETURN_IF_ERROR(st.ReadAttributes({"passes", "window", "wall", "reason"}));
  RETURN_IF_ERROR(st.Read("passes", ParseStringList, &provenance->passes));
  Window window{provenance->window_first_iteration,
                provenance->window_last_iteration};
  RETURN_IF_ERROR(st.Read("window", ParseWindow, &window));
  provenance->window_first_iteration = window.first;
  provenance->window_last_iteration = window.last;
  RETURN_IF_ERROR(st.Read("wall", ParseTime, &provenance->plan_wall_s));
  RETURN_IF_ERROR(st.Read("reason", ParseString, &provenance->reason));
  return absl::OkStatus();
}

absl::Status ParseExplainLine(const Line& line, Explanation* explanation) {
  Statement st(line);
  st.set_context("explain");
  RETURN_IF_ERROR(
      st.ReadAttributes({"baseline", "baseline_exposed", "baseline_peak"}));
  RETURN_IF_ERROR(
      st.Read("baseline", ParseTime, &explanation->baseline_iteration_s));
  RETURN_IF_ERROR(st.Read("baseline_exposed", ParseTime,
                          &explanation->baseline_exposed_comm_s));
  RETURN_IF_ERROR(
      st.Read("baseline_peak", ParseBytes, &explanation->baseline_peak_bytes));
  return absl::OkStatus();
}

absl::StatusOr<DecisionKind> ParseDecisionKindToken(absl::string_view s) {
  if (std::optional<DecisionKind> kind = ParseDecisionKind(s)) return *kind;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown decision ", Shown(s),
                   " (expected prefetch, fuse, keep, persist, offload, return, "
                   "zero1-buckets, pass, policy or least-memory)"));
}

absl::StatusOr<BindingKind> ParseBindingKindToken(absl::string_view s) {
  if (std::optional<BindingKind> kind = ParseBindingKind(s)) return *kind;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown binding ", Shown(s),
                   " (expected none, memory, link or host-link)"));
}

// `decision KIND pass=NAME gain=S exposed_gain=S ...`; several lines append
// in order.
absl::Status ParseDecisionLine(const Line& line, Explanation* explanation) {
  Statement st(line);
  st.set_context("decision");
  Decision d;
  ASSIGN_OR_RETURN(absl::string_view kind,
                   st.Positional("a decision kind (prefetch, keep, ...)"));
  ASSIGN_OR_RETURN(d.kind, st.Check(ParseDecisionKindToken(kind)));
  st.set_context(absl::StrCat("decision ", kind));
  RETURN_IF_ERROR(
      st.ReadAttributes({"pass", "gain", "exposed_gain", "held", "peak_delta",
                         "at", "groups", "params", "offloads", "bind",
                         "bind_at", "bind_bytes", "bind_limit", "what"}));
  RETURN_IF_ERROR(st.Read("pass", ParseString, &d.pass));
  RETURN_IF_ERROR(st.Read("gain", ParseTime, &d.gain_s));
  RETURN_IF_ERROR(st.Read("exposed_gain", ParseTime, &d.exposed_gain_s));
  RETURN_IF_ERROR(st.Read("held", ParseBytes, &d.held_bytes));
  RETURN_IF_ERROR(st.Read("peak_delta", ParseBytes, &d.peak_delta_bytes));
  if (st.Attribute("at")) {
    int32_t node = 0;
    RETURN_IF_ERROR(st.Read("at", IdParser('n'), &node));
    d.node_id = node;
  }
  RETURN_IF_ERROR(st.Read("groups", IdListParser('g'), &d.group_ids));
  RETURN_IF_ERROR(st.Read("params", IdListParser('p'), &d.param_ids));
  RETURN_IF_ERROR(st.Read("offloads", IdListParser('o'), &d.offload_ids));
  RETURN_IF_ERROR(st.Read("bind", ParseBindingKindToken, &d.binding.kind));
  if (st.Attribute("bind_at")) {
    int32_t node = 0;
    RETURN_IF_ERROR(st.Read("bind_at", IdParser('n'), &node));
    d.binding.node_id = node;
  }
  RETURN_IF_ERROR(st.Read("bind_bytes", ParseBytes, &d.binding.bytes));
  RETURN_IF_ERROR(st.Read("bind_limit", ParseBytes, &d.binding.limit_bytes));
  RETURN_IF_ERROR(st.Read("what", ParseString, &d.what));
  explanation->decisions.push_back(std::move(d));
  return absl::OkStatus();
}

// Rejects a second `keyword` line, naming the first.
absl::Status CheckOnce(const Line& line, absl::string_view keyword,
                       int* first_line) {
  if (*first_line != 0) {
    return LineError(line.number, absl::StrCat("duplicate '", keyword,
                                               "' line (the first is at line ",
                                               *first_line, ")"));
  }
  *first_line = line.number;
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// The profile's measured fields (profile_fields.h), printed and read alike.

// A field's value as text, by its member's type: integers plain, doubles
// in their shortest exact form.
template <typename Record>
std::string FormatField(const Record& record, const ProfileField<Record>& f) {
  return std::visit(
      [&](auto member) -> std::string {
        using T = std::remove_reference_t<decltype(record.*member)>;
        if constexpr (std::is_floating_point_v<T>) {
          return FormatDouble(record.*member);
        } else {
          return absl::StrCat(record.*member);
        }
      },
      f.member);
}

// Unprinted fields read back as +0 (doubles print -0.0 so that it
// round-trips).
template <typename Record>
bool IsUnmeasured(const Record& record, const ProfileField<Record>& f) {
  return std::visit(
      [&](auto member) {
        using T = std::remove_reference_t<decltype(record.*member)>;
        if constexpr (std::is_floating_point_v<T>) {
          return IsPositiveZero(record.*member);
        } else {
          return record.*member == 0;
        }
      },
      f.member);
}

template <typename Record>
void AppendFieldPositionals(const Record& record,
                            absl::Span<const ProfileField<Record>> fields,
                            std::string* out) {
  for (const ProfileField<Record>& f : fields) {
    if (f.positional) absl::StrAppend(out, " ", FormatField(record, f));
  }
}

template <typename Record>
void AppendFieldAttributes(const Record& record,
                           absl::Span<const ProfileField<Record>> fields,
                           std::string* out) {
  for (const ProfileField<Record>& f : fields) {
    if (f.positional || (!f.always_printed && IsUnmeasured(record, f))) {
      continue;
    }
    absl::StrAppend(out, " ", f.key, "=", FormatField(record, f));
  }
}

// Parses `text` into the field's member by its unit: sizes and durations
// take their suffixes.
template <typename Record>
absl::Status ParseField(const Statement& st, const ProfileField<Record>& f,
                        absl::string_view text, Record* record) {
  return std::visit(
      [&](auto member) -> absl::Status {
        using T = std::remove_reference_t<decltype(record->*member)>;
        if constexpr (std::is_floating_point_v<T>) {
          ASSIGN_OR_RETURN(
              record->*member,
              st.Check(f.unit == FieldUnit::kSeconds ? ParseTime(text)
                                                     : ParseNumber(text),
                       f.key));
        } else if constexpr (std::is_same_v<T, int64_t>) {
          ASSIGN_OR_RETURN(record->*member,
                           st.Check(f.unit == FieldUnit::kBytes
                                        ? ParseBytes(text)
                                        : ParseInteger<int64_t>(text),
                                    f.key));
        } else {
          ASSIGN_OR_RETURN(record->*member,
                           st.Check(ParseInteger<T>(text), f.key));
        }
        return absl::OkStatus();
      },
      f.member);
}

// The positional fields, in table order; `what` and an example name a
// missing one ("missing the node's time, e.g. 1.5ms").
template <typename Record>
absl::Status ReadFieldPositionals(Statement& st,
                                  absl::Span<const ProfileField<Record>> fields,
                                  Record* record) {
  for (const ProfileField<Record>& f : fields) {
    if (!f.positional) continue;
    ASSIGN_OR_RETURN(absl::string_view text,
                     st.Positional(absl::StrCat(
                         f.what, f.unit == FieldUnit::kSeconds ? ", e.g. 1.5ms"
                                 : f.unit == FieldUnit::kBytes ? ", e.g. 4MiB"
                                                               : "")));
    RETURN_IF_ERROR(ParseField(st, f, text, record));
  }
  return absl::OkStatus();
}

// The attributes ReadAttributes found; absent ones keep their values.
template <typename Record>
absl::Status ReadFieldAttributes(const Statement& st,
                                 absl::Span<const ProfileField<Record>> fields,
                                 Record* record) {
  for (const ProfileField<Record>& f : fields) {
    if (f.positional) continue;
    if (std::optional<absl::string_view> text = st.Attribute(f.key)) {
      RETURN_IF_ERROR(ParseField(st, f, *text, record));
    }
  }
  return absl::OkStatus();
}

// A line's attribute keys: `before`, the table's (in its order), `after`.
template <typename Record>
std::vector<absl::string_view> AttributeKeys(
    std::initializer_list<absl::string_view> before,
    absl::Span<const ProfileField<Record>> fields,
    std::initializer_list<absl::string_view> after) {
  std::vector<absl::string_view> keys(before);
  for (const ProfileField<Record>& f : fields) {
    if (!f.positional) keys.push_back(f.key);
  }
  keys.insert(keys.end(), after.begin(), after.end());
  return keys;
}

// ---------------------------------------------------------------------------
// Profile.

constexpr absl::string_view kProfileExample =
    "profile graph=0123456789abcdef rank=0 version=3 window=10..20";

absl::Status ParseProfileHeader(const Line& line, Profile* profile) {
  Statement st(line);
  st.set_context("profile");
  RETURN_IF_ERROR(st.ReadAttributes(AttributeKeys(
      {"graph", "rank", "version", "window"}, ProfileHeaderFields(),
      {"ag_scratch", "ag_scratch_cap", "rs_scratch", "rs_scratch_cap"})));
  RETURN_IF_ERROR(st.Require("graph", "0123456789abcdef"));
  RETURN_IF_ERROR(st.Read("graph", ParseString, &profile->graph_hash));
  RETURN_IF_ERROR(st.Read("rank", ParseInteger<int32_t>, &profile->rank));
  RETURN_IF_ERROR(
      st.Read("version", ParseInteger<int64_t>, &profile->schedule_version));
  Window window{profile->first_iteration, profile->last_iteration};
  RETURN_IF_ERROR(st.Read("window", ParseWindow, &window));
  profile->first_iteration = window.first;
  profile->last_iteration = window.last;
  RETURN_IF_ERROR(ReadFieldAttributes(st, ProfileHeaderFields(), profile));
  RETURN_IF_ERROR(st.Read("ag_scratch", ParseInteger<int32_t>,
                          &profile->allgather_scratch.copies));
  RETURN_IF_ERROR(st.Read("ag_scratch_cap", ParseBytes,
                          &profile->allgather_scratch.cap_bytes));
  RETURN_IF_ERROR(st.Read("rs_scratch", ParseInteger<int32_t>,
                          &profile->reduce_scatter_scratch.copies));
  RETURN_IF_ERROR(st.Read("rs_scratch_cap", ParseBytes,
                          &profile->reduce_scatter_scratch.cap_bytes));
  return absl::OkStatus();
}

absl::Status ParseTimeLine(const Line& line, Profile* profile) {
  Statement st(line);
  st.set_context("time");
  NodeTiming timing;
  ASSIGN_OR_RETURN(absl::string_view node, st.Positional(IdExpectation('n')));
  ASSIGN_OR_RETURN(timing.node_id, st.Check(ParseId(node, 'n')));
  st.set_context(absl::StrCat("time ", node));
  RETURN_IF_ERROR(ReadFieldPositionals(st, NodeTimingFields(), &timing));
  RETURN_IF_ERROR(st.ReadAttributes(AttributeKeys({}, NodeTimingFields(), {})));
  RETURN_IF_ERROR(ReadFieldAttributes(st, NodeTimingFields(), &timing));
  profile->nodes.push_back(timing);
  return absl::OkStatus();
}

absl::StatusOr<CollectiveKind> ParseCollectiveKindToken(absl::string_view s) {
  if (std::optional<CollectiveKind> kind = ParseCollectiveKind(s)) return *kind;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown collective ", Shown(s),
                   " (expected allgather, reduce_scatter or allreduce)"));
}

// `collective KIND ARG at=nID ...`: ARG is the group for allgather and the
// param list for the reductions; the other field prints as an attribute only
// when set.
absl::Status ParseCollectiveLine(const Line& line, Profile* profile) {
  Statement st(line);
  st.set_context("collective");
  CollectiveTiming timing;
  ASSIGN_OR_RETURN(
      absl::string_view kind,
      st.Positional("a collective (allgather, reduce_scatter or allreduce)"));
  ASSIGN_OR_RETURN(timing.kind, st.Check(ParseCollectiveKindToken(kind)));
  st.set_context(absl::StrCat("collective ", kind));
  if (timing.kind == CollectiveKind::kAllGather) {
    ASSIGN_OR_RETURN(absl::string_view group,
                     st.Positional(IdExpectation('g')));
    ASSIGN_OR_RETURN(timing.group_id, st.Check(ParseId(group, 'g')));
    RETURN_IF_ERROR(st.ReadAttributes(
        AttributeKeys({"at"}, CollectiveTimingFields(), {"params"})));
  } else {
    if (std::optional<absl::string_view> ids = st.OptionalPositional()) {
      ASSIGN_OR_RETURN(timing.param_ids, st.Check(ParseIdList(*ids, 'p')));
    }
    RETURN_IF_ERROR(st.ReadAttributes(
        AttributeKeys({"at"}, CollectiveTimingFields(), {"group"})));
  }
  RETURN_IF_ERROR(st.Read("at", IdParser('n'), &timing.node_id));
  RETURN_IF_ERROR(ReadFieldAttributes(st, CollectiveTimingFields(), &timing));
  RETURN_IF_ERROR(st.Read("group", IdParser('g'), &timing.group_id));
  RETURN_IF_ERROR(st.Read("params", IdListParser('p'), &timing.param_ids));
  profile->collectives.push_back(std::move(timing));
  return absl::OkStatus();
}

absl::Status ParseMemoryLine(const Line& line, Profile* profile) {
  Statement st(line);
  st.set_context("memory");
  MemorySample sample;
  ASSIGN_OR_RETURN(absl::string_view node, st.Positional(IdExpectation('n')));
  ASSIGN_OR_RETURN(sample.node_id, st.Check(ParseId(node, 'n')));
  st.set_context(absl::StrCat("memory ", node));
  RETURN_IF_ERROR(
      st.ReadAttributes(AttributeKeys({}, MemorySampleFields(), {})));
  RETURN_IF_ERROR(ReadFieldAttributes(st, MemorySampleFields(), &sample));
  profile->memory.push_back(sample);
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------
// Public API.

std::string PrintGraph(const Graph& graph) {
  std::string out = absl::StrCat("graph ", FormatString(graph.name),
                                 " world=", graph.world_size,
                                 " micro_batches=", graph.micro_batches,
                                 " tokens=", graph.tokens_per_micro_batch);
  if (graph.reduce_dtype.has_value()) {
    absl::StrAppend(&out, " reduce=", DTypeName(*graph.reduce_dtype));
  }
  out += "\n";
  for (const Param& p : graph.params) {
    absl::StrAppend(&out, "param ", FormatId('p', p.id), " ",
                    FormatString(p.name), " ", DTypeName(p.dtype), "[",
                    absl::StrJoin(p.shape, ","), "]");
    if (!p.unit.empty()) absl::StrAppend(&out, " unit=", FormatString(p.unit));
    if (!p.trainable) out += " frozen";
    out += '\n';
  }
  for (const Node& n : graph.nodes) {
    absl::StrAppend(&out, "node ", FormatId('n', n.id), " ",
                    FormatString(n.name), " ", PhaseName(n.phase));
    if (n.micro_batch != 0) absl::StrAppend(&out, " mb=", n.micro_batch);
    if (n.forward_id) {
      absl::StrAppend(&out, " of=", FormatId('n', *n.forward_id));
    }
    if (n.recompute) out += " recompute";
    if (!n.param_ids.empty()) {
      absl::StrAppend(&out, " params=", FormatIdList('p', n.param_ids));
    }
    if (!IsPositiveZero(n.flops)) {
      absl::StrAppend(&out, " flops=", FormatDouble(n.flops));
    }
    if (!IsPositiveZero(n.time_s)) {
      absl::StrAppend(&out, " time=", FormatDouble(n.time_s));
    }
    if (n.activation_bytes != 0) {
      absl::StrAppend(&out, " act=", n.activation_bytes);
    }
    if (n.workspace_bytes != 0) {
      absl::StrAppend(&out, " ws=", n.workspace_bytes);
    }
    out += '\n';
  }
  return out;
}

absl::StatusOr<Graph> ParseGraph(absl::string_view text) {
  ASSIGN_OR_RETURN(std::vector<Line> lines, Tokenize(text));
  RETURN_IF_ERROR(CheckHeader(lines, "graph", kGraphExample));
  Graph graph;
  RETURN_IF_ERROR(ParseGraphHeader(lines[0], &graph));
  for (size_t i = 1; i < lines.size(); ++i) {
    const Line& line = lines[i];
    const absl::string_view keyword = line.tokens[0].text;
    if (keyword == "param") {
      RETURN_IF_ERROR(ParseParamLine(line, &graph));
    } else if (keyword == "node") {
      RETURN_IF_ERROR(ParseNodeLine(line, &graph));
    } else {
      return UnknownStatement(line, "graph", "param or node");
    }
  }
  return graph;
}

namespace {

// A comment for a line of a schedule printed with names: "  # TEXT\n", with
// control bytes replaced so that it stays one line. Empty text: a bare
// newline.
std::string NameComment(absl::string_view text) {
  if (text.empty()) return "\n";
  std::string out = "  # ";
  for (char c : text) {
    out += static_cast<unsigned char>(c) < 0x20 || c == 0x7f ? '?' : c;
  }
  out += '\n';
  return out;
}

// Params by their model names, the dotted prefix they share said once:
// "layers.0.attn: wq.weight, wk.weight". At most kShown names, then how many
// more. An id the graph lacks prints as itself.
std::string ParamNames(const Graph& graph, const std::vector<int32_t>& ids) {
  constexpr size_t kShown = 8;
  std::vector<std::string> names;
  names.reserve(ids.size());
  for (int32_t id : ids) {
    const Param* p = graph.FindParam(id);
    names.push_back(p != nullptr ? p->name : FormatId('p', id));
  }
  if (names.empty()) return "";
  if (names.size() == 1) return names[0];
  // The longest prefix every name shares, cut after a dot.
  size_t common = names[0].size();
  for (const std::string& n : names) {
    size_t i = 0;
    while (i < common && i < n.size() && n[i] == names[0][i]) ++i;
    common = i;
  }
  const size_t dot = names[0].rfind('.', common == 0 ? 0 : common - 1);
  const size_t cut = common == 0 || dot == std::string::npos ? 0 : dot + 1;
  std::string out;
  if (cut > 0) absl::StrAppend(&out, names[0].substr(0, cut - 1), ": ");
  for (size_t i = 0; i < names.size() && i < kShown; ++i) {
    absl::StrAppend(&out, i == 0 ? "" : ", ", names[i].substr(cut));
  }
  if (names.size() > kShown) {
    absl::StrAppend(&out, " and ", names.size() - kShown, " more");
  }
  return out;
}

std::string NodeName(const Graph& graph, int32_t id) {
  const Node* n = graph.FindNode(id);
  return n != nullptr ? n->name : FormatId('n', id);
}

}  // namespace

std::string PrintSchedule(const Schedule& schedule) {
  return PrintSchedule(schedule, nullptr);
}

std::string PrintSchedule(const Schedule& schedule, const Graph* names) {
  // With `names`, each line that names params or nodes ends in a comment
  // saying which; the parser skips comments, so the text round-trips alike.
  auto comment = [&](const std::string& text) {
    return names != nullptr ? NameComment(text) : std::string("\n");
  };
  std::string out = absl::StrCat("schedule ", FormatId('v', schedule.version),
                                 " graph=", FormatString(schedule.graph_hash),
                                 " mode=", ShardingModeName(schedule.mode),
                                 " budget=", schedule.budget_bytes);
  out += comment(
      schedule.budget_bytes > 0
          ? absl::StrCat("budget ", FormatBytesShort(schedule.budget_bytes))
          : std::string());
  for (const GatherGroup& g : schedule.groups) {
    absl::StrAppend(&out, "group ", FormatId('g', g.id));
    if (!g.param_ids.empty()) {
      absl::StrAppend(&out, " ", FormatIdList('p', g.param_ids));
    }
    out += comment(names != nullptr ? ParamNames(*names, g.param_ids) : "");
  }
  if (!schedule.persistent_param_ids.empty()) {
    absl::StrAppend(&out, "persistent ",
                    FormatIdList('p', schedule.persistent_param_ids));
    out += comment(names != nullptr
                       ? ParamNames(*names, schedule.persistent_param_ids)
                       : "");
  }
  for (const OffloadEntry& o : schedule.offloads) {
    absl::StrAppend(&out, "offload ", FormatId('o', o.id));
    if (!o.param_ids.empty()) {
      absl::StrAppend(&out, " ", FormatIdList('p', o.param_ids));
    }
    absl::StrAppend(&out, " bytes=", o.bytes);
    out += comment(names != nullptr
                       ? absl::StrCat(ParamNames(*names, o.param_ids), " (",
                                      FormatBytesShort(o.bytes), ")")
                       : "");
  }
  for (const Action& a : schedule.actions) {
    absl::StrAppend(&out, AnchorPositionName(a.position), " ",
                    FormatId('n', a.node_id), " ", ActionKindName(a.kind));
    bool group_printed = false;
    bool params_printed = false;
    bool offload_printed = false;
    switch (a.kind) {
      case ActionKind::kAllGather:
      case ActionKind::kWait:
      case ActionKind::kRelease:
        absl::StrAppend(&out, " ", FormatId('g', a.group_id));
        group_printed = true;
        break;
      case ActionKind::kReduceScatter:
        if (!a.param_ids.empty()) {
          absl::StrAppend(&out, " ", FormatIdList('p', a.param_ids));
        }
        params_printed = true;
        break;
      case ActionKind::kOffload:
      case ActionKind::kReload:
        absl::StrAppend(&out, " ", FormatId('o', a.offload_id));
        offload_printed = true;
        break;
    }
    if (!group_printed && a.group_id != 0) {
      absl::StrAppend(&out, " group=", FormatId('g', a.group_id));
    }
    if (!params_printed && !a.param_ids.empty()) {
      absl::StrAppend(&out, " params=", FormatIdList('p', a.param_ids));
    }
    if (!offload_printed && a.offload_id != 0) {
      absl::StrAppend(&out, " offload=", FormatId('o', a.offload_id));
    }
    if (names == nullptr) {
      out += '\n';
      continue;
    }
    std::string what = NodeName(*names, a.node_id);
    if (a.kind == ActionKind::kReduceScatter && !a.param_ids.empty()) {
      absl::StrAppend(&what, "; ", ParamNames(*names, a.param_ids));
    }
    out += NameComment(what);
  }
  const Prediction& p = schedule.prediction;
  absl::StrAppend(
      &out, "predict iteration=", FormatDouble(p.iteration_s),
      " compute=", FormatDouble(p.compute_s), " comm=", FormatDouble(p.comm_s),
      " exposed=", FormatDouble(p.exposed_comm_s),
      " copy=", FormatDouble(p.copy_s), " peak=", p.peak_bytes,
      p.work > 0 ? absl::StrCat(" work=", FormatDouble(p.work)) : "");
  out += comment(p.peak_bytes > 0
                     ? absl::StrCat("peak ", FormatBytesShort(p.peak_bytes))
                     : std::string());
  const Provenance& v = schedule.provenance;
  out += "provenance";
  if (!v.passes.empty()) {
    absl::StrAppend(
        &out, " passes=",
        absl::StrJoin(v.passes, ",", [](std::string* o, const std::string& s) {
          o->append(FormatString(s));
        }));
  }
  absl::StrAppend(
      &out, " window=",
      FormatWindow(v.window_first_iteration, v.window_last_iteration),
      " wall=", FormatDouble(v.plan_wall_s));
  if (!v.reason.empty()) {
    absl::StrAppend(&out, " reason=", FormatString(v.reason));
  }
  out += '\n';
  const Explanation& e = schedule.explanation;
  if (!e.empty() || !IsPositiveZero(e.baseline_iteration_s) ||
      !IsPositiveZero(e.baseline_exposed_comm_s) ||
      e.baseline_peak_bytes != 0) {
    absl::StrAppend(
        &out, "explain baseline=", FormatDouble(e.baseline_iteration_s),
        " baseline_exposed=", FormatDouble(e.baseline_exposed_comm_s),
        " baseline_peak=", e.baseline_peak_bytes, "\n");
  }
  for (const Decision& d : e.decisions) {
    absl::StrAppend(&out, "decision ", DecisionKindName(d.kind),
                    " pass=", FormatString(d.pass),
                    " gain=", FormatDouble(d.gain_s),
                    " exposed_gain=", FormatDouble(d.exposed_gain_s),
                    " held=", d.held_bytes, " peak_delta=", d.peak_delta_bytes);
    if (d.node_id.has_value()) {
      absl::StrAppend(&out, " at=", FormatId('n', *d.node_id));
    }
    if (!d.group_ids.empty()) {
      absl::StrAppend(&out, " groups=", FormatIdList('g', d.group_ids));
    }
    if (!d.param_ids.empty()) {
      absl::StrAppend(&out, " params=", FormatIdList('p', d.param_ids));
    }
    if (!d.offload_ids.empty()) {
      absl::StrAppend(&out, " offloads=", FormatIdList('o', d.offload_ids));
    }
    absl::StrAppend(&out, " bind=", BindingKindName(d.binding.kind));
    if (d.binding.node_id.has_value()) {
      absl::StrAppend(&out, " bind_at=", FormatId('n', *d.binding.node_id));
    }
    if (d.binding.bytes != 0) {
      absl::StrAppend(&out, " bind_bytes=", d.binding.bytes);
    }
    if (d.binding.limit_bytes != 0) {
      absl::StrAppend(&out, " bind_limit=", d.binding.limit_bytes);
    }
    absl::StrAppend(&out, " what=", FormatString(d.what), "\n");
  }
  return out;
}

absl::StatusOr<Schedule> ParseSchedule(absl::string_view text) {
  ASSIGN_OR_RETURN(std::vector<Line> lines, Tokenize(text));
  RETURN_IF_ERROR(CheckHeader(lines, "schedule", kScheduleExample));
  Schedule schedule;
  RETURN_IF_ERROR(ParseScheduleHeader(lines[0], &schedule));
  int predict_line = 0;
  int provenance_line = 0;
  int explain_line = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    const Line& line = lines[i];
    const absl::string_view keyword = line.tokens[0].text;
    if (keyword == "group") {
      RETURN_IF_ERROR(ParseGroupLine(line, &schedule));
    } else if (keyword == "persistent") {
      RETURN_IF_ERROR(ParsePersistentLine(line, &schedule));
    } else if (keyword == "offload") {
      RETURN_IF_ERROR(ParseOffloadLine(line, &schedule));
    } else if (keyword == "before") {
      RETURN_IF_ERROR(
          ParseActionLine(line, AnchorPosition::kBefore, &schedule));
    } else if (keyword == "after") {
      RETURN_IF_ERROR(ParseActionLine(line, AnchorPosition::kAfter, &schedule));
    } else if (keyword == "predict") {
      RETURN_IF_ERROR(CheckOnce(line, keyword, &predict_line));
      RETURN_IF_ERROR(ParsePredictLine(line, &schedule.prediction));
    } else if (keyword == "provenance") {
      RETURN_IF_ERROR(CheckOnce(line, keyword, &provenance_line));
      RETURN_IF_ERROR(ParseProvenanceLine(line, &schedule.provenance));
    } else if (keyword == "explain") {
      RETURN_IF_ERROR(CheckOnce(line, keyword, &explain_line));
      RETURN_IF_ERROR(ParseExplainLine(line, &schedule.explanation));
    } else if (keyword == "decision") {
      RETURN_IF_ERROR(ParseDecisionLine(line, &schedule.explanation));
    } else {
      return UnknownStatement(line, "schedule",
                              "group, persistent, offload, before, after, "
                              "predict, provenance, explain or decision");
    }
  }
  return schedule;
}

std::string PrintProfile(const Profile& profile) {
  std::string out = absl::StrCat(
      "profile graph=", FormatString(profile.graph_hash),
      " rank=", profile.rank, " version=", profile.schedule_version, " window=",
      FormatWindow(profile.first_iteration, profile.last_iteration));
  AppendFieldAttributes(profile, ProfileHeaderFields(), &out);
  // The communicator's scratch rule, when reported.
  const std::pair<absl::string_view, const CollectiveScratch*> scratch[] = {
      {"ag_scratch", &profile.allgather_scratch},
      {"rs_scratch", &profile.reduce_scatter_scratch}};
  for (const auto& [key, rule] : scratch) {
    if (rule->copies != 0) absl::StrAppend(&out, " ", key, "=", rule->copies);
    if (rule->cap_bytes != 0) {
      absl::StrAppend(&out, " ", key, "_cap=", rule->cap_bytes);
    }
  }
  absl::StrAppend(&out, "\n");
  for (const NodeTiming& t : profile.nodes) {
    absl::StrAppend(&out, "time ", FormatId('n', t.node_id));
    AppendFieldPositionals(t, NodeTimingFields(), &out);
    AppendFieldAttributes(t, NodeTimingFields(), &out);
    out += '\n';
  }
  for (const CollectiveTiming& c : profile.collectives) {
    absl::StrAppend(&out, "collective ", CollectiveKindName(c.kind));
    const bool gather = c.kind == CollectiveKind::kAllGather;
    if (gather) {
      absl::StrAppend(&out, " ", FormatId('g', c.group_id));
    } else if (!c.param_ids.empty()) {
      absl::StrAppend(&out, " ", FormatIdList('p', c.param_ids));
    }
    absl::StrAppend(&out, " at=", FormatId('n', c.node_id));
    AppendFieldAttributes(c, CollectiveTimingFields(), &out);
    if (gather && !c.param_ids.empty()) {
      absl::StrAppend(&out, " params=", FormatIdList('p', c.param_ids));
    }
    if (!gather && c.group_id != 0) {
      absl::StrAppend(&out, " group=", FormatId('g', c.group_id));
    }
    out += '\n';
  }
  for (const MemorySample& m : profile.memory) {
    absl::StrAppend(&out, "memory ", FormatId('n', m.node_id));
    AppendFieldAttributes(m, MemorySampleFields(), &out);
    out += '\n';
  }
  return out;
}

absl::StatusOr<Profile> ParseProfile(absl::string_view text) {
  ASSIGN_OR_RETURN(std::vector<Line> lines, Tokenize(text));
  RETURN_IF_ERROR(CheckHeader(lines, "profile", kProfileExample));
  Profile profile;
  RETURN_IF_ERROR(ParseProfileHeader(lines[0], &profile));
  for (size_t i = 1; i < lines.size(); ++i) {
    const Line& line = lines[i];
    const absl::string_view keyword = line.tokens[0].text;
    if (keyword == "time") {
      RETURN_IF_ERROR(ParseTimeLine(line, &profile));
    } else if (keyword == "collective") {
      RETURN_IF_ERROR(ParseCollectiveLine(line, &profile));
    } else if (keyword == "memory") {
      RETURN_IF_ERROR(ParseMemoryLine(line, &profile));
    } else {
      return UnknownStatement(line, "profile", "time, collective or memory");
    }
  }
  return profile;
}

}  // namespace tandem
