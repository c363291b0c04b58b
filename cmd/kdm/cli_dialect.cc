#include "cli_dialect.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <iostream>

#include "cli_common.h"
#include "kdm/base/log_value.h"

namespace kdm::cli {
namespace {

bool g_dry_run = false;

// Optimal string alignment distance: insertions, deletions, substitutions
// and swaps of two neighbours ("--prot" is one edit from "--port").
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

bool IsHelpOption(const CLI::App* app, const CLI::Option* opt) {
  return opt == app->get_help_ptr() || opt == app->get_help_all_ptr();
}

// Every flag name of `app`: "--root", "-v", ...
std::vector<std::string> FlagNames(CLI::App* app) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : app->get_options()) {
    for (const std::string& l : opt->get_lnames()) names.push_back("--" + l);
    for (const std::string& s : opt->get_snames()) names.push_back("-" + s);
  }
  return names;
}

// The named subcommands of `app` (not option groups), with their aliases.
std::vector<std::string> CommandNames(CLI::App* app) {
  std::vector<std::string> names;
  for (CLI::App* sub : app->get_subcommands([](CLI::App* s) { return !s->get_name().empty(); })) {
    names.push_back(sub->get_name());
    for (const std::string& a : sub->get_aliases()) names.push_back(a);
  }
  return names;
}

std::string QuotedArgument(const std::string& text) {
  // Outside text: a control byte or a long word must not break the line.
  bool plain = text.size() <= 200 && std::all_of(text.begin(), text.end(), [](char c) {
                 const auto u = static_cast<unsigned char>(c);
                 return u >= 0x20 && u < 0x7f && c != '\'';
               });
  return plain ? "'" + text + "'" : QuoteLogValue(text, 200);
}

// The one line for the arguments `extras` that `app` did not take.
std::string UnknownArgumentLine(CLI::App* app, const std::vector<std::string>& extras) {
  auto is_flag = [](const std::string& e) { return e.size() > 1 && e[0] == '-'; };
  std::vector<std::string> commands = CommandNames(app);
  // A flag first ("--port 8888" with --port unknown is about --port), but
  // for a word where a command was due ("kdm kubelt --root x") the word.
  auto flag = std::find_if(extras.begin(), extras.end(), is_flag);
  if (flag != extras.end() && (commands.empty() || is_flag(extras.front()))) {
    std::string name = flag->substr(0, flag->find('='));
    std::string line = "unknown flag " + QuotedArgument(name);
    if (std::string close = DidYouMean(name, FlagNames(app)); !close.empty()) {
      line += " (did you mean '" + close + "'?)";
    }
    return line;
  }
  const std::string& word = extras.front();
  if (commands.empty()) return "unexpected argument " + QuotedArgument(word);
  std::string line = "unknown command " + QuotedArgument(word);
  if (std::string close = DidYouMean(word, commands); !close.empty()) {
    line += " (did you mean '" + close + "'?)";
  } else {
    std::string known;
    for (CLI::App* sub : app->get_subcommands([](CLI::App* s) { return !s->get_name().empty(); })) {
      known += (known.empty() ? "" : ", ") + sub->get_name();
    }
    line += " (known: " + known + ")";
  }
  return line;
}

bool IsBooleanWord(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text == "true" || text == "false" || text == "1" || text == "0";
}

// Gives the long flags of `app` their KDM_<FLAG> variables; see AddEnvNames.
void SetEnvNames(CLI::App* app) {
  for (CLI::Option* opt : app->get_options()) {
    if (IsHelpOption(app, opt) || !opt->get_envname().empty()) continue;
    // -v, the one short-only flag every command has, is KDM_V.
    const bool verbosity = opt->get_lnames().empty() && opt->get_snames().size() == 1 &&
                           opt->get_snames().front() == "v";
    if (opt->get_lnames().empty() && !verbosity) continue;
    const std::string env = EnvNameOfFlag(verbosity ? "v" : opt->get_lnames().front());
    opt->envname(env);
    // CLI11 takes yes/no/on/off and more for a flag: the documented words
    // only, said by the variable's name.
    const char* value = std::getenv(env.c_str());
    if (opt->get_expected_max() == 0 && value != nullptr && *value != '\0' &&
        !IsBooleanWord(value)) {
      throw CLI::ValidationError(env,
                                 QuotedArgument(value) + " is not a boolean (true, false, 1 or 0)");
    }
  }
}

}  // namespace

void AddVerbosityFlag(CLI::App* cmd, int* verbosity) {
  cmd->add_option("-v", *verbosity,
                  "Log verbosity: 0 the command's normal lines, 1 debug, 2-9 trace (every "
                  "command the same)")
      ->type_name("N")
      ->check([](const std::string& v) -> std::string {
        if (v.size() == 1 && v[0] >= '0' && v[0] <= '0' + kMaxVerbosity) return "";
        return "must be a whole number from 0 to " + std::to_string(kMaxVerbosity) +
               " (0 normal, 1 debug, 2-9 trace), got " + QuotedArgument(v);
      })
      ->capture_default_str();
}

spdlog::level::level_enum LogLevelFor(int verbosity, spdlog::level::level_enum normal) {
  if (verbosity >= 2) return spdlog::level::trace;
  if (verbosity == 1) return spdlog::level::debug;
  return normal;
}

void SetDryRun(bool value) { g_dry_run = value; }
bool DryRun() { return g_dry_run; }

std::string EnvNameOfFlag(std::string_view name) {
  while (!name.empty() && name.front() == '-') name.remove_prefix(1);
  std::string env = "KDM_";
  for (char c : name) {
    env += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return env;
}

void AddEnvNames(CLI::App& root) {
  for (CLI::App* sub : root.get_subcommands([](CLI::App* s) { return !s->get_name().empty(); })) {
    // Only the command being run reads the environment: the variable is
    // attached just before it parses (CLI11 reads variables of every
    // subcommand, parsed or not, and would convert them all).
    sub->preparse_callback([sub](std::size_t) { SetEnvNames(sub); });
    AddEnvNames(*sub);
  }
}

std::string DidYouMean(std::string_view word, const std::vector<std::string>& candidates) {
  std::string_view core = word;
  while (!core.empty() && core.front() == '-') core.remove_prefix(1);
  if (core.size() < 3) return "";
  const size_t bound = core.size() < 5 ? 1 : core.size() < 10 ? 2 : 3;
  std::string best;
  size_t best_distance = bound + 1;
  for (const std::string& c : candidates) {
    // A long flag is never suggested for a short one, nor the reverse.
    const bool word_long = word.starts_with("--"), candidate_long = c.starts_with("--");
    if (word.starts_with("-") && word_long != candidate_long) continue;
    const size_t d = EditDistance(word, c);
    if (d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  return best;
}

int ReportParseError(CLI::App& root, const CLI::ParseError& e) {
  std::vector<CLI::App*> chain = {&root};
  while (!chain.back()->get_subcommands().empty()) {
    chain.push_back(chain.back()->get_subcommands().front());
  }
  auto name_of = [&chain](size_t depth) {
    std::string name = "kdm";
    for (size_t i = 1; i <= depth; ++i) name += " " + chain[i]->get_name();
    return name;
  };
  // What a command did not take, the deepest first: "kdm get pods --rot x"
  // is about `get pods`.
  for (size_t depth = chain.size(); depth-- > 0;) {
    std::vector<std::string> extras = chain[depth]->remaining(false);
    std::erase(extras, "--");
    if (extras.empty()) continue;
    std::cerr << name_of(depth) << ": " << UnknownArgumentLine(chain[depth], extras) << std::endl;
    return kUsageError;
  }
  // --help, --version: CLI11 prints them (exit 0), unless something else on
  // the line was unknown (above: `kdm help kubelt` is `kdm kubelt --help`).
  if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return root.exit(e);
  std::string what = e.what();
  if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr && what.starts_with("A subcommand")) {
    std::string known;
    for (const std::string& c : CommandNames(chain.back()))
      known += (known.empty() ? "" : ", ") + c;
    what = "a command is required (" + known + "; see 'kdm help')";
  }
  std::cerr << name_of(chain.size() - 1) << ": " << what << std::endl;
  return kUsageError;
}

}  // namespace kdm::cli
