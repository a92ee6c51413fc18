// rankwatchd's command line: the config file named by --config, then the flags, which win over
// it; both through the settings table (daemon_settings.h), so every value is parsed and checked
// before the daemon binds a port or writes a file. --help, --help-markdown (the docs' flag
// table) and --version print and exit.
//
// A function of its arguments; thread-compatible.
#pragma once

#include <ostream>
#include <string>

#include "daemon/daemon_config.h"

namespace rankwatch {

struct CommandLine {
  // -1: run the daemon with `config`. Else exit with this code at once: 0 after --help,
  // --help-markdown or --version (printed to `out`), 2 after a bad argument, a bad config file
  // or a bad value (one line on `err`, naming the flag or the file and its key).
  int exit_code = -1;
  DaemonConfig config;
};

CommandLine ReadCommandLine(int argc, const char* const* argv, const std::string& version,
                            std::ostream& out, std::ostream& err);

}  // namespace rankwatch
