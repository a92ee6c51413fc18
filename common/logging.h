// Logging setup for the main()s: human-readable lines on stderr (stdout is kept for
// machine-readable output such as `rankwatch kafka`'s bootstrap address).
#pragma once

#include <string>

namespace rankwatch {

// Installs the stderr logger at `level` (trace, debug, info, warn, error). Returns false for
// an unknown level name (the level is then info).
bool SetupLogging(const std::string& level);

}  // namespace rankwatch
