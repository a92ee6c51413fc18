// fuzz_batch: one Kafka message's bytes through BatchDecoder (protobuf parsing and every
// validation rule of wire/schema.h). Seeds: batches as collectors publish them.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "google/protobuf/stubs/logging.h"
#include "ingest/batch_decoder.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // protobuf logs every string that is not UTF-8; that is the input, not news.
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  static const rankwatch::BatchDecoder decoder;
  static rankwatch::v1::Batch batch;  // reused across inputs, as the consumer does
  std::string detail;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const rankwatch::RejectReason reason = decoder.Decode(bytes, &batch, &detail);
  (void)rankwatch::RejectReasonName(reason);
  if (reason == rankwatch::RejectReason::kNone) {
    // What the pipeline reads of an accepted batch must be addressable.
    for (const auto& s : batch.steps()) (void)s.step();
    (void)decoder.Validate(batch, &detail);
  }
  return 0;
}
