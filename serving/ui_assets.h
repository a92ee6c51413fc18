// The web UI's static files (serving/ui/), compiled into the binary at build time
// (serving/ui/embed.cmake writes ui_assets.cc into the build folder), so that the UI needs no
// file, network or CDN at run time.
#pragma once

#include <cstddef>
#include <string_view>

namespace rankwatch {

struct UiAsset {
  std::string_view name;     // file name, e.g. "app.js"
  const char* content_type;  // e.g. "text/javascript; charset=utf-8"
  const unsigned char* data;
  size_t size;
};

// The asset named `name`, or null.
const UiAsset* FindUiAsset(std::string_view name);

}  // namespace rankwatch
