// Process-wide stop request from SIGINT / SIGTERM, for the main()s.
#pragma once

#include <atomic>
#include <chrono>

namespace rankwatch {

// Installs handlers for SIGINT and SIGTERM that set the stop flag. Call once, early.
void InstallStopSignalHandlers();

// True once SIGINT or SIGTERM arrived (or RequestStop was called).
bool StopRequested();
void RequestStop();

// Sleeps until a stop is requested or `timeout` passes; returns StopRequested().
bool WaitForStop(std::chrono::milliseconds timeout);

}  // namespace rankwatch
