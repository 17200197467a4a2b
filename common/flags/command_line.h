// The command line of every Tandem binary: flags are abseil flags
// (ABSL_FLAG in the binary's main file, read with absl::GetFlag), parsed
// here, and spelled the way Tandem writes them (common/README.md, "Flags"):
//
//   --name VALUE   --name=VALUE     any flag that is not a boolean
//   --name   --name=true|false   --noname     a boolean
//   -h, --help     the usage text and every flag with its help and default
//   --             the rest are positional arguments
//
// Names are kebab-case on the command line (--metrics-listen) and
// snake_case in ABSL_FLAG (metrics_listen); either spelling is accepted.
//
// Why not absl::ParseCommandLine: in abseil 20220623 it exits with status 1
// on any usage error (tandem-health's 1 means "not serving"; Tandem's
// binaries exit 2 on bad arguments), names an unknown flag without listing
// the valid ones, prints flags in snake_case, and exits 1 after --help. The
// parser below sets the same abseil flags through abseil's public reflection
// API (absl::FindCommandLineFlag, CommandLineFlag::ParseFrom), so values are
// checked by the flag's type (AbslParseFlag) as abseil checks them.
//
// A binary's main:
//
//   ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC address");
//   int main(int argc, char** argv) {
//     const tandem::CommandLineSpec spec{"tandem-coordinator", kUsage};
//     tandem::ParseCommandLineOrExit(spec, argc, argv);
//     tandem::ExitIfInvalid(spec, {tandem::CheckHostPort(
//         "--listen", absl::GetFlag(FLAGS_listen),
//         tandem::PortZero::kAllowed)});
//
// flag_checks.h has the post-parse checks (ranges, HOST:PORT, choices,
// byte counts); launcher_environment.h reads torchrun's and Slurm's
// variables as defaults.
#ifndef TANDEM_COMMON_FLAGS_COMMAND_LINE_H_
#define TANDEM_COMMON_FLAGS_COMMAND_LINE_H_

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tandem {

// One binary's command line, beyond its flags.
struct CommandLineSpec {
  // The binary's name: messages start with it ("tandem-plan: ...").
  absl::string_view program;
  // What --help prints before the flags: the synopsis and notes. Also the
  // program's absl::ProgramUsageMessage().
  absl::string_view usage;
  // Positional arguments (e.g. "HOST:PORT", "SERIES..."); empty: none.
  absl::string_view positional;
  // At most this many positional arguments; -1: any number. The binary
  // checks how many it needs.
  int max_positional = 0;
  // One-letter spellings, e.g. {"q", "quiet"}: -q is --quiet. -h is always
  // --help.
  std::vector<std::pair<absl::string_view, absl::string_view>> short_names;
};

struct ParsedCommandLine {
  // -h or --help was given: print CommandLineHelp() and exit 0. Flags before
  // it are set, the rest of the line is not read.
  bool help = false;
  std::vector<std::string> positional;
};

// Parses `args` (args[0] is the program) into the process's abseil flags.
// InvalidArgument, saying what to fix, for: an unknown flag (naming it, the
// closest valid one, and listing every valid one), a missing value, a value
// the flag's type does not parse (naming the flag and the type), a value or
// --no form given to the wrong kind of flag, or too many positional
// arguments. Flags are set as they are read: on an error some may be set.
absl::StatusOr<ParsedCommandLine> ParseCommandLine(
    const CommandLineSpec& spec, absl::Span<const char* const> args);

// `spec.usage`, then every flag of the binary, sorted, with its help and
// default, in kebab-case.
std::string CommandLineHelp(const CommandLineSpec& spec);

// The binary's flags, "--name" each, sorted: every registered abseil flag
// but abseil's own.
std::vector<std::string> FlagNames();

// For main: sets the program usage message, parses, and on --help prints
// the help on stdout and exits 0; on an error prints
// "<program>: <message>" and a pointer to --help on stderr and exits 2.
// Returns the positional arguments.
std::vector<std::string> ParseCommandLineOrExit(const CommandLineSpec& spec,
                                                int argc, char** argv);

// For main, after parsing: prints every error among `checks` as
// "<program>: <message>" and exits 2 when there is one.
void ExitIfInvalid(const CommandLineSpec& spec,
                   std::initializer_list<absl::Status> checks);

// Prints "<program>: <message>" and a pointer to --help on stderr and
// exits 2: a usage error found after parsing (e.g. a missing flag).
[[noreturn]] void ExitWithUsageError(const CommandLineSpec& spec,
                                     absl::string_view message);

}  // namespace tandem

#endif  // TANDEM_COMMON_FLAGS_COMMAND_LINE_H_
