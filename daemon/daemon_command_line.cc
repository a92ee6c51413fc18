#include "daemon/daemon_command_line.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <vector>

#include "daemon/daemon_settings.h"

namespace rankwatch {
namespace {

// --help shows the table's help without the markdown quotes of inline code.
std::string PlainText(std::string text) {
  text.erase(std::remove(text.begin(), text.end(), '`'), text.end());
  return text;
}

// One line, whatever the message holds.
std::string OneLine(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

int BadArgument(std::ostream& err, const std::string& message) {
  err << "rankwatchd: " << OneLine(message) << "\n";
  return 2;
}

}  // namespace

CommandLine ReadCommandLine(int argc, const char* const* argv, const std::string& version,
                            std::ostream& out, std::ostream& err) {
  CommandLine result;
  const std::vector<Setting>& settings = DaemonSettings();
  CLI::App app{"rankwatchd: live cross-rank diagnosis of distributed training jobs"};
  std::string config_file;
  app.add_option("--config", config_file, "YAML config file; flags override its keys")
      ->type_name("FILE");
  bool help_markdown = false;
  app.add_flag("--help-markdown", help_markdown,
               "print the flag table of docs/operating.md (markdown) and exit");
  // The flags' text, parsed by the table once the file is read.
  std::vector<std::string> texts(settings.size());
  std::vector<std::vector<std::string>> lists(settings.size());  // a repeated list flag's items
  std::vector<CLI::Option*> options(settings.size(), nullptr);
  for (size_t i = 0; i < settings.size(); ++i) {
    const Setting& s = settings[i];
    if (s.file_only()) continue;
    options[i] =
        s.is_list ? app.add_option(s.flag(), lists[i], PlainText(s.help))->allow_extra_args(false)
                  : app.add_option(s.flag(), texts[i], PlainText(s.help));
    options[i]->type_name(s.value_name)->default_str(s.DefaultText());
  }
  app.set_version_flag("--version", version);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {
      result.exit_code = app.exit(e, out, err);  // --help, --version
      return result;
    }
    result.exit_code = BadArgument(err, std::string(e.what()) + " (see --help)");
    return result;
  }
  if (help_markdown) {
    out << DaemonSettingsMarkdown();
    result.exit_code = 0;
    return result;
  }
  if (!config_file.empty()) {
    if (absl::Status s = LoadDaemonConfigFile(config_file, &result.config); !s.ok()) {
      result.exit_code = BadArgument(err, std::string(s.message()));
      return result;
    }
  }
  for (size_t i = 0; i < settings.size(); ++i) {
    if (options[i] == nullptr || options[i]->count() == 0) continue;
    if (settings[i].is_list) {  // the flag's items replace the file's
      texts[i].clear();
      for (const std::string& item : lists[i]) texts[i] += (texts[i].empty() ? "" : ",") + item;
    }
    if (absl::Status s = settings[i].set(texts[i], &result.config); !s.ok()) {
      result.exit_code = BadArgument(err, settings[i].flag() + ": " + std::string(s.message()));
      return result;
    }
  }
  if (absl::Status s = CheckDaemonConfig(result.config); !s.ok()) {
    result.exit_code = BadArgument(err, std::string(s.message()));
  }
  return result;
}

}  // namespace rankwatch
