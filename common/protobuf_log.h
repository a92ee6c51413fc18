// Routes protobuf's log lines to the daemon's log, throttled. protobuf logs an error for every
// string field that is not UTF-8 when it parses a message (the batch is then rejected as
// malformed, and counted): a hostile producer would flood the log. Its lines go to the log at
// most once a minute, with the count since; a fatal one always goes, at critical.
#pragma once

namespace rankwatch {

// Installs the handler for the whole process (google::protobuf::SetLogHandler). Call once, from
// main(), before any thread parses messages.
void RouteProtobufLogs();

}  // namespace rankwatch
