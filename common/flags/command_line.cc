#include "common/flags/command_line.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/did_you_mean.h"

namespace tandem {
namespace {

// Flags that abseil itself defines (--flagfile, --undefok, ...) when a
// library links absl::flags_parse: not the binary's.
bool IsAbseilsOwn(const absl::CommandLineFlag& flag) {
  return absl::StrContains(flag.Filename(), "absl/flags/");
}

// The binary's flag named `name` (snake_case), or null.
absl::CommandLineFlag* FindFlag(absl::string_view name) {
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr || flag->IsRetired() || IsAbseilsOwn(*flag)) {
    return nullptr;
  }
  return flag;
}

std::string Dashed(absl::string_view snake) {
  return absl::StrReplaceAll(snake, {{"_", "-"}});
}

std::string Snake(absl::string_view dashed) {
  return absl::StrReplaceAll(dashed, {{"-", "_"}});
}

// What a value of the flag's type looks like, for messages.
std::string TypeDescription(const absl::CommandLineFlag& flag) {
  if (flag.IsOfType<bool>()) return "true or false";
  if (flag.IsOfType<int>() || flag.IsOfType<int64_t>() ||
      flag.IsOfType<std::optional<int>>() ||
      flag.IsOfType<std::optional<int64_t>>()) {
    return "an integer";
  }
  if (flag.IsOfType<double>() || flag.IsOfType<std::optional<double>>()) {
    return "a number";
  }
  return "a valid value";
}

bool LooksBoolean(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  return lower == "true" || lower == "false" || lower == "yes" ||
         lower == "no" || lower == "1" || lower == "0";
}

// `typed` as written ("--metrics-lisen"), `name` without its dashes.
absl::Status UnknownFlag(const CommandLineSpec& spec, absl::string_view typed,
                         absl::string_view name) {
  const std::vector<std::string> names = FlagNames();
  const std::string wanted = absl::StrCat("--", Dashed(name));
  const std::string closest = NearestOption(wanted, names);
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown flag '", typed, "'",
      closest.empty() ? "" : absl::StrCat(" (did you mean ", closest, "?)"),
      "; ", spec.program, "'s flags are ",
      names.empty() ? "none" : absl::StrJoin(names, ", "),
      " (--help says what each does)"));
}

absl::Status BadValue(const absl::CommandLineFlag& flag,
                      absl::string_view value, absl::string_view detail) {
  std::string message =
      absl::StrCat("--", Dashed(flag.Name()), ": expected ",
                   TypeDescription(flag), ", got '", value, "'");
  // abseil's own reason, when its AbslParseFlag gave one ("Illegal value
  // ... ; <reason>").
  const size_t reason = detail.find("; ");
  if (reason != absl::string_view::npos) {
    absl::StrAppend(&message, " (", detail.substr(reason + 2), ")");
  }
  return absl::InvalidArgumentError(message);
}

// Appends `text` to `out` wrapped at `width` columns, every line after the
// first (and the first when `out` already ends past `indent`) indented.
void AppendWrapped(std::string& out, absl::string_view text, size_t indent,
                   size_t width) {
  size_t column = out.size() - std::min(out.size(), out.rfind('\n') + 1);
  for (absl::string_view word :
       absl::StrSplit(text, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
    if (column > indent && column + 1 + word.size() > width) {
      out.push_back('\n');
      column = 0;
    }
    if (column < indent) {
      out.append(indent - column, ' ');
      column = indent;
    } else {
      out.push_back(' ');
      ++column;
    }
    absl::StrAppend(&out, word);
    column += word.size();
  }
}

void PrintUsageError(const CommandLineSpec& spec, absl::string_view message) {
  std::fprintf(stderr, "%.*s: %.*s\nRun '%.*s --help' for usage.\n",
               static_cast<int>(spec.program.size()), spec.program.data(),
               static_cast<int>(message.size()), message.data(),
               static_cast<int>(spec.program.size()), spec.program.data());
}

}  // namespace

std::vector<std::string> FlagNames() {
  std::vector<std::string> names;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (FindFlag(name) != nullptr)
      names.push_back(absl::StrCat("--", Dashed(name)));
  }
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<ParsedCommandLine> ParseCommandLine(
    const CommandLineSpec& spec, absl::Span<const char* const> args) {
  ParsedCommandLine parsed;
  bool only_positional = false;
  // The boolean flag just read without a value: "--compare false" is a
  // mistake for --compare=false.
  std::string bare_boolean;
  for (size_t i = 1; i < args.size(); ++i) {
    const absl::string_view arg = args[i];
    if (only_positional || arg.size() < 2 || arg[0] != '-') {
      if (spec.max_positional >= 0 &&
          static_cast<int>(parsed.positional.size()) >= spec.max_positional) {
        if (!bare_boolean.empty() && LooksBoolean(arg)) {
          return absl::InvalidArgumentError(
              absl::StrCat("unexpected argument '", arg,
                           "': a boolean flag takes its value "
                           "after '=' (--",
                           bare_boolean, "=", arg, ")"));
        }
        return absl::InvalidArgumentError(absl::StrCat(
            "unexpected argument '", arg, "' (", spec.program,
            spec.max_positional == 0
                ? " takes flags only, each starting with --"
                : absl::StrCat(" takes at most ", spec.max_positional,
                               " positional argument",
                               spec.max_positional == 1 ? "" : "s", ": ",
                               spec.positional),
            ")"));
      }
      parsed.positional.emplace_back(arg);
      bare_boolean.clear();
      continue;
    }
    bare_boolean.clear();
    if (arg == "--") {
      only_positional = true;
      continue;
    }
    // -name and --name alike, as abseil reads them.
    const size_t dashes = arg[1] == '-' ? 2 : 1;
    absl::string_view body = arg.substr(dashes);
    std::optional<absl::string_view> value;
    if (const size_t eq = body.find('='); eq != absl::string_view::npos) {
      value = body.substr(eq + 1);
      body = body.substr(0, eq);
    }
    const absl::string_view typed = arg.substr(0, dashes + body.size());
    std::string name = Snake(body);
    if (dashes == 1) {
      for (const auto& [letter, long_name] : spec.short_names) {
        if (body == letter) name = Snake(long_name);
      }
    }
    absl::CommandLineFlag* flag = FindFlag(name);
    if (flag == nullptr && (name == "help" || (dashes == 1 && name == "h"))) {
      parsed.help = true;
      return parsed;
    }
    bool negative = false;
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      absl::string_view rest = absl::string_view(name).substr(2);
      absl::ConsumePrefix(&rest, "_");
      absl::CommandLineFlag* positive = FindFlag(rest);
      if (positive != nullptr) {
        if (!positive->IsOfType<bool>()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "'", typed, "': only a boolean flag has a --no form; --",
              Dashed(positive->Name()), " takes a value"));
        }
        flag = positive;
        negative = true;
      }
    }
    if (flag == nullptr) return UnknownFlag(spec, typed, body);
    const std::string flag_name = absl::StrCat("--", Dashed(flag->Name()));
    std::string error;
    if (flag->IsOfType<bool>()) {
      if (negative && value.has_value()) {
        return absl::InvalidArgumentError(
            absl::StrCat("'", arg, "': write ", flag_name, "=false, or ", typed,
                         " without a value"));
      }
      const absl::string_view text =
          value.has_value() ? *value : (negative ? "false" : "true");
      if (!flag->ParseFrom(text, &error)) return BadValue(*flag, text, error);
      if (!value.has_value() && !negative) bare_boolean = Dashed(flag->Name());
      continue;
    }
    if (!value.has_value()) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(flag_name, " needs a value (", flag_name, " VALUE or ",
                         flag_name, "=VALUE)"));
      }
      value = args[++i];
    }
    if (!flag->ParseFrom(*value, &error)) return BadValue(*flag, *value, error);
  }
  return parsed;
}

std::string CommandLineHelp(const CommandLineSpec& spec) {
  std::string out(spec.usage);
  if (!out.empty() && out.back() != '\n') out.push_back('\n');
  std::vector<absl::CommandLineFlag*> flags;
  size_t longest = 0;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (FindFlag(name) == nullptr) continue;
    flags.push_back(flag);
    longest = std::max(longest, name.size() + 2);
  }
  std::sort(flags.begin(), flags.end(),
            [](const absl::CommandLineFlag* a, const absl::CommandLineFlag* b) {
              return a->Name() < b->Name();
            });
  constexpr size_t kWidth = 80;
  const size_t column = std::min<size_t>(longest + 4, 28);
  absl::StrAppend(&out,
                  "\nflags (--name VALUE or --name=VALUE; a boolean is --name, "
                  "--name=false or --noname):\n");
  for (const absl::CommandLineFlag* flag : flags) {
    std::string line = absl::StrCat("  --", Dashed(flag->Name()));
    std::string help = flag->Help();
    const std::string default_value = flag->DefaultValue();
    if (!default_value.empty() &&
        !(flag->IsOfType<bool>() && default_value == "false")) {
      absl::StrAppend(&help, " (default: ", default_value, ")");
    }
    if (line.size() + 1 > column) {
      line.push_back('\n');
    }
    AppendWrapped(line, help, column, kWidth);
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

std::vector<std::string> ParseCommandLineOrExit(const CommandLineSpec& spec,
                                                int argc, char** argv) {
  absl::SetProgramUsageMessage(spec.usage);
  absl::StatusOr<ParsedCommandLine> parsed = ParseCommandLine(
      spec, absl::Span<const char* const>(argv, static_cast<size_t>(argc)));
  if (!parsed.ok()) ExitWithUsageError(spec, parsed.status().message());
  if (parsed->help) {
    std::fputs(CommandLineHelp(spec).c_str(), stdout);
    std::exit(0);
  }
  return std::move(parsed->positional);
}

void ExitIfInvalid(const CommandLineSpec& spec,
                   std::initializer_list<absl::Status> checks) {
  bool failed = false;
  for (const absl::Status& status : checks) {
    if (status.ok()) continue;
    std::fprintf(stderr, "%.*s: %.*s\n", static_cast<int>(spec.program.size()),
                 spec.program.data(), static_cast<int>(status.message().size()),
                 status.message().data());
    failed = true;
  }
  if (!failed) return;
  std::fprintf(stderr, "Run '%.*s --help' for usage.\n",
               static_cast<int>(spec.program.size()), spec.program.data());
  std::exit(2);
}

void ExitWithUsageError(const CommandLineSpec& spec,
                        absl::string_view message) {
  PrintUsageError(spec, message);
  std::exit(2);
}

}  // namespace tandem
